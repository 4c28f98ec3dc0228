"""COCO instances JSON (COCO itself, Roboflow's `_annotations.coco.json`, CVAT, Label Studio exports).

Images are looked up, for each `file_name`, in `--image-dir` when given,
else beside the JSON, else in `images/` next to it. Categories sorted by id
become class indices 0, 1, ... (`data.coco.category_mapping`); their names
are the dataset's class names. Roboflow's placeholder category (the
dataset's name, supercategory of every class, used by no annotation) is
left out. Crowd regions are left out, as keras-yolo3's
COCO converter does. Each image is one record whose `source` names the
JSON and the image id, so a problem reads `instances.json[image 7]: ...`.
A bbox under 1 px wide or high is left out on its own (the image stays);
an image no annotation names counts as unlabelled (`data.check`).
"""

from __future__ import annotations

import json
import logging
import math
import os

import numpy as np

from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.data.check import DROPPED, degenerate_box_reason
from keras_yolo_mgpu.data.coco import category_mapping
from keras_yolo_mgpu.data.formats.records import Problem, SplitRecords, pixel_box_rounding, recorded_size

logger = logging.getLogger(__name__)

__all__ = ["find_image_dir", "read_coco_json"]


def find_image_dir(json_path: str, file_names: list[str], image_dir: str | None = None) -> str:
    """The folder holding the JSON's images: `image_dir`, beside the JSON, or `images/` next to it."""
    if image_dir is not None:
        return image_dir
    folder = os.path.dirname(os.path.abspath(json_path))
    candidates = [folder, os.path.join(folder, "images")]
    sample = file_names[: min(len(file_names), 20)]
    for candidate in candidates:
        if sample and any(os.path.isfile(os.path.join(candidate, name)) for name in sample):
            return candidate
    if not sample:
        return folder
    raise FileNotFoundError(
        f"{json_path}: none of its images (e.g. {sample[0]}) is in {' or '.join(candidates)}; pass --image-dir"
    )


def _box(ann: dict) -> tuple[list[float] | None, str | None, str | None]:
    """COCO [x, y, w, h] -> ([x1, y1, x2, y2], None, None) or (None, kind, message)."""
    bbox = ann.get("bbox")
    if not isinstance(bbox, list) or len(bbox) != 4:
        return None, "malformed", f"bbox {bbox!r} is not [x, y, width, height]"
    try:
        x, y, w, h = (float(v) for v in bbox)
    except (TypeError, ValueError):
        return None, "malformed", f"bbox {bbox!r} holds a value that is not a number"
    if not all(math.isfinite(v) for v in (x, y, w, h)):
        return None, "malformed", f"bbox {bbox!r} is not finite"
    reason = degenerate_box_reason([x, y, x + w, y + h])
    if reason:
        return None, "degenerate-box", f"bbox {bbox!r}: {reason}; {DROPPED}"
    return [x, y, x + w, y + h], None, None


def _without_placeholder(categories: list[dict], annotations: list[dict], json_path: str) -> list[dict]:
    """`categories` without Roboflow's placeholder: the supercategory of all the others, which no annotation uses.

    Roboflow's COCO export writes the dataset's name as category 0
    (`supercategory: none`) and every real class under it; kept, it would be
    a class that never has a box.
    """
    used = {ann.get("category_id") for ann in annotations}
    for category in categories:
        rest = [c for c in categories if c is not category]
        heads_all = bool(rest) and all(c.get("supercategory") == category.get("name") for c in rest)
        if heads_all and category.get("id") not in used:
            logger.info(
                "%s: category %s (%r) is the supercategory of all the others and no annotation uses it "
                "(Roboflow's export writes one): not a class",
                json_path,
                category.get("id"),
                category.get("name"),
            )
            return rest
    return categories


def read_coco_json(json_path: str, image_dir: str | None = None) -> tuple[SplitRecords, list[str]]:
    """(the JSON's images as one split, class names by index)."""
    try:
        with open(json_path, encoding="utf-8") as handle:
            instances = json.load(handle)
    except json.JSONDecodeError as error:
        raise ValueError(f"{json_path}: not valid JSON: {error}") from None
    categories = _without_placeholder(instances.get("categories", []), instances.get("annotations", []), json_path)
    id_to_index, names = category_mapping(categories)
    images = instances.get("images", [])
    folder = find_image_dir(json_path, [str(i.get("file_name", "")) for i in images], image_dir)
    by_image: dict = {image["id"]: [] for image in images}
    split = SplitRecords(source=json_path, num_entries=len(images))
    bad_images: set = set()
    for ann in instances.get("annotations", []):
        where = f"{json_path}[image {ann.get('image_id')}]"
        if ann.get("image_id") not in by_image:
            split.problems.append(
                Problem(
                    json_path, 0, "label-without-image", f"annotation {ann.get('id')}: no image {ann.get('image_id')}"
                )
            )
            continue
        if ann.get("iscrowd", 0):
            continue
        box, kind, message = _box(ann)
        if kind is None and ann.get("category_id") not in id_to_index:
            kind, message = "class-out-of-range", f"category_id {ann.get('category_id')} is not in the categories"
        if kind:
            split.problems.append(Problem(where, 0, kind, f"annotation {ann.get('id')}: {message}"))
            if kind != "degenerate-box":  # that box alone is left out
                bad_images.add(ann["image_id"])
            continue
        by_image[ann["image_id"]].append([*(pixel_box_rounding(v) for v in box), id_to_index[ann["category_id"]]])
    for image in images:
        if image["id"] in bad_images:
            continue
        boxes = np.array(by_image[image["id"]], np.float32).reshape(-1, 5)
        path = os.path.join(folder, str(image["file_name"]))
        recorded = recorded_size(image.get("width"), image.get("height"))
        where = f"{json_path}[image {image['id']}]"
        split.records.append(Annotation(os.path.abspath(path), boxes, where, 0, recorded_size=recorded))
    annotations = instances.get("annotations", [])
    annotated = {ann.get("image_id") for ann in annotations}
    unlabelled = [image for image in images if image["id"] not in annotated]
    split.num_unlabelled = len(unlabelled)
    if images:
        example = (unlabelled or images)[0]
        split.labels_looked_for = (
            f"in the {len(annotations)} annotations of {json_path}, by image_id, "
            f"e.g. for image {example['id']} ({example.get('file_name')})"
        )
    return split, names
