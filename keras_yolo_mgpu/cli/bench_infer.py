"""`python -m keras_yolo_mgpu.bench infer`: video detection fps against the bare forward pass.

Prints progress, then one JSON object as the last line (see `bench/infer.py`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from keras_yolo_mgpu.cli.args import ArgumentParser, flag_values, input_size, positive_int
from keras_yolo_mgpu.cli.bench import print_result
from keras_yolo_mgpu.cli.runner import run_command
from keras_yolo_mgpu.model.architectures import MODEL_NAMES


def _frame_size(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected HEIGHTxWIDTH like 480x640, got {text!r}")
    return int(parts[0]), int(parts[1])


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python -m keras_yolo_mgpu.bench infer",
        description="Video detection fps against the bare forward pass.",
    )
    parser.add_argument("--frames", type=positive_int, default=96, help="frames in the generated video (default: 96)")
    parser.add_argument(
        "--frame-size", type=_frame_size, default=(480, 640), metavar="HxW", help="video frame size (default: 480x640)"
    )
    parser.add_argument(
        "--input-size", type=input_size, default=(416, 416), metavar="HxW", help="network input (default: 416)"
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=4, help="frames per forward pass, both measurements (default: 4)"
    )
    parser.add_argument("--full", action="store_true", help="YOLOv3 (Darknet-53) instead of tiny YOLOv3")
    parser.add_argument(
        "--model", choices=MODEL_NAMES, default=None, help="network (default: yolov3-tiny, yolov3 with --full)"
    )
    parser.add_argument(
        "--num-classes", type=positive_int, default=80, help="classes of the random model (default: 80, COCO)"
    )
    parser.add_argument(
        "--output-gain",
        type=float,
        default=4.5,
        help="random model: scale of the output kernels, sets the boxes per frame (default: 4.5)",
    )
    parser.add_argument(
        "--weights",
        default=None,
        help="trained weights instead of a random model (their network, classes and anchors from the file)",
    )
    parser.add_argument("--anchors", default=None, help="anchors file for --weights without metadata")
    parser.add_argument("--classes", default=None, help="classes file for --weights without metadata")
    parser.add_argument("--score", type=float, default=0.3, help="detection score threshold (default: 0.3)")
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        help="interleaved runs of each measurement; the best counts (default: 5)",
    )
    parser.add_argument("--output-dir", default=None, help="keep the video files here (default: a temporary folder)")
    parser.add_argument(
        "--exported",
        nargs="+",
        default=(),
        metavar="PATH",
        help="exports of --weights (.onnx, .tflite, SavedModel folder; `python -m keras_yolo_mgpu.export`) "
        "timed in the same rounds, each by its own runtime",
    )
    return parser


def run(args) -> int:
    # Here: the benchmark's part (Keras, TensorFlow) loads once the command has set TensorFlow's logging.
    from keras_yolo_mgpu.bench.infer import run_infer_benchmark

    result = run_infer_benchmark(**flag_values(run_infer_benchmark, args))
    return print_result(result)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv, expected_errors=(RuntimeError,), tensorflow=True)
