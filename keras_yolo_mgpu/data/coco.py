"""COCO instances JSON to keras-yolo3 annotation lines.

    python coco_annotation.py --instances annotations/instances_train2017.json \\
        --image-dir train2017 --output train.txt

Class ids: COCO numbers its 80 categories with ids from 1 to 90 (11 ids
unused); the model wants 0..79. The mapping is derived from the JSON itself:
the categories sorted by id get indices 0, 1, 2, ... (so it also works for
other COCO-format datasets). Where the JSON's names and the classes file's
names are the same word (default ``model_data/coco_classes.txt``, which
spells six classes the VOC way, e.g. ``motorbike``), they must sit at the
same index, otherwise the conversion stops: that catches a classes file in
another order, which would silently train every box under the wrong name.

Boxes: ``[x, y, width, height]`` becomes ``x, y, x + width, y + height``
(rounded to 1/1000 px); crowd regions (``iscrowd: 1``) and boxes of zero
size are skipped; images left without boxes are left out unless
``--keep-empty``. Image paths are ``--image-dir`` joined with ``file_name``.

``python coco_annotation.py`` without flags writes keras-yolo3's own lines
instead (:func:`keras_yolo3_coco_lines`).
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Sequence

import numpy as np

from keras_yolo_mgpu.data.annotations import format_annotation_line

logger = logging.getLogger(__name__)

#: COCO's 80 category ids in class-index order: keras-yolo3's coco_annotation.py maps id
#: `COCO_CATEGORY_IDS[i]` to class i (its if/elif chain of offsets), the order of model_data/coco_classes.txt.
COCO_CATEGORY_IDS = (
    *range(1, 12),
    *range(13, 26),
    27,
    28,
    *range(31, 45),
    *range(46, 66),
    67,
    70,
    *range(72, 83),
    *range(84, 91),
)


def category_mapping(categories: Sequence[dict]) -> tuple[dict, list[str]]:
    """Maps COCO category ids to contiguous class indices.

    Args:
        categories: the JSON's ``categories`` list (``id``, ``name``).

    Returns:
        ``(id_to_index, names)``: categories sorted by id get 0, 1, ...;
        ``names[index]`` is the category name.

    Raises:
        ValueError: duplicate category ids.
    """
    ordered = sorted(categories, key=lambda c: int(c["id"]))
    ids = [int(c["id"]) for c in ordered]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate category ids in the JSON")
    return {cid: i for i, cid in enumerate(ids)}, [str(c["name"]) for c in ordered]


def check_class_order(
    json_names: Sequence[str], file_names: Sequence[str], source: str = "classes file", *, strict: bool = True
) -> None:
    """Checks that names present in both lists have the same index.

    Names found in only one list (``motorcycle`` vs ``motorbike``) cannot be
    checked and are logged.

    Args:
        strict: a different number of classes is an error. Without it
            (the default classes file against some other dataset) lists of
            different lengths are not compared at all.

    Raises:
        ValueError: a shared name at different indices, or (``strict``)
            different class counts.
    """
    if not strict and len(json_names) != len(file_names):
        logger.info(
            "The JSON has %d categories, %s %d: a different dataset, class order not checked",
            len(json_names),
            source,
            len(file_names),
        )
        return
    file_index = {name: i for i, name in enumerate(file_names)}
    shared = [name for name in json_names if name in file_index]
    if not shared:
        logger.info("No class name in common with %s: class order not checked", source)
        return
    moved = [
        (name, i, file_index[name]) for i, name in enumerate(json_names) if name in file_index and file_index[name] != i
    ]
    if moved:
        details = ", ".join(f"{name!r} is {i} in the JSON but {j} in {source}" for name, i, j in moved[:5])
        raise ValueError(
            f"the JSON's categories (sorted by id) and {source} disagree on the class order: {details}"
            + (f" (and {len(moved) - 5} more)" if len(moved) > 5 else "")
        )
    if len(json_names) != len(file_names):
        raise ValueError(f"the JSON has {len(json_names)} categories but {source} lists {len(file_names)} classes")
    differ = [(i, a, file_names[i]) for i, a in enumerate(json_names) if a not in file_index]
    if differ:
        logger.info(
            "%d of %d class names match %s by position; differently spelt: %s",
            len(shared),
            len(json_names),
            source,
            ", ".join(f"{i}: {a}/{b}" for i, a, b in differ),
        )


def coco_lines(
    instances: dict,
    image_dir: str,
    *,
    class_names: Sequence[str] | None = None,
    classes_source: str = "classes file",
    strict: bool = True,
    keep_empty: bool = False,
) -> tuple[list[str], list[str]]:
    """Annotation lines for a loaded COCO instances JSON.

    Args:
        instances: the parsed JSON (``images``, ``annotations``, ``categories``).
        image_dir: folder joined with each image's ``file_name``.
        class_names: when given, checked with :func:`check_class_order`
            (``strict`` is passed on).
        keep_empty: also write images without (non-crowd) boxes.

    Returns:
        ``(lines, names)``: lines in the JSON's image order, and the class
        names by index.
    """
    id_to_index, names = category_mapping(instances.get("categories", []))
    if class_names is not None:
        check_class_order(names, class_names, classes_source, strict=strict)
    boxes_by_image = collections.defaultdict(list)
    skipped = collections.Counter()
    for ann in instances.get("annotations", []):
        if ann.get("iscrowd", 0):
            skipped["crowd"] += 1
            continue
        if ann["category_id"] not in id_to_index:
            raise ValueError(f"annotation {ann.get('id')} has category_id {ann['category_id']} not in the categories")
        x, y, w, h = (float(v) for v in ann["bbox"])
        if w <= 0 or h <= 0:
            skipped["zero-size"] += 1
            continue
        boxes_by_image[ann["image_id"]].append(
            [round(x, 3), round(y, 3), round(x + w, 3), round(y + h, 3), id_to_index[ann["category_id"]]]
        )
    lines = []
    empty = 0
    for image in instances.get("images", []):
        boxes = boxes_by_image.get(image["id"], [])
        if not boxes:
            empty += 1
            if not keep_empty:
                continue
        lines.append(
            format_annotation_line(os.path.join(image_dir, image["file_name"]), np.array(boxes).reshape(-1, 5))
        )
    logger.info(
        "%d images written, %d without boxes %s; skipped %d crowd and %d zero-size boxes",
        len(lines),
        empty,
        "kept" if keep_empty else "left out",
        skipped["crowd"],
        skipped["zero-size"],
    )
    return lines, names


def keras_yolo3_coco_lines(instances: dict, image_dir: str) -> list[str]:
    """The lines keras-yolo3's coco_annotation.py writes for a loaded instances JSON.

    Its rules, not :func:`coco_lines`': one line per image that has any
    annotation, in the order of each image's first annotation, with the path
    ``image_dir/<image_id as %012d>.jpg``; every annotation, crowd regions
    and zero-size boxes included, as ``int(x), int(y), int(x) + int(w),
    int(y) + int(h)`` (up to 2 px smaller than the box); class ids from
    :data:`COCO_CATEGORY_IDS`.

    Args:
        instances: the parsed JSON (only ``annotations`` is read).
        image_dir: written before each file name as given
            (keras-yolo3: ``mscoco2017/train2017``).

    Returns:
        The lines, without newlines.

    Raises:
        ValueError: a category id outside COCO's 80 (keras-yolo3 would
            write it unchanged, as a wrong class id).
    """
    index = {category_id: i for i, category_id in enumerate(COCO_CATEGORY_IDS)}
    boxes_by_image: dict[int, list[list[int]]] = {}
    for ann in instances.get("annotations", []):
        category_id = int(ann["category_id"])
        if category_id not in index:
            raise ValueError(
                f"annotation {ann.get('id')} has category_id {category_id}, not one of COCO's 80 that keras-yolo3's "
                "fixed class table maps: convert this JSON with --instances, --image-dir and --output (classes from "
                "its categories)"
            )
        x, y, w, h = ann["bbox"]
        x_min, y_min = int(x), int(y)
        boxes_by_image.setdefault(int(ann["image_id"]), []).append(
            [x_min, y_min, x_min + int(w), y_min + int(h), index[category_id]]
        )
    lines = [
        format_annotation_line(os.path.join(image_dir, f"{image_id:012d}.jpg"), np.array(boxes).reshape(-1, 5))
        for image_id, boxes in boxes_by_image.items()
    ]
    logger.info("%d images written, as keras-yolo3's coco_annotation.py", len(lines))
    return lines
