"""`--data PATH`: a dataset as users have it, recognised by its kind.

    keras-yolo3   a text file, `path x1,y1,x2,y2,class ...` per line (data.annotations)
    yolo          a `data.yaml`, or a folder with `data.yaml` or `images/` + `labels/` (formats.yolo)
    coco          a COCO instances `.json`, or a folder whose train/ and valid/ (or val/) hold one each
                  (formats.coco_json)
    voc           a folder of Pascal VOC XML files: `Annotations/` + `JPEGImages/`, or XML beside
                  images (formats.voc_xml)

Every reader gives the same records (`data.annotations.Annotation`, boxes in
pixels), so the format changes nothing downstream; `Dataset.checked` runs
the dataset checker (`data.check`) over a split.

Class names: the dataset's (YOLO `names`, COCO categories, VOC object
names) unless the dataset has none, then the `--classes` file; both given
and different is an error naming both (`resolve_class_names`).
"""

from __future__ import annotations

import glob
import logging
import os
import time
from dataclasses import dataclass

from keras_yolo_mgpu.data.check import CheckReport, check_records
from keras_yolo_mgpu.data.formats.coco_json import read_coco_json
from keras_yolo_mgpu.data.formats.keras_yolo3 import read_annotation_file
from keras_yolo_mgpu.data.formats.records import SplitRecords, file_stat, load_split_record, save_split_record
from keras_yolo_mgpu.data.formats.voc_xml import find_xml_dir, read_voc_dataset
from keras_yolo_mgpu.data.formats.yolo import read_yolo_dataset
from keras_yolo_mgpu.data.scan import record_path
from keras_yolo_mgpu.resources import get_classes

logger = logging.getLogger(__name__)

__all__ = ["KINDS", "Dataset", "detect_kind", "open_dataset", "resolve_class_names"]

KINDS = ("keras-yolo3", "yolo", "coco", "voc")


def _coco_split_files(folder: str) -> dict[str, str]:
    """Roboflow's COCO export: train/, valid/ (or val/) and test/ folders holding one JSON each."""
    found = {}
    for split, names in (("train", ("train",)), ("val", ("valid", "val", "validation")), ("test", ("test",))):
        for name in names:
            jsons = sorted(glob.glob(os.path.join(glob.escape(os.path.join(folder, name)), "*.json")))
            if len(jsons) == 1 and split not in found:
                found[split] = jsons[0]
    return found


def detect_kind(path: str) -> str:
    """The dataset kind of `path`, one of `KINDS`.

    Raises:
        FileNotFoundError: nothing at `path`.
        ValueError: a file or folder of no kind known here, saying what was looked for.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"--data: {path} not found")
    lower = path.lower()
    if os.path.isfile(path):
        if lower.endswith((".yaml", ".yml")):
            return "yolo"
        if lower.endswith(".json"):
            return "coco"
        if lower.endswith(".xml"):
            raise ValueError(f"--data: {path} is one VOC XML file; give the folder that holds the XML files")
        return "keras-yolo3"
    if os.path.isfile(os.path.join(path, "data.yaml")) or os.path.isdir(os.path.join(path, "labels")):
        return "yolo"
    if any(os.path.isdir(os.path.join(path, s, "labels")) for s in ("train", "valid", "val")):
        return "yolo"
    if "train" in _coco_split_files(path):
        return "coco"
    if find_xml_dir(path) is not None:
        return "voc"
    raise ValueError(
        f"--data: {path} is no dataset kind known here: expected a keras-yolo3 annotation file, a data.yaml or "
        "a folder with images/ + labels/ (YOLO format), a COCO .json, or a folder of VOC XML files"
    )


@dataclass
class Dataset:
    """A dataset opened from `path`.

    Attributes:
        kind: one of `KINDS`.
        path: what `--data` named.
        class_names: the dataset's own class names, or None (keras-yolo3
            files and YOLO folders without names have none).
        splits: "train" and, when the dataset defines one, "val".
        record_dir: the folder of the records of what was read and scanned
            (`data.scan.cache_dir`), or None for none.
        write_record: whether this process writes them (the chief of several does).
    """

    kind: str
    path: str
    class_names: list[str] | None
    splits: dict[str, SplitRecords]
    record_dir: str | None = None
    write_record: bool = True

    def checked(self, split: str, num_classes: int, **options) -> CheckReport:
        """The dataset checker's report on one split (see `data.check.check_records`)."""
        options.setdefault("record_dir", self.record_dir)
        options.setdefault("write_record", self.write_record)
        report = check_records(self.splits[split], num_classes, **options)
        if self.kind != "keras-yolo3":
            report.entry_word = "images listed"
        return report


def _recorded(read, kind: str, path: str, options: dict, record_dir: str | None, write_record: bool):
    """`read()` -> (SplitRecords, names), through the record of `path` in `record_dir` when there is one.

    The record is keyed by the file's size and mtime, the reader's options
    and its version: any change to the file reads it again.
    """
    if record_dir is None:
        return read()
    source = os.path.abspath(path)
    record = record_path(record_dir, "records", {"kind": kind, "source": source, **options})
    key = {"kind": kind, "source": source, "stat": file_stat(path), **options}
    found = load_split_record(record, key)
    if found is not None:
        logger.info("%s: read from its record %s (%d images)", path, record, len(found[0].records))
        return found
    started = time.perf_counter()
    split, names = read()
    logger.info("%s: %d images read in %.1f s", path, len(split.records), time.perf_counter() - started)
    if write_record:
        try:
            save_split_record(record, split, names, key)
        except OSError as error:  # a read-only cache folder costs the next start time, not this run
            logger.warning("cannot write the record %s (%s): the next start reads %s again", record, error, path)
    return split, names


def open_dataset(
    path: str,
    *,
    image_dir: str | None = None,
    class_names: list[str] | None = None,
    root: str | None = None,
    record_dir: str | None = None,
    write_record: bool = True,
) -> Dataset:
    """Reads the dataset at `path`, whatever its kind.

    Args:
        path: see the module docstring.
        image_dir: COCO: the folder of the JSON's images (default: beside the
            JSON, else `images/` next to it).
        class_names: VOC: the class list (default: the object names of the XML files, sorted).
        root: keras-yolo3 files: folder of relative image paths.
        record_dir: the folder of records (`data.scan.cache_dir`): a COCO
            JSON or keras-yolo3 file already read is loaded from its record,
            and every split's image scan reuses its own; None: no records.
        write_record: write the records (the chief of several processes does;
            the others only read them).
    """
    kind = detect_kind(path)
    recorded = {"record_dir": record_dir, "write_record": write_record}
    if kind == "keras-yolo3":
        # Relative image paths resolve against the working directory too (`annotations.resolve_image_path`).
        options = {"root": root and os.path.abspath(root), "cwd": os.getcwd()}
        split, _ = _recorded(lambda: (read_annotation_file(path, root), None), kind, path, options, **recorded)
        return Dataset(kind, path, None, {"train": split}, **recorded)
    if kind == "yolo":
        splits, names = read_yolo_dataset(path)
        return Dataset(kind, path, names, splits, **recorded)
    if kind == "voc":
        splits, names = read_voc_dataset(path, class_names)
        return Dataset(kind, path, names, splits, **recorded)
    files = {"train": path} if os.path.isfile(path) else _coco_split_files(path)
    splits, names = {}, None
    options = {"image_dir": image_dir and os.path.abspath(image_dir)}
    for split, json_path in files.items():
        splits[split], split_names = _recorded(
            lambda json_path=json_path: read_coco_json(json_path, image_dir), kind, json_path, options, **recorded
        )
        if names is not None and split_names != names:
            raise ValueError(f"{json_path}: categories {split_names} differ from {files['train']}'s {names}")
        names = split_names
    return Dataset(kind, path, names, splits, **recorded)


def resolve_class_names(dataset: Dataset, classes_path: str | None) -> list[str]:
    """The run's class names: the dataset's and/or the `--classes` file's, which must agree.

    Raises:
        ValueError: neither names classes, or both do and differ (naming both).
    """
    from_file = get_classes(classes_path) if classes_path else None
    if dataset.class_names is None:
        if from_file is None:
            raise ValueError(f"--data {dataset.path} ({dataset.kind}) names no classes: pass --classes FILE")
        return from_file
    if from_file is not None and from_file != dataset.class_names:
        raise ValueError(
            f"--classes {classes_path} lists {from_file} but the dataset {dataset.path} names {dataset.class_names}; "
            "drop --classes to use the dataset's names, or fix one of them"
        )
    return list(dataset.class_names)
