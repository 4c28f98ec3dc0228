"""Export with decoding and NMS inside: SavedModel, TFLite (builtins only), ONNX."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from inference_helpers import INPUT_SHAPE, TINY_ANCHORS, TINY_ANCHORS_PATH, make_body, write_classes

from keras_yolo_mgpu.cli.export import main
from keras_yolo_mgpu.inference import export
from keras_yolo_mgpu.inference.export import BOX_TOLERANCE_PX, SCORE_TOLERANCE, ExportError, export_model

SCORE = 0.5
HAVE_ONNX = all(importlib.util.find_spec(name) for name in ("tf2onnx", "onnxruntime"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export")
    weights = str(folder / "tiny.weights.h5")
    make_body().save_weights(weights)
    return {"folder": folder, "weights": weights, "classes": write_classes(folder / "classes.txt")}


def _export(files, fmt, **kwargs):
    return export_model(
        files["weights"],
        fmt,
        str(files["folder"] / f"model.{fmt}"),
        classes_path=files["classes"],
        anchors_path=TINY_ANCHORS_PATH,
        input_size=INPUT_SHAPE,
        score=SCORE,
        **kwargs,
    )


def _assert_matches(check):
    # check_export already raised if these failed; the numbers are stated here.
    assert check["detections"] > 5  # the comparison covers real boxes, not only padding
    assert check["valid_equal"] and check["classes_equal"]
    assert check["max_box_diff"] <= BOX_TOLERANCE_PX and check["max_score_diff"] <= SCORE_TOLERANCE


def test_savedmodel_cli_matches_keras(files, capsys):
    output = files["folder"] / "cli_savedmodel"
    argv = [
        "--weights",
        files["weights"],
        "--classes",
        files["classes"],
        "--anchors",
        TINY_ANCHORS_PATH,
        "--input-size",
        "96x128",
        "--score",
        str(SCORE),
        "--format",
        "savedmodel",
        "--output",
        str(output),
    ]
    assert main(argv) == 0
    assert (output / "saved_model.pb").is_file()
    out = capsys.readouterr().out
    assert "check:" in out and "exported savedmodel" in out

    # The signature any TensorFlow user calls, on a batch of 3 of different sizes.
    model = export.build_export_model(files["weights"], TINY_ANCHORS, ["a", "b"], input_size=INPUT_SHAPE, score=SCORE)
    images = np.random.default_rng(0).random((3, *INPUT_SHAPE, 3), dtype=np.float32)
    shapes = np.array([[96, 128], [300, 200], [50, 400]], np.float32)
    served = export.run_savedmodel(str(output), images, shapes)
    assert served["boxes"].shape == (3, 100, 4) and served["valid_detections"].shape == (3,)
    _assert_matches(
        {
            **export.compare_detections({k: np.asarray(v) for k, v in model([images, shapes]).items()}, served),
            "detections": int(served["valid_detections"].sum()),
        }
    )


def test_tflite_uses_builtin_ops_and_matches_keras(files):
    result = _export(files, "tflite")
    _assert_matches(result["check"])  # run by the stock interpreter: no Flex delegate needed


@pytest.mark.skipif(not HAVE_ONNX, reason="tf2onnx and onnxruntime not installed (pip install tf2onnx onnxruntime)")
def test_onnx_matches_keras(files):
    result = _export(files, "onnx")
    _assert_matches(result["check"])


def test_onnx_missing_tools_is_a_clear_error(files, monkeypatch):
    def missing():
        raise ExportError(export.ONNX_MISSING)

    monkeypatch.setattr(export, "_import_onnx_tools", missing)
    with pytest.raises(ExportError, match="pip install tf2onnx onnxruntime"):
        _export(files, "onnx")
    with pytest.raises(ValueError, match="format must be one of"):
        _export(files, "coreml")
