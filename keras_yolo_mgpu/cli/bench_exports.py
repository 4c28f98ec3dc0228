"""`python -m keras_yolo_mgpu.bench exports`: size, mAP and images/s of every export format of one model.

Prints progress, a markdown table, then one JSON object as the last line (see `bench/exports.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

from keras_yolo_mgpu.cli.args import ArgumentParser, positive_int
from keras_yolo_mgpu.cli.bench import print_result
from keras_yolo_mgpu.cli.runner import run_command


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python -m keras_yolo_mgpu.bench exports",
        description="Export trained weights in every format and measure each: file size, mAP, images/s.",
    )
    parser.add_argument("--weights", required=True, help="trained weights with metadata (.weights.h5)")
    parser.add_argument(
        "--images",
        required=True,
        metavar="DIR_OR_ANNOTATION_FILE",
        help="training images: the exports' check and INT8 calibration",
    )
    parser.add_argument("--annotations", required=True, help="validation annotation file: mAP and speed")
    parser.add_argument("--out", required=True, help="folder for the exports")
    parser.add_argument("--rounds", type=positive_int, default=3, help="interleaved speed rounds (default: 3)")
    parser.add_argument(
        "--speed-images", type=positive_int, default=20, help="validation images timed per round (default: 20)"
    )
    parser.add_argument(
        "--calibration-images", type=positive_int, default=200, help="INT8 calibration images (default: 200)"
    )
    return parser


def run(args) -> int:
    from keras_yolo_mgpu.bench.exports import benchmark_exports, format_table

    result = benchmark_exports(
        args.weights,
        args.images,
        args.annotations,
        args.out,
        rounds=args.rounds,
        speed_images=args.speed_images,
        calibration_images=args.calibration_images,
    )
    print(format_table(result))
    return print_result(result)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv, expected_errors=(RuntimeError,), tensorflow=True)
