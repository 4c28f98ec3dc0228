"""Labels that were not found, and degenerate boxes: the same rules for every format `--data` reads.

A training split with no box left after the checks is refused, naming where
labels were looked for; more than half of the images without labels is a
warning; a degenerate box is dropped on its own, its image and other boxes
kept (keras-yolo3's rule). Tiny generated images (64x48), no model built.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

import numpy as np
import pytest
from dataset_writers import write_voc
from PIL import Image

from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.data.check import check_annotations, degenerate_box_reason
from keras_yolo_mgpu.data.dataset_source import open_dataset
from keras_yolo_mgpu.training.config import TrainConfig
from keras_yolo_mgpu.training.training_data import TrainingData

SIZE = (64, 48)  # width, height
GOOD = "0 0.5 0.5 0.25 0.5"  # 16 x 24 px


def _image(path, seed=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (SIZE[1], SIZE[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


def _yolo(folder, labels: dict[int, str], num_images=4, val: dict[int, str] | None = None):
    """A data.yaml dataset of `num_images` PNGs per split; `labels`: image index -> label file text."""
    for split, texts in (("train", labels), ("val", val)):
        if texts is None:
            continue
        for index in range(num_images):
            _image(folder / "images" / split / f"img_{index:03d}.png", seed=index)
            if index in texts:
                label = folder / "labels" / split / f"img_{index:03d}.txt"
                label.parent.mkdir(parents=True, exist_ok=True)
                label.write_text(texts[index])
    yaml = "path: .\ntrain: images/train\n" + ("val: images/val\n" if val is not None else "")
    (folder / "data.yaml").write_text(yaml + "names: [circle, square]\n")
    return folder / "data.yaml"


def _voc(folder, boxes_per_image: list[list[list[float]]]):
    """A VOC folder (Annotations/ + JPEGImages/), one image per entry of `boxes_per_image`."""
    records = []
    for index, boxes in enumerate(boxes_per_image):
        path = folder / "JPEGImages" / f"{index:06d}.png"
        _image(path, seed=index)
        records.append(Annotation(str(path), np.array(boxes, np.float32).reshape(-1, 5)))
    write_voc(folder, records)
    return folder


def _snapshot(folder):
    return {
        p: (os.stat(p).st_mtime_ns, hashlib.sha1(open(p, "rb").read()).hexdigest())
        for p in (os.path.join(d, f) for d, _, files in os.walk(folder) for f in files)
    }


def _training_data(tmp_path, data, **settings):
    config = TrainConfig(data=str(data), classes=None, log_dir=str(tmp_path / "run"), seed=0, **settings)
    return TrainingData(config)


# --- no boxes at all: refused, naming where labels were looked for -----------------------------------------


def test_yolo_without_any_label_is_refused_naming_the_images_to_labels_rule(tmp_path):
    data = _yolo(tmp_path / "ds", labels={})
    report = open_dataset(str(data)).checked("train", 2)
    example = tmp_path / "ds" / "labels" / "train" / "img_000.txt"
    assert report.no_boxes_message() == (
        f"{data}: no labels found for any of the 4 training images; labels are looked for at each image's path "
        f"with its last images/ folder -> labels/ and the extension .txt, e.g. {example}"
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(ValueError, match=r"no labels found for any of the 4 training images; .*images/ folder -> "):
        _training_data(tmp_path, data).splits(str(run_dir))
    assert os.listdir(run_dir) == []  # refused before any listing is written


def test_yolo_whose_only_label_is_malformed_is_refused_with_the_counts(tmp_path):
    # The case: one label file among the images, and that one malformed.
    data = _yolo(tmp_path / "ds", labels={2: "0 0.5 0.5 0.2\n"})
    with pytest.raises(ValueError) as refused:
        _training_data(tmp_path, data).splits(str(tmp_path))
    message = str(refused.value)
    assert message.startswith(f"{data}: no box left in the 4 training images read (3 without labels; 1 with problems")
    assert "img_002.txt:1: 4 fields, expected 5" in message
    assert f"e.g. {tmp_path / 'ds' / 'labels' / 'train' / 'img_000.txt'}" in message
    assert f"python -m keras_yolo_mgpu.check_dataset --data {data}" in message


def test_voc_coco_and_keras_yolo3_without_boxes_say_what_was_read(tmp_path):
    voc = _voc(tmp_path / "voc", [[], []])
    message = open_dataset(str(voc), class_names=["circle"]).checked("train", 1).no_boxes_message()
    xml_dir = voc / "Annotations"
    assert message == (
        f"{xml_dir}: no labels found for any of the 2 training images; labels are looked for as the <object> "
        f"elements of each image's XML file in {xml_dir}, e.g. {xml_dir / '000000.xml'}"
    )

    (tmp_path / "coco").mkdir()
    _image(tmp_path / "coco" / "a.png")
    instances = {
        "images": [{"id": 1, "file_name": "a.png"}],
        "annotations": [{"id": 1, "image_id": 7, "category_id": 1, "bbox": [1, 1, 5, 5]}],
        "categories": [{"id": 1, "name": "circle"}],
    }
    (tmp_path / "coco" / "train.json").write_text(json.dumps(instances))
    message = open_dataset(str(tmp_path / "coco" / "train.json")).checked("train", 1).no_boxes_message()
    assert message.endswith(
        f"labels are looked for in the 1 annotations of {tmp_path / 'coco' / 'train.json'}, by image_id, "
        "e.g. for image 1 (a.png)"
    )

    _image(tmp_path / "k" / "a.png")
    (tmp_path / "k" / "train.txt").write_text("a.png\na.png 5,5,5,20,0\n")
    report = check_annotations(str(tmp_path / "k" / "train.txt"), 1)
    assert report.no_boxes_message().startswith(f"{tmp_path / 'k' / 'train.txt'}: no box left in the 2 training")
    assert f"on each line of {tmp_path / 'k' / 'train.txt'} after the image path" in report.no_boxes_message()


def test_validation_without_boxes_is_refused_only_when_the_run_monitors_map(tmp_path, caplog):
    data = _yolo(tmp_path / "ds", labels={0: GOOD}, num_images=2, val={})
    with pytest.raises(ValueError, match=r"no labels found for any of the 2 validation images"):
        _training_data(tmp_path, data, monitor="val_mAP", eval_every=1).splits(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="keras_yolo_mgpu.training.training_data"):
        train, val = _training_data(tmp_path, data).splits(str(tmp_path))  # val_loss: a warning only
    assert (len(train), len(val)) == (2, 2)
    assert any("validation images" in r.getMessage() and "backgrounds only" in r.getMessage() for r in caplog.records)


# --- most images without labels: a warning, in training and in the checker ----------------------------------


def test_most_yolo_images_without_labels_warn_at_the_start_and_in_the_checker(tmp_path, caplog, capsys):
    from keras_yolo_mgpu.cli.check_dataset import main as check_main

    # 3 of 4 images without a label file; an empty label file is a background on purpose and does not count.
    data = _yolo(tmp_path / "ds", labels={0: GOOD})
    with caplog.at_level(logging.WARNING, logger="keras_yolo_mgpu.training.training_data"):
        train, _ = _training_data(tmp_path, data, val_split=0.0).splits(str(tmp_path))
    assert len(train) == 4
    warning = f"{data}: 3 of the 4 training images have no labels; labels are looked for at each image's path"
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith(warning)]
    assert f"e.g. {tmp_path / 'ds' / 'labels' / 'train' / 'img_001.txt'}" in caplog.text

    assert check_main(["--data", str(data)]) == 0  # a warning, not a problem
    assert f"warning: {warning}" in capsys.readouterr().out

    for index in (1, 2):
        (tmp_path / "ds" / "labels" / "train" / f"img_{index:03d}.txt").write_text("")  # backgrounds on purpose
    assert open_dataset(str(data)).checked("train", 2).unlabelled_warning() is None


def test_most_voc_files_without_objects_warn(tmp_path):
    voc = _voc(tmp_path / "voc", [[[4, 4, 30, 30, 0]], [], []])
    report = open_dataset(str(voc), class_names=["circle"]).checked("train", 1)
    assert report.no_boxes_message() is None
    assert report.unlabelled_warning().startswith(f"{voc / 'Annotations'}: 2 of the 3 training images have no labels")


# --- a degenerate box: dropped on its own, named with its file and box index ---------------------------------


def test_voc_zero_size_box_is_dropped_alone_and_the_image_trains_with_its_good_boxes(tmp_path, caplog):
    # The second case: x_max == x_min among good boxes of one XML file.
    good = [[2, 2, 20, 20, 0], [30, 4, 60, 40, 0], [10, 25, 25, 45, 0]]
    voc = _voc(tmp_path / "voc", [[good[0], [12, 5, 12, 30, 0], *good[1:]], [good[1]]])
    with caplog.at_level(logging.WARNING, logger="keras_yolo_mgpu.training.training_data"):
        train, _ = _training_data(tmp_path, voc, val_split=0.0).splits(str(tmp_path))
    assert len(train) == 2
    np.testing.assert_array_equal(train[0].boxes, good)
    xml = voc / "Annotations" / "000000.xml"
    dropped = (
        f"{xml}: box 2 (12,5,12,30,0): zero width (x_max == x_min); the box is dropped, the image and its other "
        "boxes kept"
    )
    assert (tmp_path / "skipped_lines_train.txt").read_text().splitlines()[0] == dropped
    assert dropped in caplog.text
    with pytest.raises(ValueError, match=r"1 problem\(s\), --strict refuses to start"):
        _training_data(tmp_path, voc, val_split=0.0, strict=True).splits(str(tmp_path))


def test_yolo_box_under_1px_once_clipped_is_dropped_on_its_line(tmp_path):
    # Line 3 (box 2): 0.64 px wide, 0.384 px of it inside the image; lines 1 and 4 good.
    text = f"{GOOD}\n\n1 0.999 0.5 0.01 0.5\n1 0.25 0.5 0.25 0.5\n"
    data = _yolo(tmp_path / "ds", labels={0: text}, num_images=1)
    report = open_dataset(str(data)).checked("train", 2)
    assert [(p.line_number, p.kind) for p in report.problems] == [(3, "degenerate-box")]
    assert (
        "img_000.txt:3: box 2 (1 0.999 0.5 0.01 0.5): under 1 px once clipped to the 64x48 image (0.384 x 24 px)"
        in (str(report.problems[0]))
    )
    assert len(report.annotations) == 1 and len(report.annotations[0].boxes) == 2


@pytest.mark.parametrize(
    "box, size, reason",
    [
        ((5, 5, 5, 9), None, "zero width (x_max == x_min)"),
        ((5, 9, 8, 5), None, "negative height (y_max < y_min)"),
        ((5, 5, 5.5, 9), (64, 48), "under 1 px once clipped to the 64x48 image (0.5 x 4 px)"),
        ((70, 5, 80, 9), (64, 48), "nothing left once clipped to the 64x48 image"),
        ((-3, 5, 0.5, 9), None, "under 1 px once clipped at 0 (0.5 x 4 px)"),
        ((5, 5, 6, 6), (64, 48), None),  # exactly 1 px: kept
    ],
)
def test_degenerate_box_reason(box, size, reason):
    assert degenerate_box_reason(box, size) == reason


# --- a refused train.py run: no folder left, no file modified ------------------------------------------------


def test_refused_train_run_leaves_no_folder_and_modifies_no_file(tmp_path, monkeypatch, capsys):
    from keras_yolo_mgpu.cli.train import main as train_main
    from keras_yolo_mgpu.training.run_setup import RunSetup

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built for a dataset without boxes")

    monkeypatch.setattr(RunSetup, "build_models", no_model, raising=False)
    data = _yolo(tmp_path / "ds", labels={})
    before = _snapshot(tmp_path)
    log_dir = tmp_path / "run"
    args = ["--data", str(data), "--tiny", "--input-size", "64", "--batch-size", "2", "--log-dir", str(log_dir)]
    assert train_main([*args, "--quiet"]) == 1
    assert "no labels found for any of the 4 training images; labels are looked for at" in capsys.readouterr().err
    assert not log_dir.exists()
    assert _snapshot(tmp_path) == before
