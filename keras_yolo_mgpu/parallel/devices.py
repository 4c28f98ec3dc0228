"""Several devices: device selection, simulated devices, strategies.

The default engine is `tf.distribute.MirroredStrategy`: one replica per GPU,
gradients all-reduced (NCCL on GPUs), BatchNormalization synchronised. The
`multi_gpu_model` here replaces the function Keras removed, for code written
against keras-yolo3 and for users who want the classic in-graph replication.

Both compute what one device computes at the same global batch, because the
loss is per sample (see `loss.py`): the compiled loss averages over the whole
global batch exactly once.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Sequence

import tensorflow as tf

logger = logging.getLogger(__name__)

STRATEGIES = ("mirrored", "multiworker")
# Memory per simulated GPU when one physical GPU is split (MiB).
DEFAULT_SIMULATED_GPU_MEMORY_MB = 4096


def simulate_devices(count: int, memory_limit_mb: int = DEFAULT_SIMULATED_GPU_MEMORY_MB) -> list[str]:
    """Splits the single GPU (or, without one, the CPU) into `count` logical devices.

    Lets a multi-GPU run be rehearsed on any machine. Must run before
    TensorFlow initialises its devices (before any op or model is created).

    Returns:
        The logical device names, e.g. `['/device:CPU:0', '/device:CPU:1']`.

    Raises:
        RuntimeError: TensorFlow's devices are already initialised with
            another layout.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1. Received: count={count}")
    gpus = tf.config.list_physical_devices("GPU")
    physical = gpus[0] if gpus else tf.config.list_physical_devices("CPU")[0]
    kind = "GPU" if gpus else "CPU"
    if kind == "GPU":
        layout = [tf.config.LogicalDeviceConfiguration(memory_limit=memory_limit_mb)] * count
    else:
        layout = [tf.config.LogicalDeviceConfiguration()] * count
    try:
        tf.config.set_logical_device_configuration(physical, layout)
    except RuntimeError:
        existing = tf.config.list_logical_devices(kind)
        if len(existing) >= count:
            logger.info("devices already initialised; using %d of %d logical %s devices", count, len(existing), kind)
        else:
            raise RuntimeError(
                f"cannot split the {kind} into {count} logical devices: TensorFlow already "
                f"initialised {len(existing)}. Simulate devices before building any model."
            ) from None
    return [d.name for d in tf.config.list_logical_devices(kind)[:count]]


def select_devices(gpus: int | None = None, simulate: bool = False) -> list[str]:
    """The devices to train on.

    Args:
        gpus: number of GPUs; None means every visible GPU (the CPU if none).
        simulate: split the CPU or single GPU into `gpus` logical devices.

    Raises:
        ValueError: more GPUs asked for than visible (without `simulate`).
    """
    if simulate:
        return simulate_devices(gpus or 2)
    visible = [d.name for d in tf.config.list_logical_devices("GPU")]
    if gpus is None:
        return visible or [tf.config.list_logical_devices("CPU")[0].name]
    if gpus > len(visible):
        raise ValueError(
            f"--gpus {gpus} asked for {gpus} GPUs but TensorFlow sees {len(visible)} "
            f"({', '.join(visible) or 'none'}). Check CUDA_VISIBLE_DEVICES and the TensorFlow GPU install, "
            "or add --simulate-devices to rehearse on logical devices."
        )
    return visible[:gpus]


def make_strategy(devices: Sequence[str], kind: str = "mirrored") -> tf.distribute.Strategy:
    """A strategy over `devices`.

    Args:
        devices: device names from `select_devices`.
        kind: "mirrored" (one machine) or "multiworker" (several machines,
            configured by the TF_CONFIG environment variable; each worker
            uses its local devices).
    """
    if kind not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}. Received: strategy={kind!r}")
    if kind == "multiworker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError(
                "--strategy multiworker needs the TF_CONFIG environment variable, e.g. "
                '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}'
            )
        try:
            json.loads(os.environ["TF_CONFIG"])
        except json.JSONDecodeError as error:
            raise ValueError(f"TF_CONFIG is not valid JSON: {error}") from None
        return tf.distribute.MultiWorkerMirroredStrategy()
    if len(devices) == 1:
        return tf.distribute.OneDeviceStrategy(devices[0])
    cross_device_ops = None
    if not all("GPU" in d.upper() for d in devices):
        # NCCL only runs on GPUs; logical CPU devices reduce on one device.
        cross_device_ops = tf.distribute.ReductionToOneDevice()
    return mirrored_strategy(devices, cross_device_ops)


# Spacing of the collective group keys of successive strategies: a strategy
# takes one group key per device set it reduces over.
_COLLECTIVE_KEY_STEP = 10_000
_collective_key_bases = itertools.count(1)


class _MirroredStrategyWithOwnKeys(tf.distribute.MirroredStrategy):
    """MirroredStrategy whose collective ops use keys no earlier strategy of this process used.

    TensorFlow numbers every MirroredStrategy's collective groups from 1 and
    their instances from 100 (`_collective_key_base`, 0 unless a test sets
    it; TF 2.21). The runtime remembers each instance's shape, so a second
    strategy in the same process (a second run in a script, a second `train()` in
    a notebook, a test suite) that all-reduces another shape under the same
    keys aborts with "Shape mismatch in the collective instance 100". That
    is what broke the float64 replica tests on 4 logical GPUs of one H100
    (issue #14): on GPUs the gradients and sync BN's statistics go through
    collective ops. A fresh key base per strategy keeps them apart.
    """

    def __init__(self, devices, cross_device_ops=None):
        # Read by MirroredExtended.__init__ (from super().__init__) to number its keys.
        self._collective_key_base = next(_collective_key_bases) * _COLLECTIVE_KEY_STEP
        super().__init__(devices=devices, cross_device_ops=cross_device_ops)


def mirrored_strategy(devices: Sequence[str], cross_device_ops=None) -> tf.distribute.MirroredStrategy:
    """`tf.distribute.MirroredStrategy(devices, cross_device_ops)` with collective keys of its own.

    Args:
        devices: two or more device names.
        cross_device_ops: None: TensorFlow's default (collective ops, NCCL on
            physical GPUs).
    """
    return _MirroredStrategyWithOwnKeys(list(devices), cross_device_ops)
