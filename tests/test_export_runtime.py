"""Exported models run by evaluate.py and yolo_video.py; INT8 and float16 TFLite."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from inference_helpers import CLASS_NAMES, TINY_ANCHORS, make_body

from keras_yolo_mgpu.cli import detect, evaluate
from keras_yolo_mgpu.cli import export as export_cli
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
from keras_yolo_mgpu.inference.export import export_model
from keras_yolo_mgpu.weights.metadata import make_metadata, write_metadata

INPUT = (64, 64)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export_runtime")
    data = make_synthetic_dataset(folder / "data", num_train=24, num_val=4, image_size=64, classes=CLASS_NAMES)
    weights = str(folder / "tiny.weights.h5")
    make_body().save_weights(weights)
    write_metadata(weights, make_metadata(TINY_ANCHORS, CLASS_NAMES, INPUT))  # as train.py's files carry
    tflite = export_model(weights, "tflite", str(folder / "model.tflite"))
    return {"folder": folder, "data": data, "weights": weights, "tflite": tflite}


def test_int8_and_float16_tflite_sizes_and_checks(setup, capsys):
    float_size = setup["tflite"]["size"]
    int8 = str(setup["folder"] / "int8.tflite")
    data = setup["data"]
    argv = ["--weights", setup["weights"], "--format", "tflite", "--int8", "--images", data.train, "--output", int8]
    assert export_cli.main([*argv, "--validation", data.val]) == 0
    out = capsys.readouterr().out
    assert f"check on 8 images of {data.train}" in out and "exported tflite (int8, " in out
    assert os.path.getsize(int8) < 0.3 * float_size  # 8-bit weights: about a quarter
    # The mAP of both, by evaluate.py's code, side by side.
    assert re.search(r"keras: mAP@\.5 \d\.\d{3}", out) and re.search(r"export: mAP@\.5 \d\.\d{3}", out)
    # Only the network is 8-bit: decoding, NMS and the outputs stay float32,
    # in every subgraph of the file. (Exported with a batch of None, NMS was a
    # WHILE loop whose body, a second subgraph the float list missed, had its
    # boxes and scores quantised: a trained network's boxes all came out 0.)
    subgraphs = _tensors_by_subgraph(int8)
    assert len(subgraphs) == 1, "NMS must be unrolled in the main graph"
    int8_tensors = [name for name, dtype in subgraphs[0] if dtype == "INT8"]
    assert len(int8_tensors) > 20  # the network's weights and activations
    assert [n for n in int8_tensors if "tiny_yolo_body" not in n] == ["tfl.quantize"]  # its input
    interpreter = tf.lite.Interpreter(model_path=int8)
    outputs = interpreter.get_signature_runner().get_output_details()
    assert {name for name, d in outputs.items() if d["dtype"] == np.float32} == {
        "boxes",
        "scores",
        "decoded_boxes",
        "decoded_scores",
    }
    # A run's weights: INT8 calibrates on the images the run trained on (its train_split.txt) without --images.
    run = setup["folder"] / "run"
    run.mkdir()
    shutil.copy(setup["weights"], run / "best.weights.h5")
    shutil.copy(data.train, run / "train_split.txt")
    argv = ["--weights", str(run / "best.weights.h5"), "--format", "tflite", "--int8", "--calibration-images", "8"]
    assert export_cli.main(argv) == 0
    assert f"check on 8 images of {run / 'train_split.txt'}" in capsys.readouterr().out
    half = export_model(setup["weights"], "tflite", str(setup["folder"] / "half.tflite"), precision="float16")
    assert 0.45 < half["size"] / float_size < 0.55
    at_floor = half["check"]["at_floor"]
    assert at_floor["compared"] > 0 and at_floor["found"] >= 0.95 * at_floor["compared"]
    with pytest.raises(ValueError, match="--images"):
        export_model(setup["weights"], "tflite", str(setup["folder"] / "x.tflite"), precision="int8")
    with pytest.raises(ValueError, match="--format tflite"):
        export_model(setup["weights"], "onnx", str(setup["folder"] / "x.onnx"), precision="float16")


def _tensors_by_subgraph(path) -> list[list[tuple[str, str]]]:
    """`(name, type)` of every tensor, per subgraph of a `.tflite` flatbuffer."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    types = {value: name for name, value in vars(schema.TensorType).items() if not name.startswith("_")}
    model = flatbuffer_utils.read_model(path)
    return [[(t.name.decode(), types[t.type]) for t in graph.tensors] for graph in model.subgraphs]


def _evaluate(path, setup, capsys):
    saved = str(setup["folder"] / (os.path.basename(path) + ".json"))
    argv = ["--annotations", setup["data"].val, "--weights", path, "--save-detections", saved, "--no-progress"]
    assert evaluate.main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    with open(saved) as f:
        return report, sorted(json.load(f), key=lambda d: (d["image_id"], -d["score"]))


def test_evaluate_runs_the_export_as_it_runs_the_weights(setup, capsys):
    keras_report, keras_dets = _evaluate(setup["weights"], setup, capsys)
    export_report, export_dets = _evaluate(setup["tflite"]["path"], setup, capsys)
    assert len(keras_dets) == len(export_dets) > 0
    np.testing.assert_allclose([d["bbox"] for d in export_dets], [d["bbox"] for d in keras_dets], atol=0.05)
    np.testing.assert_allclose([d["score"] for d in export_dets], [d["score"] for d in keras_dets], atol=1e-4)
    assert export_report["mAP50"] == pytest.approx(keras_report["mAP50"], abs=1e-6)


def test_yolo_video_runs_an_export_and_needs_its_metadata(setup, capsys, tmp_path):
    images = os.path.join(os.path.dirname(setup["data"].val), "images", "val")
    counts = {}
    for name, path in (("keras", setup["weights"]), ("tflite", setup["tflite"]["path"])):
        saved = tmp_path / f"{name}.jsonl"
        argv = ["--model", path, "--image", images, "--output", str(tmp_path / name), "--save-json", str(saved)]
        assert detect.main([*argv, "--no-progress"]) == 0
        counts[name] = [len(json.loads(line)["detections"]) for line in saved.read_text().splitlines()]
    assert counts["tflite"] == counts["keras"] and sum(counts["keras"]) > 0
    bare = tmp_path / "bare.tflite"
    shutil.copy(setup["tflite"]["path"], bare)  # without its .metadata.json
    capsys.readouterr()
    assert detect.main(["--model", str(bare), "--image", images, "--output", str(tmp_path / "x")]) == 1
    assert "bare.tflite.metadata.json" in capsys.readouterr().err


def test_bench_infer_times_an_export_beside_the_keras_path_on_jax(setup, tmp_path):
    # The weights' classes and anchors from the file's metadata, as every command reads them.
    flags = ["--weights", setup["weights"], "--input-size", "64", "--frames", "4"]
    flags += ["--batch-size", "2", "--repeats", "1", "--exported", setup["tflite"]["path"]]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="jax")
    command = [sys.executable, "-m", "keras_yolo_mgpu.bench", "infer", *flags]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(result.stdout.strip().splitlines()[-1])
    (row,) = record["exported"]
    assert record["backend"] == "jax" and row["path"] == setup["tflite"]["path"] and row["format"] == "tflite"
    assert row["fps"] > 0 and row["forward_fps"] > 0
    # keras_ratio is rounded to 4 decimals: a small ratio (0.0292 for 0.02925) is off by up to 5e-5.
    assert row["keras_ratio"] == pytest.approx(record["fps"] / row["fps"], rel=1e-3, abs=5e-5)
    # The same network, so the same boxes on the same frames (the export decodes in float32 too).
    assert row["boxes_per_frame"] == record["boxes_per_frame"] > 0
    assert f"{setup['tflite']['path']}: full path" in result.stderr

    # An export needs the weights it came from.
    refused = subprocess.run(command[:4] + ["--exported", setup["tflite"]["path"]], capture_output=True, text=True,
                             timeout=120, env=env, cwd=tmp_path)  # fmt: skip
    assert refused.returncode == 1 and "give --weights" in refused.stderr, refused.stderr[-2000:]
