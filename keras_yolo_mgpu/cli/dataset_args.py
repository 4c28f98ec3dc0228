"""`--data`, `--split`, `--image-dir`, `--scan-cache`: a dataset of any kind for the commands that read one."""

from __future__ import annotations

import argparse
import logging

from keras_yolo_mgpu.data.annotations import turned_upright
from keras_yolo_mgpu.data.dataset_source import open_dataset
from keras_yolo_mgpu.data.scan import cache_dir

logger = logging.getLogger(__name__)

__all__ = ["SCAN_CACHE_HELP", "add_data_args", "checked_records", "open_data"]

SCAN_CACHE_HELP = (
    "folder of the records of what was read and scanned, so the next start skips it (default: "
    "$KERAS_YOLO_MGPU_CACHE, else $XDG_CACHE_HOME/keras-yolo-mgpu, else ~/.cache/keras-yolo-mgpu; never the "
    "dataset's folder); 'none': no record"
)


def add_data_args(parser: argparse.ArgumentParser, *, split: str | None = "val", required: bool = False) -> None:
    """--data PATH, --image-dir DIR and (when `split` is given, its default) --split train|val|test."""
    parser.add_argument(
        "--data",
        metavar="PATH",
        required=required,
        help="the dataset, its kind recognised: YOLO-format data.yaml or folder (images/ + labels/), COCO "
        "instances .json, Pascal VOC folder (Annotations/ + JPEGImages/ or XML beside images), or a keras-yolo3 "
        "annotation file",
    )
    parser.add_argument(
        "--image-dir", default=None, help="COCO: folder of the JSON's images (default: beside the JSON, or images/)"
    )
    parser.add_argument("--scan-cache", metavar="DIR", default=None, help=SCAN_CACHE_HELP)
    if split is not None:
        parser.add_argument(
            "--split",
            choices=("train", "val", "test"),
            default=split,
            help=f"which split of --data (default: {split}; a dataset without a val split has only train; test "
            "where the dataset has one: data.yaml's test, Roboflow's test/, VOC's ImageSets/Main/test.txt)",
        )


def open_data(args, class_names: list[str] | None = None, *, path: str | None = None):
    """The `Dataset` at `path` (default: `args.data`) (VOC reads `class_names` when given)."""
    return open_dataset(
        path or args.data,
        image_dir=args.image_dir,
        class_names=class_names,
        root=getattr(args, "root", None),
        record_dir=cache_dir(args.scan_cache),
    )


def checked_records(dataset, split: str, num_classes: int, *, check_images: bool = True) -> list:
    """The split's usable records; each problem logged as a warning with its file and line, then a summary."""
    if split not in dataset.splits:
        if split == "val" and "train" in dataset.splits:
            logger.warning(
                "%s has no val split: scoring all of its images. A model trained on it has seen them, and the "
                "score is then inflated: evaluate a run's weights alone (--weights RUN/best.weights.h5) to score the "
                "images it held out (RUN/val_split.txt), or give validation images with --annotations",
                dataset.path,
            )
            split = "train"
        else:
            raise ValueError(f"{dataset.path} has no {split} split (it has {', '.join(dataset.splits)})")
    report = dataset.checked(split, num_classes, check_images=check_images, progress=True)
    for problem in report.problems[:20]:
        logger.warning("%s", problem)
    if len(report.problems) > 20:
        logger.warning("... and %d more problems (python -m keras_yolo_mgpu.check_dataset --data %s lists them)",
                       len(report.problems) - 20, dataset.path)  # fmt: skip
    logger.info("%s", report.summary_text())
    if not report.annotations:
        raise ValueError(f"{dataset.path} ({split}): no usable images")
    if not check_images:  # the check's scan turns boxes drawn on stored pixels; without it, each header does
        return [turned_upright(annotation) for annotation in report.annotations]
    return report.annotations
