"""`python -m keras_yolo_mgpu.align`: the 1-vs-N alignment check and the weight-file diff."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_yolo_mgpu.cli import align as align_cli
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
from keras_yolo_mgpu.parallel.align import FLOAT32_RELATIVE_THRESHOLD, LayerDifference, judge, layer_differences

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_synthetic_dataset(tmp_path_factory.mktemp("align_data"), num_train=8, num_val=1, image_size=64, seed=0)


def _align_flags(dataset, *extra):
    return [
        *("--annotations", dataset.train, "--classes", dataset.classes, "--tiny", "--input-size", "64"),
        *("--steps", "2", "--batch-size", "4", "--gpus", "2", "--float64", *extra),
    ]


def test_layer_differences_group_by_layer_and_judge():
    names = ["conv", "conv", "bn"]
    start = [np.zeros(2), np.zeros(1), np.zeros(3)]
    reference = [np.array([1.0, -2.0]), np.array([0.5]), np.array([0.1, 0.0, 0.0])]
    other = [np.array([1.0, -2.001]), np.array([0.5]), np.array([0.1, 0.0, 0.01])]
    rows = layer_differences(names, start, reference, other)
    assert [r.layer for r in rows] == ["bn", "conv"]  # largest difference first
    by_name = {r.layer: r for r in rows}
    assert by_name["conv"].max_abs_diff == pytest.approx(0.001) and by_name["conv"].step == 2.0
    assert by_name["bn"].max_abs_diff == pytest.approx(0.01) and by_name["bn"].ratio == pytest.approx(0.1)
    # float64: absolute 1e-9 by default.
    assert judge(rows, "float64") == (False, 1e-9, None)
    assert judge(rows, "float64", threshold=0.02)[0]
    # float32: a fraction of the largest step (2.0): 0.01 / 2.0 = 0.005.
    passed, threshold, relative = judge(rows, "float32", relative_threshold=0.004)
    assert (passed, threshold, relative) == (False, pytest.approx(0.008), 0.004)
    assert judge(rows, "float32", relative_threshold=0.006)[0]
    assert judge(rows, "float32")[2] == FLOAT32_RELATIVE_THRESHOLD
    # A layer that did not move must not differ at all.
    assert LayerDifference("frozen", 0.0, 0.0).ratio == 0.0
    assert LayerDifference("frozen", 1e-12, 0.0).ratio == float("inf")


def test_batches_carry_the_targets_train_py_builds_for_the_iou_thresh(dataset):
    def object_cells(*extra):
        args = align_cli.build_parser().parse_args(_align_flags(dataset, *extra))
        _, anchors, _ = align_cli._classes_anchors_and_kind(args)
        batches = align_cli._load_batches(args, anchors, 4, "yolov3-tiny")
        return sum(float(x[key][..., 4].sum()) for x, _ in batches for key in x if key.startswith("y_true"))

    best_only = object_cells()
    assert object_cells("--iou-thresh", "1") == best_only > 0
    assert object_cells("--iou-thresh", "0.213") > best_only


@pytest.mark.slow
def test_replicas_with_sync_bn_align_in_float64(dataset, logical_cpus):
    args = align_cli.build_parser().parse_args(_align_flags(dataset))
    report = align_cli.run_alignment(args, logical_cpus[:2])
    assert report.passed, report.summary()
    assert report.max_abs_diff < 1e-12
    # The steps are real: a wrong gradient scale would show at this size.
    assert report.max_step > 1e-3
    assert report.reference_losses == pytest.approx(report.replica_losses, rel=1e-12)


@pytest.mark.slow
def test_command_fails_without_sync_bn(dataset):
    """Per-replica BatchNormalization statistics are a different computation: the check must catch it."""
    flags = _align_flags(dataset, "--simulate-devices", "--no-sync-bn")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="0")
    result = subprocess.run(
        [sys.executable, "-m", "keras_yolo_mgpu.align", *flags],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=REPO,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["passed"] is False and summary["sync_bn"] is False and summary["replicas"] == 2
    assert summary["max_abs_diff"] > 1e-6
    assert "batch_normalization" in summary["worst_layer"]
    assert "FAILED" in result.stdout


def test_diff_names_the_changed_tensor_across_formats(tmp_path, capsys):
    """A Keras 2 file of keras-yolo3 against our .weights.h5 with one tensor changed."""
    k2 = pytest.importorskip("keras2_reference")
    from keras_yolo_mgpu.model.yolo3 import build_body
    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors
    from keras_yolo_mgpu.weights.loading import load_weights

    classes = tmp_path / "classes.txt"
    classes.write_text("a\nb\n")
    keras2_file = str(tmp_path / "keras2_body.h5")
    k2.build_body(tiny=True, num_classes=2).save_weights(keras2_file)

    body = build_body(get_anchors(default_anchors_path(True)), 2)
    load_weights(body, keras2_file)
    bias = body.get_layer("yolo_output_1").bias
    changed = bias.numpy()
    changed[3] += 0.25
    changed[5] -= 0.125
    bias.assign(changed)
    ours = str(tmp_path / "ours.weights.h5")
    body.save_weights(ours)

    def run(*extra):
        code = align_cli.main(["diff", keras2_file, ours, "--tiny", "--classes", str(classes), *extra])
        return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    code, summary = run("--threshold", "0.1")
    assert code == 1
    assert summary["max_abs_diff"] == pytest.approx(0.25)
    assert summary["sum_squares"] == pytest.approx(0.25**2 + 0.125**2, rel=1e-6)
    assert summary["tensors_over_threshold"] == 1 and "yolo_output_1" in summary["worst_tensor"]
    assert run("--threshold", "0.3")[0] == 0
    assert align_cli.main(["diff", keras2_file, keras2_file, "--tiny", "--classes", str(classes)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["max_abs_diff"] == 0.0
