"""keras-yolo3 annotation files: one image per line.

    path/to/image.jpg x_min,y_min,x_max,y_max,class_id x_min,y_min,...

Coordinates are absolute pixels of the stored image (integers in keras-yolo3's
own converters; decimals are accepted too); a line with a path and no box is a
background image. What this parser accepts beyond the original:

- paths with spaces: box tokens are taken from the right, and the first token
  (from the right) without a comma ends the boxes, so everything left of it is
  the path, spaces included;
- CRLF line endings, a UTF-8 byte-order mark, blank or whitespace-only lines
  (skipped; line numbers still count them, so `FILE:LINE` matches an editor);
- relative paths (`resolve_image_path`; keras-yolo3 resolved them against
  the working directory only).

Errors name the place: `AnnotationError("train.txt:12: malformed box token ...")`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from keras_yolo_mgpu.data.images import displayed_size, image_size_and_orientation, stored_to_displayed

__all__ = [
    "Annotation",
    "AnnotationError",
    "drawn_on_stored_pixels",
    "format_annotation_line",
    "iter_annotation_lines",
    "parse_annotation_line",
    "read_annotations",
    "resolve_image_path",
    "turned_upright",
]


class AnnotationError(ValueError):
    """A malformed annotation line; the message starts with `FILE:LINE: `."""

    def __init__(self, source: str, line_number: int, problem: str):
        super().__init__(f"{source}:{line_number}: {problem}")
        self.source = source
        self.line_number = line_number
        self.problem = problem


@dataclass(frozen=True)
class Annotation:
    """One image and its boxes.

    Attributes:
        image_path: resolved path of the image (it may not exist: the dataset
            checker reports that).
        boxes: float32 array of shape (K, 5): x_min, y_min, x_max, y_max,
            class_id in image pixels; K == 0 for a background image.
        source: the annotation file ("<string>" when parsed from a string).
        line_number: 1-based line in `source`.
        size: the image's (width, height) as displayed (EXIF orientation applied) once the dataset check read
            its header, so later steps need not open the file (None before;
            not part of equality).
        recorded_size: the (width, height) of the image the boxes were drawn
            on, where known: the size the annotation gives (COCO's
            `width`/`height`, VOC's `<size>`, the displayed size a YOLO
            label is normalised to), which the check compares with the
            file's, and the displayed size once the boxes are on the
            displayed image (after the check or `turned_upright`, so no
            later step turns them again). None where the format records none
            (keras-yolo3's files, drawn on the stored pixels).
    """

    image_path: str
    boxes: np.ndarray = field(repr=False)
    source: str = "<string>"
    line_number: int = 0
    size: tuple[int, int] | None = None
    recorded_size: tuple[int, int] | None = None

    def __eq__(self, other) -> bool:  # ndarray fields break the generated __eq__
        if not isinstance(other, Annotation):
            return NotImplemented
        return (self.image_path, self.source, self.line_number) == (
            other.image_path,
            other.source,
            other.line_number,
        ) and np.array_equal(self.boxes, other.boxes)


def _parse_box(token: str) -> tuple[float, ...] | None:
    """`"1,2,30,40,3"` -> (1.0, 2.0, 30.0, 40.0, 3.0); None when malformed."""
    parts = token.split(",")
    if len(parts) != 5:
        return None
    try:
        values = tuple(float(part) for part in parts)
    except ValueError:
        return None
    if not all(math.isfinite(v) for v in values) or values[4] != int(values[4]):
        return None  # class id must be an integer ("3" or "3.0")
    return values


def resolve_image_path(path: str, source: str | None = None, root: str | None = None) -> str:
    """Resolves an image path from an annotation line.

    Absolute paths are kept. A relative path is joined to `root` when given;
    otherwise to the folder of the annotation file `source` if the image
    exists there, else to the current working directory.

    Returns:
        An absolute, normalised path (which may not exist).
    """
    path = os.path.expanduser(path)
    if os.path.isabs(path):
        return os.path.normpath(path)
    if root is not None:
        return os.path.abspath(os.path.join(root, path))
    if source is not None and source != "<string>":
        beside_annotations = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(source)), path))
        if os.path.exists(beside_annotations):
            return beside_annotations
        in_cwd = os.path.abspath(path)
        # Neither exists: report the annotation-relative path, the first choice.
        return in_cwd if os.path.exists(in_cwd) else beside_annotations
    return os.path.abspath(path)


def parse_annotation_line(
    line: str, *, source: str = "<string>", line_number: int = 0, root: str | None = None
) -> Annotation:
    """Parses one annotation line.

    Args:
        line: `path x1,y1,x2,y2,c ...`; a trailing newline, CR or BOM is fine.
        source: the file the line comes from (used to resolve relative paths
            and in error messages).
        line_number: 1-based line number, for error messages.
        root: folder that relative image paths are relative to (see
            `resolve_image_path` for the default).

    Raises:
        AnnotationError: empty line, no path, or a malformed box token (a
            token with a comma that is not five numbers, or a class id that is
            not an integer).
    """
    text = line.lstrip("\ufeff").strip()
    if not text:
        raise AnnotationError(source, line_number, "empty line (expected 'path x1,y1,x2,y2,class ...')")
    tokens = text.split()
    boxes = []
    # Box tokens from the right: the first one without a comma is the last
    # word of the path, which may itself contain spaces.
    end = len(tokens)
    while end > 1 and "," in tokens[end - 1]:
        end -= 1
    for token in tokens[end:]:
        box = _parse_box(token)
        if box is None:
            raise AnnotationError(
                source, line_number, f"malformed box token {token!r} (expected x_min,y_min,x_max,y_max,class_id)"
            )
        boxes.append(box)
    path_tokens = tokens[:end]
    if end == 1 and "," in tokens[0] and _parse_box(tokens[0]) is not None:
        raise AnnotationError(source, line_number, f"no image path before the box {tokens[0]!r}")
    # A valid box token stranded inside the "path" means a malformed token
    # after it cut the box list short: report that token, not a missing file.
    for index, token in enumerate(path_tokens[1:], start=1):
        if _parse_box(token) is not None:
            bad = next(t for t in path_tokens[index + 1 :] if _parse_box(t) is None)
            raise AnnotationError(
                source, line_number, f"malformed box token {bad!r} (expected x_min,y_min,x_max,y_max,class_id)"
            )
    # Keep the path's own spacing: cut the original text at the first box token.
    path = text
    if boxes:
        first_box = list(re.finditer(r"\S+", text))[end]
        path = text[: first_box.start()].rstrip()
    return Annotation(
        image_path=resolve_image_path(path, source, root),
        boxes=np.array(boxes, dtype=np.float32).reshape(-1, 5),
        source=source,
        line_number=line_number,
    )


def iter_annotation_lines(path: str) -> Iterator[tuple[int, str]]:
    """Yields (1-based line number, text) for every non-blank line of `path`.

    Handles a UTF-8 BOM and CRLF/CR line endings.
    """
    with open(path, encoding="utf-8-sig", newline=None) as f:
        for line_number, line in enumerate(f, start=1):
            if line.strip():
                yield line_number, line


def read_annotations(path: str, root: str | None = None) -> list[Annotation]:
    """Reads an annotation file, skipping blank lines.

    Args:
        path: the annotation file.
        root: folder for relative image paths (see `resolve_image_path`).

    Returns:
        The records, boxes on each image as displayed: keras-yolo3 drew its
        boxes on the stored pixels, and an image with an EXIF orientation
        (read upright by every command, `data.images`) has them turned with
        it (its `recorded_size` then set, so the dataset check keeps them).

    Raises:
        AnnotationError: on the first malformed line (`FILE:LINE: ...`). Use
            `keras_yolo_mgpu.data.check.check_annotations` to collect every
            problem instead.
    """
    return [
        turned_upright(parse_annotation_line(line, source=path, line_number=line_number, root=root))
        for line_number, line in iter_annotation_lines(path)
    ]


def turned_upright(annotation: Annotation) -> Annotation:
    """`annotation` with boxes drawn on its image's stored pixels turned as the image is shown.

    Every command reads images upright (EXIF orientation applied,
    `data.images`). Boxes lie on the stored pixels where the record gives no
    size (keras-yolo3's files: keras-yolo3 read images as stored) or gives
    the stored size of a photo turned 90 degrees; those are turned, and the
    record then gives the displayed size (so no later step turns them
    again). The dataset check does the same from its scan (`data.check`);
    this reads the image's header, for records that skip the scan.
    """
    if not len(annotation.boxes):
        return annotation
    try:
        stored, orientation = image_size_and_orientation(annotation.image_path)  # the header only
    except Exception:  # noqa: BLE001 - a missing or unreadable image is the checker's finding
        return annotation
    if not drawn_on_stored_pixels(annotation.recorded_size, stored, orientation):
        return annotation
    boxes = stored_to_displayed(annotation.boxes, orientation, stored).astype(np.float32)
    return replace(annotation, boxes=boxes, recorded_size=displayed_size(stored, orientation))


def drawn_on_stored_pixels(recorded_size, stored_size: tuple[int, int], orientation: int) -> bool:
    """Whether a record's boxes lie on its image's stored pixels, which the image's EXIF orientation turns.

    Args:
        recorded_size: the record's `recorded_size`: None (keras-yolo3's
            files, drawn as stored), or the size the boxes were drawn on.
        stored_size: (width, height) of the stored pixels.
        orientation: the image's EXIF orientation, 1-8.

    A photo flipped or turned 180 degrees has one size in both views: a
    recorded size then means the displayed view, as browser-based tools draw.
    """
    displayed = displayed_size(stored_size, orientation)
    return orientation != 1 and recorded_size in (None, stored_size) and recorded_size != displayed


def _format_number(value: float) -> str:
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def format_annotation_line(image_path: str, boxes) -> str:
    """Inverse of `parse_annotation_line`: `path x1,y1,x2,y2,c ...` (no newline).

    Integral coordinates are written as integers (keras-yolo3's format), others
    with the shortest exact decimal.

    Args:
        image_path: written as given (no resolution).
        boxes: (K, 5) array-like of x_min, y_min, x_max, y_max, class_id.
    """
    if image_path != image_path.strip() or not image_path or "\n" in image_path or "\r" in image_path:
        raise ValueError(f"image path cannot be written on an annotation line: {image_path!r}")
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 5)
    tokens = [image_path]
    for box in boxes:
        if not box[4].is_integer():
            raise ValueError(f"class id must be an integer; got {box[4]}")
        tokens.append(",".join(_format_number(v) for v in box))
    return " ".join(tokens)
