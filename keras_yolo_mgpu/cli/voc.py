"""`python voc_annotation.py`: Pascal VOC XML to keras-yolo3 annotation lines.

    python voc_annotation.py --devkit VOCdevkit --sets 2007_train 2007_val 2007_test
    python voc_annotation.py --xml-dir labels --image-dir images --classes my_classes.txt --output train.txt

Never imports TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli.args import ArgumentParser
from keras_yolo_mgpu.cli.runner import UsageError, run_command
from keras_yolo_mgpu.data.voc import DEFAULT_SETS


def _parse_set(text: str) -> tuple[str, str]:
    year, sep, image_set = text.partition("_")
    if not sep or not year or not image_set:
        raise argparse.ArgumentTypeError(f"expected YEAR_SET like 2007_train, got {text!r}")
    return year, image_set


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="voc_annotation.py", description="Pascal VOC XML to keras-yolo3 annotation lines.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--devkit", help="VOCdevkit folder (holds VOC2007/, VOC2012/)")
    source.add_argument("--xml-dir", help="folder of VOC-style .xml files (needs --image-dir and --output)")
    parser.add_argument(
        "--sets",
        nargs="+",
        type=_parse_set,
        default=[_parse_set(s) for s in DEFAULT_SETS],
        metavar="YEAR_SET",
        help=f"with --devkit: sets to convert (default: {' '.join(DEFAULT_SETS)})",
    )
    parser.add_argument("--output-dir", default=".", help="with --devkit: folder for <YEAR>_<SET>.txt (default: .)")
    parser.add_argument("--image-dir", help="with --xml-dir: folder of the images")
    parser.add_argument("--output", help="with --xml-dir: annotation file to write")
    parser.add_argument("--classes", default=None, help="class names file (default: model_data/voc_classes.txt)")
    parser.add_argument(
        "--keep-difficult", action="store_true", help="keep objects marked difficult (skipped by default)"
    )
    return parser


def run(args) -> int:
    from keras_yolo_mgpu.data.voc import voc_set_lines, xml_dir_lines
    from keras_yolo_mgpu.fileio import write_lines_atomic
    from keras_yolo_mgpu.resources import get_classes, resolve_resource

    if args.xml_dir and not (args.image_dir and args.output):
        raise UsageError("--xml-dir needs --image-dir and --output")
    class_names = get_classes(resolve_resource(args.classes, "voc_classes"))
    if args.xml_dir:
        lines = xml_dir_lines(args.xml_dir, args.image_dir, class_names, keep_difficult=args.keep_difficult)
        write_lines_atomic(args.output, lines)
        print(f"Wrote {args.output}")
        return 0
    for year, image_set in args.sets:
        lines = voc_set_lines(args.devkit, year, image_set, class_names, keep_difficult=args.keep_difficult)
        output = os.path.join(args.output_dir, f"{year}_{image_set}.txt")
        write_lines_atomic(output, lines)
        print(f"Wrote {output} ({len(lines)} images)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
