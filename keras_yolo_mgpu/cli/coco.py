"""`python coco_annotation.py`: COCO instances JSON to keras-yolo3 annotation lines.

    python coco_annotation.py --instances annotations/instances_train2017.json --image-dir train2017 --output train.txt
    python coco_annotation.py       # keras-yolo3's line: mscoco2017/ to train.txt, keras-yolo3's lines exactly

Never imports TensorFlow.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli.args import ArgumentParser, add_overwrite_arg
from keras_yolo_mgpu.cli.runner import CommandError, UsageError, run_command
from keras_yolo_mgpu.data.coco import (
    COCO_CATEGORY_IDS,
    category_mapping,
    check_class_order,
    coco_lines,
    keras_yolo3_coco_lines,
)
from keras_yolo_mgpu.fileio import write_lines_atomic
from keras_yolo_mgpu.outputs import check_output, record_written
from keras_yolo_mgpu.resources import get_classes, resolve_resource
from keras_yolo_mgpu.wording import counted

logger = logging.getLogger("coco_annotation")

# What keras-yolo3's coco_annotation.py reads and writes, from the current folder.
KERAS_YOLO3_INSTANCES = "mscoco2017/annotations/instances_train2017.json"
KERAS_YOLO3_IMAGE_DIR = "mscoco2017/train2017"
KERAS_YOLO3_OUTPUT = "train.txt"


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="coco_annotation.py", description="COCO instances JSON to keras-yolo3 annotation lines."
    )
    parser.add_argument(
        "--instances", default=None, help=f"instances_*.json (default: {KERAS_YOLO3_INSTANCES}, as keras-yolo3)"
    )
    parser.add_argument(
        "--image-dir",
        default=None,
        help=f"folder of the images, written before each file name (default: {KERAS_YOLO3_IMAGE_DIR}, as keras-yolo3)",
    )
    parser.add_argument(
        "--output", default=None, help=f"annotation file to write (default: {KERAS_YOLO3_OUTPUT}, as keras-yolo3)"
    )
    parser.add_argument(
        "--keras-yolo3-compat",
        action="store_true",
        help="write exactly keras-yolo3's lines: boxes truncated to whole pixels, crowd and zero-size boxes kept, "
        "paths from the image ids, its fixed class table (default: only when none of --instances, --image-dir, "
        "--output is given, i.e. keras-yolo3's own command line)",
    )
    parser.add_argument(
        "--classes",
        default=None,
        help="classes file the class order must agree with (default: model_data/coco_classes.txt, "
        "checked only when the JSON has as many categories)",
    )
    parser.add_argument("--classes-output", default=None, help="also write the JSON's class names in index order")
    parser.add_argument("--keep-empty", action="store_true", help="also write images without boxes")
    add_overwrite_arg(parser)
    return parser


def run(args) -> int:
    defaulted = _take_keras_yolo3_defaults(args)
    if args.keras_yolo3_compat and args.keep_empty:
        raise UsageError("--keep-empty: keras-yolo3's lines (--keras-yolo3-compat) never list images without boxes")
    if not os.path.isfile(args.instances):
        raise UsageError(
            f"instances file not found: {args.instances}"
            + (" (keras-yolo3's default: give --instances, --image-dir and --output)" if defaulted else "")
        )
    classes_path = resolve_resource(args.classes, "classes")
    for flag, path in (("--output", args.output), ("--classes-output", args.classes_output)):
        if path is not None:
            check_output(path, inputs=(args.instances, classes_path), overwrite=args.overwrite, flag=flag)
    with open(args.instances, encoding="utf-8") as f:
        instances = json.load(f)
    class_names, strict = get_classes(classes_path), args.classes is not None
    try:
        if args.keras_yolo3_compat:
            _, names = category_mapping(instances.get("categories", []))
            check_class_order(names, class_names, classes_path, strict=strict)
            _check_fixed_classes(instances, args.classes_output)
            lines = keras_yolo3_coco_lines(instances, args.image_dir)
        else:
            lines, names = coco_lines(
                instances,
                args.image_dir,
                class_names=class_names,
                classes_source=classes_path,
                strict=strict,
                keep_empty=args.keep_empty,
            )
    except KeyError as error:
        raise CommandError(f"{args.instances}: malformed instances JSON, missing key {error}") from None
    write_lines_atomic(args.output, lines)
    record_written([args.output])
    if args.classes_output:
        write_lines_atomic(args.classes_output, names)
        record_written([args.classes_output])
    print(f"Wrote {args.output} ({len(lines)} images, {counted(len(names), 'classes')})")
    return 0


def _take_keras_yolo3_defaults(args) -> bool:
    """keras-yolo3's paths for the flags not given; its lines too when none of them is (its own command line).

    Returns:
        Whether any default was taken.
    """
    defaults = {
        "instances": KERAS_YOLO3_INSTANCES,
        "image_dir": KERAS_YOLO3_IMAGE_DIR,
        "output": KERAS_YOLO3_OUTPUT,
    }
    taken = {name: value for name, value in defaults.items() if getattr(args, name) is None}
    if not taken:
        return False
    for name, value in taken.items():
        setattr(args, name, value)
    if len(taken) == len(defaults):
        args.keras_yolo3_compat = True
    logger.info(
        "keras-yolo3's defaults: %s%s",
        " ".join(f"--{name.replace('_', '-')} {value}" for name, value in taken.items()),
        " --keras-yolo3-compat (its exact lines)" if len(taken) == len(defaults) else "",
    )
    return True


def _check_fixed_classes(instances: dict, classes_output: str | None) -> None:
    """--classes-output names the classes in the JSON's order; keras-yolo3's table is COCO's: they must agree."""
    ids = sorted(int(c["id"]) for c in instances.get("categories", []))
    if classes_output and ids != list(COCO_CATEGORY_IDS):
        raise ValueError(
            f"--classes-output: the JSON's {len(ids)} categories are not COCO's 80, which keras-yolo3's class ids "
            "(--keras-yolo3-compat) follow; drop --keras-yolo3-compat to number its own categories"
        )


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
