"""`python train.py` as keras-yolo3's users run it: its hard-coded paths, and the settings they edit in train.py.

keras-yolo3's train.py takes no flags: it reads `train.txt`, `model_data/voc_classes.txt`,
`model_data/yolo_anchors.txt` and `model_data/yolo_weights.h5` (`tiny_yolo_weights.h5` for 6
anchors); its train_bottleneck.py reads `model_data/coco_classes.txt` instead. This module fills
those flags from the folder the command runs in; a flag given wins.

`annotation_path` and `classes_path` set in train.py's SETTINGS (`cli.script_settings`) take the place of
keras-yolo3's files here.
"""

from __future__ import annotations

import argparse
import logging
import os

from keras_yolo_mgpu.cli.runner import CommandError
from keras_yolo_mgpu.cli.script_settings import DATASET_SETTINGS, ScriptSettings
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
            official = "yolov3-tiny" if tiny else "yolov3"
            raise CommandError(
                f"keras-yolo3's {script} starts from {weights} ({'6 anchors: tiny YOLOv3' if tiny else '9 anchors'}), "
                f"which is not in this folder. Make it as keras-yolo3's README does: python convert.py -w "
                f"{official}.cfg {official}.weights {weights}; or pass --weights FILE (a Darknet .weights file works "
                f"as it is) or --weights {official} (the official weights by name), or set weights_path in {script}"
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
