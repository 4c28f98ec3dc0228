"""Test configuration: split the CPU into logical devices before TF starts.

Multi-device equivalence tests need several devices on a 2-core machine with
no GPU. TensorFlow only accepts a logical-device layout before it initialises
its devices, so this runs at import time, before any test module imports
code that touches TensorFlow.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Equivalence tests compare weights to 1e-5; oneDNN's reordered float sums
# are deterministic per shape but differ between batch sizes, so keep them
# off in tests for the cleanest comparison.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import tensorflow as tf  # noqa: E402

NUM_LOGICAL_CPUS = 4
# KERAS_YOLO_TEST_DEVICES=GPU splits the first GPU instead (4 logical GPUs of
# 2 GiB): the equivalence tests then run on GPU kernels and the fixture below
# hands out GPU names (a rehearsal on a one-GPU machine; CI uses the CPU).
TEST_DEVICE_TYPE = os.environ.get("KERAS_YOLO_TEST_DEVICES", "CPU").upper()

if TEST_DEVICE_TYPE == "GPU":
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("GPU")[0],
        [tf.config.LogicalDeviceConfiguration(memory_limit=2048)] * NUM_LOGICAL_CPUS,
    )
else:
    _cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(_cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than ~20 s; still run by `make test`")


@pytest.fixture
def logical_cpus():
    """Names of the logical CPU devices, e.g. ['/device:CPU:0', ...] (GPUs with KERAS_YOLO_TEST_DEVICES=GPU)."""
    return [d.name for d in tf.config.list_logical_devices(TEST_DEVICE_TYPE)]
