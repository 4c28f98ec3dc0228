"""`python train.py` as keras-yolo3's users run it: its hard-coded paths, and the settings they edit in train.py.

keras-yolo3's train.py takes no flags: it reads `train.txt`, `model_data/voc_classes.txt`,
`model_data/yolo_anchors.txt` and `model_data/yolo_weights.h5` (`tiny_yolo_weights.h5` for 6
anchors); its train_bottleneck.py reads `model_data/coco_classes.txt` instead. This module fills
those flags from the folder the command runs in; a flag given wins.

Its README's next step is "Modify train.py and start training": users edit the values its
`_main()` sets. This project's train.py and train_bottleneck.py hold the same names (`SCRIPT_SETTINGS`) and
pass them here (`ScriptSettings`); each stands for a flag, and a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from collections.abc import Mapping

from keras_yolo_mgpu.cli.runner import CommandError
from keras_yolo_mgpu.resources import get_anchors, resolve_resource

logger = logging.getLogger("train")

ANNOTATIONS = "train.txt"
# The class names each keras-yolo3 script reads, and the shipped copy (`resources`) where the folder has none.
CLASSES = {
    "train.py": (os.path.join("model_data", "voc_classes.txt"), "voc_classes"),
    "train_bottleneck.py": (os.path.join("model_data", "coco_classes.txt"), "classes"),
}
ANCHORS = os.path.join("model_data", "yolo_anchors.txt")
WEIGHTS = os.path.join("model_data", "yolo_weights.h5")
TINY_WEIGHTS = os.path.join("model_data", "tiny_yolo_weights.h5")

# The values keras-yolo3's `_main()` sets and its users edit, under their names (with the epoch counts its fit
# calls hard-code), and the flag (parser dest) each stands for.
SCRIPT_SETTINGS = {
    "annotation_path": "annotations",
    "classes_path": "classes",
    "anchors_path": "anchors",
    "weights_path": "weights",
    "log_dir": "log_dir",
    "input_shape": "input_size",
    "val_split": "val_split",
    "batch_size": "batch_size",
    "batch_size2": "batch_size2",
    "epochs": "epochs",
    "freeze_epochs": "freeze_epochs",
    "bottleneck_epochs": "bottleneck_epochs",
}
# The dataset's own files: used where no dataset flag (--data, --annotations) is on the command line, which names
# another dataset; the others become the flags' defaults.
DATASET_SETTINGS = ("annotation_path", "classes_path")


@dataclasses.dataclass(frozen=True)
class ScriptSettings:
    """The settings a script (train.py, train_bottleneck.py) sets in its file; None values are not set.

    `values`: `SCRIPT_SETTINGS` name -> value, as the script passes them.
    A name keras-yolo3's scripts do not have, or a value its flag refuses, is
    a problem `check` reports: a typo in train.py never trains with a default.
    """

    script: str = "train.py"
    values: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def given(self) -> dict[str, object]:
        """The settings the script sets (name -> value), in `SCRIPT_SETTINGS` order."""
        return {name: self.values[name] for name in SCRIPT_SETTINGS if self.values.get(name) is not None}

    def dataset_path(self, name: str) -> str | None:
        """`annotation_path` or `classes_path` as the script sets it (None: not set)."""
        value = self.values.get(name)
        return None if value is None else os.fspath(value)

    def problems(self, parser: argparse.ArgumentParser) -> list[str]:
        """What the script sets that is no setting, or that its flag refuses."""
        problems = [f"{name} is not one of its settings" for name in self.values if name not in SCRIPT_SETTINGS]
        for name, (_, value) in self._flag_defaults(parser).items():
            if isinstance(value, Exception):
                problems.append(f"{name} = {self.values[name]!r}: {value}")
        return problems

    def check(self, parser: argparse.ArgumentParser) -> None:
        """Raises CommandError naming each problem and the settings there are."""
        problems = self.problems(parser)
        if problems:
            raise CommandError(
                f"{self.script}'s settings: " + "; ".join(problems) + f" (the settings: {', '.join(SCRIPT_SETTINGS)})"
            )

    def apply_defaults(self, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Makes each setting but the dataset's files its flag's default (a flag given wins); returns `parser`."""
        for dest, value in self._flag_defaults(parser).values():
            if not isinstance(value, Exception):  # `check` reports it before anything runs
                parser.set_defaults(**{dest: value})
        return parser

    def log(self, args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
        """Says which settings the script set, and which a flag on the command line or a dataset flag replaced."""
        defaults = self._flag_defaults(parser)
        parts = []
        for name, value in self.given().items():
            dest = SCRIPT_SETTINGS[name]
            if name in DATASET_SETTINGS:
                replaced = args.data or args.annotations
                parts.append(f"{name} = {value!r}" + (" (not used: a dataset flag names the data)" if replaced else ""))
            elif getattr(args, dest) != defaults[name][1]:
                parts.append(f"{name} = {value!r} (--{dest.replace('_', '-')} {getattr(args, dest)} given wins)")
            else:
                parts.append(f"{name} = {value!r}")
        if parts:
            logger.info("%s sets %s", self.script, ", ".join(parts))

    def _flag_defaults(self, parser: argparse.ArgumentParser) -> dict[str, tuple[str, object]]:
        """name -> (dest, the value as its flag parses it, or the error it raised), dataset files left out."""
        actions = {action.dest: action for action in parser._actions}
        defaults = {}
        for name, value in self.given().items():
            dest = SCRIPT_SETTINGS[name]
            if name in DATASET_SETTINGS or dest not in actions:
                continue
            text, convert = _flag_text(value), actions[dest].type
            try:
                defaults[name] = (dest, convert(text) if convert else text)
            except (ValueError, TypeError, argparse.ArgumentTypeError) as error:
                defaults[name] = (dest, error)
        return defaults


def _flag_text(value) -> str:
    """A setting as its flag is written: (416, 416) -> "416x416"."""
    if isinstance(value, (tuple, list)):
        return "x".join(str(part) for part in value)
    return os.fspath(value) if isinstance(value, os.PathLike) else str(value)


def is_keras_yolo3_folder(folder: str = ".") -> bool:
    """True when `folder` holds keras-yolo3's annotation file `train.txt`."""
    return os.path.isfile(os.path.join(folder, ANNOTATIONS))


def apply_keras_yolo3_paths(args: argparse.Namespace, settings: ScriptSettings | None = None) -> None:
    """Sets --annotations, --classes, --anchors and --weights to the paths keras-yolo3's script reads.

    `settings`: the script and what its file sets (default: train.py, nothing
    set); its annotation_path and classes_path take the place of keras-yolo3's.
    A file the folder's `model_data/` lacks comes from this project's (the
    same shipped files), said in the log. Missing start weights stop the
    command, naming the file and how keras-yolo3's README makes it.

    Raises:
        CommandError: keras-yolo3's start weights are missing and no --weights was given, or a file the
            script's settings name is missing.
    """
    settings = settings or ScriptSettings()
    script = settings.script
    for name in DATASET_SETTINGS:
        path = settings.dataset_path(name)
        if path is not None and not os.path.isfile(path):
            raise CommandError(f"{script}'s {name} = {path!r}: file not found (in {os.path.abspath('.')})")
    args.annotations = settings.dataset_path("annotation_path") or ANNOTATIONS
    taken = [args.annotations]
    if args.classes is None and settings.dataset_path("classes_path"):
        args.classes = settings.dataset_path("classes_path")
        taken.append(args.classes)
    elif args.classes is None:
        args.classes = _folder_or_shipped(*CLASSES[script], taken)
    if args.anchors is None:
        args.anchors = _folder_or_shipped(ANCHORS, "anchors", taken)
    if args.weights is None:
        anchors_path = args.anchors if args.anchors != "auto" else resolve_resource(None, "anchors")
        tiny = len(get_anchors(anchors_path)) == 6  # keras-yolo3: `is_tiny_version = len(anchors)==6`
        weights = TINY_WEIGHTS if tiny else WEIGHTS
        if not os.path.isfile(weights):
            source = "yolov3-tiny.cfg yolov3-tiny.weights" if tiny else "yolov3.cfg yolov3.weights"
            raise CommandError(
                f"keras-yolo3's {script} starts from {weights} ({'6 anchors: tiny YOLOv3' if tiny else '9 anchors'}), "
                f"which is not in this folder. Make it as keras-yolo3's README does: python convert.py -w {source} "
                f"{weights}; or pass --weights FILE (a Darknet .weights file works as it is), or set weights_path in "
                f"{script}"
            )
        args.weights = weights
        taken.append(weights)
    logger.info(
        "keras-yolo3 folder: took %s from %s (keras-yolo3's %s paths; --data/--annotations, --classes, "
        "--anchors and --weights choose others)",
        ", ".join(taken),
        os.path.abspath("."),
        script,
    )


def _folder_or_shipped(path: str, kind: str, taken: list[str]) -> str:
    """`path` in the folder when it is there (appended to `taken`), else this project's shipped copy."""
    if os.path.isfile(path):
        taken.append(path)
        return path
    shipped = resolve_resource(None, kind)
    logger.info("keras-yolo3 folder: no %s here; using the shipped %s", path, shipped)
    return shipped
