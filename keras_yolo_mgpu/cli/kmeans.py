"""`python kmeans.py`: anchors by IoU k-means over the boxes of a dataset.

    python kmeans.py --data my_dataset/data.yaml --clusters 9 --output model_data/my_anchors.txt
    python kmeans.py --annotations train.txt --clusters 9 --output model_data/my_anchors.txt
    python kmeans.py        # keras-yolo3's line: 2012_train.txt, 9 clusters, writes yolo_anchors.txt

Never imports TensorFlow.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli.args import ArgumentParser, add_overwrite_arg
from keras_yolo_mgpu.cli.dataset_args import add_data_args, checked_records, open_data
from keras_yolo_mgpu.cli.runner import UsageError, run_command
from keras_yolo_mgpu.data.dataset_source import resolve_class_names
from keras_yolo_mgpu.data.kmeans import (
    box_sizes_from_annotations,
    box_sizes_from_records,
    kmeans_anchors,
    mean_iou,
    round_anchors,
)
from keras_yolo_mgpu.fileio import write_text_atomic
from keras_yolo_mgpu.outputs import check_output, record_written
from keras_yolo_mgpu.resources import format_anchors, get_classes

logger = logging.getLogger("kmeans")

# What keras-yolo3's kmeans.py reads and writes, in the current folder, when run without flags.
KERAS_YOLO3_ANNOTATIONS = "2012_train.txt"
KERAS_YOLO3_OUTPUT = "yolo_anchors.txt"


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="kmeans.py", description="Anchors by IoU k-means over the boxes of a dataset (its training split)."
    )
    parser.add_argument(
        "--annotations",
        help="keras-yolo3 annotation file (path x1,y1,x2,y2,class ...) (default without --data: "
        f"{KERAS_YOLO3_ANNOTATIONS} in the current folder, written to {KERAS_YOLO3_OUTPUT}, as keras-yolo3)",
    )
    add_data_args(parser, split="train")
    parser.add_argument(
        "--classes", default=None, help="class names file (--data: only when the dataset names no classes)"
    )
    parser.add_argument(
        "--clusters", type=int, default=9, help="number of anchors: 9 for YOLOv3, 6 for tiny (default: 9)"
    )
    parser.add_argument("--output", default=None, help="anchors file to write (model_data format); printed either way")
    parser.add_argument(
        "--input-size",
        type=int,
        default=None,
        metavar="N",
        help="scale boxes as when letterboxing images to NxN (reads image sizes); "
        "default: image pixels, as keras-yolo3",
    )
    parser.add_argument("--root", default=None, help="folder for relative image paths (with --input-size)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--restarts", type=int, default=5, help="k-means++ restarts, best kept (default: 5)")
    parser.add_argument(
        "--centre", choices=("median", "mean"), default="median", help="cluster centre (default: median)"
    )
    add_overwrite_arg(parser)
    return parser


def run(args) -> int:
    if args.clusters < 1:
        raise UsageError(f"--clusters must be positive, got {args.clusters}")
    if args.input_size is not None and args.input_size <= 0:
        raise UsageError(f"--input-size must be positive, got {args.input_size}")
    if args.annotations and args.data:
        raise UsageError("give one of --data (a dataset of any kind) or --annotations (keras-yolo3 file), not both")
    keras_yolo3_file = not args.annotations and not args.data
    if keras_yolo3_file:
        _take_keras_yolo3_defaults(args)
    if args.annotations and not os.path.isfile(args.annotations):
        raise UsageError(f"annotation file not found: {args.annotations}")
    if args.output:
        inputs = (args.annotations, args.data, args.classes)
        check_output(args.output, inputs=inputs, overwrite=args.overwrite, flag="--output")
    if args.clusters not in (6, 9):
        logger.warning("%d anchors: the models here expect 9 (YOLOv3) or 6 (tiny YOLOv3)", args.clusters)
    if args.data:
        boxes = box_sizes_from_records(_data_records(args), input_size=args.input_size)
    else:
        boxes = box_sizes_from_annotations(args.annotations, root=args.root, input_size=args.input_size)
    anchors, _ = kmeans_anchors(boxes, args.clusters, seed=args.seed, restarts=args.restarts, centre=args.centre)
    anchors = round_anchors(anchors)
    line = format_anchors(anchors)
    print(f"{len(boxes)} boxes, {args.clusters} clusters")
    print(f"Anchors: {line}")
    print(f"Mean IoU: {100 * mean_iou(boxes, anchors):.2f}%")
    if args.output:
        text = keras_yolo3_anchors_text(anchors) if keras_yolo3_file else line + "\n"
        write_text_atomic(args.output, text)
        record_written([args.output])
        print(f"Wrote {args.output}")
    else:
        logger.info("not written: --output FILE writes them, for train.py --anchors FILE")
    if args.input_size is None:
        # train.py reads anchors in network input pixels: boxes of 1000-pixel photos give anchors twice too large
        # for a 416 input.
        logger.info(
            "the anchors are in image pixels, as keras-yolo3's kmeans.py gives them; the network sees the images "
            "letterboxed to its input: --input-size N (e.g. 416) gives the anchors at that size"
        )
    return 0


def _take_keras_yolo3_defaults(args) -> None:
    """No --data nor --annotations: keras-yolo3's input and output files, or a UsageError naming them."""
    if not os.path.isfile(KERAS_YOLO3_ANNOTATIONS):
        raise UsageError(
            f"no {KERAS_YOLO3_ANNOTATIONS} in {os.getcwd()} (what keras-yolo3's kmeans.py reads without flags): "
            "give --annotations FILE (keras-yolo3 lines) or --data DATASET"
        )
    args.annotations = KERAS_YOLO3_ANNOTATIONS
    taken = [f"--annotations {KERAS_YOLO3_ANNOTATIONS}"]
    if args.output is None:
        args.output = KERAS_YOLO3_OUTPUT
        taken.append(f"--output {KERAS_YOLO3_OUTPUT} (keras-yolo3's one-line format)")
    logger.info("no --data or --annotations: keras-yolo3's defaults %s, --clusters %d", ", ".join(taken), args.clusters)


def keras_yolo3_anchors_text(anchors) -> str:
    """`(N, 2)` integer anchors (width, height) as keras-yolo3's kmeans.py writes `yolo_anchors.txt`.

    `w,h, w,h, ...` on one line without a newline, as its `result2txt`. The
    anchors are this command's: rounded and sorted by area, where keras-yolo3
    truncates and sorts by width (the masks pick anchors by index, smallest area first).
    """
    return ", ".join(f"{int(w)},{int(h)}" for w, h in anchors)


def _data_records(args) -> list:
    """The checked records of --data's --split (images not decoded: only their boxes count here).

    With --input-size the boxes are scaled by each image's size: the headers
    are then read by the check's parallel scan (and recorded), not one by one.
    """
    dataset = open_data(args, class_names=get_classes(args.classes) if args.classes else None)
    names = resolve_class_names(dataset, args.classes)
    return checked_records(dataset, args.split, len(names), check_images=args.input_size is not None)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
