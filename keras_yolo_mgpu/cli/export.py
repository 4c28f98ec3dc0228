"""`python -m keras_yolo_mgpu.export`: weights to a SavedModel, TFLite or ONNX detector.

python -m keras_yolo_mgpu.export --weights W --classes C --anchors A --format savedmodel|tflite|onnx
python -m keras_yolo_mgpu.export --weights W --format tflite --int8 --images train.txt --validation val.txt
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from keras_yolo_mgpu.cli import args as cli
from keras_yolo_mgpu.cli.runner import UsageError, run_command
from keras_yolo_mgpu.evaluation.mean_ap import DEFAULT_MAX_MAP_DROP, compare_map
from keras_yolo_mgpu.inference.export import (  # light: TensorFlow loads later
    FORMATS,
    ExportError,
    export_model,
    use_keras_on_tensorflow,
)
from keras_yolo_mgpu.inference.export_check import format_check, image_paths
from keras_yolo_mgpu.inference.quantize import DEFAULT_CALIBRATION_IMAGES
from keras_yolo_mgpu.training.run_folder import held_out_list, recorded_validation, trained_on_list
from keras_yolo_mgpu.weights.download import resolve_weights
from keras_yolo_mgpu.weights.start_weights import darknet_as_keras

logger = logging.getLogger("export")


# Over 60 lines by design: the command's flat list of flags, as --help prints them.
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
        "--images",
        metavar="DIR_OR_ANNOTATION_FILE",
        default=None,
        help="training images (a folder, or an annotation file's images): the self-check runs on 8 of them "
        "(default: the images a run validated on, its val_split.txt or --val-annotations, else generated scenes "
        "with objects) and --int8 calibrates on them (default: the images a run trained on, its train_split.txt)",
    )
    _add_precision_args(parser)
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing .tflite/.onnx file at --output (a SavedModel replaces only an empty folder or "
        "a previous export of this tool, never anything else)",
    )
    return parser


def _add_precision_args(parser: cli.ArgumentParser) -> None:
    """--int8 or --half, the calibration images, and the mAP the export may lose (--validation)."""
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument(
        "--int8", action="store_true", help="TFLite only: INT8 network calibrated on --images (about 1/4 the size)"
    )
    precision.add_argument("--half", action="store_true", help="TFLite only: float16 weights (half the size)")
    parser.add_argument(
        "--calibration-images",
        type=cli.positive_int,
        default=DEFAULT_CALIBRATION_IMAGES,
        help=f"images of --images that calibrate --int8 (default: {DEFAULT_CALIBRATION_IMAGES})",
    )
    parser.add_argument(
        "--validation",
        metavar="ANNOTATION_FILE",
        default=None,
        help="also measure mAP of the export and of the Keras weights on this annotation file, and warn when "
        "the export loses more than --max-map-drop mAP@0.5",
    )
    parser.add_argument(
        "--max-map-drop",
        type=cli.unit_float,
        default=DEFAULT_MAX_MAP_DROP,
        help=f"largest mAP@0.5 drop accepted without a warning (default: {DEFAULT_MAX_MAP_DROP})",
    )


def run(args) -> int:
    result = exported(args)
    if result["check"]:
        print(format_check(result["check"]))
    print(f"exported {result['format']} ({result['precision']}, {result['size'] / 1e6:.2f} MB): {result['path']}")
    for name in ("keras", "export") if result["map"] else ():
        row = result["map"][name]
        print(f"mAP on {args.validation}, {name:>6}: mAP@.5 {row['mAP50']:.3f}   mAP@[.5:.95] {row['mAP']:.3f}")
    return 0


def exported(args) -> dict:
    """What the command does: `inference.export.export_model`'s result, the model's `settings`, and `map`.

    `map` is `evaluation.mean_ap.compare_map`'s comparison on `--validation`, None without it.
    """
    if not args.weights:
        raise UsageError("--weights is required")
    use_keras_on_tensorflow()  # before anything builds a model
    args.weights = darknet_as_keras(resolve_weights(args.weights))  # an official name, Darknet files
    params = cli.detector_params(args, args.weights)
    images = args.images
    if not images and args.int8:  # calibration: the images the run trained on
        images = _run_images(trained_on_list(args.weights), "calibrating INT8 on the images the run trained on")
    elif not images and not args.no_check:  # the self-check: photos like the ones the model will see
        validated_on = held_out_list(args.weights) or (recorded_validation(args.weights) or {}).get("annotations")
        images = _run_images(validated_on, "checking the export on images the run validated on")
    result = export_model(
        args.weights,
        args.format,
        args.output,
        **params,
        max_boxes=args.max_boxes,
        max_detections=args.max_detections,
        check=not args.no_check,
        overwrite=args.overwrite,
        precision="int8" if args.int8 else "float16" if args.half else "float32",
        images=images,
        calibration_images=args.calibration_images,
    )
    comparison = _compare_map(args, result["path"], params["settings"]) if args.validation else None
    return {**result, "settings": params["settings"], "map": comparison}


def _run_images(listed: str | None, use: str) -> str | None:
    """A run folder's image list (`held_out_list`, `trained_on_list`), when its images are all here; else None."""
    if listed is None:
        return None
    missing = [path for path in image_paths(listed) if not os.path.isfile(path)]
    if missing:  # the dataset moved since the run
        logger.info("%s lists %d image(s) not found here (%s): not using it", listed, len(missing), missing[0])
        return None
    logger.info("%s (%s); --images chooses others", use, listed)
    return listed


def _compare_map(args, exported: str, settings) -> dict:
    comparison = compare_map(args.weights, exported, args.validation, settings, iou=args.iou)
    drop = comparison["drop50"]
    if drop > args.max_map_drop:
        logger.warning(
            "the export loses %.3f mAP@0.5 against the Keras weights (more than --max-map-drop %.3f)",
            drop,
            args.max_map_drop,
        )
    return comparison


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv, expected_errors=(ExportError,), tensorflow=True)
