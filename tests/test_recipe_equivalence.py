"""The modern recipe's options keep N replicas equal to one device, through train.py.

Each run is `train.py`'s own `main(argv)` in this process (4 logical CPUs,
conftest.py), in float64 so that rounding cannot masquerade as a difference
(test_parallel.py explains why), from the same start weights. The final
weights and the whole history (losses, val_mAP) of 2 and 4 MirroredStrategy
replicas must equal the single-device run's: an option that made the
replicas see different learning rates, averages, input sizes or images
would differ by at least one optimizer step, far above the tolerance.
"""

import keras
import numpy as np
import pytest

from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset

TOLERANCE = 1e-9
OPTIONS = {
    "cosine_warmup": ["--lr-schedule", "cosine", "--warmup-epochs", "1"],
    "plateau_warmup": ["--warmup-epochs", "1.5"],
    "ema": ["--ema", "0.8"],
    "eval_monitor_map": ["--monitor", "val_mAP", "--eval-every", "1"],
}


@pytest.fixture(scope="module", autouse=True)
def float64_models():
    previous_floatx, previous_policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    yield
    keras.config.set_dtype_policy(previous_policy)
    keras.config.set_floatx(previous_floatx)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return make_synthetic_dataset(root, num_train=8, num_val=4, image_size=64, seed=0)


@pytest.fixture(scope="module")
def start_weights(tmp_path_factory, float64_models):
    from keras_yolo_mgpu.model.yolo3 import build_body
    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors

    keras.utils.set_random_seed(1)
    body = build_body(get_anchors(default_anchors_path(True)), 4)
    path = tmp_path_factory.mktemp("weights") / "start.weights.h5"
    body.save_weights(str(path))
    return str(path)


def _weights(path):
    """Every array of a .weights.h5 file, in name order."""
    import h5py

    arrays = {}
    with h5py.File(path, "r") as handle:
        handle.visititems(
            lambda name, item: arrays.__setitem__(name, np.array(item)) if hasattr(item, "shape") else None
        )
    return [arrays[name] for name in sorted(arrays)]


def _train(dataset, start_weights, log_dir, gpus, options, epochs=3, freeze_epochs=1):
    """train.py's main() in this process; returns (final, best, last weights, history)."""
    from keras_yolo_mgpu.cli.train import main
    from keras_yolo_mgpu.training.callbacks import read_history

    argv = [
        *("--annotations", dataset.train, "--val-annotations", dataset.val, "--classes", dataset.classes),
        *("--tiny", "--input-size", "64", "--batch-size", "4", "--steps-per-epoch", "2"),
        *("--epochs", str(epochs), "--freeze-epochs", str(freeze_epochs), "--freeze-body", "0"),
        *("--lr", "1e-3", "--lr2", "5e-4", "--weights", start_weights, "--log-dir", str(log_dir), "--quiet"),
        *options,
    ]
    if gpus > 1:
        argv += ["--gpus", str(gpus), "--simulate-devices"]
    assert main(argv) == 0
    files = ("trained_weights_final.weights.h5", "best.weights.h5", "last.weights.h5")
    return [_weights(log_dir / name) for name in files], read_history(str(log_dir / "history.csv"))


def _max_difference(first, second):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(first, second, strict=True))


def _assert_same_run(reference, replicated):
    (ref_files, ref_history), (files, history) = reference, replicated
    for ref_weights, weights in zip(ref_files, files):
        assert _max_difference(ref_weights, weights) <= TOLERANCE
    for key in ("loss", "val_loss", "val_mAP", "val_mAP50"):
        if key in ref_history:
            np.testing.assert_allclose(history[key], ref_history[key], rtol=1e-9, equal_nan=True, err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_option_alone_on_2_and_4_replicas_matches_one_device(dataset, start_weights, tmp_path, option):
    reference = _train(dataset, start_weights, tmp_path / "one", 1, OPTIONS[option])
    for gpus in (2, 4):
        _assert_same_run(reference, _train(dataset, start_weights, tmp_path / f"gpus{gpus}", gpus, OPTIONS[option]))
