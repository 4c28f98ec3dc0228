"""`python -m keras_yolo_mgpu.check_dataset`: check a dataset (any kind) or annotation files, and their images.

    python -m keras_yolo_mgpu.check_dataset --data my_dataset/data.yaml
    python -m keras_yolo_mgpu.check_dataset train.txt --classes model_data/voc_classes.txt
    python -m keras_yolo_mgpu.check_dataset --annotations train.txt val.txt --classes my_classes.txt

Prints `FILE:LINE: problem` lines and a summary per split, then, when a split
has no box left or more than half of its images have no labels, where the
labels were looked for. Exit status: 0 clean, 1 when there are problems or a
split without a box, 2 when the command itself is wrong. Never modifies a
file; never imports TensorFlow. What was read and scanned is recorded
(`--scan-cache`), so checking the same dataset again takes seconds.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from keras_yolo_mgpu.cli.args import ArgumentParser, positive_int
from keras_yolo_mgpu.cli.dataset_args import add_data_args, open_data
from keras_yolo_mgpu.cli.runner import CommandError, run_command
from keras_yolo_mgpu.data.overlap import find_overlap
from keras_yolo_mgpu.resources import get_classes, resolve_resource
from keras_yolo_mgpu.wording import counted


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python -m keras_yolo_mgpu.check_dataset",
        description="Check a dataset (YOLO-format, COCO JSON, VOC XML or keras-yolo3 annotation files) and its "
        "images; prints FILE:LINE: problem lines and a summary per split, exits 1 when there are problems. "
        "Never modifies a file.",
    )
    parser.add_argument(
        "annotations", nargs="*", help="dataset(s) of any kind --data takes, e.g. annotation files 'path x1,y1,...'"
    )
    parser.add_argument(
        "--annotations",
        dest="annotation_files",
        action="extend",
        nargs="+",
        default=[],
        metavar="FILE",
        help="annotation file(s), as train.py and evaluate.py take them; the same as giving them as arguments",
    )
    add_data_args(parser, split=None)
    parser.add_argument(
        "--classes",
        default=None,
        help="class names file, one per line (default: the dataset's names, else model_data/coco_classes.txt)",
    )
    parser.add_argument(
        "--root",
        default=None,
        help="folder for relative image paths (default: the annotation file's folder, then the working directory)",
    )
    images = parser.add_mutually_exclusive_group()
    images.add_argument(
        "--no-images", action="store_true", help="only check that images exist; do not read their headers"
    )
    images.add_argument(
        "--full",
        action="store_true",
        help="decode every image in full (default: read each image's header and, for a JPEG, its end marker)",
    )
    parser.add_argument(
        "--workers", type=positive_int, default=None, help="image reading threads (default: CPU count, at most 8)"
    )
    return parser


# Each split's name in the messages, and what a split without boxes stops.
SPLIT_ROLES = {
    "train": ("training", "training refuses to start"),
    "val": ("validation", "a run monitoring mAP refuses it"),
    "test": ("test", "evaluate.py --split test has nothing to score"),
}


def _reports(path: str, args):
    """(split name, its label in the messages, CheckReport) for each split of the dataset at `path`.

    A dataset of one split (an annotation file) is labelled `path`, each split of one with several `path (split)`.
    """
    classes = get_classes(args.classes) if args.classes else None
    dataset = open_data(args, classes, path=path)
    if dataset.class_names is not None and classes is not None and classes != dataset.class_names:
        raise CommandError(f"--classes {args.classes} lists {classes} but {path} names {dataset.class_names}")
    names = dataset.class_names or get_classes(resolve_resource(args.classes, "classes"))
    if dataset.kind != "keras-yolo3":
        print(f"{path}: {dataset.kind} dataset, {counted(len(names), 'classes')}: {', '.join(names)}")
    for split in dataset.splits:
        yield (
            split,
            path if len(dataset.splits) == 1 else f"{path} ({split})",
            dataset.checked(
                split,
                len(names),
                check_images=not args.no_images,
                full_decode=args.full,
                workers=args.workers,
                progress=True,
            ),
        )


def run(args) -> int:
    paths = [*args.annotations, *args.annotation_files] + ([args.data] if args.data else [])
    if not paths:
        raise CommandError("give a dataset: --data PATH, or annotation files (--annotations FILE, or as arguments)")
    any_problem = False
    images = {}  # split label -> its image paths, for the overlap check across all of them
    missing = [path for path in paths if not os.path.exists(path)]
    if missing:  # each named as given, whichever flag gave it
        raise CommandError(f"not found: {', '.join(missing)}")
    for path in paths:
        try:
            for split, label, report in _reports(path, args):
                images[label] = [a.image_path for a in report.annotations]
                for problem in report.problems:
                    print(problem)
                print(report.summary_text() if split == "train" else f"{split}: {report.summary_text()}")
                split_word, refusal = SPLIT_ROLES[split]
                no_boxes = report.no_boxes_message(split_word)
                warning = report.unlabelled_warning(split_word)
                if warning:
                    print(f"warning: {warning}")
                if no_boxes:
                    print(f"error: {no_boxes}; {refusal}")
                any_problem = any_problem or bool(report.problems) or bool(no_boxes)
        except OSError as error:
            raise CommandError(f"cannot read {path}: {error}") from error
    overlap = find_overlap(images)
    for between_splits, message in overlap.messages():
        print(f"{'error' if between_splits else 'warning'}: {message}")
    return 1 if any_problem or overlap.splits_overlap else 0


def main(argv: Sequence[str] | None = None) -> int:
    # Exit status 1 means "problems found", so errors of the command itself keep 2.
    return run_command(build_parser, run, argv, error_status=2)
