"""`python -m keras_yolo_mgpu.bench pipeline`: input pipeline images/sec with augmentation.

    python -m keras_yolo_mgpu.bench pipeline --annotations /tmp/bench_images/train.txt \\
        --classes model_data/voc_classes.txt --input-size 416 --batch-size 32 --batches 20

Prints progress, then one JSON object as the last line (see `bench/pipeline.py`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from keras_yolo_mgpu.bench.pipeline import GENERATORS  # light: TensorFlow loads later
from keras_yolo_mgpu.cli.args import ArgumentParser, input_size, positive_int
from keras_yolo_mgpu.cli.bench import print_result
from keras_yolo_mgpu.cli.runner import CommandError, run_command

logger = logging.getLogger("bench")


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python -m keras_yolo_mgpu.bench pipeline", description="Input pipeline images/sec with augmentation."
    )
    parser.add_argument("--annotations", required=True, help="keras-yolo3 annotation file")
    parser.add_argument("--classes", required=True, help="class names file, one per line")
    parser.add_argument(
        "--anchors", default=None, help="anchors file (default: model_data/yolo_anchors.txt, or tiny with --tiny)"
    )
    parser.add_argument("--tiny", action="store_true", help="tiny YOLOv3 anchors (2 output scales)")
    parser.add_argument(
        "--input-size", type=input_size, default=(416, 416), metavar="HxW", help="network input (default: 416)"
    )
    parser.add_argument("--batch-size", type=positive_int, default=32, help="global batch size (default: 32)")
    parser.add_argument("--batches", type=positive_int, default=20, help="timed batches (default: 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches first (default: 3)")
    parser.add_argument("--generator", choices=GENERATORS, default="tfdata", help="what to time (default: tfdata)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=None, help="tfdata only: 'ram' or a directory for decoded images")
    parser.add_argument("--root", default=None, help="folder for relative image paths (default: the annotation file's)")
    return parser


def run(args) -> int:
    from keras_yolo_mgpu.bench.pipeline import run_benchmark
    from keras_yolo_mgpu.data.annotations import read_annotations
    from keras_yolo_mgpu.resources import get_anchors, get_classes, resolve_resource

    num_classes = len(get_classes(args.classes))
    anchors = get_anchors(resolve_resource(args.anchors, "anchors", tiny=args.tiny))
    annotations = read_annotations(args.annotations, root=args.root)
    if not annotations:
        raise CommandError(f"{args.annotations} holds no image")
    logger.info(
        "timing %s: %d images, input %dx%d, batch %d, %d+%d batches",
        args.generator,
        len(annotations),
        *args.input_size,
        args.batch_size,
        args.warmup,
        args.batches,
    )
    result = run_benchmark(
        args.generator,
        annotations,
        args.input_size,
        anchors,
        num_classes,
        args.batch_size,
        args.batches,
        args.warmup,
        args.seed,
        args.cache,
    )
    return print_result(result)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv, tensorflow=True)


if __name__ == "__main__":
    sys.exit(main())
