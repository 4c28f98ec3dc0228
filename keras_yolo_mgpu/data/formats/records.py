"""What every format reader returns: one split's records and the problems with its entries (`Problem`).

A split read from one annotation file (a COCO JSON, a keras-yolo3 file) is
also saved as a record in the user's cache folder (`save_split_record`),
keyed by the file's size and modification time and the reader's options,
so the next start loads arrays instead of parsing the file again.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field

import numpy as np

from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.data.scan import load_record, record_text, save_record

logger = logging.getLogger(__name__)

__all__ = [
    "IMAGE_EXTENSIONS",
    "Problem",
    "SplitRecords",
    "file_stat",
    "is_image_file",
    "load_split_record",
    "pixel_box_rounding",
    "recorded_size",
    "save_split_record",
]

# What YOLO-format tools (ultralytics, Roboflow, CVAT) count as images.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".gif", ".pgm", ".ppm")


def is_image_file(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def pixel_box_rounding(value: float) -> float:
    """Pixel coordinates converted from another unit are rounded to 1/1000 px (as coco_annotation.py writes).

    A box written as whole pixels and read back from normalised or
    width/height form then gives the same float32 record as keras-yolo3's
    format, hence the same targets.
    """
    return round(value, 3)


def recorded_size(width, height) -> tuple[int, int] | None:
    """(width, height) an annotation gives its image, or None unless both are positive whole numbers.

    Args:
        width, height: as the file holds them (text, numbers or None); tools
            that did not read the image write 0 or leave them out.
    """
    try:
        size = float(str(width).strip()), float(str(height).strip())
    except ValueError:
        return None
    if not all(math.isfinite(v) and v > 0 and v == int(v) for v in size):
        return None
    return int(size[0]), int(size[1])


@dataclass
class Problem:
    """One problem on one annotation line; `str()` gives `FILE:LINE: message`.

    `kind` is one of `data.check.KINDS`.
    """

    source: str
    line_number: int
    kind: str
    message: str

    def __str__(self) -> str:
        # Line 0: a record without lines (a COCO image, a VOC XML file).
        where = f"{self.source}:{self.line_number}" if self.line_number else self.source
        return f"{where}: {self.message}"


@dataclass
class SplitRecords:
    """One split of a dataset as a reader found it.

    Attributes:
        records: an `Annotation` per image the reader could read (boxes as
            (K, 5) float32 x_min, y_min, x_max, y_max, class_id in pixels).
        problems: what was wrong with the entries, `FILE:LINE` each; an
            image with a problem here is not in `records`, but for a
            `degenerate-box`: that box alone is left out.
        num_entries: images (or lines) the split lists, read or not.
        source: the file or folder the split comes from.
        num_unlabelled: images for which no labels were found at all (each
            reader's module says what that is in its format).
        labels_looked_for: where the reader looked for labels, with one
            example, to end "labels are looked for ..." (`data.check`).
    """

    records: list[Annotation] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    num_entries: int = 0
    source: str = ""
    num_unlabelled: int = 0
    labels_looked_for: str = ""

    def __post_init__(self):
        self.source = os.fspath(self.source)


# --- the record of a split, so the next start reads arrays instead of the annotation file ---------

# Bump when a reader's output or the record's layout changes: older records are then rebuilt.
RECORDS_VERSION = 4  # 4: YOLO boxes past an edge by the labels' rounding put on it


def file_stat(path: str) -> list[int]:
    """[size, mtime_ns] of `path`: what a record of it is keyed by."""
    stat = os.stat(path)
    return [stat.st_size, stat.st_mtime_ns]


def save_split_record(path: str, split: SplitRecords, names: list[str] | None, key: dict) -> None:
    """Writes `split` (and the class names) atomically as arrays: all boxes in one (M, 5) float32 array.

    Args:
        path: the record file, in the user's cache folder (`data.scan.record_path`).
        key: what the record must match to be used (the annotation file's
            `file_stat`, the reader's options); stored and compared whole.
    """
    records = split.records
    meta = {
        "version": RECORDS_VERSION,
        "key": key,
        "names": names,
        "num_entries": split.num_entries,
        "source": split.source,
        "num_unlabelled": split.num_unlabelled,
        "labels_looked_for": split.labels_looked_for,
        "problems": [[p.source, p.line_number, p.kind, p.message] for p in split.problems],
    }
    boxes = [r.boxes for r in records if len(r.boxes)]
    save_record(
        path,
        meta,
        {"paths": [r.image_path for r in records], "sources": [r.source for r in records]},
        lines=np.array([r.line_number for r in records], np.int64),
        counts=np.array([len(r.boxes) for r in records], np.int64),
        boxes=np.concatenate(boxes).astype(np.float32) if boxes else np.zeros((0, 5), np.float32),
        recorded_sizes=np.array([r.recorded_size or (-1, -1) for r in records], np.int64).reshape(-1, 2),
    )


def load_split_record(path: str, key: dict) -> tuple[SplitRecords, list[str] | None] | None:
    """(the split, its class names) from the record at `path`; None when missing, unreadable or stale.

    Each record's boxes are a view into one (M, 5) array: about 160 bytes of
    Python objects per image instead of a list per box.
    """

    def read(meta, data):
        texts = record_text(data["paths"]), record_text(data["sources"])
        return meta, *texts, data["lines"], data["counts"], data["boxes"], data["recorded_sizes"]

    unreadable = "record %s unreadable (%s: %s): reading the dataset again"
    found = load_record(path, {"version": RECORDS_VERSION, "key": key}, read, logger, unreadable)
    if found is None:
        return None
    meta, paths, sources, lines, counts, boxes, recorded = found
    if not len(counts):
        paths, sources = [], []
    if not (len(paths) == len(sources) == len(lines) == len(counts) == len(recorded)) or counts.sum() != len(boxes):
        return None
    split = SplitRecords(
        records=[
            Annotation(p, b, s, int(n), recorded_size=(int(w), int(h)) if w > 0 else None)
            for p, b, s, n, (w, h) in zip(
                paths, np.split(boxes, np.cumsum(counts)[:-1]), sources, lines.tolist(), recorded.tolist()
            )
        ],
        problems=[Problem(*problem) for problem in meta["problems"]],
        num_entries=meta["num_entries"],
        source=meta["source"],
        num_unlabelled=meta["num_unlabelled"],
        labels_looked_for=meta["labels_looked_for"],
    )
    return split, meta["names"]
