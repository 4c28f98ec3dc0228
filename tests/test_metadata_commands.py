"""Commands given a weights file with metadata and no model flags: align diff, evaluate --data."""

from __future__ import annotations

import json

import numpy as np
import pytest
from dataset_writers import CLASSES, write_yolo

from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
from keras_yolo_mgpu.training.checkpoint import save_weights_atomic
from keras_yolo_mgpu.weights.metadata import make_metadata

TINY_ANCHORS = np.array([(10, 14), (23, 27), (37, 58), (81, 82), (135, 169), (344, 319)], np.float32)


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """Two tiny YOLOv3 files for 2 classes at 64x64, equal but for one bias (+0.25)."""
    from keras_yolo_mgpu.model.yolo3 import build_body

    folder = tmp_path_factory.mktemp("tiny")
    body = build_body(TINY_ANCHORS, len(CLASSES), model="yolov3-tiny")
    metadata = make_metadata(TINY_ANCHORS, CLASSES, (64, 64), [[3, 4, 5], [1, 2, 3]], kind="yolov3-tiny")
    first, second = str(folder / "a.weights.h5"), str(folder / "b.weights.h5")
    save_weights_atomic(body, first, metadata)
    layer = body.get_layer("yolo_output_0")
    kernel, bias = layer.get_weights()
    layer.set_weights([kernel, bias + 0.25])
    save_weights_atomic(body, second, metadata)
    return first, second


def test_align_diff_builds_the_network_the_files_name(tiny_files, capsys):
    from keras_yolo_mgpu.cli.align import main

    assert main(["diff", *tiny_files, "--threshold", "0.3"]) == 0, capsys.readouterr().err[-2000:]
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["max_abs_diff"] == pytest.approx(0.25)
    assert summary["worst_tensor"].startswith("yolo_output_0")
    assert summary["tensors_over_threshold"] == 0


def test_evaluate_data_takes_classes_and_network_from_the_weights(tiny_files, tmp_path, capsys):
    from keras_yolo_mgpu.cli.evaluate import main

    paths = make_synthetic_dataset(tmp_path, num_train=2, num_val=3, image_size=64, classes=CLASSES)
    write_yolo(tmp_path, {"train": read_annotations(paths.train), "val": read_annotations(paths.val)})
    (tmp_path / "images" / "val" / "zz_broken.png").write_bytes(b"not an image")  # a background nobody reads
    assert main(["--data", str(tmp_path), "--weights", tiny_files[0], "--no-progress"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out.strip().splitlines()[-1])
    assert (report["num_listed"], report["num_images"]) == (4, 3)  # the val split; the broken image skipped
    assert report["unreadable_images"] == [str(tmp_path / "images" / "val" / "zz_broken.png")]
    assert "scored 3 of 4 images listed (1 unreadable, skipped:" in out
    assert list(report["per_class"]) == CLASSES
