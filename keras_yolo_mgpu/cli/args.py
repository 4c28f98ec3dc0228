"""Command-line flags shared by every command, defined once.

Commands call the `add_*` functions and convert parsed arguments to library
parameters explicitly; the library itself never reads argv. The parser class
and the error handling every command shares live in `runner.py`.
"""

from __future__ import annotations

import argparse

from keras_yolo_mgpu.cli.runner import ArgumentParser, setup_logging

__all__ = [
    "ArgumentParser",
    "add_detection_args",
    "add_device_args",
    "add_gpu_num_arg",
    "add_model_args",
    "input_size",
    "positive_int",
    "setup_logging",
    "unit_float",
]


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


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def unit_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def add_model_args(parser: argparse.ArgumentParser, *, weights_help: str = "weights file to load") -> None:
    """--classes, --anchors, --tiny, --input-size, --weights."""
    parser.add_argument(
        "--classes", default=None, help="class names file, one per line (default: model_data/coco_classes.txt)"
    )
    parser.add_argument(
        "--anchors",
        default=None,
        help="anchors file (default: model_data/yolo_anchors.txt, or tiny_yolo_anchors.txt with --tiny)",
    )
    parser.add_argument("--tiny", action="store_true", help="tiny YOLOv3 (6 anchors) when --anchors is not given")
    parser.add_argument(
        "--input-size",
        type=input_size,
        default=(416, 416),
        metavar="HxW",
        help="network input, multiples of 32 (default: 416)",
    )
    parser.add_argument("--weights", default=None, help=weights_help)


def add_detection_args(parser: argparse.ArgumentParser, *, score: float = 0.3, iou: float = 0.45) -> None:
    """--score, --iou."""
    parser.add_argument("--score", type=unit_float, default=score, help=f"minimum detection score (default: {score})")
    parser.add_argument("--iou", type=unit_float, default=iou, help=f"NMS IoU threshold (default: {iou})")


def add_gpu_num_arg(parser: argparse.ArgumentParser, *, what: str) -> None:
    """--gpu_num (keras-yolo3's name) / --gpus: GPUs an inference command spreads its batches over."""
    parser.add_argument(
        "--gpu_num",
        "--gpus",
        dest="gpu_num",
        type=positive_int,
        default=1,
        help=f"GPUs to spread batches of {what} over (default: 1)",
    )


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
