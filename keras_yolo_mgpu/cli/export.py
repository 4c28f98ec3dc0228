"""`python -m keras_yolo_mgpu.export`: weights to a SavedModel, TFLite or ONNX detector.

python -m keras_yolo_mgpu.export --weights W --classes C --anchors A --format savedmodel|tflite|onnx
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli import args as cli
from keras_yolo_mgpu.cli.runner import UsageError, run_command
from keras_yolo_mgpu.inference.export import FORMATS, ExportError  # light: TensorFlow loads later


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="python -m keras_yolo_mgpu.export",
        description="Export weights as a SavedModel, TFLite or ONNX model with decoding and NMS inside.",
    )
    cli.add_model_args(parser, weights_help="weights to export (.weights.h5, .keras or Keras 2 .h5)")
    cli.add_detection_args(parser)
    parser.add_argument(
        "--format", required=True, choices=FORMATS, help="savedmodel (folder), tflite (batch 1) or onnx"
    )
    parser.add_argument(
        "--output",
        default=None,
        help="output path (default: next to the weights, e.g. W_savedmodel/, W.tflite, W.onnx)",
    )
    parser.add_argument(
        "--max-boxes", type=cli.positive_int, default=20, help="most boxes per class and image (default: 20)"
    )
    parser.add_argument(
        "--max-detections", type=cli.positive_int, default=100, help="detections per image, padded (default: 100)"
    )
    parser.add_argument("--no-check", action="store_true", help="skip comparing the export with the Keras model")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing .tflite/.onnx file at --output (a SavedModel replaces only an empty folder or "
        "a previous export of this tool, never anything else)",
    )
    return parser


def run(args) -> int:
    from keras_yolo_mgpu.inference.export import BOX_TOLERANCE_PX, SCORE_TOLERANCE, export_model

    if not args.weights:
        raise UsageError("--weights is required")
    result = export_model(
        args.weights,
        args.format,
        args.output,
        **cli.detector_params(args, args.weights),
        max_boxes=args.max_boxes,
        max_detections=args.max_detections,
        check=not args.no_check,
        overwrite=args.overwrite,
    )
    if result["check"]:
        c = result["check"]
        print(
            f"check: {c['detections']} detections on random images; largest differences "
            f"{c['max_box_diff']:.2e} px (tolerance {BOX_TOLERANCE_PX}), "
            f"score {c['max_score_diff']:.2e} (tolerance {SCORE_TOLERANCE})"
        )
    print(f"exported {result['format']}: {result['path']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv, expected_errors=(ExportError,), tensorflow=True)


if __name__ == "__main__":
    sys.exit(main())
