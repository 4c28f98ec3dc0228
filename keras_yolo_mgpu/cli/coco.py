"""`python coco_annotation.py`: COCO instances JSON to keras-yolo3 annotation lines.

    python coco_annotation.py --instances annotations/instances_train2017.json --image-dir train2017 --output train.txt

Never imports TensorFlow.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli.args import ArgumentParser
from keras_yolo_mgpu.cli.runner import CommandError, UsageError, run_command


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="coco_annotation.py", description="COCO instances JSON to keras-yolo3 annotation lines."
    )
    parser.add_argument("--instances", required=True, help="instances_*.json")
    parser.add_argument("--image-dir", required=True, help="folder of the images (e.g. train2017)")
    parser.add_argument("--output", required=True, help="annotation file to write")
    parser.add_argument(
        "--classes",
        default=None,
        help="classes file the class order must agree with (default: model_data/coco_classes.txt, "
        "checked only when the JSON has as many categories)",
    )
    parser.add_argument("--classes-output", default=None, help="also write the JSON's class names in index order")
    parser.add_argument("--keep-empty", action="store_true", help="also write images without boxes")
    return parser


def run(args) -> int:
    from keras_yolo_mgpu.data.coco import coco_lines
    from keras_yolo_mgpu.fileio import write_lines_atomic
    from keras_yolo_mgpu.resources import get_classes, resolve_resource

    if not os.path.isfile(args.instances):
        raise UsageError(f"instances file not found: {args.instances}")
    classes_path = resolve_resource(args.classes, "classes")
    with open(args.instances, encoding="utf-8") as f:
        instances = json.load(f)
    try:
        lines, names = coco_lines(
            instances,
            args.image_dir,
            class_names=get_classes(classes_path),
            classes_source=classes_path,
            strict=args.classes is not None,
            keep_empty=args.keep_empty,
        )
    except KeyError as error:
        raise CommandError(f"{args.instances}: malformed instances JSON, missing key {error}") from None
    write_lines_atomic(args.output, lines)
    if args.classes_output:
        write_lines_atomic(args.classes_output, names)
    print(f"Wrote {args.output} ({len(lines)} images, {len(names)} classes)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
