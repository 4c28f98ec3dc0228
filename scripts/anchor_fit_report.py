#!/usr/bin/env python3
"""docs/training.md's anchor rows: how well an anchors file, and k-means anchors, fit a dataset's boxes.

Prints best possible recall (YOLOv5's AutoAnchor definition) and mean best
IoU at the input size for the given anchors and for the anchors
`--anchors auto` would fit (training/anchor_fit.py). Usage:

    .venv/bin/python scripts/anchor_fit_report.py train.txt [--anchors model_data/tiny_yolo_anchors.txt] \
        [--masks '3,4,5 1,2,3'] [--input-size 320]
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("annotations")
    parser.add_argument("--anchors", default="model_data/tiny_yolo_anchors.txt")
    parser.add_argument("--masks", default="3,4,5 1,2,3", help="anchor indices per scale (default: tiny YOLOv3's)")
    parser.add_argument("--input-size", type=int, default=320)
    args = parser.parse_args(argv)

    from keras_yolo_mgpu.cli.args import masks_arg
    from keras_yolo_mgpu.data.annotations import read_annotations
    from keras_yolo_mgpu.data.kmeans import mean_iou
    from keras_yolo_mgpu.resources import format_anchors, get_anchors
    from keras_yolo_mgpu.training.anchor_fit import best_possible_recall, box_sizes_at_input, fit_anchors, used_anchors

    masks = masks_arg(args.masks)
    sizes = box_sizes_at_input(read_annotations(args.annotations), (args.input_size, args.input_size))
    given = get_anchors(args.anchors)
    print(f"{args.annotations}: {len(sizes)} boxes at {args.input_size} px")
    for name, anchors in (("given", given), ("k-means (--anchors auto)", fit_anchors(sizes, len(given), masks))):
        used = used_anchors(anchors, masks)
        bpr, iou = best_possible_recall(sizes, used), mean_iou(sizes, used)
        print(f"  {name}: {format_anchors(anchors)}: best possible recall {bpr:.4f}, mean best IoU {iou:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
