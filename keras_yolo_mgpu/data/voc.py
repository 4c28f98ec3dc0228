"""Pascal VOC XML annotations to keras-yolo3 annotation lines.

Two ways in:

    # A VOCdevkit: one output file per set, named like keras-yolo3's (2007_train.txt, ...)
    python voc_annotation.py --devkit VOCdevkit --sets 2007_train 2007_val 2007_test
    python voc_annotation.py      # the same for ./VOCdevkit, with absolute paths, as keras-yolo3

    # Any folder of VOC-style XML files (LabelImg and most labelling tools write them)
    python voc_annotation.py --xml-dir labels --image-dir images --classes my_classes.txt --output train.txt

Objects marked ``<difficult>1</difficult>`` are skipped by default, as in
keras-yolo3 (``--keep-difficult`` keeps them); objects whose class is not in
the classes file are skipped and counted. An image left with no box is
still written (a background image). Image paths are written as the given
folder joined with the file name, so an absolute ``--devkit`` gives absolute
paths and a relative one paths relative to where training runs.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import typing
import xml.etree.ElementTree as ET
from collections.abc import Sequence

import numpy as np

from keras_yolo_mgpu.data.annotations import format_annotation_line
from keras_yolo_mgpu.data.formats.records import recorded_size

logger = logging.getLogger(__name__)

DEFAULT_SETS = ("2007_train", "2007_val", "2007_test")


@dataclasses.dataclass
class VocImage:
    """Boxes of one XML file.

    Attributes:
        filename: the ``<filename>`` element, or None when absent.
        size: ``<size>``'s (width, height), or None when absent or not positive integers.
        boxes: ``(K, 5)`` float array x_min, y_min, x_max, y_max, class index.
        difficult_skipped: objects dropped for being difficult.
        unknown: names of objects dropped for a class not in the list.
    """

    filename: str | None
    boxes: np.ndarray
    difficult_skipped: int = 0
    unknown: list = dataclasses.field(default_factory=list)
    size: tuple[int, int] | None = None


def _number(obj, tag: str, xml_path: str) -> float:
    element = obj.find(tag)
    if element is None or element.text is None:
        raise ValueError(f"{xml_path}: object without <{tag}>")
    try:
        return float(element.text.strip())
    except ValueError:
        raise ValueError(f"{xml_path}: <{tag}> is not a number: {element.text!r}") from None


def parse_voc_xml(xml_path: str, class_names: Sequence[str], *, keep_difficult: bool = False) -> VocImage:
    """Reads the boxes of one VOC XML file.

    Args:
        xml_path: the ``.xml`` file.
        class_names: class list; an object's index in it is its class id.
        keep_difficult: keep objects marked difficult.

    Returns:
        A :class:`VocImage` (coordinates as written in the XML: VOC's own
        1-based pixels, unchanged as keras-yolo3 did).

    Raises:
        ValueError: malformed XML or a box without its coordinates.
    """
    try:
        root = ET.parse(xml_path).getroot()
    except ET.ParseError as error:
        raise ValueError(f"{xml_path}: not valid XML ({error})") from None
    index = {name: i for i, name in enumerate(class_names)}
    filename = root.findtext("filename")
    boxes, unknown, difficult_skipped = [], [], 0
    for obj in root.iter("object"):
        name = (obj.findtext("name") or "").strip()
        difficult = (obj.findtext("difficult") or "0").strip()
        if difficult not in ("", "0") and not keep_difficult:
            difficult_skipped += 1
            continue
        if name not in index:
            unknown.append(name)
            continue
        box = obj.find("bndbox")
        if box is None:
            raise ValueError(f"{xml_path}: object {name!r} has no <bndbox>")
        boxes.append([_number(box, tag, xml_path) for tag in ("xmin", "ymin", "xmax", "ymax")] + [index[name]])
    return VocImage(
        filename.strip() if filename else None,
        np.array(boxes, dtype=np.float64).reshape(-1, 5),
        difficult_skipped,
        unknown,
        recorded_size(root.findtext("size/width"), root.findtext("size/height")),
    )


class _Tally:
    """Counts what was skipped, for one summary log line per output file."""

    def __init__(self):
        self.images = self.boxes = self.difficult = 0
        self.unknown = collections.Counter()

    def add(self, image: VocImage):
        self.images += 1
        self.boxes += len(image.boxes)
        self.difficult += image.difficult_skipped
        self.unknown.update(image.unknown)

    def log(self, output: str):
        logger.info(
            "%s: %d images, %d boxes, %d difficult objects skipped", output, self.images, self.boxes, self.difficult
        )
        if self.unknown:
            logger.warning(
                "%s: skipped %d objects of classes not in the class list: %s",
                output,
                sum(self.unknown.values()),
                ", ".join(f"{name!r} x{count}" for name, count in self.unknown.most_common()),
            )


def voc_set_list_path(devkit: str, year: str, image_set: str) -> str:
    """``<devkit>/VOC<year>/ImageSets/Main/<image_set>.txt``: the image ids of one set."""
    return os.path.join(devkit, f"VOC{year}", "ImageSets", "Main", f"{image_set}.txt")


def voc_set_xml_paths(devkit: str, year: str, image_set: str) -> list[str]:
    """The ``Annotations/<id>.xml`` of every image id in the set's list, in order."""
    with open(voc_set_list_path(devkit, year, image_set), encoding="utf-8") as f:
        image_ids = [line.strip().split()[0] for line in f if line.strip()]
    return [os.path.join(devkit, f"VOC{year}", "Annotations", f"{image_id}.xml") for image_id in image_ids]


class VocSetLines(typing.NamedTuple):
    """`voc_set_lines`' result: the annotation lines, and how many boxes they hold."""

    lines: list[str]
    boxes: int


def voc_set_lines(
    devkit: str, year: str, image_set: str, class_names: Sequence[str], *, keep_difficult: bool = False
) -> VocSetLines:
    """Annotation lines for ``VOCdevkit/VOC<year>/ImageSets/Main/<image_set>.txt``.

    The image paths are ``<devkit>/VOC<year>/JPEGImages/<id>.jpg``: with
    ``devkit`` = ``os.path.join(os.getcwd(), "VOCdevkit")`` exactly the
    lines keras-yolo3's voc_annotation.py writes for VOC's own XML.
    """
    tally = _Tally()
    lines = []
    for xml_path in voc_set_xml_paths(devkit, year, image_set):
        image = parse_voc_xml(xml_path, class_names, keep_difficult=keep_difficult)
        tally.add(image)
        image_id = os.path.splitext(os.path.basename(xml_path))[0]
        lines.append(
            format_annotation_line(os.path.join(devkit, f"VOC{year}", "JPEGImages", f"{image_id}.jpg"), image.boxes)
        )
    tally.log(f"{year}_{image_set}")
    return VocSetLines(lines, tally.boxes)


def xml_dir_lines(
    xml_dir: str, image_dir: str, class_names: Sequence[str], *, keep_difficult: bool = False
) -> list[str]:
    """Annotation lines for every ``*.xml`` in ``xml_dir`` (sorted by name).

    The image is ``image_dir/<filename>`` from the XML, or the XML's stem
    with ``.jpg`` when it has no ``<filename>``.
    """
    tally = _Tally()
    lines = []
    missing = 0
    for name in sorted(os.listdir(xml_dir)):
        if not name.lower().endswith(".xml"):
            continue
        image = parse_voc_xml(os.path.join(xml_dir, name), class_names, keep_difficult=keep_difficult)
        tally.add(image)
        image_path = os.path.join(image_dir, image.filename or os.path.splitext(name)[0] + ".jpg")
        missing += not os.path.exists(image_path)
        lines.append(format_annotation_line(image_path, image.boxes))
    if not lines:
        raise ValueError(f"no .xml files in {xml_dir}")
    if missing:
        logger.warning("%d of %d images named by the XML files do not exist under %s", missing, len(lines), image_dir)
    tally.log(xml_dir)
    return lines
