"""`python evaluate.py`: mAP of weights, or of saved detections, on a dataset.

python evaluate.py --data my_dataset/data.yaml --weights W         (its val split; classes from the weights)
python evaluate.py --data my_dataset/data.yaml --weights W --split test   (its test split, held out of training)
python evaluate.py --annotations val.txt --weights W --classes C --anchors A
python evaluate.py --annotations val.txt --detections detections.json --classes C
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli import args as cli
from keras_yolo_mgpu.cli import quiet
from keras_yolo_mgpu.cli.dataset_args import add_data_args, checked_records, open_data
from keras_yolo_mgpu.cli.runner import UsageError, run_command
from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.dataset_source import resolve_class_names
from keras_yolo_mgpu.data.overlap import find_overlap
from keras_yolo_mgpu.evaluation.mean_ap import evaluate_detections, evaluate_weights, format_report, load_annotations
from keras_yolo_mgpu.outputs import check_output
from keras_yolo_mgpu.plots.evaluation import evaluation_picture_paths
from keras_yolo_mgpu.resources import resolve_resource
from keras_yolo_mgpu.training.run_folder import (
    held_out_list,
    recorded_dataset,
    recorded_validation,
    trained_on_list,
)
from keras_yolo_mgpu.weights.download import resolve_weights
from keras_yolo_mgpu.weights.start_weights import darknet_as_keras

logger = logging.getLogger("evaluate")


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="evaluate.py",
        description="COCO mAP@[.5:.95] and mAP@.5 (faster-coco-eval), AP per class, precision/recall "
        "and a PR curve, of weights or of saved detections on a dataset (--data) or a keras-yolo3 annotation file.",
    )
    parser.add_argument(
        "--annotations",
        metavar="FILE",
        help="annotation file (keras-yolo3 format) with the ground truth",
    )
    add_data_args(parser, split="val")
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
    # No default file: evaluate writes nothing unless told where, so it never overwrites a plot behind the user's back.
    parser.add_argument(
        "--pr-curve",
        default=None,
        metavar="PNG",
        help="write the precision-recall plot to this file, and beside it <name>_confusion_matrix.png and "
        "<name>_confidence_curves.png (F1, precision, recall against confidence) (default: no plots)",
    )
    parser.add_argument(
        "--save-detections", metavar="FILE", help="with --weights: write the detections as COCO results JSON"
    )
    cli.add_overwrite_arg(parser)
    return parser


def run(args) -> int:
    result = evaluation(args)
    print(format_report(result))
    print(json.dumps(result))
    return 0


def _check_outputs(args) -> None:
    """--save-detections and --pr-curve's pictures under the output rule (`outputs.check_output`)."""
    outputs = [(args.save_detections, "--save-detections")] if args.save_detections else []
    if args.pr_curve:
        outputs += [(path, "--pr-curve") for path in evaluation_picture_paths(args.pr_curve).values()]
    inputs = (args.weights, args.detections, args.annotations, args.data, args.classes, args.anchors)
    for path, flag in outputs:
        check_output(path, inputs=inputs, overwrite=args.overwrite, flag=flag)


def evaluation(args) -> dict:
    """What the command does, returning its report (the JSON it prints last)."""
    if bool(args.weights) == bool(args.detections):
        raise UsageError("give exactly one of --weights (run a model) or --detections (score saved detections)")
    runs_validation = _use_the_runs_images(args)
    if args.split != "val" and not args.data:
        raise UsageError(
            f"--split {args.split} scores that split of a dataset, and the run of --weights named none: give it "
            "with --data"
        )
    if bool(args.annotations) == bool(args.data):
        raise UsageError(
            "give exactly one of --data (a dataset of any kind) or --annotations (keras-yolo3 file); "
            "the weights of a run that validated on images need neither (it scores those)"
        )
    _check_outputs(args)  # before the model runs: a refused file must not cost the whole evaluation
    if args.detections:
        annotations, class_names = args.annotations, resolve_resource(args.classes, "classes")
        if args.data:
            annotations, class_names = _data_records(args, None)
        result = evaluate_detections(
            args.detections,
            annotations,
            class_names,
            score=args.score,
            root=args.root,
            pr_curve=args.pr_curve or None,
        )
    else:
        args.weights = resolve_weights(args.weights)  # an official net's name: its file, downloaded once
        if not os.path.exists(args.weights):  # before the classes it would have are compared with the dataset's
            raise FileNotFoundError(f"weights file not found: {args.weights}")
        quiet.import_tensorflow(args.verbose)  # only a model needs TensorFlow
        args.weights = darknet_as_keras(args.weights)  # Darknet files, converted as convert.py does
        params = cli.detector_params(args, args.weights)
        if args.data:
            annotations, _ = _data_records(args, list(params["settings"].class_names))
        else:
            annotations = load_annotations(args.annotations, args.root)  # read once: the check below and the scores
        _say_if_trained_on(args.weights, annotations, runs_validation)
        result = evaluate_weights(
            args.weights,
            annotations,
            **params,
            batch_size=args.batch_size,
            gpu_num=args.gpu_num,
            root=args.root,
            pr_curve=args.pr_curve or None,
            save_detections=args.save_detections,
            progress=not args.no_progress,
        )
    return result


def _use_the_runs_images(args) -> bool:
    """The images a run's --weights are scored on where no dataset is given, or where the one given has no val split.

    Returns whether they are the ones the run itself validated on.
    """
    if not args.weights or args.annotations:
        return False
    if args.split == "val":
        if args.data:
            _use_held_out_when_data_has_no_val(args)
            return False
        return _use_the_runs_validation(args)
    recorded = None if args.data else recorded_dataset(args.weights)  # --split test or train: of the run's --data
    if recorded is not None:
        args.data, args.image_dir = recorded["data"], args.image_dir or recorded["image_dir"]
        logger.info("scoring the %s split of the run's --data %s (its args.json)", args.split, args.data)
    return False


def _use_the_runs_validation(args) -> bool:
    """A run's weights alone: the images that run validated on (those it held out, else those it was given).

    Returns whether the run had any (False: `args` unchanged).
    """
    args.annotations = held_out_list(args.weights)
    if args.annotations:
        logger.info("scoring the images the run held out for validation: %s", args.annotations)
        return True
    recorded = recorded_validation(args.weights)
    if recorded is None:
        return False
    if "annotations" in recorded:
        args.annotations = recorded["annotations"]
        source = f"--val-annotations {shlex.quote(args.annotations)}"
    else:
        args.data, args.image_dir = recorded["data"], args.image_dir or recorded["image_dir"]
        source = f"the val split of --data {shlex.quote(args.data)}"
    logger.info("scoring the images the run validated on: %s (its args.json)", source)
    return True


def _use_held_out_when_data_has_no_val(args) -> None:
    """--data without a val split, and weights of a run that trained on it: score the images that run held out."""
    held_out = held_out_list(args.weights, args.data)
    if held_out is None:
        return
    dataset = open_data(args)
    if "val" not in dataset.splits:
        logger.info(
            "%s has no val split; %s trained on it and held out %s: scoring those images",
            args.data,
            args.weights,
            held_out,
        )
        args.annotations, args.data = held_out, None


def _say_if_trained_on(weights: str, records: list, runs_validation: bool) -> None:
    """Warns when images scored here are images the run of `weights` trained on (the same path or the same bytes).

    `runs_validation`: `records` are the images the run validated on, so they cannot be chosen otherwise here.
    """
    trained_on = trained_on_list(weights)
    if trained_on is None:
        return
    scored = [a.image_path for a in records]
    overlap = find_overlap({"trained": [a.image_path for a in read_annotations(trained_on)], "scored": scored})
    seen = set(overlap.shared.get(("trained", "scored"), []))
    seen.update(path for _, path in overlap.same_content.get(("trained", "scored"), []))
    if not seen:
        return
    if runs_validation:  # the run's own validation overlaps its training images: the dataset's doing
        advice = "These are the images the run validated on, so its val_mAP and best.weights.h5 counted them too: "
        advice += "give the dataset validation images of their own"
    else:
        advice = f"evaluate.py --weights {shlex.quote(weights)} alone scores the images the run validated on"
    logger.warning(
        "%d of the %d images scored here are images the run of %s trained on (the same file or the same bytes, "
        "listed in %s): the scores count images the model has learnt. %s",
        len(seen),
        len(set(scored)),
        weights,
        trained_on,
        advice,
    )


def _data_records(args, model_names: list[str] | None):
    """(records of --data's --split, class names): the dataset's names must be the model's, when both have them."""
    dataset = open_data(args, class_names=model_names)
    if model_names is None:
        names = resolve_class_names(dataset, args.classes)
    else:
        names = dataset.class_names or model_names
        if names != model_names:
            raise UsageError(
                f"the dataset {args.data} names {names} but the model ({args.weights}) detects {model_names}: "
                "evaluate it on a dataset of its classes"
            )
    # Images are decoded once, by the detector, which skips (and counts) those nobody reads.
    return checked_records(dataset, args.split, len(names), check_images=False), names


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
