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
    parser.add_argument(
        "--classes",
        default=None,
        help="class names file (default: --devkit: model_data/voc_classes.txt; --xml-dir: the object names the XML "
        "files use, sorted, written beside --output as <output>_classes.txt)",
    )
    parser.add_argument(
        "--keep-difficult", action="store_true", help="keep objects marked difficult (skipped by default)"
    )
    return parser


def run(args) -> int:
    from keras_yolo_mgpu.data.voc import voc_set_lines
    from keras_yolo_mgpu.fileio import write_lines_atomic
    from keras_yolo_mgpu.resources import get_classes, resolve_resource

    if args.xml_dir and not (args.image_dir and args.output):
        raise UsageError("--xml-dir needs --image-dir and --output")
    if args.xml_dir:
        return _convert_xml_dir(args)
    class_names = get_classes(resolve_resource(args.classes, "voc_classes"))
    for year, image_set in args.sets:
        lines = voc_set_lines(args.devkit, year, image_set, class_names, keep_difficult=args.keep_difficult)
        output = os.path.join(args.output_dir, f"{year}_{image_set}.txt")
        write_lines_atomic(output, lines)
        print(f"Wrote {output} ({len(lines)} images)")
    return 0


def _convert_xml_dir(args) -> int:
    """--xml-dir: the XML files' own class names unless --classes; refuses a class list none of their objects is in."""
    from keras_yolo_mgpu.data.formats.voc_xml import voc_class_names
    from keras_yolo_mgpu.data.voc import xml_dir_lines
    from keras_yolo_mgpu.fileio import write_lines_atomic, write_text_atomic
    from keras_yolo_mgpu.resources import get_classes

    if not os.path.isdir(args.xml_dir):
        raise UsageError(f"--xml-dir: not a folder: {args.xml_dir}")
    xml_paths = sorted(os.path.join(args.xml_dir, n) for n in os.listdir(args.xml_dir) if n.lower().endswith(".xml"))
    used = voc_class_names(xml_paths)
    if args.classes:
        class_names = get_classes(args.classes)
        if used and not set(used) & set(class_names):
            raise ValueError(
                f"none of the classes the XML files name ({', '.join(used[:10])}) is in --classes {args.classes}: "
                "every image would be written without boxes. Leave --classes out to take the XML files' names."
            )
    else:
        class_names = used
        classes_path = os.path.splitext(args.output)[0] + "_classes.txt"
        write_text_atomic(classes_path, "".join(f"{name}\n" for name in class_names))
        print(f"Classes from the XML files ({len(class_names)}): {', '.join(class_names)}; wrote {classes_path}")
    lines = xml_dir_lines(args.xml_dir, args.image_dir, class_names, keep_difficult=args.keep_difficult)
    write_lines_atomic(args.output, lines)
    print(f"Wrote {args.output}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
