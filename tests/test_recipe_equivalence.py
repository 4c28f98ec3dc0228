"""The modern recipe's options keep N devices equal to one device, through train.py, on both backends.

Each run is `train.py`'s own `main(argv)` in a child process (`isolation.py`:
4 logical TF CPUs, or Keras on JAX with 4 fake CPU devices; one child per
option runs its device counts, so the pytest process never holds their
graphs), in float64 so that rounding cannot masquerade as a difference
(test_parallel.py explains why), from the same start weights. The final,
best and last weights and the history (losses, val_mAP) of the replicated
runs must equal the single-device run's: each option on 2 devices (in one
of four runs, `OPTION_GROUPS`), every option together on 4. An option that let replicas see different
learning rates, averages, input sizes or images would differ by at least a
whole optimizer step, far above the tolerance
(`test_the_tolerance_is_far_below_a_step` keeps that claim honest). On TF
the replicas are MirroredStrategy's; on JAX one SPMD program over the devices.

The optimizer is SGD with momentum, as in test_parallel.py: Adam divides each
step by the root of the squared gradients' average, so a weight whose
gradient is ~0 turns a 1e-16 rounding difference into a visible step
(measured through train.py: 2.2e-6 on 4 replicas after 2 Adam steps, 1.5e-10
with SGD). That is Adam amplifying rounding, on one device as well, not a
difference in what the replicas compute.

Runs are kept short (tracing a 4-replica float64 step dominates on TF): one
epoch for each option group, both stages (one epoch each) with every option
together, which also covers the start options (--objectness-prior), the
CIoU box loss, Darknet's anchor assignment (--iou-thresh) and stage 0
(--bottleneck-epochs).
"""

import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
from isolation import computed_once, run_isolated, shared_folder
from memory_report import release_memory

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
    # The named recipes (training/named_recipes.py) under _train's explicit schedule
    # flags: the default's mAP, best by val_mAP, EMA, prior, iou_thresh and
    # best/last-only checkpoints. (keras-yolo3's recipe is every run's base,
    # `_train`'s `--recipe keras-yolo3`: each option above runs on it.)
    "recipe_default": ["--recipe", "default"],
}
# With the initialisation options too: these runs start from a seeded fresh
# build (no --weights), which the objectness prior then changes.
ALL_TOGETHER = [
    *("--eval-every", "1", "--monitor", "val_mAP", "--lr-schedule", "cosine", "--warmup-epochs", "1"),
    *("--ema", "0.8", "--multi-scale", "32,96", "--mosaic", "0.5", "--steps-per-epoch", "6"),
    *("--objectness-prior", "0.01", "--box-loss", "ciou", "--ciou-weight", "1.5", "--iou-thresh", "0.213"),
    *("--bottleneck-epochs", "1"),
]
NEEDS_VALIDATION = {"eval_every_monitor_map", "recipe_default"}
# Devices each option group is compared on: 2 (tracing a 4-replica float64
# step on TensorFlow costs twice as much); every option together runs on 4.
# Any N > 1 catches what a replica could get wrong alone (its share of the
# loss, its BatchNormalization statistics).
OPTION_DEVICES = {"tensorflow": (2,), "jax": (2,)}
# The options share four runs on each backend (a run's start, its traces on
# TF and its compiled programs on JAX are most of its cost): an option that
# made 2 devices differ from one still differs with others beside it, by a
# step's worth, far above the tolerance. EMA and --iou-thresh run alone: the
# tests below compare them with other runs (without the option, with XLA, on
# the other backend).
OPTION_GROUPS = {
    "ema": ["ema"],
    "iou_thresh": ["iou_thresh"],
    "cosine_mosaic_eval": ["cosine_warmup", "mosaic", "eval_every_monitor_map"],
    "plateau_multiscale_default": ["plateau_warmup", "multi_scale", "recipe_default"],
}
GROUP_OF = {option: group for group, options in OPTION_GROUPS.items() for option in options}


def _group_run(group):
    """(flags, `_train` kwargs) of `OPTION_GROUPS[group]`'s run."""
    options = OPTION_GROUPS[group]
    return [flag for option in options for flag in OPTIONS[option]], {
        "validation": not NEEDS_VALIDATION.isdisjoint(options)
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_synthetic_dataset(tmp_path_factory.mktemp("data"), num_train=8, num_val=4, image_size=64, seed=0)


def _write_start_weights(path):
    from keras_yolo_mgpu.model.yolo3 import build_body
    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors

    keras.utils.set_random_seed(1)
    build_body(get_anchors(default_anchors_path(True)), 4).save_weights(path)


@pytest.fixture(scope="module")
def start_weights(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("weights") / "start.weights.h5")
    run_isolated(_write_start_weights, path, floatx="float64")
    return path


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
    The run folder is deleted once read: its float64 checkpoints take ~270 MB.
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
        # The run's pictures are tested elsewhere (test_train.py); here they would only cost time.
        *("--log-dir", str(log_dir), "--quiet", "--no-pictures"),
        *(("--val-annotations", dataset.val) if validation else ("--val-split", "0")),
        *options,  # later flags win: an option may set its own --steps-per-epoch
    ]
    if gpus > 1:
        argv += ["--gpus", str(gpus), "--simulate-devices"]
    assert main(argv) == 0
    files = ("trained_weights_final.weights.h5", "best.weights.h5", "last.weights.h5")
    run = [_weights(log_dir / name) for name in files], read_history(str(log_dir / "history.csv"))
    shutil.rmtree(log_dir)
    release_memory()  # the next run of this child starts from what this one freed
    return run


def _max_difference(first, second):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(first, second, strict=True))


def _compare_replica_runs(dataset, start_weights, work_dir, options, train_kwargs, device_counts=(2, 4)):
    """Runs one device, 2 and 4 replicas in this (child) process; returns what the tests assert on.

    Returns a dict: `differences[gpus]`, the largest |difference| of the final,
    best and last weights against the one-device run; `histories[gpus]`
    (1, 2, 4); `moved`, how far the one-device run's final weights moved from
    `start_weights` (None without them). The one-device final weights are
    kept in `work_dir/reference_final.npz` for comparisons with other runs.
    """
    work_dir = Path(work_dir)
    reference = _train(dataset, start_weights, work_dir / "gpus1", 1, options, **train_kwargs)
    np.savez(work_dir / "reference_final.npz", *reference[0][0])
    result = {"differences": {}, "histories": {1: reference[1]}, "moved": None}
    if start_weights:
        result["moved"] = _max_difference(reference[0][0], _weights(start_weights))
    for gpus in device_counts:
        files, history = _train(dataset, start_weights, work_dir / f"gpus{gpus}", gpus, options, **train_kwargs)
        result["differences"][gpus] = [_max_difference(a, b) for a, b in zip(reference[0], files, strict=True)]
        result["histories"][gpus] = history
    return result


def _compare_each_option(dataset, start_weights, work_root, jobs):
    """`_compare_replica_runs` for each `name: (options, train_kwargs, device_counts)`, one after another."""
    results = {}
    for name, (options, train_kwargs, device_counts) in jobs.items():
        work_dir = Path(work_root) / name
        work_dir.mkdir()
        results[name] = _compare_replica_runs(dataset, start_weights, work_dir, options, train_kwargs, device_counts)
    return results


def _difference_from_saved(dataset, start_weights, work_dir, options, train_kwargs, saved_final):
    """Largest |difference| between this run's final weights (one device) and `saved_final` (.npz)."""
    files, _ = _train(dataset, start_weights, Path(work_dir) / "run", 1, options, **train_kwargs)
    with np.load(saved_final) as saved:
        return _max_difference(files[0], [saved[f"arr_{i}"] for i in range(len(saved.files))])


@pytest.fixture(scope="module")
def replica_runs(dataset, start_weights, tmp_path_factory):
    """`get(name, options, start=True, **train_kwargs)`: `_compare_replica_runs`' result, once per test run.

    Each name's three runs share one child process (they trace three float64
    steps), so the pytest process never holds their graphs; the result is
    shared by the xdist workers (`computed_once`), with `work_dir` in a
    folder they all read.
    """
    shared = shared_folder(tmp_path_factory)

    def get(name, options, start=True, backend="tensorflow", device_counts=None, **train_kwargs):
        """`name`: an option (its group's runs: `OPTION_GROUPS`) or the name of other runs."""
        if name in OPTIONS:
            if backend == "jax":
                return jax_options()[GROUP_OF[name]]
            name = GROUP_OF[name]
            options, train_kwargs = _group_run(name)
        device_counts = device_counts or OPTION_DEVICES[backend]
        key = f"recipe-{name}" if backend == "tensorflow" else f"recipe-{backend}-{name}"

        def compute():
            work_dir = shared / key
            work_dir.mkdir()
            weights = start_weights if start else None
            result = run_isolated(
                _compare_replica_runs,
                dataset,
                weights,
                str(work_dir),
                options,
                train_kwargs,
                device_counts,
                floatx="float64",
                backend=backend,
            )
            return {**result, "work_dir": work_dir}

        return computed_once(key, compute, shared)

    def jax_options():
        """Every `OPTION_GROUPS` run on JAX in one child process: JAX starts and caches its programs once."""

        def compute():
            work_dir = shared / "recipe-jax-options"
            work_dir.mkdir()
            jobs = {group: (*_group_run(group), OPTION_DEVICES["jax"]) for group in OPTION_GROUPS}
            results = run_isolated(
                _compare_each_option, dataset, start_weights, str(work_dir), jobs, floatx="float64", backend="jax"
            )
            return {name: {**result, "work_dir": work_dir / name} for name, result in results.items()}

        return computed_once("recipe-jax-options", compute, shared)

    return get


def _assert_same_run(runs, gpus, tolerance=TOLERANCE):
    for name, difference in zip(("final", "best", "last"), runs["differences"][gpus], strict=True):
        assert difference <= tolerance, (name, difference)
    reference, history = runs["histories"][1], runs["histories"][gpus]
    for key in ("loss", "val_loss", "val_mAP", "val_mAP50"):
        if key in reference:
            np.testing.assert_allclose(history[key], reference[key], rtol=1e-7, equal_nan=True, err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("option", list(OPTIONS))
def test_option_on_replicas_matches_one_device(replica_runs, option):
    """Each option, 1 device against 2 replicas, in its `OPTION_GROUPS` run (4 replicas: every option together)."""
    runs = replica_runs(option, OPTIONS[option])
    _assert_same_run(runs, 2)


@pytest.mark.slow
def test_all_options_together_through_both_stages_match_one_device(replica_runs):
    # One epoch per stage; multi-scale's 12 steps cross its first size change (step 10).
    runs = replica_runs(
        "all", ALL_TOGETHER, start=False, device_counts=(4,), validation=True, epochs=2, freeze_epochs=1
    )
    _assert_same_run(runs, 4)
    val_map = runs["histories"][4]["val_mAP"]
    assert len(val_map) == 2 and not np.isnan(val_map).any()


@pytest.mark.slow
def test_the_tolerance_is_far_below_a_step(replica_runs):
    """Training moves the weights by orders of magnitude more than TOLERANCE (the check can fail)."""
    assert replica_runs("ema", OPTIONS["ema"], validation=False)["moved"] > 1e3 * TOLERANCE


@pytest.mark.slow
def test_iou_thresh_changes_what_train_py_trains(dataset, start_weights, replica_runs, tmp_path):
    """--iou-thresh reaches the targets through train.py: its run differs from the best-anchor-only run."""
    runs = replica_runs("iou_thresh", OPTIONS["iou_thresh"], validation=False)
    saved = str(runs["work_dir"] / "reference_final.npz")
    kwargs = dict(validation=False)
    difference = run_isolated(
        _difference_from_saved, dataset, start_weights, str(tmp_path), [], kwargs, saved, floatx="float64"
    )
    assert difference > 1e3 * TOLERANCE


@pytest.mark.slow
def test_xla_on_one_device_trains_like_the_uncompiled_run(dataset, start_weights, replica_runs, tmp_path):
    """--jit (XLA, the one-GPU default) through train.py trains the final weights of the same run without it.

    With --iou-thresh, so the static ignore-mask bound XLA needs is the
    multi-anchor one. One device only: with several replicas Keras 3.15
    compiles the whole cross-replica step as one XLA computation, which
    fails on logical devices (training/precision.py), so several GPUs keep
    XLA off by default: the path the tests above prove exact.
    """
    runs = replica_runs("iou_thresh", OPTIONS["iou_thresh"], validation=False)
    saved = str(runs["work_dir"] / "reference_final.npz")
    options, kwargs = [*OPTIONS["iou_thresh"], "--jit"], dict(validation=False)
    difference = run_isolated(
        _difference_from_saved, dataset, start_weights, str(tmp_path), options, kwargs, saved, floatx="float64"
    )
    assert difference <= TOLERANCE


# --- JAX: one SPMD program over 1, 2 and 4 fake CPU devices -------------------------------------------------
#
# The same runs through train.py's main under KERAS_BACKEND=jax (XLA at every
# device count, keras.distribution.DataParallel). The loss and
# BatchNormalization compute in float64 there (model/loss.py, model/batch_norm.py),
# so the bound is the 1e-9; measured differences are ~2e-16.
JAX_TOLERANCE = 1e-9
# TF and JAX compute the same float64 arithmetic with two compilers: after a
# few steps the weights agree to rounding, far below a step (~1e-2). TF's
# BatchNormalization keeps Keras's float32 statistics in float64 models.
CROSS_BACKEND_TOLERANCE = 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("option", list(OPTIONS))
def test_jax_option_on_devices_matches_one_device(replica_runs, option):
    """Each option on 2 devices against one device, in its `OPTION_GROUPS` run."""
    runs = replica_runs(option, OPTIONS[option], backend="jax")
    _assert_same_run(runs, 2, JAX_TOLERANCE)


@pytest.mark.slow
def test_jax_all_options_together_through_both_stages_match_one_device(replica_runs):
    runs = replica_runs(
        "all", ALL_TOGETHER, start=False, backend="jax", device_counts=(4,), validation=True, epochs=2, freeze_epochs=1
    )
    _assert_same_run(runs, 4, JAX_TOLERANCE)
    val_map = runs["histories"][4]["val_mAP"]
    assert len(val_map) == 2 and not np.isnan(val_map).any()


@pytest.mark.slow
def test_jax_tolerance_is_far_below_a_step(replica_runs):
    """The JAX runs move the weights by orders of magnitude more than JAX_TOLERANCE (the check can fail)."""
    assert replica_runs("ema", OPTIONS["ema"], backend="jax")["moved"] > 1e3 * JAX_TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("option", ["ema", "iou_thresh"])
def test_tensorflow_and_jax_train_the_same_weights(replica_runs, option):
    """One device each, same start weights, same batches: TF's and JAX's final weights agree to 1e-6."""
    tf_runs = replica_runs(option, OPTIONS[option], validation=False)
    jax_runs = replica_runs(option, OPTIONS[option], backend="jax")
    with (
        np.load(tf_runs["work_dir"] / "reference_final.npz") as a,
        np.load(jax_runs["work_dir"] / "reference_final.npz") as b,
    ):
        difference = max(float(np.max(np.abs(a[key] - b[key]))) for key in a.files)
    assert difference <= CROSS_BACKEND_TOLERANCE
    assert jax_runs["moved"] > 1e3 * CROSS_BACKEND_TOLERANCE
