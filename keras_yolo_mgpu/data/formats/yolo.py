"""YOLO-format datasets (ultralytics, Roboflow, CVAT exports).

    data.yaml               path: .  train: images/train  val: images/val  names: [cat, dog]
    images/train/a.jpg      labels/train/a.txt: one `class cx cy w h` line per box, normalised to [0, 1]
                            (or a polygon, `class x1 y1 x2 y2 x3 y3 ...`: the box around it)

An image's label file is its path with the last `images` folder replaced by
`labels` and the extension by `.txt`; an image without one is a background
image, counted as unlabelled (`data.check`; an empty label file is a
background on purpose). `train` / `val` may each be a folder of images, a
text file listing image paths, or a list of those.
Relative paths resolve against `path` (itself relative to the YAML's
folder; the YAML's folder when `path` is no folder here, as in a dataset
copied from another machine), else the YAML's folder; Roboflow's `../train/images` is also tried
without its `../`, as ultralytics does. `names` is a list or a
`{index: name}` mapping. Labels are normalised to the image as displayed,
EXIF orientation applied (ultralytics' convention), which is how every
command reads images (`data.images`).

A folder without `data.yaml` is read as `images/` + `labels/`, with
`train/` and `val/` (or `valid/`) sub-folders when it has them (under
`images/`, or Roboflow's `train/images`); class names then come from a
`classes.txt` or `obj.names` beside them, else from `--classes`.
"""

from __future__ import annotations

import glob
import logging
import math
import os

import numpy as np
import yaml

from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.data.check import DROPPED, degenerate_box_reason
from keras_yolo_mgpu.data.formats.records import Problem, SplitRecords, is_image_file, pixel_box_rounding
from keras_yolo_mgpu.data.images import image_size

logger = logging.getLogger(__name__)

__all__ = ["label_path_for", "read_yolo_dataset", "read_yolo_split"]

SPLIT_KEYS = {"train": ("train",), "val": ("val", "valid", "validation"), "test": ("test",)}
NAMES_FILES = ("classes.txt", "obj.names", "names.txt")


def label_path_for(image_path: str) -> str:
    """`.../images/train/a.jpg` -> `.../labels/train/a.txt` (the last `images` folder becomes `labels`)."""
    parts = os.path.normpath(image_path).split(os.sep)
    for index in range(len(parts) - 2, -1, -1):
        if parts[index] == "images":
            parts[index] = "labels"
            break
    return os.path.splitext(os.sep.join(parts))[0] + ".txt"


def _parse_label_line(text: str, names_count: int | None) -> tuple[list[float] | None, str | None, str | None]:
    """`class cx cy w h`, or a polygon, -> ([class, cx, cy, w, h], None, None) or (None, problem kind, message).

    A segmentation label, `class x1 y1 x2 y2 x3 y3 ...` (three points or
    more, normalised), gives the box around its points, as ultralytics
    trains detection on segmentation datasets.
    """
    fields = text.split()
    if len(fields) != 5 and (len(fields) < 7 or len(fields) % 2 == 0):
        expected = "expected 5: class cx cy w h (normalised), or a polygon: class x1 y1 x2 y2 x3 y3 ..."
        return None, "malformed", f"{len(fields)} fields, {expected}"
    try:
        values = [float(f) for f in fields]
    except ValueError:
        return None, "malformed", f"not a number in {text.strip()!r}"
    if not all(math.isfinite(v) for v in values) or values[0] != int(values[0]) or values[0] < 0:
        return None, "malformed", f"class id {fields[0]!r} is not a non-negative integer"
    if names_count is not None and values[0] >= names_count:
        return None, "class-out-of-range", f"class id {int(values[0])} not in [0, {names_count}) (the dataset's names)"
    if any(not 0.0 <= v <= 1.0 for v in values[1:]):
        shown = " ".join(fields[1:]) if len(fields) == 5 else "of the polygon"
        return None, "box-outside-image", f"coordinates {shown} outside [0, 1] (not normalised?)"
    if len(fields) > 5:
        xs, ys = values[1::2], values[2::2]
        x1, y1, x2, y2 = min(xs), min(ys), max(xs), max(ys)
        values = [values[0], (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]
    return values, None, None  # a zero width or height: `degenerate_box_reason`, in pixels


# Labels are written with a few decimals, so a box that touches the image's edge can sum past it:
# 0.941838 + 0.116325 / 2 = 1.0000005 (a Roboflow export of a kangaroo photo, 1023 px wide). A corner within
# this of an edge (0.4 px of a 4000-pixel photo) is on it; ultralytics, which checks each value alone, takes it too.
EDGE_ROUNDING = 1e-4


def _on_the_image(corner: float) -> float:
    """A normalised corner coordinate, past an edge by no more than `EDGE_ROUNDING` put on it."""
    if -EDGE_ROUNDING <= corner < 0.0:
        return 0.0
    return 1.0 if 1.0 < corner <= 1.0 + EDGE_ROUNDING else corner


def _read_label_file(label_path: str, image_path: str, names_count: int | None):
    """(Annotation or None, problems) for one image and its label file.

    The labels are normalised to the image as displayed (EXIF orientation
    applied, `data.images.image_size`); the record carries that size as its
    `recorded_size`. A degenerate box is left out on its own (reported on
    its line); any other problem leaves the image out.
    """
    if not os.path.isfile(label_path):
        return Annotation(image_path, np.zeros((0, 5), np.float32), label_path, 0), []
    problems, rows = [], []
    with open(label_path, encoding="utf-8-sig") as handle:
        lines = [(number, line) for number, line in enumerate(handle, start=1) if line.strip()]
    for index, (number, line) in enumerate(lines, start=1):
        values, kind, message = _parse_label_line(line, names_count)
        if kind:
            problems.append(Problem(label_path, number, kind, f"{message} (image {image_path})"))
        else:
            rows.append((index, number, line.strip(), values))
    if problems:
        return None, problems
    boxes, size = [], None
    if rows:
        try:
            size = width, height = image_size(image_path)  # the header only: normalised -> pixels
        except Exception as error:  # noqa: BLE001 - the checker reports the image itself
            return None, _unreadable(image_path, error)
        for index, number, text, (c, cx, cy, w, h) in rows:
            x1, y1, x2, y2 = (_on_the_image(v) for v in (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))
            box = [*(pixel_box_rounding(v) for v in (x1 * width, y1 * height, x2 * width, y2 * height)), c]
            reason = degenerate_box_reason(box, (width, height))
            if reason:
                message = f"box {index} ({text}): {reason}; {DROPPED} (image {image_path})"
                problems.append(Problem(label_path, number, "degenerate-box", message))
            else:
                boxes.append(box)
    # Line 1: the checker's "box N" then counts the label file's boxes.
    boxes = np.array(boxes, np.float32).reshape(-1, 5)
    return Annotation(image_path, boxes, label_path, 1, recorded_size=size), problems


def _unreadable(image_path: str, error: Exception) -> list[Problem]:
    return [Problem(image_path, 0, "unreadable-image", f"unreadable image: {type(error).__name__}: {error}")]


def _list_images(entry: str) -> list[str]:
    """Image paths of a split entry: a folder (searched recursively) or a text file of paths."""
    if os.path.isdir(entry):
        found = glob.glob(os.path.join(glob.escape(entry), "**", "*"), recursive=True)
        return sorted(os.path.abspath(p) for p in found if is_image_file(p) and os.path.isfile(p))
    base = os.path.dirname(os.path.abspath(entry))
    with open(entry, encoding="utf-8-sig") as handle:
        listed = [line.strip() for line in handle if line.strip()]
    return [p if os.path.isabs(p) else os.path.normpath(os.path.join(base, p)) for p in listed]


def _orphan_labels(image_paths: list[str]) -> list[Problem]:
    """Label files in the split's label folders that no image of the split points to."""
    expected = {label_path_for(p) for p in image_paths}
    folders = {os.path.dirname(p) for p in expected if os.path.isdir(os.path.dirname(p))}
    orphans = []
    for folder in sorted(folders):
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if name.endswith(".txt") and path not in expected and name not in NAMES_FILES:
                orphans.append(Problem(path, 0, "label-without-image", "label file without an image"))
    return orphans


def _labels_looked_for(image_path: str) -> str:
    """How `label_path_for` found (or did not find) the label of `image_path`, for `data.check`'s messages."""
    label = label_path_for(image_path)
    if "images" not in os.path.normpath(image_path).split(os.sep)[:-1]:
        return f"beside each image, extension .txt (no images/ folder in its path to become labels/), e.g. {label}"
    return f"at each image's path with its last images/ folder -> labels/ and the extension .txt, e.g. {label}"


def read_yolo_split(entries: list[str], names_count: int | None, source: str) -> SplitRecords:
    """Every image of `entries` (folders or path lists) with its boxes in pixels."""
    split = SplitRecords(source=source)
    image_paths = [path for entry in entries for path in _list_images(entry)]
    split.num_entries = len(image_paths)
    unlabelled = []
    for image_path in image_paths:
        if not os.path.isfile(image_path):
            split.problems.append(Problem(image_path, 0, "missing-file", f"image not found: {image_path}"))
            continue
        label_path = label_path_for(image_path)
        if not os.path.isfile(label_path):
            unlabelled.append(image_path)
        record, problems = _read_label_file(label_path, image_path, names_count)
        split.problems += problems
        if record is not None:
            split.records.append(record)
    split.problems += _orphan_labels(image_paths)
    split.num_unlabelled = len(unlabelled)
    if image_paths:
        split.labels_looked_for = _labels_looked_for((unlabelled or image_paths)[0])
    return split


def _names_from_yaml(value, source: str) -> list[str]:
    if isinstance(value, dict):
        keys = sorted(int(k) for k in value)
        if keys != list(range(len(keys))):
            raise ValueError(f"{source}: names' indices must be 0..{len(keys) - 1}, got {keys}")
        return [str(value[k] if k in value else value[str(k)]) for k in keys]
    if isinstance(value, list):
        return [str(v) for v in value]
    raise ValueError(f"{source}: names must be a list or an index: name mapping, got {type(value).__name__}")


def _resolve_entry(entry: str, base: str, yaml_path: str, key: str) -> str:
    candidates = [entry] if os.path.isabs(entry) else [os.path.join(base, entry)]
    stripped = entry
    while stripped.startswith("../"):  # Roboflow writes ../train/images beside data.yaml
        stripped = stripped[3:]
        candidates.append(os.path.join(base, stripped))
    for candidate in candidates:
        if os.path.exists(candidate):
            return os.path.normpath(candidate)
    raise FileNotFoundError(f"{yaml_path}: {key}: {entry} not found (looked in {', '.join(candidates)})")


def _read_yaml(yaml_path: str) -> dict:
    try:
        with open(yaml_path, encoding="utf-8") as handle:
            config = yaml.safe_load(handle)
    except yaml.YAMLError as error:
        raise ValueError(f"{yaml_path}: not valid YAML: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{yaml_path}: expected a mapping with train, val and names")
    return config


def _yaml_splits(yaml_path: str) -> tuple[dict[str, list[str]], list[str] | None]:
    config = _read_yaml(yaml_path)
    folder = os.path.dirname(os.path.abspath(yaml_path))
    base = os.path.join(folder, str(config["path"])) if config.get("path") else folder
    if not os.path.isdir(base):  # a dataset moved from the machine that wrote it (e.g. /content/... on Colab)
        logger.warning("%s: path %s is no folder here: reading the splits from the YAML's own folder", yaml_path, base)
        base = folder
    names = _names_from_yaml(config["names"], yaml_path) if "names" in config else None
    if names is not None and "nc" in config and int(config["nc"]) != len(names):
        raise ValueError(f"{yaml_path}: nc is {config['nc']} but names lists {len(names)} classes")
    splits = {}
    for split, keys in SPLIT_KEYS.items():
        key = next((k for k in keys if config.get(k)), None)
        if key is None:
            continue
        value = config[key]
        entries = value if isinstance(value, list) else [value]
        try:
            splits[split] = [_resolve_entry(str(e), base, yaml_path, key) for e in entries]
        except FileNotFoundError as error:
            if split != "test":  # training and its validation never read the test split
                raise
            # Roboflow's data.yaml names ../test/images whether or not the export has that folder (as ultralytics, a
            # missing test split matters only to a command that asks for it, which then says it has none).
            logger.warning("%s; the dataset is read without a test split", error)
    if "train" not in splits:
        raise ValueError(f"{yaml_path}: no train entry")
    return splits, names


def _folder_splits(folder: str) -> tuple[dict[str, list[str]], list[str] | None]:
    """images/ + labels/ folders, with train / val sub-folders when present."""
    splits = {}
    for split, keys in SPLIT_KEYS.items():
        for key in keys:
            for candidate in (os.path.join(folder, "images", key), os.path.join(folder, key, "images")):
                if os.path.isdir(candidate) and split not in splits:
                    splits[split] = [candidate]
    if "train" not in splits:
        splits = {"train": [os.path.join(folder, "images")]}
    names = None
    for name in NAMES_FILES:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8-sig") as handle:
                names = [line.strip() for line in handle if line.strip()]
            break
    return splits, names


def read_yolo_dataset(path: str) -> tuple[dict[str, SplitRecords], list[str] | None]:
    """`({"train": ..., "val": ...}, class names or None)` of a data.yaml or a YOLO-format folder."""
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "data.yaml")):
        path = os.path.join(path, "data.yaml")
    splits, names = _yaml_splits(path) if os.path.isfile(path) else _folder_splits(path)
    count = len(names) if names is not None else None
    return {split: read_yolo_split(entries, count, path) for split, entries in splits.items()}, names
