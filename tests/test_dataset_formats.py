"""`--data`: YOLO-format, COCO and VOC datasets read as keras-yolo3's format, and their bad labels."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil

import numpy as np
import pytest
from dataset_writers import CLASSES, write_coco, write_voc, write_yolo
from PIL import Image, ImageOps

from keras_yolo_mgpu.cli.check_dataset import main as check_main
from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.dataset_source import detect_kind, open_dataset, resolve_class_names
from keras_yolo_mgpu.data.images import image_size
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
from keras_yolo_mgpu.resources import get_anchors, model_data_path


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A tiny keras-yolo3 dataset (64x48 and 48x64 images) whose boxes every other format repeats."""
    out = tmp_path_factory.mktemp("formats")
    paths = make_synthetic_dataset(out, num_train=6, num_val=3, image_size=[(48, 64), (64, 48)], classes=CLASSES)
    return out, read_annotations(paths.train), read_annotations(paths.val)


def _targets(records):
    from keras_yolo3_targets import dense_inputs

    from keras_yolo_mgpu.data.tf_dataset import make_dataset

    anchors = get_anchors(model_data_path("tiny_yolo_anchors.txt"))
    dataset = make_dataset(records, (64, 64), anchors, len(CLASSES), 3, training=False)
    batches = [[*dense_inputs(x, anchors, len(CLASSES)).values(), w] for x, _, w in dataset.as_numpy_iterator()]
    return [np.concatenate(parts) for parts in zip(*batches)]  # images, targets per scale, weights


def test_every_format_gives_keras_yolo3s_records_and_targets(reference, tmp_path):
    out, train, val = reference
    write_yolo(out, {"train": train, "val": val})
    write_coco(out / "images" / "train" / "instances.json", train)
    voc = tmp_path / "voc"
    write_voc(voc, train)
    os.symlink(out / "images" / "train", voc / "JPEGImages")

    yolo = open_dataset(str(out / "data.yaml"))
    coco = open_dataset(str(out / "images" / "train" / "instances.json"))
    voc_dataset = open_dataset(str(voc))
    assert (detect_kind(str(out)), coco.kind, voc_dataset.kind) == ("yolo", "coco", "voc")
    assert yolo.class_names == coco.class_names == voc_dataset.class_names == CLASSES
    for dataset in (yolo, coco, voc_dataset):
        records = dataset.checked("train", len(CLASSES)).annotations
        assert [os.path.realpath(r.image_path) for r in records] == [r.image_path for r in train]
        for got, want in zip(records, train):
            np.testing.assert_array_equal(got.boxes, want.boxes)  # float32, exactly
    np.testing.assert_array_equal(yolo.checked("val", 2).annotations[1].boxes, val[1].boxes)
    reference_targets = _targets(train)
    assert len(reference_targets) >= 3 and sum(t.sum() for t in reference_targets[1:-1]) > 0
    for dataset in (yolo, coco, voc_dataset):
        for got, want in zip(_targets(dataset.checked("train", 2).annotations), reference_targets):
            np.testing.assert_array_equal(got, want)


def _snapshot(folder):
    return {
        p: hashlib.sha1(open(p, "rb").read()).hexdigest()
        for p in (os.path.join(d, f) for d, _, files in os.walk(folder) for f in files)
    }


def test_bad_yolo_labels_are_reported_with_file_and_line(reference, tmp_path):
    out, train, _ = reference
    folder = tmp_path / "yolo"
    (folder / "images").mkdir(parents=True)
    for record in train[:5]:
        os.symlink(record.image_path, folder / "images" / os.path.basename(record.image_path))
    labels = folder / "labels"
    labels.mkdir()
    bad = {
        "00000.txt": "0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.2\n",  # line 2: four fields
        "00001.txt": "1 0.5 1.5 0.2 0.2\n",  # outside [0, 1]
        "00002.txt": "\n2 0.5 0.5 0.2 0.2\n",  # line 2: class 2 past the two names
        "00003.txt": "0 0.5 0.5 0 0.2\n1 0.25 0.5 0.5 0.5\n",  # zero width: that box alone dropped
        "00004.txt": "1 0.25 0.5 0.5 0.5\n",  # good
        "99999.txt": "0 0.5 0.5 0.1 0.1\n",  # no image
    }
    for name, text in bad.items():
        (labels / name).write_text(text)
    (folder / "classes.txt").write_text("circle\nsquare\n")
    before = _snapshot(folder)
    dataset = open_dataset(str(folder))
    report = dataset.checked("train", 2)
    found = [(os.path.basename(p.source), p.line_number, p.kind) for p in report.problems]
    assert found == [
        ("00000.txt", 2, "malformed"),
        ("00001.txt", 1, "box-outside-image"),
        ("00002.txt", 2, "class-out-of-range"),
        ("00003.txt", 1, "degenerate-box"),
        ("99999.txt", 0, "label-without-image"),
    ]
    assert str(report.problems[0]).startswith(f"{labels / '00000.txt'}:2: 4 fields, expected 5")
    assert str(report.problems[3]) == (
        f"{labels / '00003.txt'}:1: box 1 (0 0.5 0.5 0 0.2): zero width (x_max == x_min); the box is dropped, "
        f"the image and its other boxes kept (image {folder / 'images' / '00003.png'})"
    )
    assert [os.path.basename(a.image_path) for a in report.annotations] == ["00003.png", "00004.png"]
    for record, original in zip(report.annotations, train[3:5]):
        width, height = image_size(original.image_path)
        np.testing.assert_array_equal(record.boxes, [[0, height * 0.25, width * 0.5, height * 0.75, 1]])
    assert _snapshot(folder) == before  # nothing modified


def test_bad_coco_entries_name_their_place(reference, tmp_path):
    _, train, _ = reference
    folder = tmp_path / "coco"
    folder.mkdir()
    (folder / "images").mkdir()
    for record in train[:2]:
        os.symlink(record.image_path, folder / "images" / os.path.basename(record.image_path))
    instances = {
        "images": [{"id": 1, "file_name": "00000.png"}, {"id": 2, "file_name": "00001.png"}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5]},
            {"id": 2, "image_id": 2, "category_id": 7, "bbox": [1, 1, 5, 5]},
            {"id": 3, "image_id": 9, "category_id": 1, "bbox": [1, 1, 5, 5]},
        ],
        "categories": [{"id": 1, "name": "circle"}],
    }
    (folder / "train.json").write_text(json.dumps(instances))
    report = open_dataset(str(folder / "train.json")).checked("train", 1)
    assert [str(p).replace(str(folder), "") for p in report.problems] == [
        "/train.json: annotation 3: no image 9",
        "/train.json[image 1]: annotation 1: bbox [1, 1, 5] is not [x, y, width, height]",
        "/train.json[image 2]: annotation 2: category_id 7 is not in the categories",
    ]
    assert report.annotations == []


def test_class_names_from_the_dataset_or_the_file_and_a_contradiction_names_both(reference, tmp_path):
    out, train, val = reference
    write_yolo(out, {"train": train, "val": val})
    dataset = open_dataset(str(out))
    assert resolve_class_names(dataset, None) == CLASSES
    other = tmp_path / "other.txt"
    other.write_text("dog\ncat\n")
    with pytest.raises(ValueError, match=r"--classes .*other.txt lists \['dog', 'cat'\] but the dataset .* names"):
        resolve_class_names(dataset, str(other))
    voc = tmp_path / "voc"
    write_voc(voc, train[:2])
    report = open_dataset(str(voc), class_names=["circle"]).checked("train", 1)
    assert {p.kind for p in report.problems} <= {"class-out-of-range", "missing-file"}
    assert any("object class square not in the names ['circle']" in str(p) for p in report.problems)


def test_checker_and_kmeans_commands_take_data(reference, tmp_path, capsys):
    from keras_yolo_mgpu.cli.kmeans import main as kmeans_main

    out, train, val = reference
    write_yolo(out, {"train": train, "val": val})
    assert check_main(["--data", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"{out}: yolo dataset, 2 classes: circle, square"
    assert printed[-1].startswith(f"val: {out / 'data.yaml'}: 3 images listed, 3 usable")
    label = out / "labels" / "train" / "00001.txt"
    original = label.read_text()
    label.write_text(original + "5 0.5 0.5 0.1 0.1\n")
    try:
        assert check_main(["--data", str(out)]) == 1
        assert f"{label}:{len(original.splitlines()) + 1}: class id 5 not in [0, 2)" in capsys.readouterr().out
    finally:
        label.write_text(original)
    assert kmeans_main(["--data", str(out), "--clusters", "2"]) == 0
    boxes = sum(len(r.boxes) for r in train)
    assert capsys.readouterr().out.startswith(f"{boxes} boxes, 2 clusters")


# PIL's rule for showing stored pixels (`ImageOps.exif_transpose`), inverted: how to store an upright picture so
# that a viewer shows it upright under each EXIF orientation (the rotations are each other's inverse).
STORED_FOR_ORIENTATION = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def _bright_box(pixels: np.ndarray) -> list[int]:
    """x_min, y_min, x_max, y_max around the pixels brighter than mid-grey (the drawn object)."""
    rows, columns = np.nonzero(pixels[..., 0] > 128)
    return [int(columns.min()), int(rows.min()), int(columns.max()) + 1, int(rows.max()) + 1]


def test_exif_rotated_photos_are_read_upright_with_their_labels_from_either_grid(tmp_path, caplog, capsys):
    """A phone photo is stored sideways with an EXIF orientation. Every command reads it upright, as ultralytics
    does. YOLO-format labels are drawn on that view and taken as they are; keras-yolo3's annotation files hold
    boxes on the stored pixels (keras-yolo3 read images as stored) and are turned with the image. For every
    orientation both give the box around the object in the pixels training reads."""
    from keras_yolo_mgpu.cli.dataset_args import checked_records
    from keras_yolo_mgpu.data.check import check_records
    from keras_yolo_mgpu.data.formats.records import SplitRecords
    from keras_yolo_mgpu.data.images import decode_image

    upright = np.zeros((48, 64, 3), np.uint8)  # as displayed: 64 wide, 48 high
    upright[8:20, 40:58] = 255  # the object: x 40-58, y 8-20
    label = f"0 {49 / 64!r} {14 / 48!r} {18 / 64!r} {12 / 48!r}\n"
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    keras_yolo3_lines = []
    for orientation, transpose in STORED_FOR_ORIENTATION.items():
        stored = Image.fromarray(upright)
        stored = stored if transpose is None else stored.transpose(transpose)
        exif = Image.Exif()
        exif[0x0112] = orientation
        path = tmp_path / "images" / f"o{orientation}.jpg"
        stored.save(path, quality=100, exif=exif.tobytes())
        with Image.open(path) as shown:  # the file is what a viewer shows upright
            assert np.abs(np.asarray(ImageOps.exif_transpose(shown)).astype(int) - upright).max() < 40
            box_as_stored = _bright_box(np.asarray(shown))
        (tmp_path / "labels" / f"o{orientation}.txt").write_text(label)
        keras_yolo3_lines.append(f"{path} {','.join(map(str, box_as_stored))},0")
    (tmp_path / "classes.txt").write_text("object\n")
    (tmp_path / "train.txt").write_text("\n".join(keras_yolo3_lines) + "\n")

    with caplog.at_level(logging.INFO, logger="keras_yolo_mgpu"):
        yolo = open_dataset(str(tmp_path)).checked("train", 1).annotations
        assert "were labelled on their stored pixels" not in caplog.text  # YOLO labels are taken as they are
        keras_yolo3 = open_dataset(str(tmp_path / "train.txt")).checked("train", 1).annotations
    assert "7 image(s) carry an EXIF orientation and were labelled on their stored pixels" in caplog.text
    assert f"first {tmp_path / 'images' / 'o2.jpg'}: mirrored" in caplog.text
    # The raw reader (evaluate.py --annotations, kmeans.py, the API) turns them too, and the check does not again;
    # so does evaluate.py --data, whose check reads no image header.
    raw = read_annotations(str(tmp_path / "train.txt"))
    rechecked = check_records(SplitRecords(raw, source="raw"), 1).annotations
    twice = check_records(SplitRecords(keras_yolo3, source="checked"), 1).annotations  # a check's output, again
    assert [a.boxes.tolist() for a in twice] == [a.boxes.tolist() for a in keras_yolo3]
    unscanned = checked_records(open_dataset(str(tmp_path / "train.txt")), "train", 1, check_images=False)
    assert len(yolo) == len(keras_yolo3) == len(raw) == len(rechecked) == len(unscanned) == 8
    for from_yolo, from_keras_yolo3, from_raw, again, without_scan in zip(yolo, keras_yolo3, raw, rechecked, unscanned):
        np.testing.assert_array_equal(without_scan.boxes, from_keras_yolo3.boxes)
        pixels, _, size = decode_image(from_yolo.image_path)  # what training decodes
        assert size == (64, 48) == from_yolo.size
        np.testing.assert_allclose(from_yolo.boxes[0, :4], _bright_box(pixels), atol=1, err_msg=from_yolo.image_path)
        np.testing.assert_allclose(from_keras_yolo3.boxes[0, :4], _bright_box(pixels), atol=1)
        np.testing.assert_array_equal(from_raw.boxes, from_keras_yolo3.boxes)
        np.testing.assert_array_equal(again.boxes, from_keras_yolo3.boxes)
        assert from_yolo.boxes[0, 4] == from_keras_yolo3.boxes[0, 4] == 0
    assert check_main(["--data", str(tmp_path)]) == 0  # the checker reads the same boxes: none outside the image
    assert "8 usable" in capsys.readouterr().out


def test_an_image_resized_after_labelling_is_named_and_left_out_and_a_stored_size_turns_the_boxes(
    reference, tmp_path, caplog
):
    """COCO and VOC record each image's size. An image that no longer has it (resized after labelling) would get
    boxes in another image's pixels: the check names it and leaves it out. A photo stored sideways is read upright;
    labelled as displayed, its boxes stay; labelled as stored (the recorded size says which), they turn with it."""
    from keras_yolo_mgpu.data.images import read_image

    _, train, _ = reference
    images = tmp_path / "images"
    images.mkdir()
    for record in train[:3]:
        (images / os.path.basename(record.image_path)).write_bytes(open(record.image_path, "rb").read())
    write_coco(images / "instances.json", train[:3])
    write_voc(tmp_path / "voc", train[:3])
    os.symlink(images, tmp_path / "voc" / "JPEGImages")
    resized = images / os.path.basename(train[1].image_path)
    with Image.open(resized) as image:
        image.resize((image.width * 2, image.height * 2)).save(resized)
    for path in (str(images / "instances.json"), str(tmp_path / "voc")):
        report = open_dataset(path).checked("train", len(CLASSES))
        assert [p.kind for p in report.problems] == ["size-mismatch"], path
        width, height = image_size(train[1].image_path)
        message = str(report.problems[0])
        assert (
            f"as {width}x{height} pixels, and " in message and f"{resized.name} is {2 * width}x{2 * height}" in message
        )
        assert [os.path.basename(a.image_path) for a in report.annotations] == [
            os.path.basename(r.image_path) for r in (train[0], train[2])
        ]

    # A portrait photo: an object at x 8-20, y 30-50 of the displayed 48x64 image, stored sideways (64x48) with
    # orientation 6. One JSON labels it as displayed (48x64); another as stored (64x48, the box turned back).
    upright = np.zeros((64, 48, 3), np.uint8)
    upright[30:50, 8:20] = 255
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90).save(images / "portrait.jpg", exif=exif.tobytes())
    as_stored = _bright_box(np.asarray(Image.open(images / "portrait.jpg")))
    stored_bbox = [as_stored[0], as_stored[1], as_stored[2] - as_stored[0], as_stored[3] - as_stored[1]]
    for name, (width, height), bbox in (("displayed", (48, 64), [8, 30, 12, 20]), ("stored", (64, 48), stored_bbox)):
        instances = {
            "images": [{"id": 1, "file_name": "portrait.jpg", "width": width, "height": height}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": bbox, "iscrowd": 0}],
            "categories": [{"id": 1, "name": "circle"}],
        }
        (images / f"{name}.json").write_text(json.dumps(instances))
        for from_record in (False, True):
            with caplog.at_level(logging.INFO, logger="keras_yolo_mgpu"):
                dataset = open_dataset(str(images / f"{name}.json"), record_dir=str(tmp_path / "cache"))
                report = dataset.checked("train", 1)
            assert report.problems == [] and len(report.annotations) == 1
            found = _bright_box(read_image(str(images / "portrait.jpg")))
            np.testing.assert_allclose(report.annotations[0].boxes[0, :4], found, atol=1, err_msg=name)
            turned = "1 image(s) carry an EXIF orientation and were labelled on their stored pixels" in caplog.text
            assert turned == (name == "stored")
            assert ("read from its record" in caplog.text) == from_record
            caplog.clear()


def test_a_test_split_is_read_checked_kept_out_of_training_and_its_overlap_named(reference, tmp_path, caplog, capsys):
    """data.yaml's `test` (Roboflow exports have test/): checked with the others, never trained on, and an image
    it shares with training named, since it would inflate the test score."""
    from keras_yolo_mgpu.training.config import TrainConfig
    from keras_yolo_mgpu.training.training_data import TrainingData

    _, train, val = reference
    splits = {"train": train[:4], "val": val[:2], "test": [train[4], val[2]]}
    write_yolo(tmp_path, splits)
    with open(tmp_path / "data.yaml", "a", encoding="utf-8") as handle:
        handle.write("test: images/test\n")
    for split, records in splits.items():
        (tmp_path / "images" / split).mkdir(parents=True)
        for record in records:
            shutil.copy(record.image_path, tmp_path / "images" / split)
    # The third test image is a copy of a training image under another name.
    shutil.copy(train[0].image_path, tmp_path / "images" / "test" / "copy_of_train0.png")
    shutil.copy(tmp_path / "labels" / "train" / "00000.txt", tmp_path / "labels" / "test" / "copy_of_train0.txt")

    dataset = open_dataset(str(tmp_path))
    assert list(dataset.splits) == ["train", "val", "test"]
    assert len(dataset.checked("test", len(CLASSES)).annotations) == 3

    config = TrainConfig(data=str(tmp_path), classes=None, log_dir=str(tmp_path / "run"), seed=0)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with caplog.at_level(logging.INFO, logger="keras_yolo_mgpu"):
        trained, validated = TrainingData(config).splits(str(run_dir))
    assert len(trained) == 4 and len(validated) == 2  # the test images in neither
    assert "its test split (3 images) is kept out of the run" in caplog.text
    assert "image(s) of training have the same bytes as one of test" in caplog.text
    assert "test scores (evaluate.py --split test) count images the model trains on" in caplog.text
    assert "validation scores" not in caplog.text  # training and validation share nothing

    assert check_main(["--data", str(tmp_path)]) == 1
    printed = capsys.readouterr().out
    assert (
        "\ntest: " in printed
        and f"image(s) of {tmp_path} (train) have the same bytes as one of {tmp_path} (test)" in printed
    )


def test_a_test_split_the_folder_lacks_is_left_out_and_a_missing_val_split_refused(reference, tmp_path, caplog):
    """Roboflow's data.yaml names `../test/images` whether or not the export has it (as ultralytics, a missing test
    split matters only to a command that asks for it); a missing val split stops the run."""
    _, train, val = reference
    splits = {"train": train[:2], "val": val[:1]}
    write_yolo(tmp_path, splits)
    for split, records in splits.items():
        (tmp_path / "images" / split).mkdir(parents=True)
        for record in records:
            shutil.copy(record.image_path, tmp_path / "images" / split)
    yaml_path = tmp_path / "data.yaml"
    yaml_path.write_text(yaml_path.read_text(encoding="utf-8") + "test: ../test/images\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="keras_yolo_mgpu"):
        assert list(open_dataset(str(tmp_path)).splits) == ["train", "val"]
    assert "test: ../test/images not found" in caplog.text and "read without a test split" in caplog.text

    yaml_path.write_text(yaml_path.read_text(encoding="utf-8").replace("val: images/val", "val: ../valid/images"))
    with pytest.raises(FileNotFoundError, match="val: ../valid/images not found"):
        open_dataset(str(tmp_path))


def test_segmentation_polygons_train_as_the_boxes_around_them(tmp_path):
    """ultralytics' detection training reads a YOLO segmentation label (`class x1 y1 x2 y2 ...`) as the box around its
    points (`segments2boxes`: min and max of x and y); a line of 6 fields is neither form."""
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    Image.new("RGB", (200, 100)).save(tmp_path / "images" / "a.png")
    triangle = [0.1, 0.2, 0.4, 0.9, 0.25, 0.5]
    lines = [
        "1 " + " ".join(map(str, triangle)),
        "0 0.5 0.5 0.2 0.2",  # a box line beside the polygons
        "0 0.6 0.1 0.9 0.1 0.9 0.3 0.6 0.3",  # a rectangle as four points
        "0 0.1 0.2 0.3 0.4 0.5",  # 6 fields
        "0 0.1 0.2 0.3 0.4 0.5 1.7",  # a point outside the image
    ]
    (tmp_path / "labels" / "a.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "classes.txt").write_text("a\nb\n")
    split = open_dataset(str(tmp_path)).splits["train"]
    assert [(p.line_number, p.kind) for p in split.problems] == [(4, "malformed"), (5, "box-outside-image")]
    assert "6 fields, expected 5: class cx cy w h (normalised), or a polygon" in split.problems[0].message
    (tmp_path / "labels" / "a.txt").write_text("\n".join(lines[:3]) + "\n")
    record = open_dataset(str(tmp_path)).checked("train", 2).annotations[0]
    xs, ys = np.array(triangle[0::2]) * 200, np.array(triangle[1::2]) * 100
    expected = [[xs.min(), ys.min(), xs.max(), ys.max(), 1], [80, 40, 120, 60, 0], [120, 10, 180, 30, 0]]
    np.testing.assert_allclose(record.boxes, expected, atol=1e-3)


def test_a_box_that_sums_past_the_edge_by_the_labels_rounding_is_on_the_edge(tmp_path):
    """A Roboflow export of a kangaroo photo (1023x576): `cx + w / 2` = 1.0000005, rounding of the six decimals;
    a box that really crosses the edge is still reported."""
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    Image.new("RGB", (1023, 576)).save(tmp_path / "images" / "00155.png")
    (tmp_path / "classes.txt").write_text("kangaroo\n")
    on_the_edge = "0 0.941838 0.571181 0.116325 0.555556"
    (tmp_path / "labels" / "00155.txt").write_text(on_the_edge + "\n")
    report = open_dataset(str(tmp_path)).checked("train", 1)
    assert report.problems == []
    assert check_main(["--data", str(tmp_path), "--scan-cache", "none"]) == 0  # the command: no problem either
    [box] = report.annotations[0].boxes.tolist()
    assert box[2] == 1023 and box[0] == pytest.approx((0.941838 - 0.116325 / 2) * 1023, abs=1e-3)
    (tmp_path / "labels" / "00155.txt").write_text(on_the_edge + "\n0 0.95 0.5 0.2 0.2\n")  # x2 = 1.05
    report = open_dataset(str(tmp_path)).checked("train", 1)
    assert [(p.kind, "box 2" in p.message) for p in report.problems] == [("box-outside-image", True)]
    assert check_main(["--data", str(tmp_path), "--scan-cache", "none"]) == 1


def test_a_data_yaml_copied_from_another_machine_reads_its_own_folder(reference, tmp_path, caplog):
    """`path: /content/datasets/x` (a Colab run's) names no folder here: the splits are read beside the YAML."""
    _, train, val = reference
    write_yolo(tmp_path, {"train": train[:2], "val": val[:1]})
    for split, records in (("train", train[:2]), ("val", val[:1])):
        (tmp_path / "images" / split).mkdir(parents=True)
        for record in records:
            shutil.copy(record.image_path, tmp_path / "images" / split)
    yaml_text = (tmp_path / "data.yaml").read_text().replace("path: .", "path: /content/datasets/elsewhere")
    (tmp_path / "data.yaml").write_text(yaml_text)
    with caplog.at_level(logging.WARNING, logger="keras_yolo_mgpu"):
        dataset = open_dataset(str(tmp_path / "data.yaml"))
    assert [len(dataset.splits[s].records) for s in ("train", "val")] == [2, 1]
    assert "path /content/datasets/elsewhere is no folder here: reading the splits from the YAML's own folder" in (
        caplog.text
    )


def test_roboflows_placeholder_category_is_no_class(reference, tmp_path, caplog):
    """Roboflow's COCO export: category 0 is the dataset's name, supercategory of every class, and no annotation
    uses it. It is left out: the classes are the labelled ones, numbered from 0, in train/ and valid/ alike."""
    _, train, val = reference
    for split, records in (("train", train[:3]), ("valid", val[:2])):
        folder = tmp_path / split
        folder.mkdir()
        for record in records:
            shutil.copy(record.image_path, folder)
        write_coco(folder / "_annotations.coco.json", records)
        instances = json.loads((folder / "_annotations.coco.json").read_text())
        for category in instances["categories"]:
            category["supercategory"] = "shapes"
        instances["categories"].insert(0, {"id": 0, "name": "shapes", "supercategory": "none"})
        (folder / "_annotations.coco.json").write_text(json.dumps(instances))
    with caplog.at_level(logging.INFO, logger="keras_yolo_mgpu"):
        dataset = open_dataset(str(tmp_path))
    assert dataset.class_names == CLASSES
    assert "category 0 ('shapes') is the supercategory of all the others" in caplog.text
    for split, records in (("train", train[:3]), ("val", val[:2])):
        got = dataset.checked(split, len(CLASSES)).annotations
        assert [a.boxes.tolist() for a in got] == [r.boxes.tolist() for r in records]
