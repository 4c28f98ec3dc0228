"""Export with decoding and NMS inside: SavedModel, TFLite (builtins only), ONNX."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys

import cv2
import numpy as np
import pytest
from inference_helpers import (
    INPUT_SHAPE,
    TINY_ANCHORS,
    TINY_ANCHORS_PATH,
    compare_detections,
    make_body,
    random_images,
    write_classes,
)

from keras_yolo_mgpu import outputs
from keras_yolo_mgpu.cli import export as export_cli
from keras_yolo_mgpu.cli.export import main
from keras_yolo_mgpu.inference import export
from keras_yolo_mgpu.inference.export import ExportError, export_model
from keras_yolo_mgpu.inference.export_check import FLOAT_TOLERANCES
from keras_yolo_mgpu.inference.export_formats import open_runner

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
    assert check["source"] == "generated scenes"
    assert check["at_floor"]["compared"] > 5  # the comparison covers real boxes, not only padding
    assert check["at_floor"]["exact"] and check["own_nms"]["exact"]
    assert check["at_floor"]["found"] == check["at_floor"]["compared"]
    assert check["decoded"]["max_box_excess"] <= 0 and check["decoded"]["max_score_diff"] <= FLOAT_TOLERANCES.score


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
    assert "check on 4 generated scenes" in out and "exported savedmodel" in out

    # The signature any TensorFlow user calls, on a batch of 3 of different sizes.
    model = export.build_export_model(files["weights"], TINY_ANCHORS, ["a", "b"], input_size=INPUT_SHAPE, score=SCORE)
    images = np.random.default_rng(0).random((3, *INPUT_SHAPE, 3), dtype=np.float32)
    shapes = np.array([[96, 128], [300, 200], [50, 400]], np.float32)
    served = open_runner(str(output))(images, shapes)
    assert served["boxes"].shape == (3, 100, 4) and served["valid_detections"].shape == (3,)
    assert served["decoded_boxes"].shape == (3, (3 * 4 + 6 * 8) * 3, 4)  # every box before NMS
    matched = compare_detections({k: np.asarray(v) for k, v in model([images, shapes]).items()}, served)
    assert int(served["valid_detections"].sum()) > 5
    assert matched["valid_equal"] and matched["classes_equal"]
    assert matched["max_box_diff"] <= FLOAT_TOLERANCES.box_px and matched["max_score_diff"] <= FLOAT_TOLERANCES.score


def test_tflite_uses_builtin_ops_and_matches_keras(files):
    result = _export(files, "tflite")
    _assert_matches(result["check"])  # run by the stock interpreter: no Flex delegate needed


@pytest.mark.skipif(not HAVE_ONNX, reason="tf2onnx and onnxruntime not installed (pip install tf2onnx onnxruntime)")
def test_onnx_matches_keras(files):
    result = _export(files, "onnx")
    _assert_matches(result["check"])
    assert export.CATCH_ERRORS not in os.environ  # set for tf2onnx during the conversion only


def test_onnx_missing_tools_is_a_clear_error(files, monkeypatch):
    def missing():
        raise ExportError(export.ONNX_MISSING)

    monkeypatch.setattr(export, "_import_onnx_tools", missing)
    # overwrite: an earlier test of this module may have written model.onnx;
    # the error under test is the missing tools, not the existing file.
    with pytest.raises(ExportError, match="pip install tf2onnx onnxruntime"):
        _export(files, "onnx", overwrite=True)
    with pytest.raises(ValueError, match="format must be one of"):
        _export(files, "coreml")


def test_export_never_touches_a_folder_it_did_not_write(files, tmp_path, capsys):
    """A user's folder given as --output (e.g. `--output .`) keeps every file; nothing is exported."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "sub").mkdir()
    (folder / "sub" / "data.csv").write_text("1,2")
    argv = ["--weights", files["weights"], "--classes", files["classes"], "--anchors", TINY_ANCHORS_PATH]
    assert main([*argv, "--format", "savedmodel", "--output", str(folder)]) == 1
    assert "not a SavedModel exported by this tool" in capsys.readouterr().err
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) == ["notes.txt", "sub", "sub/data.csv"]
    assert (folder / "notes.txt").read_text() == "mine"
    # A file in the way is not replaced either, unless asked.
    existing = tmp_path / "model.tflite"
    existing.write_bytes(b"someone's model")
    assert main([*argv, "--format", "tflite", "--output", str(existing)]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert existing.read_bytes() == b"someone's model"
    assert main([*argv, "--format", "tflite", "--output", str(folder)]) == 1  # a folder for a file export
    assert sorted(os.listdir(tmp_path)) == ["model.tflite", "project"]  # no temporary left behind


class _FakeExportable:
    """Stands in for the Keras model: `export` writes a SavedModel-like folder (the real one takes seconds)."""

    def __init__(self, content, fail=False):
        self.content, self.fail = content, fail

    def export(self, path, format, verbose, input_signature=None):
        os.makedirs(path)
        with open(os.path.join(path, "saved_model.pb"), "w") as f:
            f.write(self.content)
        if self.fail:
            raise RuntimeError("interrupted")


def test_a_previous_export_is_replaced_and_a_failed_one_leaves_it(tmp_path):
    output = str(tmp_path / "exported")
    export.export_savedmodel(_FakeExportable("first"), output, mark=True)
    assert sorted(os.listdir(output)) == [export.EXPORT_MARKER, "saved_model.pb"]
    export._check_output(output, "savedmodel", overwrite=False)  # ours: may be replaced
    with pytest.raises(RuntimeError):
        export.export_savedmodel(_FakeExportable("second", fail=True), output, mark=True)
    assert open(os.path.join(output, "saved_model.pb")).read() == "first"
    export.export_savedmodel(_FakeExportable("third"), output, mark=True)
    assert open(os.path.join(output, "saved_model.pb")).read() == "third"
    assert os.listdir(tmp_path) == ["exported"]  # no temporary or old copy left behind
    empty = tmp_path / "empty"
    empty.mkdir()
    export._check_output(str(empty), "savedmodel", overwrite=False)  # an empty folder loses nothing


_BACKEND_AFTER_THE_SWITCH = """
import sys
if sys.argv[1] == "keras first":
    import keras
from keras_yolo_mgpu.inference.export import ExportError, use_keras_on_tensorflow
try:
    use_keras_on_tensorflow()
except ExportError as error:
    print("refused:", error)
import keras
print(keras.backend.backend())
"""


@pytest.mark.parametrize("order", ["switch first", "keras first"])
def test_an_export_on_jax_runs_keras_on_tensorflow_or_says_where_to_run(order):
    """`KERAS_BACKEND=jax python -m keras_yolo_mgpu.export ...` failed inside tf2onnx on a symbolic tensor."""
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-c", _BACKEND_AFTER_THE_SWITCH, order], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    if order == "switch first":
        assert result.stdout.split() == ["tensorflow"]
    else:
        assert "refused: exports are written through TensorFlow, and Keras runs on jax in this process" in result.stdout
        assert "KERAS_BACKEND=tensorflow" in result.stdout and result.stdout.split()[-1] == "jax"


def test_the_export_command_on_jax_writes_through_tensorflow(files, tmp_path):
    command = [sys.executable, "-m", "keras_yolo_mgpu.export", "--weights", files["weights"], "--format", "savedmodel"]
    command += ["--classes", files["classes"], "--anchors", TINY_ANCHORS_PATH, "--input-size", "64", "--no-check"]
    command += ["--output", str(tmp_path / "saved")]
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "export runs Keras on TensorFlow" in result.stderr and (tmp_path / "saved" / "saved_model.pb").is_file()


def test_a_rerun_replaces_its_own_export_checked_on_the_images_the_run_held_out(files, tmp_path, capsys, caplog):
    """A run's weights: the check runs on its val_split.txt; a re-run replaces its own file, never an edited one."""
    run = tmp_path / "logs" / "000"
    run.mkdir(parents=True)
    weights = run / "best.weights.h5"
    shutil.copy(files["weights"], weights)
    lines = []
    for index, image in enumerate(random_images(3, seed=7)):
        cv2.imwrite(str(run / f"held_{index}.jpg"), image)
        lines.append(f"{run / f'held_{index}.jpg'} 2,3,40,50,1")
    (run / "val_split.txt").write_text("\n".join(lines) + "\n")
    argv = ["--weights", str(weights), "--classes", files["classes"], "--anchors", TINY_ANCHORS_PATH]
    argv += ["--input-size", "96x128", "--format", "tflite"]

    assert main(argv) == 0
    assert f"check on 3 images of {run / 'val_split.txt'}" in capsys.readouterr().out
    caplog.set_level(logging.INFO)
    assert main([*argv, "--no-check"]) == 0
    assert f"replacing {run / 'best.tflite'}, an earlier output of keras-yolo-mgpu" in caplog.text
    exported = (run / "best.tflite").read_bytes()
    (run / "best.tflite").write_bytes(exported + b"an edit")  # now the user's file
    assert main([*argv, "--no-check"]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert (run / "best.tflite").read_bytes() == exported + b"an edit"
    # The metadata beside an export of an earlier version (never recorded) is still known as this project's.
    unrecorded = tmp_path / "old.onnx.metadata.json"
    unrecorded.write_text((run / "best.tflite.metadata.json").read_text())
    users = tmp_path / "mine.onnx.metadata.json"
    users.write_text('{"notes": "mine"}')
    assert outputs.written_here(unrecorded) and not outputs.written_here(users)
    # A dataset moved since the run: its list no longer names images here, and the generated scenes check instead.
    # A run given --val-annotations: the check runs on those images.
    given = tmp_path / "given"
    given.mkdir()
    shutil.copy(weights, given / "best.weights.h5")
    (given / "args.json").write_text(json.dumps({"val_annotations": str(run / "val_split.txt")}))
    assert main([*argv, "--weights", str(given / "best.weights.h5")]) == 0  # the later --weights wins
    assert f"check on 3 images of {run / 'val_split.txt'}" in capsys.readouterr().out
    held_out = str(run / "val_split.txt")
    assert export_cli._run_images(held_out, "checking") == held_out
    (run / "held_0.jpg").unlink()
    assert export_cli._run_images(held_out, "checking") is None
