"""`python -m keras_yolo_mgpu.check_dataset`: check annotation files and their images.

    python -m keras_yolo_mgpu.check_dataset train.txt --classes model_data/voc_classes.txt

Prints `FILE:LINE: problem` lines and a summary. Exit status: 0 clean, 1 when
there are problems, 2 when the command itself is wrong (a missing file, a
bad classes file). Never modifies a file; never imports TensorFlow.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli.args import ArgumentParser, positive_int
from keras_yolo_mgpu.cli.runner import CommandError, run_command


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python -m keras_yolo_mgpu.check_dataset",
        description="Check keras-yolo3 annotation files and their images; prints FILE:LINE: problem lines "
        "and a summary, exits 1 when there are problems. Never modifies a file.",
    )
    parser.add_argument("annotations", nargs="+", help="annotation file(s): 'path x1,y1,x2,y2,class ...' per line")
    parser.add_argument(
        "--classes", default=None, help="class names file, one per line (default: model_data/coco_classes.txt)"
    )
    parser.add_argument(
        "--root",
        default=None,
        help="folder for relative image paths (default: the annotation file's folder, then the working directory)",
    )
    parser.add_argument("--no-images", action="store_true", help="only check that images exist; do not decode them")
    parser.add_argument(
        "--workers", type=positive_int, default=None, help="image decoding threads (default: CPU count)"
    )
    return parser


def run(args) -> int:
    from keras_yolo_mgpu.data.check import check_annotations
    from keras_yolo_mgpu.resources import get_classes, resolve_resource

    num_classes = len(get_classes(resolve_resource(args.classes, "classes")))
    any_problem = False
    for path in args.annotations:
        try:
            report = check_annotations(
                path,
                num_classes,
                root=args.root,
                check_images=not args.no_images,
                workers=args.workers,
                progress=sys.stderr.isatty(),
            )
        except OSError as error:
            raise CommandError(f"cannot read {path}: {error}") from error
        for problem in report.problems:
            print(problem)
        print(report.summary_text())
        any_problem = any_problem or bool(report.problems)
    return 1 if any_problem else 0


def main(argv: Sequence[str] | None = None) -> int:
    # Exit status 1 means "problems found", so errors of the command itself keep 2.
    return run_command(build_parser, run, argv, error_status=2)


if __name__ == "__main__":
    sys.exit(main())
