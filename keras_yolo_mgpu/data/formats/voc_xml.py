"""Pascal VOC XML datasets (VOCdevkit, LabelImg, CVAT's VOC export).

    VOC2007/Annotations/*.xml + JPEGImages/ [+ ImageSets/Main/train.txt, val.txt]
    dataset/annotations/*.xml + images/      (any XML folder beside an image folder)
    dataset/*.xml beside the images

Each XML's `<filename>` (else its own name with `.jpg`) is looked up in
`JPEGImages/`, `images/`, the XML's folder, and the dataset folder. Class
names are the given list, else every object name the XML files use, sorted
(VOC's own 20 names come out in VOC's order that way). Objects marked
difficult are left out, as keras-yolo3 does. `ImageSets/Main/train.txt` and
`val.txt`, when present, give the split. An XML file without any object, or
one the image set lists that is missing, counts as unlabelled
(`data.check`); a degenerate box is dropped by the checker, which names it
`FILE.xml: box N` (N counts the boxes read, difficult objects left out).
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.data.formats.records import Problem, SplitRecords, is_image_file
from keras_yolo_mgpu.data.voc import parse_voc_xml

__all__ = ["find_xml_dir", "read_voc_dataset", "voc_class_names"]

XML_DIRS = ("Annotations", "annotations", "annots", "xml", "labels")
IMAGE_DIRS = ("JPEGImages", "images", "Images", "imgs")


def find_xml_dir(folder: str) -> str | None:
    """The folder of XML files in a VOC dataset folder, or None when there is none."""
    for name in (*XML_DIRS, "."):
        candidate = os.path.normpath(os.path.join(folder, name))
        if os.path.isdir(candidate) and any(n.lower().endswith(".xml") for n in os.listdir(candidate)):
            return candidate
    return None


def _xml_files(xml_dir: str) -> list[str]:
    return sorted(os.path.join(xml_dir, n) for n in os.listdir(xml_dir) if n.lower().endswith(".xml"))


def voc_class_names(xml_paths: Sequence[str]) -> list[str]:
    """Every object name used in the XML files (difficult ones included), sorted."""
    names = set()
    for path in xml_paths:
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError:
            continue  # reported when the file is read
        names.update((obj.findtext("name") or "").strip() for obj in root.iter("object"))
    names.discard("")
    return sorted(names)


def _image_for(xml_path: str, filename: str | None, folder: str) -> str:
    name = filename or os.path.splitext(os.path.basename(xml_path))[0] + ".jpg"
    name = os.path.basename(name) if not os.path.isfile(os.path.join(folder, name)) else name
    places = [os.path.join(folder, d) for d in IMAGE_DIRS] + [os.path.dirname(xml_path), folder]
    for place in places:
        path = os.path.join(place, name)
        if os.path.isfile(path):
            return os.path.abspath(path)
    stem = os.path.splitext(os.path.basename(xml_path))[0]
    for place in places:  # <filename> disagrees with the file on disk: the XML's own stem
        if os.path.isdir(place):
            for candidate in sorted(os.listdir(place)):
                if os.path.splitext(candidate)[0] == stem and is_image_file(candidate):
                    return os.path.abspath(os.path.join(place, candidate))
    return os.path.abspath(os.path.join(places[0] if os.path.isdir(places[0]) else folder, name))


def _read_split(xml_paths: list[str], class_names: list[str], folder: str, source: str) -> SplitRecords:
    split = SplitRecords(source=source, num_entries=len(xml_paths))
    index = {name: i for i, name in enumerate(class_names)}
    unlabelled = []
    for xml_path in xml_paths:
        if not os.path.isfile(xml_path):
            split.problems.append(Problem(xml_path, 0, "missing-file", "XML file listed in the image set not found"))
            unlabelled.append(xml_path)
            continue
        try:
            image = parse_voc_xml(xml_path, class_names)
        except ValueError as error:
            split.problems.append(Problem(xml_path, 0, "malformed", str(error).removeprefix(f"{xml_path}: ")))
            continue
        if image.unknown:
            unknown = ", ".join(sorted(set(image.unknown)))
            split.problems.append(
                Problem(xml_path, 0, "class-out-of-range", f"object class {unknown} not in the names {list(index)}")
            )
            continue
        if not len(image.boxes) and not image.difficult_skipped:
            unlabelled.append(xml_path)  # no <object> at all
        boxes = image.boxes.astype("float32")
        image_path = _image_for(xml_path, image.filename, folder)
        split.records.append(Annotation(image_path, boxes, xml_path, 0, recorded_size=image.size))
    split.num_unlabelled = len(unlabelled)
    if xml_paths:
        example = (unlabelled or xml_paths)[0]
        split.labels_looked_for = f"as the <object> elements of each image's XML file in {source}, e.g. {example}"
    return split


def _image_sets(folder: str, xml_dir: str) -> dict[str, list[str]] | None:
    sets = os.path.join(folder, "ImageSets", "Main")
    found = {}
    for split, name in (("train", "train.txt"), ("val", "val.txt"), ("test", "test.txt")):
        path = os.path.join(sets, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                ids = [line.split()[0] for line in handle if line.strip()]
            found[split] = [os.path.join(xml_dir, f"{i}.xml") for i in ids]
    return found if "train" in found else None


def read_voc_dataset(folder: str, class_names: list[str] | None = None) -> tuple[dict[str, SplitRecords], list[str]]:
    """`({"train": ..., ["val": ...]}, class names)` of a VOC folder."""
    xml_dir = find_xml_dir(folder)
    if xml_dir is None:
        raise FileNotFoundError(f"{folder}: no VOC XML files (looked in {', '.join(XML_DIRS)} and the folder)")
    sets = _image_sets(folder, xml_dir) or {"train": _xml_files(xml_dir)}
    names = list(class_names) if class_names is not None else voc_class_names(_xml_files(xml_dir))
    if not names:
        raise ValueError(f"{xml_dir}: the XML files name no object class")
    return {split: _read_split(paths, names, folder, xml_dir) for split, paths in sets.items()}, names
