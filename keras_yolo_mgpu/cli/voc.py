"""`python voc_annotation.py`: Pascal VOC XML to keras-yolo3 annotation lines.

    python voc_annotation.py --devkit VOCdevkit --sets 2007_train 2007_val 2007_test
    python voc_annotation.py --xml-dir labels --image-dir images --classes my_classes.txt --output train.txt
    python voc_annotation.py      # keras-yolo3's line: ./VOCdevkit, 2007_{train,val,test}.txt, absolute paths

Never imports TensorFlow.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli.args import ArgumentParser, add_overwrite_arg
from keras_yolo_mgpu.cli.keras_yolo3_folder import CLASSES as KERAS_YOLO3_CLASSES
from keras_yolo_mgpu.cli.runner import UsageError, run_command
from keras_yolo_mgpu.data.formats.voc_xml import voc_class_names
from keras_yolo_mgpu.data.voc import (
    DEFAULT_SETS,
    voc_set_lines,
    voc_set_list_path,
    voc_set_xml_paths,
    xml_dir_lines,
)
from keras_yolo_mgpu.fileio import write_lines_atomic
from keras_yolo_mgpu.outputs import check_output, record_written
from keras_yolo_mgpu.resources import get_classes, resolve_resource

logger = logging.getLogger("voc_annotation")

# keras-yolo3's voc_annotation.py reads this folder of the current one when run without flags.
KERAS_YOLO3_DEVKIT = "VOCdevkit"


def _parse_set(text: str) -> tuple[str, str]:
    year, sep, image_set = text.partition("_")
    if not sep or not year or not image_set:
        raise argparse.ArgumentTypeError(f"expected YEAR_SET like 2007_train, got {text!r}")
    return year, image_set


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="voc_annotation.py", description="Pascal VOC XML to keras-yolo3 annotation lines.")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--devkit",
        help=f"VOCdevkit folder (holds VOC2007/, VOC2012/) (default without --xml-dir: ./{KERAS_YOLO3_DEVKIT} "
        "with absolute image paths, as keras-yolo3)",
    )
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
        help="class names file (default: --devkit: model_data/voc_classes.txt of this folder, else VOC's 20; "
        "--xml-dir: the object names the XML files use, sorted, written beside --output as <output>_classes.txt)",
    )
    parser.add_argument(
        "--keep-difficult", action="store_true", help="keep objects marked difficult (skipped by default)"
    )
    add_overwrite_arg(parser)
    return parser


def run(args) -> int:
    if args.xml_dir and not (args.image_dir and args.output):
        raise UsageError("--xml-dir needs --image-dir and --output")
    if args.xml_dir:
        return _convert_xml_dir(args)
    if args.devkit is None:
        args.devkit = _keras_yolo3_devkit(args.sets)
    classes_path = args.classes or _devkit_classes()
    class_names = get_classes(classes_path)
    lists = [voc_set_list_path(args.devkit, year, image_set) for year, image_set in args.sets]
    missing = [path for path in lists if not os.path.isfile(path)]
    if missing:
        present = [f"{year}_{s}" for (year, s), path in zip(args.sets, lists) if path not in missing]
        hint = f": pass --sets {' '.join(present)} to convert only the others" if present else ""
        raise FileNotFoundError(f"image set list not found: {', '.join(missing)}{hint}")
    outputs = [os.path.join(args.output_dir, f"{year}_{image_set}.txt") for year, image_set in args.sets]
    for output in outputs:  # all of them before any is written
        check_output(output, inputs=[*lists, classes_path], overwrite=args.overwrite, flag="output")
    converted = [
        voc_set_lines(args.devkit, year, image_set, class_names, keep_difficult=args.keep_difficult)
        for year, image_set in args.sets
    ]
    if not sum(result.boxes for result in converted):
        _refuse_a_class_list_no_object_is_in(args.devkit, args.sets, classes_path, class_names)
    for output, (lines, _) in zip(outputs, converted):
        write_lines_atomic(output, lines)
        record_written([output])
        print(f"Wrote {output} ({len(lines)} images)")
    return 0


def _refuse_a_class_list_no_object_is_in(devkit, sets, classes_path, class_names) -> None:
    """No set got a box: refused when the sets' XML files name objects, none of them in the class list.

    Raises:
        ValueError: naming the classes file and the classes the XML files use.
    """
    used = voc_class_names([path for year, image_set in sets for path in voc_set_xml_paths(devkit, year, image_set)])
    if used and not set(used) & set(class_names):
        folder_classes = KERAS_YOLO3_CLASSES["train.py"][0]
        fix = (
            "list your classes in it, one per line"
            if os.path.abspath(classes_path) == os.path.abspath(folder_classes)
            else f"write your classes, one per line, into {folder_classes} here (train.py reads it too)"
        )
        raise ValueError(
            f"none of the classes the XML files name ({', '.join(used[:10])}) is in {classes_path} "
            f"({', '.join(class_names[:5])}{', ...' if len(class_names) > 5 else ''}): every image would be written "
            f"without boxes; {fix}, or give --classes FILE"
        )


def _devkit_classes() -> str:
    """No --classes: the folder's `model_data/voc_classes.txt`, the file `python train.py` reads here, else VOC's 20.

    keras-yolo3 users list their classes in that file for train.py (and in
    voc_annotation.py's own list); taking the same file keeps the class ids
    written here the ids train.py names.
    """
    folder_classes = KERAS_YOLO3_CLASSES["train.py"][0]
    if os.path.isfile(folder_classes):
        logger.info("class names from %s (the file train.py reads in this folder; --classes to choose)", folder_classes)
        return folder_classes
    return resolve_resource(None, "voc_classes")


def _keras_yolo3_devkit(sets) -> str:
    """No --devkit nor --xml-dir: keras-yolo3's `./VOCdevkit`, absolute so the lines are keras-yolo3's (getcwd())."""
    devkit = os.path.join(os.getcwd(), KERAS_YOLO3_DEVKIT)
    if not os.path.isdir(devkit):
        raise UsageError(
            f"no {KERAS_YOLO3_DEVKIT} folder in {os.getcwd()} (what keras-yolo3's voc_annotation.py reads without "
            "flags): give --devkit FOLDER, or --xml-dir with --image-dir and --output"
        )
    logger.info(
        "no --devkit or --xml-dir: keras-yolo3's defaults --devkit %s (absolute image paths) --sets %s",
        devkit,
        " ".join(f"{year}_{image_set}" for year, image_set in sets),
    )
    return devkit


def _convert_xml_dir(args) -> int:
    """--xml-dir: the XML files' own class names unless --classes; refuses a class list none of their objects is in."""
    if not os.path.isdir(args.xml_dir):
        raise UsageError(f"--xml-dir: not a folder: {args.xml_dir}")
    classes_output = None if args.classes else os.path.splitext(args.output)[0] + "_classes.txt"
    check_output(args.output, inputs=[args.classes], overwrite=args.overwrite, flag="--output")
    if classes_output:
        check_output(classes_output, inputs=[args.classes], overwrite=args.overwrite, flag="the classes file")
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
    lines = xml_dir_lines(args.xml_dir, args.image_dir, class_names, keep_difficult=args.keep_difficult)
    if classes_output:
        write_lines_atomic(classes_output, class_names)
        record_written([classes_output])
        print(f"Classes from the XML files ({len(class_names)}): {', '.join(class_names)}; wrote {classes_output}")
    write_lines_atomic(args.output, lines)
    record_written([args.output])
    print(f"Wrote {args.output}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
