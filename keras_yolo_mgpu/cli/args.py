"""Command-line flags shared by every command, defined once; the parser class and error handling are in `runner.py`."""

from __future__ import annotations

import argparse
import inspect

from keras_yolo_mgpu.cli.runner import ArgumentParser  # noqa: F401 (the commands' parser, from here with the flags)
from keras_yolo_mgpu.model.architectures import MODEL_NAMES
from keras_yolo_mgpu.weights.metadata import settings_for


def flag_values(target, args: argparse.Namespace, **converted) -> dict:
    """Keyword arguments for `target` (a function or a dataclass) from parsed flags.

    Every parameter of `target` named like a flag's `dest` takes its value as
    parsed; `converted` gives the others (e.g. `sync_bn=not args.no_sync_bn`)
    and wins over a flag of the same name. Others keep `target`'s default.
    """
    parsed = vars(args)
    same_named = {name: parsed[name] for name in inspect.signature(target).parameters if name in parsed}
    return {**same_named, **converted}


def input_size(text: str) -> tuple[int, int]:
    """`416` -> (416, 416); `320x416` -> (320, 416) as (height, width)."""
    parts = text.lower().replace(",", "x").split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a size like 416 or 320x416 (height x width), got {text!r}"
        ) from None
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or any(v <= 0 or v % 32 for v in values):
        raise argparse.ArgumentTypeError(
            f"input size must be positive multiples of 32 (e.g. 416 or 320x416), got {text!r}"
        )
    return values[0], values[1]


def _number(text: str, kind, accepts, expected: str):
    """`kind(text)` when it parses and `accepts` it, else an ArgumentTypeError saying `expected`."""
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not accepts(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, lambda value: value > 0, "a positive integer")


def non_negative_int(text: str) -> int:
    return _number(text, int, lambda value: value >= 0, "an integer >= 0")


def batch_size_or_auto(text: str) -> int | str:
    """A positive integer, or "auto" (`training.batch_fit`: the largest batch up to the default that fits)."""
    return "auto" if text.strip().lower() == "auto" else positive_int(text)


def positive_float(text: str) -> float:
    return _number(text, float, lambda value: value > 0, "a positive number")


def unit_float(text: str) -> float:
    return _number(text, float, lambda value: 0.0 <= value <= 1.0, "a number in [0, 1]")


def masks_arg(text: str):
    """`keras-yolo3` -> None (the default masks); `6,7,8 3,4,5 0,1,2` -> [[6, 7, 8], [3, 4, 5], [0, 1, 2]]."""
    if text.strip() == "keras-yolo3":
        return None
    try:
        masks = [[int(i) for i in group.split(",") if i] for group in text.replace(";", " ").split()]
    except ValueError:
        masks = []
    if not masks or not all(masks):
        raise argparse.ArgumentTypeError(
            f"expected keras-yolo3 or anchor indices per scale, coarsest first, like '3,4,5 1,2,3'; got {text!r}"
        )
    return masks


def add_model_args(
    parser: argparse.ArgumentParser, *, weights_help: str = "weights file to load", model_flag: str = "--model"
) -> None:
    """--classes, --anchors, --model, --tiny, --masks, --input-size, --weights.

    They default to the weights' metadata and must agree with it. `model_flag` names the network
    flag (yolo_video.py keeps keras-yolo3's `--model` for the weights file and uses `--architecture`).
    """
    parser.add_argument(
        "--classes",
        default=None,
        help="class names file, one per line (default: the weights' metadata, else model_data/coco_classes.txt)",
    )
    parser.add_argument(
        "--anchors",
        default=None,
        help="anchors file (default: the weights' metadata, else model_data/yolo_anchors.txt, "
        "or tiny_yolo_anchors.txt with --tiny)",
    )
    add_network_args(
        parser,
        default_help="the weights' metadata, else yolov3, or yolov3-tiny for 6 anchors",
        model_flag=model_flag,
    )
    parser.add_argument(
        "--masks",
        type=masks_arg,
        default=None,
        metavar="'3,4,5 1,2,3'",
        help="anchor indices per output scale, coarsest first (default: the weights' metadata, else keras-yolo3's)",
    )
    parser.add_argument(
        "--input-size",
        type=input_size,
        default=None,
        metavar="HxW",
        help="network input, multiples of 32 (default: the weights' metadata, else 416)",
    )
    parser.add_argument("--weights", default=None, help=weights_help)


def resolve_model_settings(args: argparse.Namespace, weights: str | None):
    """The `weights.metadata.ModelMetadata` for the model flags and the weights file.

    Raises:
        weights.metadata.MetadataError (a ValueError): a flag contradicts the file.
    """
    return settings_for(
        weights,
        classes_path=args.classes,
        anchors_path=args.anchors,
        tiny=args.tiny,
        masks=args.masks,
        input_shape=args.input_size,
        model=getattr(args, "model", None),
    )


def add_network_args(parser: argparse.ArgumentParser, *, default_help: str, model_flag: str = "--model") -> None:
    """--model NAME (stored as `model`) and --tiny, its alias for yolov3-tiny; `default_help` says the default."""
    parser.add_argument(
        model_flag, dest="model", choices=MODEL_NAMES, default=None, help=f"network (default: {default_help})"
    )
    parser.add_argument("--tiny", action="store_true", help=f"alias of {model_flag} yolov3-tiny")


def add_detection_args(parser: argparse.ArgumentParser, *, score: float = 0.3, iou: float = 0.45) -> None:
    """--score, --iou."""
    parser.add_argument("--score", type=unit_float, default=score, help=f"minimum detection score (default: {score})")
    parser.add_argument("--iou", type=unit_float, default=iou, help=f"NMS IoU threshold (default: {iou})")


def detector_params(args: argparse.Namespace, weights: str | None) -> dict:
    """`settings`, `score` and `iou` keywords from the `add_model_args` and `add_detection_args` flags.

    Raises:
        weights.metadata.MetadataError (a ValueError): a flag contradicts the file.
    """
    return {"settings": resolve_model_settings(args, weights), "score": args.score, "iou": args.iou}


def add_inference_run_args(parser: argparse.ArgumentParser, *, what: str) -> None:
    """--batch-size, --gpu_num (keras-yolo3's name) / --gpus, --no-progress: how a detecting command runs `what`."""
    parser.add_argument("--batch-size", type=positive_int, default=8, help=f"most {what} per forward pass (default: 8)")
    parser.add_argument(
        "--gpu_num",
        "--gpus",
        dest="gpu_num",
        type=positive_int,
        default=1,
        help=f"GPUs to spread batches of {what} over (default: 1)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_device_args(parser: argparse.ArgumentParser) -> None:
    """--gpus, --simulate-devices."""
    parser.add_argument(
        "--gpus", type=positive_int, default=None, help="number of GPUs (default: all visible GPUs, else the CPU)"
    )
    parser.add_argument(
        "--simulate-devices",
        action="store_true",
        help="split the CPU (or the single GPU) into --gpus logical devices to rehearse a multi-GPU run",
    )


def add_parallel_arg(parser: argparse.ArgumentParser) -> None:
    """--parallel: how the replicas run (train.py, align, the training benchmark); parallel.engine builds it."""
    parser.add_argument(
        "--parallel",
        choices=("strategy", "multi_gpu_model"),
        default="strategy",
        help="tf.distribute strategy (MirroredStrategy, or --strategy's) or the in-graph multi_gpu_model "
        "(default: strategy)",
    )


def add_iou_thresh_arg(parser: argparse.ArgumentParser) -> None:
    """--iou-thresh: Darknet's anchor assignment for the training targets (train.py, align)."""
    parser.add_argument(
        "--iou-thresh",
        type=unit_float,
        default=None,
        metavar="T",
        help="Darknet's iou_thresh: each box also trains every other anchor of its scales with IoU > T "
        "(e.g. 0.213 as yolov4.cfg; 1 = its best anchor only; default: the model's: 0.213 for YOLOv4, "
        "best anchor only for the others)",
    )


def add_freeze_args(parser: argparse.ArgumentParser, *, default: int, help: str | None = None) -> None:
    """--freeze-body (`default`, what `help` says it freezes), --no-sync-bn: which layers train, and how."""
    parser.add_argument("--freeze-body", type=int, choices=(0, 1, 2), default=default, help=help)
    parser.add_argument(
        "--no-sync-bn",
        action="store_true",
        help="per-replica BatchNormalization statistics (default: synchronized over the replicas)",
    )


def add_overwrite_arg(parser: argparse.ArgumentParser) -> None:
    """--overwrite: replace an existing output that this project did not write (`keras_yolo_mgpu.outputs`)."""
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing output files (default: only this project's own unchanged earlier outputs are "
        "replaced; an output that is also an input is always refused)",
    )
