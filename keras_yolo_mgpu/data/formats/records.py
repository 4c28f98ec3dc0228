"""What every format reader returns: one split's records and what was wrong with its entries."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.data.check import Problem

__all__ = ["IMAGE_EXTENSIONS", "SplitRecords", "is_image_file", "pixel_box_rounding"]

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
        num_unlabelled: images for which no labels were found at all (a
            YOLO image without a label file, a COCO image no annotation
            names, a VOC XML without an object or missing, a keras-yolo3
            line without a box). An empty YOLO label file marks a background
            on purpose and is not counted.
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
