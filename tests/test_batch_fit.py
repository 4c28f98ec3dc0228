"""`--batch-size auto`: the largest batch up to the default whose step fits the budget, and the next size up
measured not to.

The search is checked against every size measured by brute force on memory
curves of the shapes real steps have (a fixed part and a slope, allocator
blocks, a convex tail, out-of-memory trials); the command is checked through
`train.py` on both engines, where the run's own measurements must place the
budget between the chosen size and the next one, or the size at the ceiling.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
from keras_yolo_mgpu.training.batch_fit import BatchDoesNotFit, BatchFit, auto_ceiling, describe, largest_fitting_batch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 2**20

CURVES = {
    "linear": lambda size: 200 * MIB + size * 3 * MIB,
    "allocator blocks": lambda size: 64 * MIB * -(-(150 * MIB + size * 5 * MIB) // (64 * MIB)),
    "convex": lambda size: 100 * MIB + size * MIB + size * size * MIB // 8,
    "out of memory above 40": lambda size: None if size > 40 else 50 * MIB + size * 7 * MIB,
}


@pytest.mark.parametrize("curve", CURVES)
def test_the_largest_fitting_batch_of_every_budget_with_the_next_size_measured(curve):
    step_bytes = CURVES[curve]
    most = 300
    for budget in np.linspace(step_bytes(1), 2 * step_bytes(most) if step_bytes(most) else 400 * MIB, 37):
        budget = int(budget)
        calls = []
        fit = largest_fitting_batch(lambda size: calls.append(size) or step_bytes(size), budget, most)
        # The reference: every size measured.
        fitting = [size for size in range(1, most + 1) if step_bytes(size) is not None and step_bytes(size) <= budget]
        assert fit.per_device == max(fitting), (curve, budget)
        assert fit.step_bytes == step_bytes(fit.per_device) <= budget
        if fit.per_device < most:
            assert fit.per_device + 1 in calls and not fit.largest_allowed
            assert fit.next_step_bytes is None or fit.next_step_bytes > budget
        else:
            assert fit.largest_allowed
        assert len(calls) == len(set(calls)) <= 20  # each size compiled or tried once, and few of them


def test_the_ceiling_is_the_default_global_batch_split_and_the_log_says_which_limit_chose():
    assert auto_ceiling(num_train=148, replicas=1, default_batch=32) == 32  # not the 148 that fit on the CPU
    assert auto_ceiling(num_train=148, replicas=4, default_batch=32) == 8  # the global batch stays 32 on 4 GPUs
    assert auto_ceiling(num_train=148, replicas=3, default_batch=32) == 10
    assert auto_ceiling(num_train=20, replicas=2, default_batch=32) == 10  # a set smaller than the batch
    assert auto_ceiling(num_train=148, replicas=64, default_batch=32) == 1

    def fit(per_device, largest_allowed):
        return BatchFit(per_device, 3 * 2**30, None if largest_allowed else 5 * 2**30, 4 * 2**30, largest_allowed, {})

    ceiling = describe(fit(8, True), replicas=4, budget_given=True, num_train=148)
    assert ceiling.startswith("--batch-size auto: global batch 32 (8 per device): the default batch over the devices")
    assert "3.00 GiB of the --memory-budget of 4.00 GiB per device" in ceiling
    whole_set = describe(fit(10, True), replicas=2, budget_given=False, num_train=20)
    assert "global batch 20 (10 per device): every training image in one step" in whole_set
    memory = describe(fit(6, False), replicas=1, budget_given=True, num_train=148)
    assert memory.endswith("; 7 per device would need 5.00 GiB")


def test_one_image_over_the_budget_is_refused_with_what_to_change():
    with pytest.raises(BatchDoesNotFit, match=r"one image per device needs 0\.20 GiB, more than the budget of 0\.10"):
        largest_fitting_batch(lambda size: 200 * MIB * size, 100 * MIB, most=8)
    with pytest.raises(BatchDoesNotFit, match="one image per device ran out of memory.*--input-size"):
        largest_fitting_batch(lambda size: None, 100 * MIB, most=8)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch_auto")
    make_synthetic_dataset(root / "data", num_train=40, num_val=0, image_size=64, seed=0)
    return root


def _train(root, backend, log_dir, *flags):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND=backend)
    env.pop("TF_CONFIG", None)
    command = [
        sys.executable,
        os.path.join(REPO, "train.py"),
        *("--annotations", "data/train.txt", "--classes", "data/classes.txt"),
        *("--anchors", os.path.join(REPO, "model_data", "tiny_yolo_anchors.txt"), "--input-size", "64"),
        *("--epochs", "1", "--steps-per-epoch", "1", "--quiet", "--no-pictures", "--seed", "0"),
        *("--log-dir", log_dir, "-v", *flags),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=400, env=env, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


def _chosen(log: str, budget_gib: float, replicas: int) -> int:
    """The per-device batch the run chose, checked against the run's own measurements (the next size up
    measured not to fit, or not measured: the size is the ceiling)."""
    measured = re.search(r"step bytes by images per device: (\{.*\})", log).group(1)
    measured = {int(size): value for size, value in json.loads(re.sub(r"(\d+):", r'"\1":', measured)).items()}
    per_device = int(re.search(r"--batch-size auto: global batch \d+ \((\d+) per device\)", log).group(1))
    budget = int(budget_gib * 2**30)
    assert measured[per_device] <= budget
    assert measured.get(per_device + 1) is None or measured[per_device + 1] > budget
    assert f"global batch {per_device * replicas} ({per_device} per replica)" in log
    return per_device


def test_jax_batch_auto_fits_the_budget_over_two_devices_and_trains_as_that_batch_would(dataset):
    """Two fake devices: the global batch is the per-device size twice, and the run trains exactly as one started
    with that batch (the measurement leaves no trace in the run)."""
    log = _train(
        dataset, "jax", "auto", "--gpus", "2", "--simulate-devices", "--batch-size", "auto", "--memory-budget", "0.2"
    )
    per_device = _chosen(log, 0.2, replicas=2)
    assert 2 < per_device < 18  # the budget lies inside the range, not at an end of it
    args = json.loads((dataset / "auto" / "args.json").read_text())
    assert args["batch_size"] == 2 * per_device and args["memory_budget"] == 0.2
    # The default feed, chosen and said: the steps of this run compute on the CPU.
    assert "feed: worker threads (auto: the step runs on the CPU" in log and args["feed"] == "threads"
    _train(dataset, "jax", "given", "--gpus", "2", "--simulate-devices", "--batch-size", str(2 * per_device))
    auto = (dataset / "auto" / "trained_weights_final.weights.h5").read_bytes()
    given = (dataset / "given" / "trained_weights_final.weights.h5").read_bytes()
    assert auto == given


def test_tensorflow_batch_auto_measures_a_trial_step_and_records_the_batch(dataset):
    """On the CPU the trial measures the process's peak resident memory, TensorFlow and Python included: 1.2 to
    1.4 GiB for one image on the 2-core machine, depending on what else the process loaded; the budget leaves room."""
    log = _train(dataset, "tensorflow", "tf_auto", "--batch-size", "auto", "--memory-budget", "4")
    per_device = _chosen(log, 4, replicas=1)
    assert json.loads((dataset / "tf_auto" / "args.json").read_text())["batch_size"] == per_device
    # The 36 training images all fit the budget (about 1.6 GiB on the CPU); auto stops at the default batch.
    assert per_device == 32 and "global batch 32 (32 per device): the default batch over the devices" in log
