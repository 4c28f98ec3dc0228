"""`python convert.py`: a Darknet `.cfg` + `.weights` pair to a Keras 3 file.

python convert.py yolov3.cfg yolov3.weights model_data/yolo.weights.h5
python convert.py yolov3-tiny.cfg yolov3-tiny.weights model_data/tiny_yolo.weights.h5 --anchors-output A
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli.args import ArgumentParser
from keras_yolo_mgpu.cli.runner import CommandError, UsageError, run_command


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="convert.py",
        description="Convert Darknet .cfg + .weights to a Keras 3 model file.",
        epilog="A yolov3/yolov3-tiny cfg is saved as yolo_body/tiny_yolo_body weights; other cfgs as the "
        "generic cfg-built model (prefer .keras for those).",
    )
    parser.add_argument("config_path", help="Darknet .cfg file")
    parser.add_argument("weights_path", help="Darknet .weights file")
    parser.add_argument("output_path", help="output: .weights.h5 (weights) or .keras (whole model)")
    parser.add_argument(
        "--generic",
        action="store_true",
        help="save the generic cfg-built model even when the cfg is a yolo_body/tiny_yolo_body",
    )
    parser.add_argument(
        "--anchors-output", default=None, help="also write the cfg's anchors to this file (model_data format)"
    )
    return parser


def run(args) -> int:
    from keras_yolo_mgpu.cli import quiet
    from keras_yolo_mgpu.fileio import write_text_atomic
    from keras_yolo_mgpu.resources import format_anchors
    from keras_yolo_mgpu.weights.convert import check_output_path, convert

    try:
        check_output_path(args.output_path)
    except ValueError as error:
        raise UsageError(str(error)) from None
    for label, path in (("config", args.config_path), ("weights", args.weights_path)):
        if not os.path.isfile(path):
            raise UsageError(f"{label} file not found: {path}")
    quiet.import_tensorflow(args.verbose)
    result = convert(args.config_path, args.weights_path, args.output_path, generic=args.generic)
    if args.anchors_output:
        if result.anchors is None:
            raise CommandError("the cfg has no [yolo] anchors to write")
        write_text_atomic(args.anchors_output, format_anchors(result.anchors) + "\n")
    print(
        f"Converted {args.config_path} ({result.num_floats} floats) to {result.output_path} "
        f"as {result.architecture}" + (f"; cfg copy: {result.cfg_copy_path}" if result.cfg_copy_path else "")
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
