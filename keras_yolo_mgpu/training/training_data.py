"""A run's class names and its checked training and validation records.

`config.data` names a dataset of any kind `data.dataset_source` reads,
`config.annotations` a keras-yolo3 annotation file. Every split goes through
the dataset checker (`data.check.CheckReport`, records in `config.scan_cache`):
problems are listed in the run folder (`skipped_lines_<split>.txt`) and
skipped, or refused with `strict`. Validation is the dataset's own `val`
split, else `val_annotations`, else `val_split` of the training records drawn
with the run's seed. A training split with no box is refused (a labels folder
in the wrong place trains a detector that detects nothing); so is a
validation split without a box when the run monitors mAP.
"""

from __future__ import annotations

import logging
import os
import shlex

import numpy as np

from keras_yolo_mgpu.data.annotations import format_annotation_line
from keras_yolo_mgpu.data.check import check_annotations
from keras_yolo_mgpu.data.dataset_source import open_dataset, resolve_class_names
from keras_yolo_mgpu.data.overlap import find_overlap
from keras_yolo_mgpu.data.scan import cache_dir
from keras_yolo_mgpu.fileio import write_lines_atomic
from keras_yolo_mgpu.resources import get_classes
from keras_yolo_mgpu.training.config import DEFAULT_VAL_SPLIT
from keras_yolo_mgpu.training.recipe_options import MAP_MONITORS
from keras_yolo_mgpu.training.run_folder import HELD_OUT_FILE, TRAINED_ON_FILE

logger = logging.getLogger(__name__)


class TrainingData:
    """The run's dataset: `class_names` now, the checked records with `splits`.

    Raises ValueError on a class-name contradiction. `write_record`: whether this process writes
    the records of what it read and scanned (`data.scan`): the chief does, the others read them.
    """

    def __init__(self, config, write_record: bool = True):
        self.config = config
        self.dataset = None
        self.record_dir = cache_dir(config.scan_cache)
        self.write_record = write_record
        if config.data:
            classes = get_classes(config.classes) if config.classes else None
            self.dataset = open_dataset(
                config.data,
                image_dir=config.image_dir,
                class_names=classes,
                record_dir=self.record_dir,
                write_record=write_record,
            )
            self.class_names = resolve_class_names(self.dataset, config.classes)
            logger.info("--data %s: %s dataset, classes %s", config.data, self.dataset.kind, self.class_names)
        else:
            if not config.classes:
                raise ValueError(f"{config.annotations}: a keras-yolo3 annotation file needs classes (--classes FILE)")
            self.class_names = get_classes(config.classes)

    def _report(self, split_name: str, path: str | None, num_classes: int):
        progress = bool(self.config.verbose)
        if path is None:
            return self.dataset.checked(split_name, num_classes, progress=progress)
        return check_annotations(
            path, num_classes, progress=progress, record_dir=self.record_dir, write_record=self.write_record
        )

    def _checked(self, split_name: str, path: str | None, run_dir: str, *, need_boxes: bool = True) -> list:
        """The usable records of one split; problems listed in the run folder, or refused under `strict`.

        Raises:
            ValueError: no box left in the split while `need_boxes`, or
                problems under `strict`, or no usable image.
        """
        report = self._report(split_name, path, len(self.class_names))
        name = split_name if path is None else os.path.splitext(os.path.basename(path))[0]
        where = report.source
        split_word = "training" if split_name == "train" else "validation"
        count = f"the {len(self.class_names)} classes"
        mismatch = report.class_list_mismatch(f"{count} of {self.config.classes}" if self.config.classes else count)
        if mismatch:  # not a few bad lines to skip: most of the split would go
            raise ValueError(mismatch)
        no_boxes = report.no_boxes_message(split_word)
        if no_boxes and need_boxes:
            raise ValueError(
                f"{no_boxes}.\nThe run would learn nothing and does not start: fix the labels or where they are, then "
                f"check: python -m keras_yolo_mgpu.check_dataset {self._checker_args(path)}"
            )
        warning = report.unlabelled_warning(split_word)
        if warning:
            logger.warning("%s", warning)
        if no_boxes:
            logger.warning("%s; the validation loss measures backgrounds only", no_boxes)
        if report.problems:
            if self.config.strict:  # the run folder goes with the refusal: the checker lists them
                shown = "\n  ".join(str(p) for p in report.problems[:10])
                raise ValueError(
                    f"{where}: {len(report.problems)} problem(s), --strict refuses to start:\n  {shown}\n"
                    f"Every problem: python -m keras_yolo_mgpu.check_dataset {self._checker_args(path)}"
                )
            listing = os.path.join(run_dir, f"skipped_lines_{name}.txt")
            report.write_problems(listing)
            logger.warning(
                "%s: %d of %d entries with problems: %d skipped, the others kept with boxes clipped, repeated "
                "and degenerate ones dropped (first: %s); list in %s",
                where,
                report.num_bad_lines,
                report.num_lines,
                report.num_lines - len(report.annotations),
                report.problems[0],
                listing,
            )
        if not report.annotations:
            raise ValueError(f"{where}: no usable images")
        return report.annotations

    def _checker_args(self, path: str | None) -> str:
        config = self.config
        classes = ["--classes", config.classes] if config.classes else []
        return shlex.join(["--data", config.data, *classes] if path is None else [path, *classes])

    def splits(self, run_dir: str) -> tuple[list, list]:
        """(training records, validation records), checked; images listed twice or in both are warned of."""
        train, val, drawn = self._splits(run_dir)
        if self.write_record:
            _write_list(train, os.path.join(run_dir, TRAINED_ON_FILE))  # evaluate.py names these if it scores them
        if drawn and val and self.write_record:
            _write_held_out(val, run_dir, self.config.val_split)
        named = {"training": [a.image_path for a in train], "validation": [a.image_path for a in val]}
        if self.dataset is not None and "test" in self.dataset.splits:
            named["test"] = [a.image_path for a in self.dataset.splits["test"].records]
            logger.info(
                "%s: its test split (%d images) is kept out of the run: evaluate.py --data %s --split test scores it",
                self.config.data,
                len(named["test"]),
                self.config.data,
            )
        overlap = find_overlap(named)
        for _, message in overlap.messages():
            logger.warning("%s", message)
        for split, consequence in OVERLAP_CONSEQUENCES.items():
            if overlap.shared.get(("training", split)) or overlap.same_content.get(("training", split)):
                logger.warning("%s", consequence)
        return train, val

    def _splits(self, run_dir: str) -> tuple[list, list, bool]:
        """(training records, validation records, whether the validation records were drawn from training's)."""
        config = self.config
        # mAP over a validation split without a box is 0 at every epoch: nothing to select weights by.
        val_boxes = config.monitor in MAP_MONITORS
        given_val = None  # the validation split given, which --val-split does not draw
        if self.dataset is not None:
            train = self._checked("train", None, run_dir)
            if "val" in self.dataset.splits:
                if config.val_annotations:
                    raise ValueError(
                        f"--data {config.data} has its own val split; --val-annotations {config.val_annotations} "
                        "would replace it: drop one"
                    )
                given_val = f"the val split of --data {config.data}"
            source = config.data
        else:
            train = self._checked("train", config.annotations, run_dir)
            source = config.annotations
        if config.val_annotations:
            given_val = f"--val-annotations {config.val_annotations}"
        if given_val:
            if config.val_split != DEFAULT_VAL_SPLIT:
                logger.warning("--val-split %s is not used: the run validates on %s", config.val_split, given_val)
            val = self._checked("val", config.val_annotations or None, run_dir, need_boxes=val_boxes)
            return train, val, False
        train, val = _split_off_validation(train, config.val_split, config.seed, source)
        if val_boxes and val and not any(len(a.boxes) for a in val):
            raise ValueError(
                f"{source}: the {len(val)} validation images drawn with val_split={config.val_split} hold no box, "
                f"and the run monitors {config.monitor}: raise --val-split, or give a validation split with boxes"
            )
        return train, val, True


# What an image shared between training and another split does to that split's scores.
OVERLAP_CONSEQUENCES = {
    "validation": "validation scores (and best.weights.h5, chosen by them) count images the model trains on: "
    "give validation images of their own",
    "test": "test scores (evaluate.py --split test) count images the model trains on: give test images of their own",
}


def _split_off_validation(annotations: list, val_split: float, seed, source: str) -> tuple[list, list]:
    order = np.random.default_rng(seed).permutation(len(annotations))
    num_val = int(round(len(annotations) * val_split))
    if val_split > 0 and num_val == 0 and len(annotations) > 1:
        num_val = 1
    if num_val >= len(annotations):
        raise ValueError(f"{source}: {len(annotations)} image(s) leave nothing to train on with val_split={val_split}")
    val = [annotations[i] for i in sorted(order[:num_val])]
    train = [annotations[i] for i in order[num_val:]]
    return train, val


def _write_list(records: list, path: str) -> None:
    """`records` as keras-yolo3 annotation lines with absolute image paths."""
    write_lines_atomic(path, [format_annotation_line(os.path.abspath(a.image_path), a.boxes) for a in records])


def _write_held_out(val: list, run_dir: str, val_split: float) -> None:
    path = os.path.join(run_dir, HELD_OUT_FILE)  # what evaluate.py scores for the run's weights
    _write_list(val, path)
    logger.info(
        "%d validation images held out (--val-split %g), listed in %s: evaluate.py --weights of this run scores them",
        len(val),
        val_split,
        path,
    )
