"""keras-yolo3 annotation parsing: spaces, CRLF, BOM, blanks, backgrounds, roots."""

import os

import numpy as np
import pytest

from keras_yolo_mgpu.data.annotations import (
    Annotation,
    AnnotationError,
    format_annotation_line,
    parse_annotation_line,
    read_annotations,
)


def test_parses_path_and_boxes():
    a = parse_annotation_line("/data/img.jpg 10,20,30,40,3 5,6,7,8,0\n", source="t.txt", line_number=4)
    assert a.image_path == "/data/img.jpg"
    np.testing.assert_array_equal(a.boxes, [[10, 20, 30, 40, 3], [5, 6, 7, 8, 0]])
    assert a.boxes.dtype == np.float32 and a.boxes.shape == (2, 5)
    assert (a.source, a.line_number) == ("t.txt", 4)


def test_path_with_spaces_keeps_its_spacing():
    a = parse_annotation_line("/data/my  photos/beach day.jpg 1,2,3,4,0")
    assert a.image_path == "/data/my  photos/beach day.jpg"
    assert a.boxes.shape == (1, 5)
    # A comma inside the path is fine as long as the last path word has none.
    assert parse_annotation_line("/data/a,b c.jpg").image_path == "/data/a,b c.jpg"


def test_background_line_has_zero_boxes():
    a = parse_annotation_line("/data/empty.jpg   \r\n")
    assert a.image_path == "/data/empty.jpg"
    assert a.boxes.shape == (0, 5) and a.boxes.dtype == np.float32


def test_decimal_coordinates_and_integral_class():
    a = parse_annotation_line("/x.jpg 1.5,2.25,30,40.75,2.0")
    np.testing.assert_allclose(a.boxes, [[1.5, 2.25, 30, 40.75, 2]])


@pytest.mark.parametrize(
    "line, token",
    [
        ("/x.jpg 1,2,3,4", "1,2,3,4"),
        ("/x.jpg 1,2,3,4,0,9", "1,2,3,4,0,9"),
        ("/x.jpg 1,2,a,4,0", "1,2,a,4,0"),
        ("/x.jpg 1,2,3,4,0.5", "1,2,3,4,0.5"),
        ("/x.jpg 1,2,3,4,nan", "1,2,3,4,nan"),
        ("/x.jpg 1,2,3,4,0 junk 5,6,7,8,1", "junk"),
    ],
)
def test_malformed_box_token_names_file_line_and_token(line, token):
    with pytest.raises(AnnotationError) as info:
        parse_annotation_line(line, source="train.txt", line_number=12)
    message = str(info.value)
    assert message.startswith("train.txt:12: ")
    assert repr(token) in message
    assert (info.value.source, info.value.line_number) == ("train.txt", 12)
    assert isinstance(info.value, ValueError)


def test_line_without_path_is_an_error():
    with pytest.raises(AnnotationError, match=r"^<string>:3: no image path"):
        parse_annotation_line("1,2,3,4,0", line_number=3)
    with pytest.raises(AnnotationError, match=r"^f:1: empty line"):
        parse_annotation_line("  \r\n", source="f", line_number=1)


def test_file_with_bom_crlf_blank_lines_and_spaces(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    for name in ("a.jpg", "b c.jpg", "d.jpg"):
        (images / name).write_bytes(b"")
    text = "\ufeffimages/a.jpg 1,2,3,4,0\r\n\r\n   \r\nimages/b c.jpg 5,6,7,8,1 9,9,19,19,2\r\nimages/d.jpg\r\n"
    path = tmp_path / "train.txt"
    path.write_bytes(text.encode("utf-8"))
    annotations = read_annotations(str(path))
    assert [a.line_number for a in annotations] == [1, 4, 5]
    assert [os.path.basename(a.image_path) for a in annotations] == ["a.jpg", "b c.jpg", "d.jpg"]
    assert all(a.image_path == str(images / os.path.basename(a.image_path)) for a in annotations)
    assert [len(a.boxes) for a in annotations] == [1, 2, 0]
    assert all(a.source == str(path) for a in annotations)


def test_read_annotations_raises_on_first_malformed_line(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("a.jpg 1,2,3,4,0\n\nb.jpg 1,2,3\nc.jpg x\n")
    with pytest.raises(AnnotationError, match=rf"^{path}:3: malformed box token '1,2,3'"):
        read_annotations(str(path))


def test_relative_paths_resolve_beside_annotations_then_cwd_then_root(tmp_path, monkeypatch):
    annotations_dir, cwd, root = tmp_path / "ann", tmp_path / "cwd", tmp_path / "root"
    for folder in (annotations_dir, cwd, root):
        folder.mkdir()
    (annotations_dir / "both.jpg").write_bytes(b"")
    (cwd / "both.jpg").write_bytes(b"")
    (cwd / "cwd_only.jpg").write_bytes(b"")
    source = str(annotations_dir / "train.txt")
    monkeypatch.chdir(cwd)

    def resolve(name, root=None):
        return parse_annotation_line(name, source=source, line_number=1, root=root).image_path

    assert resolve("both.jpg") == str(annotations_dir / "both.jpg")  # annotation folder first
    assert resolve("cwd_only.jpg") == str(cwd / "cwd_only.jpg")  # then the working directory
    assert resolve("nowhere.jpg") == str(annotations_dir / "nowhere.jpg")  # reported beside the file
    assert resolve("both.jpg", root=str(root)) == str(root / "both.jpg")  # an explicit root wins
    assert resolve("/abs/x.jpg", root=str(root)) == "/abs/x.jpg"
    # A string with no file behind it resolves against the working directory.
    assert parse_annotation_line("cwd_only.jpg").image_path == str(cwd / "cwd_only.jpg")


def test_format_round_trip():
    boxes = np.array([[1, 2, 30, 40, 3], [1.5, 2.25, 3.125, 4.75, 0]], np.float32)
    line = format_annotation_line("/data/my photo.jpg", boxes)
    assert line == "/data/my photo.jpg 1,2,30,40,3 1.5,2.25,3.125,4.75,0"
    again = parse_annotation_line(line)
    assert again == Annotation("/data/my photo.jpg", boxes)
    assert format_annotation_line("/x.jpg", np.zeros((0, 5))) == "/x.jpg"
    with pytest.raises(ValueError, match="class id"):
        format_annotation_line("/x.jpg", [[1, 2, 3, 4, 0.5]])
    with pytest.raises(ValueError, match="cannot be written"):
        format_annotation_line(" x.jpg", [])
