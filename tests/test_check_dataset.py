"""Dataset checker: every problem kind, FILE:LINE output, summary, exit status, read-only."""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from keras_yolo_mgpu.cli.check_dataset import main
from keras_yolo_mgpu.data.check import KINDS, CheckReport, check_annotations
from keras_yolo_mgpu.data.formats.records import Problem


def _jpeg(path, size=(64, 48), seed=0):
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, quality=90)


@pytest.fixture
def dataset(tmp_path):
    """An annotation file with one problem of each kind, and good lines around them."""
    images = tmp_path / "images"
    images.mkdir()
    _jpeg(images / "good.jpg")
    _jpeg(images / "with space.jpg")
    data = (images / "good.jpg").read_bytes()
    (images / "truncated.jpg").write_bytes(data[:100])  # cut inside the header: no decoder reads it
    (images / "not_an_image.jpg").write_bytes(b"hello, I am text")
    lines = [
        "images/good.jpg 1,2,30,40,0 10,10,20,20,1",  # 1 good
        "",  # 2 blank
        "images/missing.jpg 1,2,3,4,0",  # 3 missing-file
        "images/truncated.jpg 1,2,3,4,0",  # 4 unreadable-image (truncated)
        "images/not_an_image.jpg",  # 5 unreadable-image
        "images/good.jpg 1,2,30,40,0 1,2,65,40,1",  # 6 box-outside-image (x2 > 64)
        "images/good.jpg -1,2,30,40,0",  # 7 box-outside-image (negative)
        "images/good.jpg 30,2,30,40,0 5,40,9,39,0 1,2,30,40,1",  # 8 degenerate-box x2 == x1, then y2 < y1
        "images/good.jpg 1,2,30,40,20",  # 9 class-out-of-range
        "images/good.jpg 1,2,30,40,0 5,5,9,9,1 1,2,30,40,0",  # 10 duplicate-box
        "images/good.jpg 1,2,3,4",  # 11 malformed
        "images/with space.jpg",  # 12 good background, path with a space
        "images/good.jpg 1,2,30,40,-1",  # 13 class-out-of-range (negative)
    ]
    path = tmp_path / "train.txt"
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    return path


def _snapshot(folder):
    return {
        p: (os.stat(p).st_mtime_ns, hashlib.sha1(open(p, "rb").read()).hexdigest())
        for p in (os.path.join(d, f) for d, _, files in os.walk(folder) for f in files)
    }


def test_reports_each_problem_on_its_line(dataset):
    report = check_annotations(str(dataset), num_classes=20)
    found = [(p.line_number, p.kind) for p in report.problems]
    assert found == [
        (3, "missing-file"),
        (4, "unreadable-image"),
        (5, "unreadable-image"),
        (6, "box-outside-image"),
        (7, "box-outside-image"),
        (8, "degenerate-box"),
        (8, "degenerate-box"),
        (9, "class-out-of-range"),
        (10, "duplicate-box"),
        (11, "malformed"),
        (13, "class-out-of-range"),
    ]
    # label-without-image: YOLO-format only; size-mismatch: formats that record sizes (COCO, VOC).
    assert set(KINDS) - {"label-without-image", "size-mismatch"} == {kind for _, kind in found}
    # Lines whose only problems are repairable (boxes outside the image,
    # repeats, degenerate boxes) stay usable with boxes clipped, deduplicated
    # and degenerate ones dropped, as keras-yolo3's generator did.
    assert [a.line_number for a in report.annotations] == [1, 6, 7, 8, 10, 12]
    repaired = {a.line_number: a.boxes.tolist() for a in report.annotations}
    assert repaired[6] == [[1, 2, 30, 40, 0], [1, 2, 64, 40, 1]]  # x_max clipped to the 64 px width
    assert repaired[7] == [[0, 2, 30, 40, 0]]  # x_min clipped to 0
    assert repaired[8] == [[1, 2, 30, 40, 1]]  # the two degenerate boxes dropped, the good one kept
    assert repaired[10] == [[1, 2, 30, 40, 0], [5, 5, 9, 9, 1]]  # the repeat dropped
    degenerate = [str(p) for p in report.problems if p.kind == "degenerate-box"]
    assert degenerate == [
        f"{dataset}:8: box 1 (30,2,30,40,0): zero width (x_max == x_min); "
        "the box is dropped, the image and its other boxes kept",
        f"{dataset}:8: box 2 (5,40,9,39,0): negative height (y_max < y_min); "
        "the box is dropped, the image and its other boxes kept",
    ]
    by_line = {p.line_number: p for p in report.problems}
    assert str(by_line[3]) == f"{dataset}:3: image not found: {dataset.parent / 'images' / 'missing.jpg'}"
    assert "truncated" in str(by_line[4])
    assert str(by_line[6]).endswith("box 2 (1,2,65,40,1) extends outside the 64x48 image")
    assert str(by_line[9]).endswith("box 1 (1,2,30,40,20): class id 20 not in [0, 20)")
    assert str(by_line[10]).endswith("box 3 (1,2,30,40,0) duplicates box 1")
    assert str(by_line[11]).startswith(f"{dataset}:11: malformed box token '1,2,3,4'")


def test_summary_counts(dataset):
    report = check_annotations(str(dataset), num_classes=20)
    assert (report.num_lines, report.num_images, report.num_backgrounds) == (12, 11, 2)
    assert report.num_boxes == 15
    assert report.num_bad_lines == 10
    assert report.problems_by_kind == {
        "malformed": 1,
        "missing-file": 1,
        "unreadable-image": 2,
        "box-outside-image": 2,
        "degenerate-box": 2,
        "class-out-of-range": 2,
        "duplicate-box": 1,
    }
    text = report.summary_text()
    assert text.startswith(
        f"{dataset}: 12 lines, 6 usable; 11 images, 15 boxes, 2 backgrounds; 11 problems on 10 lines"
    )
    assert "unreadable-image 2" in text


def test_class_ids_beyond_the_names_on_most_lines_say_the_names_are_not_the_labels(dataset):
    """A few lines past the names are bad lines; most of them, a class list of another dataset."""
    assert check_annotations(str(dataset), num_classes=20).class_list_mismatch("the 20 classes") is None
    # One class: the lines with a class-1, class-20 or class--1 box (1, 6, 8, 9, 10, 13), half of the 12: bad lines.
    one_class = check_annotations(str(dataset), num_classes=1)
    assert len({p.line_number for p in one_class.problems if p.kind == "class-out-of-range"}) == 6
    assert one_class.class_list_mismatch("the 1 classes") is None
    other = dataset.parent / "other.txt"
    other.write_text("images/good.jpg 1,2,30,40,3\nimages/good.jpg 1,2,30,40,0\nimages/good.jpg 5,5,9,9,2\n")
    message = check_annotations(str(other), num_classes=2).class_list_mismatch("the 2 classes of two.txt")
    assert message.startswith(f"{other}: 2 of the 3 lines have class ids beyond the 2 classes of two.txt (first: ")
    assert message.endswith("Give this dataset's class names (--classes FILE)")
    # A YOLO label file is one entry, however many of its lines go past the names: 1 image of 3 here.
    past = [Problem("labels/a.txt", line, "class-out-of-range", "class id 5 not in [0, 2)") for line in (1, 2, 3)]
    assert (
        CheckReport([], past, num_lines=3, source="data.yaml", entry_word="images listed").class_list_mismatch(
            "the 2 classes"
        )
        is None
    )


def test_without_decoding_images_only_existence_is_checked(dataset):
    report = check_annotations(str(dataset), num_classes=20, check_images=False)
    kinds = [(p.line_number, p.kind) for p in report.problems]
    assert (3, "missing-file") in kinds
    assert not any(kind == "unreadable-image" for _, kind in kinds)
    assert (6, "box-outside-image") not in kinds  # needs the image size
    assert (7, "box-outside-image") in kinds  # negative: no size needed
    assert "(images not decoded)" in report.summary_text()


def test_write_problems_lists_every_problem(dataset, tmp_path):
    report = check_annotations(str(dataset), num_classes=20)
    out = tmp_path / "logs" / "problems.txt"
    out.parent.mkdir()
    report.write_problems(str(out))
    lines = out.read_text().splitlines()
    assert lines[:-1] == [str(p) for p in report.problems]
    assert lines[-1] == report.summary_text()


def test_problem_str():
    assert str(Problem("a.txt", 7, "missing-file", "image not found: x.jpg")) == "a.txt:7: image not found: x.jpg"


def test_cli_prints_file_line_problems_and_exits_nonzero_without_modifying(dataset, tmp_path, capsys):
    classes = tmp_path / "classes.txt"
    classes.write_text("\n".join(f"c{i}" for i in range(20)) + "\n")
    before = _snapshot(tmp_path)
    status = main([str(dataset), "--classes", str(classes)])
    out = capsys.readouterr().out.splitlines()
    assert status == 1
    assert len(out) == 13 and all(line.startswith(f"{dataset}:") for line in out[:-2])
    assert out[-2].startswith(f"{dataset}: 12 lines, 6 usable")
    assert out[-1].startswith(f"warning: 1 image(s) listed more than once in {dataset}")  # good.jpg, 4 usable lines
    assert _snapshot(tmp_path) == before  # read-only


def test_cli_clean_dataset_exits_zero_in_a_subprocess(tmp_path):
    _jpeg(tmp_path / "a.jpg")
    _jpeg(tmp_path / "b.jpg", seed=1)
    (tmp_path / "ok.txt").write_text("a.jpg 1,1,20,20,0\nb.jpg\n")
    before = _snapshot(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_yolo_mgpu.check_dataset",
            str(tmp_path / "ok.txt"),
            "--classes",
            os.path.join(os.path.dirname(__file__), "..", "model_data", "voc_classes.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("2 lines, 2 usable; 2 images, 1 box, 1 background; no problems")
    assert _snapshot(tmp_path) == before  # read-only


def test_cli_usage_errors_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "nope.txt"), "--classes", str(tmp_path / "nope_classes.txt")]) == 2
    classes = tmp_path / "classes.txt"
    classes.write_text("a\n")
    assert main([str(tmp_path / "nope.txt"), "--classes", str(classes)]) == 2
    assert f"error: not found: {tmp_path / 'nope.txt'}" in capsys.readouterr().err
    # An annotation file is named as one, not as --data (the dataset flag).
    assert main(["--annotations", str(tmp_path / "nope.txt"), "--classes", str(classes)]) == 2
    assert "--data" not in capsys.readouterr().err


def test_training_and_validation_that_share_images_are_named_with_counts(tmp_path, capsys):
    for index in range(5):
        _jpeg(tmp_path / f"{index}.jpg", seed=index)
    (tmp_path / "copy_of_4.jpg").write_bytes((tmp_path / "4.jpg").read_bytes())
    lines = [f"{tmp_path / f'{index}.jpg'} 1,2,30,40,0" for index in range(5)]
    train, val = tmp_path / "train.txt", tmp_path / "val.txt"
    train.write_text("\n".join(lines + lines[:1]) + "\n")  # 0.jpg twice
    val.write_text("\n".join([lines[1], lines[2], f"{tmp_path / 'copy_of_4.jpg'} 1,2,30,40,0"]) + "\n")
    assert main([str(train), str(val), "--classes", _classes(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"warning: 1 image(s) listed more than once in {train} (they weigh double): {tmp_path / '0.jpg'}" in out
    assert f"error: 2 image(s) in both {train} and {val}: {tmp_path / '1.jpg'}, {tmp_path / '2.jpg'}" in out
    assert "error: 1 image(s) of" in out and f"{tmp_path / 'copy_of_4.jpg'}" in out  # the same bytes, another name
    # train.py's and evaluate.py's flag for the same files: the same check.
    assert main(["--annotations", str(train), str(val), "--classes", _classes(tmp_path)]) == 1
    assert capsys.readouterr().out == out
    assert main([str(train), "--classes", _classes(tmp_path)]) == 0  # a repeat alone is a warning


def test_a_blank_line_among_the_class_names_is_refused_with_its_line(tmp_path, capsys):
    _jpeg(tmp_path / "a.jpg")
    (tmp_path / "train.txt").write_text(f"{tmp_path / 'a.jpg'} 1,2,30,40,1\n")
    (tmp_path / "classes.txt").write_text("cat\n\ndog\n\n")  # without the refusal, dog would take id 1
    assert main([str(tmp_path / "train.txt"), "--classes", str(tmp_path / "classes.txt")]) == 2
    assert f"{tmp_path / 'classes.txt'}, line 2: blank line among the class names" in capsys.readouterr().err
    (tmp_path / "classes.txt").write_text("cat\ndog\n\n")  # blank lines at the end are harmless
    assert main([str(tmp_path / "train.txt"), "--classes", str(tmp_path / "classes.txt")]) == 0


def _classes(folder):
    (folder / "two_classes.txt").write_text("cat\ndog\n")
    return str(folder / "two_classes.txt")


def test_counts_take_the_number_of_their_noun():
    from keras_yolo_mgpu.wording import counted

    assert [counted(1, "boxes"), counted(2, "boxes"), counted(0, "lines")] == ["1 box", "2 boxes", "0 lines"]
    assert [counted(1, "classes"), counted(1, "images listed")] == ["1 class", "1 image listed"]
    assert counted(1, "images listed") == "1 image listed"
