#!/usr/bin/env python3
"""Writes N synthetic 640x480 JPEGs and a keras-yolo3 annotation file.

The images are photo-like for the JPEG decoder (smooth gradients, filled
shapes, sensor-like noise; about 60-90 KB each at quality 90) so that decode
times are close to real 640x480 photos; each shape's bounding box is written
as a box, so augmentation and targets do real work too.

    python scripts/make_bench_images.py --out /tmp/bench_images --num 256
    # -> /tmp/bench_images/img_00000.jpg ... and /tmp/bench_images/train.txt
    #    (paths relative to the annotation file's folder)
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from PIL import Image

from keras_yolo_mgpu.data.annotations import format_annotation_line

WIDTH, HEIGHT = 640, 480


def make_image(rng: np.random.Generator, num_classes: int, max_objects: int) -> tuple[np.ndarray, list[tuple]]:
    """One (480, 640, 3) uint8 image and its boxes [(x1, y1, x2, y2, class), ...]."""
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    start, end = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    angle = rng.uniform(0, np.pi)
    t = (np.cos(angle) * xx / WIDTH + np.sin(angle) * yy / HEIGHT + 1.0) / 3.0
    image = start + (end - start) * t[..., None]  # (H, W, 3) gradient background
    boxes = []
    for _ in range(rng.integers(1, max_objects + 1)):
        w, h = rng.integers(16, WIDTH // 2), rng.integers(16, HEIGHT // 2)
        x1, y1 = rng.integers(0, WIDTH - w), rng.integers(0, HEIGHT - h)
        color = rng.uniform(0, 255, 3)
        region = image[y1 : y1 + h, x1 : x1 + w]
        if rng.random() < 0.5:  # ellipse
            ey, ex = np.mgrid[0:h, 0:w]
            inside = ((ex - w / 2) / (w / 2)) ** 2 + ((ey - h / 2) / (h / 2)) ** 2 <= 1
            region[inside] = color
        else:  # rectangle with stripes for some texture
            stripes = (np.arange(w) // rng.integers(2, 12)) % 2
            region[:] = color * (0.8 + 0.2 * stripes)[None, :, None]
        boxes.append((int(x1), int(y1), int(x1 + w), int(y1 + h), int(rng.integers(0, num_classes))))
    image += rng.normal(0, 6, image.shape)  # sensor-like noise: real photos are not flat
    return np.clip(image, 0, 255).astype(np.uint8), boxes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder (created)")
    parser.add_argument("--num", type=int, default=256, help="number of images (default: 256)")
    parser.add_argument("--num-classes", type=int, default=20, help="class ids drawn from [0, N) (default: 20, VOC)")
    parser.add_argument("--max-objects", type=int, default=6, help="objects per image, 1..N (default: 6)")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality (default: 90)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--annotations", default="train.txt", help="annotation file name inside --out (default: train.txt)"
    )
    args = parser.parse_args(argv)
    if args.num <= 0:
        parser.error("--num must be positive")

    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    lines = []
    for index in range(args.num):
        pixels, boxes = make_image(rng, args.num_classes, args.max_objects)
        name = f"img_{index:05d}.jpg"
        Image.fromarray(pixels).save(os.path.join(args.out, name), quality=args.quality)
        lines.append(format_annotation_line(name, boxes))
    annotation_path = os.path.join(args.out, args.annotations)
    with open(annotation_path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.num} images and {annotation_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
