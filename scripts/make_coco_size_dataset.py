#!/usr/bin/env python3
"""Writes a COCO-size detection dataset (a COCO instances JSON) with a few planted bad files.

COCO train2017's shape: 118,287 images of 640x480 and 7 boxes each (828,009
boxes), 80 categories. To keep the disk use small, only `--distinct` JPEGs
are encoded (photo-like, `make_bench_images.make_image`, about 60-90 KB each)
and every listed image is a hard link (`os.link`) to one of them: the
headers, sizes and modification times a scan reads are those of real files,
while 118,287 names cost the disk a few hundred files. (A full decode reads
the same few hundred files from the page cache, so decode timings on this set
are a lower bound.)

Planted among the listed images, each named once by `check_dataset`:

    planted_truncated.jpg      a JPEG cut in half: no end-of-image marker (decoded as far as it goes, with a warning)
    planted_zero_bytes.jpg     an empty file (unreadable: skipped)
    planted_not_an_image.jpg   text with a .jpg name (unreadable: skipped)
    planted_missing.jpg        listed in the JSON, absent from the folder (skipped)
    planted_label_outside.jpg  a valid image whose last box reaches past its right edge (clipped)

    python scripts/make_coco_size_dataset.py --out /tmp/coco_size          # 118,287 images
    python scripts/make_coco_size_dataset.py --out /tmp/coco_small --images 40 --distinct 4
    # -> OUT/train.json, OUT/images/000000000001.jpg ..., OUT/sources/ (the distinct files)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
from PIL import Image

# The encoder of photo-like JPEGs lives beside this script.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_bench_images import HEIGHT, WIDTH, make_image  # noqa: E402

PLANTED = (
    "planted_truncated.jpg",
    "planted_zero_bytes.jpg",
    "planted_not_an_image.jpg",
    "planted_missing.jpg",
    "planted_label_outside.jpg",
)


def _random_boxes(rng: np.random.Generator, count: int) -> np.ndarray:
    """(count, 4) COCO [x, y, width, height] boxes inside a 640x480 image, whole pixels."""
    width = rng.integers(8, WIDTH // 2, count)
    height = rng.integers(8, HEIGHT // 2, count)
    x = rng.integers(0, WIDTH - width)
    y = rng.integers(0, HEIGHT - height)
    return np.stack([x, y, width, height], axis=1)


def _plant(images_dir: str, sources: list[str]) -> None:
    with open(sources[0], "rb") as f:
        data = f.read()
    with open(os.path.join(images_dir, "planted_truncated.jpg"), "wb") as f:
        f.write(data[: len(data) // 2])
    open(os.path.join(images_dir, "planted_zero_bytes.jpg"), "wb").close()
    with open(os.path.join(images_dir, "planted_not_an_image.jpg"), "w", encoding="utf-8") as f:
        f.write("this is not an image\n")
    os.link(sources[0], os.path.join(images_dir, "planted_label_outside.jpg"))


def make_dataset(out: str, num_images: int, num_distinct: int, boxes_per_image: int, num_classes: int, seed: int):
    """Writes the dataset under `out` (see the module docstring); returns the JSON's path."""
    if num_images < len(PLANTED) + 1 or num_distinct < 1:
        raise ValueError(f"--images must be at least {len(PLANTED) + 1} and --distinct at least 1")
    rng = np.random.default_rng(seed)
    images_dir = os.path.join(out, "images")
    sources_dir = os.path.join(out, "sources")
    os.makedirs(images_dir)
    os.makedirs(sources_dir)
    sources = []
    for index in range(num_distinct):
        pixels, _ = make_image(rng, num_classes, 6)
        sources.append(os.path.join(sources_dir, f"source_{index:04d}.jpg"))
        Image.fromarray(pixels).save(sources[-1], quality=90)
    names = [f"{i:012d}.jpg" for i in range(1, num_images - len(PLANTED) + 1)] + list(PLANTED)
    for index, name in enumerate(names[: -len(PLANTED)]):
        os.link(sources[index % num_distinct], os.path.join(images_dir, name))
    _plant(images_dir, sources)

    boxes = _random_boxes(rng, num_images * boxes_per_image).reshape(num_images, boxes_per_image, 4)
    classes = rng.integers(1, num_classes + 1, (num_images, boxes_per_image))
    outside = names.index("planted_label_outside.jpg")
    boxes[outside, -1] = [WIDTH - 40, 10, 100, 50]  # x + width = 700 > 640
    images, annotations = [], []
    for image_id, name in enumerate(names, start=1):
        images.append({"id": image_id, "file_name": name, "width": WIDTH, "height": HEIGHT})
        for box, category in zip(boxes[image_id - 1].tolist(), classes[image_id - 1].tolist()):
            annotations.append(
                {"id": len(annotations) + 1, "image_id": image_id, "category_id": category, "bbox": box,
                 "area": box[2] * box[3], "iscrowd": 0}
            )  # fmt: skip
    categories = [{"id": i, "name": f"class_{i:02d}"} for i in range(1, num_classes + 1)]
    json_path = os.path.join(out, "train.json")
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, f)
    return json_path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder (must not exist)")
    parser.add_argument("--images", type=int, default=118_287, help="images listed (default: 118,287, COCO train2017)")
    parser.add_argument("--distinct", type=int, default=300, help="distinct JPEG files behind them (default: 300)")
    parser.add_argument("--boxes-per-image", type=int, default=7, help="default: 7 (828,009 boxes in all)")
    parser.add_argument("--num-classes", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if os.path.exists(args.out):
        parser.error(f"--out {args.out} exists: give a new folder")
    try:
        json_path = make_dataset(
            args.out, args.images, args.distinct, args.boxes_per_image, args.num_classes, args.seed
        )
    except ValueError as error:
        parser.error(str(error))
    print(f"wrote {json_path}: {args.images} images ({args.distinct} distinct files), "
          f"{args.images * args.boxes_per_image} boxes; planted: {', '.join(PLANTED)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
