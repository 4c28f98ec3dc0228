"""The modern recipe's options keep N replicas equal to one device, through train.py.

Each run is `train.py`'s own `main(argv)` in this process (4 logical CPUs,
conftest.py), in float64 so that rounding cannot masquerade as a difference
(test_parallel.py explains why), from the same start weights. The final,
best and last weights and the history (losses, val_mAP) of 2 and 4
MirroredStrategy replicas must equal the single-device run's. An option that
let replicas see different learning rates, averages, input sizes or images
would differ by at least a whole optimizer step, far above the tolerance
(`test_the_tolerance_is_far_below_a_step` keeps that claim honest).

The optimizer is SGD with momentum, as in test_parallel.py: Adam divides each
step by the root of the squared gradients' average, so a weight whose
gradient is ~0 turns a 1e-16 rounding difference into a visible step
(measured through train.py: 2.2e-6 on 4 replicas after 2 Adam steps, 1.5e-10
with SGD). That is Adam amplifying rounding, on one device as well, not a
difference in what the replicas compute.

Runs are kept short (tracing a 4-replica float64 step dominates): one epoch
for each option alone, both stages (one epoch each) with every option
together, which also covers the start options (--objectness-prior), the
CIoU box loss and Darknet's anchor assignment (--iou-thresh).
"""

import shutil

import keras
import numpy as np
import pytest

from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset

TOLERANCE = 1e-7  # measured <= 1.5e-10 (the loss itself is computed in float32); steps ~1e-2
# Each option alone. Multi-scale: seed 0 draws 32 px for steps 0-9, 64 px for 10-19.
OPTIONS = {
    "cosine_warmup": ["--lr-schedule", "cosine", "--warmup-epochs", "1"],
    "plateau_warmup": ["--warmup-epochs", "1"],
    "ema": ["--ema", "0.8"],
    "eval_every_monitor_map": ["--eval-every", "1", "--monitor", "val_mAP"],
    "multi_scale": ["--multi-scale", "32,96", "--steps-per-epoch", "12"],
    "mosaic": ["--mosaic", "0.5"],
    "iou_thresh": ["--iou-thresh", "0.213"],
    # The named recipes (training/recipes.py) under _train's explicit schedule
    # flags: the default's mAP, best by val_mAP, EMA, prior, iou_thresh and
    # best/last-only checkpoints; keras-yolo3's alone.
    "recipe_default": ["--recipe", "default"],
    "recipe_keras_yolo3": ["--recipe", "keras-yolo3"],
}
# With the initialisation options too: these runs start from a seeded fresh
# build (no --weights), which the objectness prior then changes.
ALL_TOGETHER = [
    *("--eval-every", "1", "--monitor", "val_mAP", "--lr-schedule", "cosine", "--warmup-epochs", "1"),
    *("--ema", "0.8", "--multi-scale", "32,96", "--mosaic", "0.5", "--steps-per-epoch", "6"),
    *("--objectness-prior", "0.01", "--box-loss", "ciou", "--ciou-weight", "1.5", "--iou-thresh", "0.213"),
]
NEEDS_VALIDATION = {"eval_every_monitor_map", "recipe_default"}


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
    return make_synthetic_dataset(tmp_path_factory.mktemp("data"), num_train=8, num_val=4, image_size=64, seed=0)


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

    def collect(name, item):
        if isinstance(item, h5py.Dataset):
            arrays[name] = np.array(item)

    with h5py.File(path, "r") as handle:
        handle.visititems(collect)
    return [arrays[name] for name in sorted(arrays)]


def _train(dataset, start_weights, log_dir, gpus, options, *, validation, epochs=1, freeze_epochs=0):
    """train.py's main() in this process; returns ([final, best, last weights], history).

    `start_weights` None: the run builds its own start weights from --seed.
    The run folder is deleted once read: its float64 checkpoints take ~270 MB
    and the module's 20 runs share pytest's one module-lifetime folder.
    """
    from keras_yolo_mgpu.cli.train import main
    from keras_yolo_mgpu.training.callbacks import read_history

    argv = [
        *("--annotations", dataset.train, "--classes", dataset.classes, "--tiny", "--input-size", "64"),
        *("--batch-size", "4", "--steps-per-epoch", "2", "--seed", "0"),
        *("--epochs", str(epochs), "--freeze-epochs", str(freeze_epochs), "--freeze-body", "0"),
        *("--optimizer", "sgd", "--lr", "1e-4", "--lr2", "5e-5"),
        # Each option on keras-yolo3's recipe, as before recipes existed; an
        # option may name another recipe (later flags win).
        *("--recipe", "keras-yolo3"),
        *(("--weights", start_weights) if start_weights else ()),
        *("--log-dir", str(log_dir), "--quiet"),
        *(("--val-annotations", dataset.val) if validation else ("--val-split", "0")),
        *options,  # later flags win: an option may set its own --steps-per-epoch
    ]
    if gpus > 1:
        argv += ["--gpus", str(gpus), "--simulate-devices"]
    assert main(argv) == 0
    files = ("trained_weights_final.weights.h5", "best.weights.h5", "last.weights.h5")
    run = [_weights(log_dir / name) for name in files], read_history(str(log_dir / "history.csv"))
    shutil.rmtree(log_dir)
    return run


def _max_difference(first, second):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(first, second, strict=True))


def _assert_same_run(reference, replicated):
    (ref_files, ref_history), (files, history) = reference, replicated
    for name, ref_weights, weights in zip(("final", "best", "last"), ref_files, files):
        difference = _max_difference(ref_weights, weights)
        assert difference <= TOLERANCE, (name, difference)
    for key in ("loss", "val_loss", "val_mAP", "val_mAP50"):
        if key in ref_history:
            np.testing.assert_allclose(history[key], ref_history[key], rtol=1e-7, equal_nan=True, err_msg=key)


_references = {}


def _reference(name, dataset, start_weights, tmp_path_factory, options, **kwargs):
    """The single-device run of `name`, once per module."""
    if name not in _references:
        _references[name] = _train(dataset, start_weights, tmp_path_factory.mktemp(name), 1, options, **kwargs)
    return _references[name]


@pytest.mark.slow
@pytest.mark.parametrize("gpus", [2, 4])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_option_alone_on_replicas_matches_one_device(dataset, start_weights, tmp_path_factory, option, gpus):
    kwargs = dict(validation=option in NEEDS_VALIDATION)
    reference = _reference(option, dataset, start_weights, tmp_path_factory, OPTIONS[option], **kwargs)
    run = _train(dataset, start_weights, tmp_path_factory.mktemp(f"{option}_{gpus}"), gpus, OPTIONS[option], **kwargs)
    _assert_same_run(reference, run)


@pytest.mark.slow
@pytest.mark.parametrize("gpus", [2, 4])
def test_all_options_together_through_both_stages_match_one_device(dataset, tmp_path_factory, gpus):
    # One epoch per stage; multi-scale's 12 steps cross its first size change (step 10).
    kwargs = dict(validation=True, epochs=2, freeze_epochs=1)
    reference = _reference("all", dataset, None, tmp_path_factory, ALL_TOGETHER, **kwargs)
    run = _train(dataset, None, tmp_path_factory.mktemp(f"all_{gpus}"), gpus, ALL_TOGETHER, **kwargs)
    _assert_same_run(reference, run)
    history = run[1]
    assert len(history["val_mAP"]) == 2 and not np.isnan(history["val_mAP"]).any()


@pytest.mark.slow
def test_the_tolerance_is_far_below_a_step(dataset, start_weights, tmp_path_factory):
    """Training moves the weights by orders of magnitude more than TOLERANCE (the check can fail)."""
    files, _ = _reference("ema", dataset, start_weights, tmp_path_factory, OPTIONS["ema"], validation=False)
    assert _max_difference(files[0], _weights(start_weights)) > 1e3 * TOLERANCE


@pytest.mark.slow
def test_iou_thresh_changes_what_train_py_trains(dataset, start_weights, tmp_path_factory):
    """--iou-thresh reaches the targets through train.py: its run differs from the best-anchor-only run."""
    plain, _ = _reference("plain", dataset, start_weights, tmp_path_factory, [], validation=False)
    option = OPTIONS["iou_thresh"]
    files, _ = _reference("iou_thresh", dataset, start_weights, tmp_path_factory, option, validation=False)
    assert _max_difference(files[0], plain[0]) > 1e3 * TOLERANCE
