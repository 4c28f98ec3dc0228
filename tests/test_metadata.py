"""Weights files that know what they are: metadata written, read, reconciled with flags, used by every CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import h5py
import keras
import numpy as np
import pytest
from darknet_files import random_weights, write_weights

from keras_yolo_mgpu.weights import darknet
from keras_yolo_mgpu.weights.metadata import (
    ATTRIBUTE,
    MetadataError,
    ModelMetadata,
    make_metadata,
    read_metadata,
    reconcile,
    settings_for,
    sidecar_path,
    write_metadata,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CFG = os.path.join(REPO, "model_data", "yolov3-tiny.cfg")  # the official cfg, as keras-yolo3 ships it
TINY_ANCHORS = [(10, 14), (23, 27), (37, 58), (81, 82), (135, 169), (344, 319)]
CLASSES = ["circle", "square"]


def tiny_metadata(**changes):
    values = dict(
        kind="yolov3-tiny",
        input_shape=(96, 96),
        anchors=TINY_ANCHORS,
        masks=[[3, 4, 5], [1, 2, 3]],
        class_names=CLASSES,
    )
    values.update(changes)
    return ModelMetadata(**values)


def test_round_trip_in_weights_h5_and_keras_and_legacy_is_none(tmp_path):
    import keras

    from keras_yolo_mgpu.model.yolo3 import build_body

    body = build_body(np.array(TINY_ANCHORS, np.float32), 2)
    legacy = str(tmp_path / "legacy.weights.h5")
    body.save_weights(legacy)
    assert read_metadata(legacy) is None
    meta = tiny_metadata()
    with_meta = str(tmp_path / "w.weights.h5")
    body.save_weights(with_meta)
    write_metadata(with_meta, meta)
    assert read_metadata(with_meta) == meta
    with h5py.File(with_meta, "r") as handle:  # a plain JSON string attribute, readable by any tool
        assert json.loads(handle.attrs[ATTRIBUTE])["class_names"] == CLASSES
    archive = str(tmp_path / "m.keras")
    body.save(archive)
    write_metadata(archive, meta)
    assert read_metadata(archive) == meta
    assert keras.saving.load_model(archive).name == "tiny_yolo_body"  # Keras ignores the extra entry


def test_damaged_or_inconsistent_metadata_is_named(tmp_path):
    with pytest.raises(MetadataError, match="2 output scales, so 2 masks"):
        tiny_metadata(masks=[[0, 1, 2]])
    with pytest.raises(MetadataError, match="multiples of 32"):
        tiny_metadata(input_shape=(100, 96))
    path = tmp_path / "x.weights.h5"
    with h5py.File(path, "w") as handle:
        handle.attrs[ATTRIBUTE] = '{"kind": "yolov3-tiny"'
    with pytest.raises(MetadataError, match=r"x\.weights\.h5: damaged"):
        read_metadata(path)


def test_explicit_values_that_contradict_the_file_name_both():
    meta = tiny_metadata()
    assert reconcile(meta, "w.h5", class_names=CLASSES, anchors=TINY_ANCHORS) == meta
    with pytest.raises(MetadataError, match=r"--classes says 3 classes \['a', 'b', 'c'\] but w.h5 was saved with 2"):
        reconcile(meta, "w.h5", class_names=["a", "b", "c"])
    with pytest.raises(MetadataError, match=r"--classes says 1 class \['a'\] but w.h5 was saved with 2 classes"):
        reconcile(meta, "w.h5", class_names=["a"])
    with pytest.raises(MetadataError, match=r"--anchors says 1,2, .* but w.h5 was saved with 10,14, 23,27"):
        reconcile(meta, "w.h5", anchors=[(1, 2)] * 6)
    with pytest.raises(
        MetadataError, match=r"--masks says \[\[3, 4, 5\], \[0, 1, 2\]\] .* \[\[3, 4, 5\], \[1, 2, 3\]\]"
    ):
        reconcile(meta, "w.h5", masks=[[3, 4, 5], [0, 1, 2]])
    # Another input size is a choice, not a contradiction.
    assert reconcile(meta, "w.h5", input_shape=(128, 160)).input_shape == (128, 160)
    assert reconcile(None, "legacy.h5", class_names=["a"]) is None


def test_checkpoints_and_training_settings_carry_metadata(tmp_path):
    from keras_yolo_mgpu.model.yolo3 import build_body
    from keras_yolo_mgpu.training.checkpoint import save_weights_atomic
    from keras_yolo_mgpu.training.model_settings import TrainConfig, _model_settings

    body = build_body(np.array(TINY_ANCHORS, np.float32), 2)
    meta = tiny_metadata(masks=[[3, 4, 5], [0, 1, 2]])
    path = str(tmp_path / "ckpt.weights.h5")
    save_weights_atomic(body, path, meta)
    assert read_metadata(path) == meta
    assert sorted(os.listdir(tmp_path)) == ["ckpt.weights.h5"]

    # train.py --weights W: anchors and masks come from W; classes are the dataset's.
    classes = tmp_path / "voc.txt"
    classes.write_text("a\nb\nc\n")
    names, anchors, masks, kind = _model_settings(TrainConfig(annotations="x", classes=str(classes), weights=path))
    assert names == ["a", "b", "c"] and masks == [[3, 4, 5], [0, 1, 2]] and kind == "yolov3-tiny"
    np.testing.assert_array_equal(anchors, np.array(TINY_ANCHORS, np.float32))
    full = tmp_path / "full.txt"
    full.write_text("10,13, 16,30, 33,23, 30,61, 62,45, 59,119, 116,90, 156,198, 373,326\n")
    with pytest.raises(MetadataError, match="has 9 anchors but the start weights .* are yolov3-tiny with 6"):
        _model_settings(TrainConfig(annotations="x", classes=str(classes), weights=path, anchors=str(full)))
    with pytest.raises(MetadataError, match=r"full.txt\) says 10,13, 16,30, .* was saved with 10,14, 23,27"):
        settings_for(path, anchors_path=str(full))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """yolov3-tiny.cfg for 2 classes at 96x96 with generated weights, converted with --classes."""
    folder = tmp_path_factory.mktemp("converted")
    text = open(TINY_CFG).read().replace("classes=80", "classes=2").replace("filters=255", "filters=21")
    text = text.replace("width=416", "width=96").replace("height=416", "height=96")
    cfg = folder / "tiny2.cfg"
    cfg.write_text(text)
    convs, _ = darknet.infer_layers(darknet.parse_cfg(cfg))
    weights = random_weights(convs, seed=1)
    for w in weights:  # larger head outputs, so random images give detections
        if w.bias is not None:
            w.kernel *= 20
    write_weights(folder / "tiny2.weights", weights)
    classes = folder / "classes.txt"
    classes.write_text("circle\nsquare\n")
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "convert.py"),
            str(cfg),
            str(folder / "tiny2.weights"),
            str(folder / "tiny2.weights.h5"),
            "--classes",
            str(classes),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


def run_cli(args, cwd):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.mark.slow
def test_a_converted_file_alone_detects_evaluates_and_exports(converted, tmp_path):
    from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset, make_synthetic_video

    weights = str(converted / "tiny2.weights.h5")
    meta = read_metadata(weights)
    assert meta == ModelMetadata("yolov3-tiny", (96, 96), TINY_ANCHORS, [[3, 4, 5], [1, 2, 3]], CLASSES)

    clip = make_synthetic_video(tmp_path / "clip.mp4", num_frames=4, frame_size=(96, 128), fps=5.0, seed=2)
    frames = tmp_path / "frames.jsonl"
    result = run_cli(
        [os.path.join(REPO, "yolo_video.py"), "--model", weights, "--input", str(clip), "--save-json", str(frames)],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in frames.read_text().splitlines()]
    assert len(lines) == 4
    labels = {d["class"] for line in lines for d in line["detections"]}
    assert labels and labels <= set(CLASSES)  # the file's class names, not COCO's

    data = make_synthetic_dataset(tmp_path / "data", num_train=0, num_val=3, image_size=96, classes=CLASSES)
    result = run_cli(
        [
            os.path.join(REPO, "evaluate.py"),
            "--weights",
            weights,
            "--annotations",
            data.val,
            "--pr-curve",
            "",
            "--no-progress",
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["num_images"] == 3 and set(report["per_class"]) == set(CLASSES)

    output = str(tmp_path / "tiny2_savedmodel")
    result = run_cli(
        ["-m", "keras_yolo_mgpu.export", "--weights", weights, "--format", "savedmodel", "--output", output],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.path.isdir(output) and read_metadata(output) == meta  # from the sidecar
    assert os.path.isfile(sidecar_path(output))


def test_a_flag_that_contradicts_the_file_stops_with_both_values(converted, tmp_path, capsys):
    from keras_yolo_mgpu.cli.detect import main

    coco = os.path.join(REPO, "model_data", "coco_classes.txt")
    weights = str(converted / "tiny2.weights.h5")
    from PIL import Image

    Image.new("RGB", (64, 48)).save(tmp_path / "a.jpg")  # the image check runs before the model's
    assert main(["--model", weights, "--classes", coco, "--image", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"--classes ({coco}) says 80 classes ['person', 'bicycle', 'car', ...]" in err
    assert "was saved with 2 classes ['circle', 'square']" in err
    assert main(["--model", weights, "--tiny", "--masks", "3,4,5 0,1,2", "--image", str(tmp_path)]) == 1
    assert "--masks says [[3, 4, 5], [0, 1, 2]]" in capsys.readouterr().err


def test_legacy_file_uses_flags_and_defaults(tmp_path):
    from keras_yolo_mgpu.model.yolo3 import build_body

    legacy = str(tmp_path / "legacy.weights.h5")
    build_body(np.array(TINY_ANCHORS, np.float32), 2).save_weights(legacy)
    classes = tmp_path / "c.txt"
    classes.write_text("circle\nsquare\n")
    settings = settings_for(legacy, classes_path=str(classes), tiny=True, masks=[[3, 4, 5], [0, 1, 2]])
    assert settings == make_metadata(TINY_ANCHORS, CLASSES, (416, 416), [[3, 4, 5], [0, 1, 2]])
    assert settings_for(legacy).kind == "yolov3" and settings_for(legacy).num_classes == 80  # keras-yolo3's defaults


def test_a_cut_or_foreign_weights_file_is_named_in_the_error(tmp_path):
    from keras_yolo_mgpu.model.yolo3 import tiny_yolo_body
    from keras_yolo_mgpu.weights.loading import load_weights

    body = tiny_yolo_body(keras.Input((None, None, 3)), 3, 2)
    body.save_weights(str(tmp_path / "whole.weights.h5"))
    (tmp_path / "cut.h5").write_bytes((tmp_path / "whole.weights.h5").read_bytes()[:5000])
    (tmp_path / "text.h5").write_text("not weights")
    for name, problem in (("cut.h5", "truncated file"), ("text.h5", "file signature not found")):
        path = str(tmp_path / name)
        with pytest.raises(OSError, match=rf"{path}: unreadable HDF5 weights file \(.*{problem}"):
            read_metadata(path)
        with pytest.raises((OSError, ValueError), match=rf"{path}: unreadable HDF5 weights file \(.*{problem}"):
            load_weights(body, path)
