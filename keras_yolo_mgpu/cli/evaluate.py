"""`python evaluate.py`: mAP of weights, or of saved detections, on an annotation file.

python evaluate.py --annotations val.txt --weights W --classes C --anchors A
python evaluate.py --annotations val.txt --detections detections.json --classes C
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli import args as cli
from keras_yolo_mgpu.cli import quiet
from keras_yolo_mgpu.cli.runner import UsageError, run_command


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="evaluate.py",
        description="COCO mAP@[.5:.95] and mAP@.5 (faster-coco-eval), AP per class, precision/recall "
        "and a PR curve, of weights or of saved detections on a keras-yolo3 annotation file.",
    )
    parser.add_argument(
        "--annotations",
        required=True,
        metavar="FILE",
        help="annotation file (keras-yolo3 format) with the ground truth",
    )
    cli.add_model_args(
        parser,
        weights_help="weights to evaluate (.weights.h5, .keras or Keras 2 .h5), or an exported model (SavedModel "
        "folder, .tflite, .onnx) beside its .metadata.json",
    )
    parser.add_argument(
        "--detections",
        metavar="FILE",
        help="score saved detections instead of running a model: COCO results JSON, image_id = 0-based "
        "index of the image's non-blank line, category_id = class index, bbox = [x, y, w, h] pixels",
    )
    cli.add_detection_args(parser)
    parser.add_argument("--root", default=None, help="folder for relative image paths in the annotation file")
    cli.add_inference_run_args(parser, what="images")
    # No default file: evaluate writes nothing unless told where (its report
    # goes to stdout), so it never drops or overwrites a plot in the current
    # folder, or in the weights' folder, behind the user's back.
    parser.add_argument(
        "--pr-curve",
        default=None,
        metavar="PNG",
        help="write the precision-recall plot to this file (default: no plot)",
    )
    parser.add_argument(
        "--save-detections", metavar="FILE", help="with --weights: write the detections as COCO results JSON"
    )
    return parser


def run(args) -> int:
    from keras_yolo_mgpu.evaluation.mean_ap import evaluate_detections, evaluate_weights, format_report
    from keras_yolo_mgpu.resources import resolve_resource

    if bool(args.weights) == bool(args.detections):
        raise UsageError("give exactly one of --weights (run a model) or --detections (score saved detections)")
    if args.detections:
        result = evaluate_detections(
            args.detections,
            args.annotations,
            resolve_resource(args.classes, "classes"),
            score=args.score,
            root=args.root,
            pr_curve=args.pr_curve or None,
        )
    else:
        quiet.import_tensorflow(args.verbose)  # only a model needs TensorFlow
        result = evaluate_weights(
            args.weights,
            args.annotations,
            **cli.detector_params(args, args.weights),
            batch_size=args.batch_size,
            gpu_num=args.gpu_num,
            root=args.root,
            pr_curve=args.pr_curve or None,
            save_detections=args.save_detections,
            progress=not args.no_progress,
        )
    print(format_report(result))
    print(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
