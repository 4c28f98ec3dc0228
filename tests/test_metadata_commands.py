"""Commands given a weights file with metadata and no model flags: align diff, evaluate, train, the checker.

(detect and export on metadata-only files: test_export_runtime.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from dataset_writers import CLASSES, write_coco, write_voc, write_yolo

from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
from keras_yolo_mgpu.training.checkpoint import save_weights_atomic
from keras_yolo_mgpu.weights.metadata import make_metadata, read_metadata

TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train.py")

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


def test_coco_and_voc_train_evaluate_and_check_with_no_class_or_model_flags(tiny_files, tmp_path, capsys):
    """A COCO JSON trains and a VOC folder evaluates, each from the weights' metadata and the dataset's names."""
    from keras_yolo_mgpu.cli.check_dataset import main as check_main
    from keras_yolo_mgpu.cli.evaluate import main as evaluate_main

    paths = make_synthetic_dataset(tmp_path / "data", num_train=6, num_val=2, image_size=64, classes=CLASSES)
    coco = tmp_path / "data" / "images" / "train" / "instances.json"  # the images beside it
    write_coco(coco, read_annotations(paths.train))
    voc = tmp_path / "voc"
    write_voc(voc, read_annotations(paths.val))
    os.symlink(tmp_path / "data" / "images" / "val", voc / "JPEGImages")

    assert check_main(["--data", str(coco)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"{coco}: coco dataset, 2 classes: circle, square"

    run = tmp_path / "run"
    argv = ["--data", str(coco), "--weights", tiny_files[0], "--input-size", "64", "--batch-size", "2"]
    argv += ["--epochs", "1", "--steps-per-epoch", "1", "--val-split", "0.34", "--no-pictures"]
    argv += ["--log-dir", str(run), "--quiet"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, TRAIN, *argv], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "coco dataset, classes ['circle', 'square']" in result.stderr
    trained = read_metadata(str(run / "last.weights.h5"))
    assert (trained.kind, list(trained.class_names)) == ("yolov3-tiny", CLASSES)

    capsys.readouterr()
    assert evaluate_main(["--data", str(voc), "--weights", str(run / "last.weights.h5"), "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["num_images"] == 2 and list(report["per_class"]) == CLASSES


def test_evaluate_scores_the_test_split_and_refuses_one_the_dataset_lacks(tiny_files, tmp_path, capsys):
    from keras_yolo_mgpu.cli.evaluate import main

    paths = make_synthetic_dataset(tmp_path, num_train=3, num_val=2, image_size=64, classes=CLASSES)
    train, val = read_annotations(paths.train), read_annotations(paths.val)
    write_yolo(tmp_path, {"train": train, "val": val})
    argv = ["--data", str(tmp_path), "--weights", tiny_files[0], "--no-progress", "--split", "test"]
    assert main(argv) == 1
    assert f"{tmp_path} has no test split (it has train, val)" in capsys.readouterr().err
    write_yolo(tmp_path, {"train": train[:2], "val": val, "test": train[2:]})
    with open(tmp_path / "data.yaml", "a", encoding="utf-8") as handle:
        handle.write("test: test.txt\n")
    (tmp_path / "test.txt").write_text(train[2].image_path + "\n")
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["num_images"] == 1
