"""`python -m keras_yolo_mgpu.align`: check that N GPUs train like one, on your data.

    python -m keras_yolo_mgpu.align --annotations train.txt --classes my_classes.txt \
        --weights start.weights.h5 --gpus 4 --steps 10 --float64
    python -m keras_yolo_mgpu.align diff run1/trained_weights_final.weights.h5 run2/ep010.weights.h5 --tiny

The first form trains `--steps` steps from the same weights on one device and on
`--gpus` replicas and prints per layer the largest weight difference, how far the
layer moved and their ratio, then one JSON object; exit status 0 when the difference
is under the threshold. The second compares two weight files tensor by tensor.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import numpy as np

from keras_yolo_mgpu.cli import args as cli
from keras_yolo_mgpu.cli.runner import run_command
from keras_yolo_mgpu.data.check import check_annotations
from keras_yolo_mgpu.data.host import HostBatches
from keras_yolo_mgpu.model.architectures import get_architecture, model_name, resolve_iou_thresh
from keras_yolo_mgpu.resources import get_anchors, get_classes, resolve_resource
from keras_yolo_mgpu.weights.metadata import MetadataError, read_metadata, settings_for
from keras_yolo_mgpu.wording import counted

logger = logging.getLogger("align")


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="python -m keras_yolo_mgpu.align",
        description="Train K steps on one device and on N replicas from the same weights and compare every layer. "
        "`python -m keras_yolo_mgpu.align diff A B` compares two weight files.",
    )
    data = parser.add_argument_group("data")
    data.add_argument("--annotations", required=True, help="annotation file: `path x1,y1,x2,y2,class ...` per line")
    data.add_argument("--no-augment", action="store_true", help="letterbox only (default: train.py's augmentation)")
    data.add_argument(
        "--seed", type=int, default=0, help="shuffling/augmentation seed (both runs see the same batches)"
    )
    model = parser.add_argument_group("model")
    cli.add_model_args(model, weights_help="start weights (default: random initialisation)")
    cli.add_freeze_args(
        model,
        default=0,
        help="0 trains every layer, BatchNormalization included (the demanding case); 1/2 as in train.py",
    )
    recipe = parser.add_argument_group("steps")
    recipe.add_argument("--steps", type=cli.positive_int, default=5, help="optimizer steps in each run")
    recipe.add_argument(
        "--batch-size", type=cli.positive_int, default=8, help="GLOBAL batch size (a multiple of --gpus)"
    )
    recipe.add_argument(
        "--optimizer",
        choices=("sgd", "momentum", "adam"),
        default="sgd",
        help="sgd: plain SGD (stateless, shows the gradients as they are); momentum: SGD with momentum 0.9 "
        "(train.py's sgd); adam: train.py's default",
    )
    recipe.add_argument("--lr", type=float, default=1e-4, help="learning rate")
    cli.add_iou_thresh_arg(recipe)
    recipe.add_argument("--float64", action="store_true", help="compute in float64: the runs must then agree to 1e-9")
    recipe.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="bound on the largest difference (default: 1e-9 in float64, "
        "--relative-threshold times the largest step in float32)",
    )
    recipe.add_argument(
        "--relative-threshold",
        type=float,
        default=None,
        help="float32 default threshold as a fraction of the largest weight change of the one-device run "
        "(default: 0.02, see BENCHMARKS.md)",
    )
    devices = parser.add_argument_group("devices")
    cli.add_device_args(devices)
    cli.add_parallel_arg(devices)
    parser.add_argument("--top", type=cli.positive_int, default=20, help="layers listed (largest difference first)")
    return parser


def build_diff_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="python -m keras_yolo_mgpu.align diff",
        description="Per-tensor max |A - B| and sum of squares of two weight files (any format --weights takes).",
    )
    parser.add_argument("first", help="weights file A")
    parser.add_argument("second", help="weights file B")
    parser.add_argument(
        "--classes",
        default=None,
        help="class names file of the network (default: the files' metadata, else model_data/coco_classes.txt)",
    )
    parser.add_argument(
        "--anchors", default=None, help="anchors file (default: the files' metadata, else the standard ones)"
    )
    cli.add_network_args(parser, default_help="the files' metadata, else yolov3")
    parser.add_argument("--threshold", type=float, default=0.0, help="exit 1 when max |A - B| exceeds this")
    parser.add_argument("--top", type=cli.positive_int, default=20, help="tensors listed (largest difference first)")
    return parser


def _make_optimizer(name: str, learning_rate: float):
    import keras

    from keras_yolo_mgpu.training.fused_adam import FusedAdam

    if name == "momentum":
        return keras.optimizers.SGD(learning_rate=learning_rate, momentum=0.9)
    if name == "adam":
        return FusedAdam(learning_rate=learning_rate)  # train.py's Adam
    return keras.optimizers.SGD(learning_rate=learning_rate)


def _load_batches(args, anchors, num_classes, kind):
    """The first `--steps` global batches of train.py's pipeline for model `kind`, as arrays in floatx.

    `DeviceInputs` runs here once, so every engine of the comparison trains on the same
    dense arrays: `({"image": (B, H, W, 3), "y_true_0": ..., ...}, (B, 1) zeros)`.
    """
    import keras

    from keras_yolo_mgpu.data.device_side import DeviceInputs

    report = check_annotations(args.annotations, num_classes)
    if report.problems:
        logger.warning("%s: %d problem(s), first: %s", args.annotations, len(report.problems), report.problems[0])
    if not report.annotations:
        raise ValueError(f"{args.annotations}: no usable annotation lines")
    host = HostBatches(
        report.annotations,
        tuple(args.input_size),
        num_classes,
        args.batch_size,
        training=True,
        augment=not args.no_augment,
        seed=args.seed,
    )
    finish = DeviceInputs(anchors, num_classes, args.masks, resolve_iou_thresh(args.iou_thresh, kind), dtype="float32")
    dtype = keras.config.floatx()
    batches = []
    for k in range(args.steps):
        batch = host.batch(k)
        image, y_true = finish({"image": batch.images, "boxes": batch.boxes, "hsv": batch.hsv.astype(np.float32)})
        x = {"image": keras.ops.convert_to_numpy(image).astype(dtype)}
        for layer, target in enumerate(y_true):
            x[f"y_true_{layer}"] = keras.ops.convert_to_numpy(target).astype(dtype)
        batches.append((x, np.zeros((len(batch.images), 1), dtype)))
    return batches


def _classes_anchors_and_kind(args):
    """Class names, anchors (N, 2) and `--model` kind (None: by anchor count) of --weights' metadata, else the flags.

    With a weights file that carries metadata, `args.masks` is set to its masks unless given.
    """
    weights = getattr(args, "weights", None)
    if weights and os.path.isfile(weights) and read_metadata(weights) is not None:
        settings = cli.resolve_model_settings(args, weights)
        if args.masks is None:
            args.masks = settings.masks_list
        args.input_size = args.input_size or settings.input_shape
        return list(settings.class_names), settings.anchors_array, settings.kind
    args.input_size = args.input_size or (416, 416)

    kind = model_name(args.model, args.tiny)
    class_names = get_classes(resolve_resource(args.classes, "classes"))
    anchors = get_anchors(resolve_resource(args.anchors, "anchors", tiny=args.tiny, model=kind))
    return class_names, anchors, kind


def run_alignment(args, devices):
    """Runs `parallel.align.align` as the parsed flags say, on `devices`; returns its report."""
    from keras_yolo_mgpu.parallel import align
    from keras_yolo_mgpu.training.training_model import create_model

    class_names, anchors, kind = _classes_anchors_and_kind(args)
    kind = get_architecture(kind, len(anchors)).name
    with align.floatx_policy("float64" if args.float64 else "float32"):
        batches = _load_batches(args, anchors, len(class_names), kind)

        def build(sync_bn):
            return create_model(
                tuple(args.input_size),
                anchors,
                len(class_names),
                freeze_body=args.freeze_body,
                weights_path=args.weights,
                sync_bn=sync_bn,
                masks=args.masks,
                model=kind,
            )

        return align.align(
            build,
            batches,
            devices,
            engine=args.parallel,
            sync_bn=not args.no_sync_bn,
            optimizer=lambda: _make_optimizer(args.optimizer, args.lr),
            threshold=args.threshold,
            relative_threshold=args.relative_threshold,
        )


def print_report(report, top: int) -> None:
    """The per-layer table, a verdict line and, last, the JSON summary."""
    print(f"{'layer':40s} {'max |diff|':>12s} {'step':>12s} {'diff/step':>12s}")
    for row in report.layers[:top]:
        print(f"{row.layer:40s} {row.max_abs_diff:12.4g} {row.step:12.4g} {row.ratio:12.4g}")
    if len(report.layers) > top:
        print(f"... {len(report.layers) - top} more layer(s), all closer")
    bound = f"max |diff| {report.max_abs_diff:.3g} vs threshold {report.threshold:.3g}"
    if report.relative_threshold is not None:
        bound += f" ({report.relative_threshold:g} x largest step)"
    print(
        f"{'PASSED' if report.passed else 'FAILED'}: {bound} (worst layer {report.worst_layer}); "
        f"largest step {report.max_step:.3g}; {report.replicas} replicas, {report.steps} step(s), "
        f"{report.floatx}, {report.engine}, sync BN {'on' if report.sync_bn else 'off'}"
    )
    print(json.dumps(report.summary()), flush=True)


def run(args) -> int:
    from keras_yolo_mgpu.parallel.engine import select_devices

    for flag, path in (("--classes", args.classes), ("--anchors", args.anchors), ("--weights", args.weights)):
        if path and not os.path.isfile(path):
            raise FileNotFoundError(f"{flag}: file not found: {path}")

    if args.gpus is None or args.gpus < 2:
        raise ValueError("--gpus N with N >= 2 is needed: the replicas to compare with one device")
    if args.batch_size % args.gpus:
        raise ValueError(f"--batch-size {args.batch_size} does not divide over --gpus {args.gpus}")
    devices = select_devices(args.gpus, simulate=args.simulate_devices)  # before any TF op
    report = run_alignment(args, devices)
    print_report(report, args.top)
    return 0 if report.passed else 1


def _diff_settings(args):
    """The network both files hold: their metadata (which must agree), else the flags and defaults."""

    def settings(path):
        return settings_for(
            path, classes_path=args.classes, anchors_path=args.anchors, tiny=args.tiny, model=args.model
        )

    def network(s):
        return s.kind, s.num_classes, len(s.anchors)

    first, second = settings(args.first), settings(args.second)
    if read_metadata(args.first) is None:
        first = second  # a legacy file takes the other's metadata (or, without any, the flags')
    elif read_metadata(args.second) is not None and network(first) != network(second):
        raise MetadataError(
            f"{args.first} holds {first.kind} with {counted(first.num_classes, 'classes')} but {args.second} holds "
            f"{second.kind} with {counted(second.num_classes, 'classes')}: not the same network"
        )
    return first


def diff(args) -> int:
    from keras_yolo_mgpu.model.yolo3 import build_body
    from keras_yolo_mgpu.parallel.align import tensor_differences
    from keras_yolo_mgpu.weights.loading import load_weights

    for path in (args.first, args.second):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"weights file not found: {path}")
    settings = _diff_settings(args)
    models = []
    for path in (args.first, args.second):
        model = build_body(settings.anchors_array, settings.num_classes, model=settings.kind)
        report = load_weights(model, path)
        logger.info("%s: %s, %d layers", path, report.format, report.loaded)
        models.append(model)
    rows = tensor_differences(*models)
    print(f"{'tensor':50s} {'shape':>20s} {'max |A-B|':>12s} {'sum (A-B)^2':>12s}")
    for row in rows[: args.top]:
        print(f"{row.name:50s} {str(row.shape):>20s} {row.max_abs_diff:12.4g} {row.sum_squares:12.4g}")
    over = [r for r in rows if r.max_abs_diff > args.threshold]
    max_abs_diff = max((r.max_abs_diff for r in rows), default=0.0)
    summary = {
        "max_abs_diff": max_abs_diff,
        "sum_squares": sum(r.sum_squares for r in rows),
        "tensors": len(rows),
        "tensors_over_threshold": len(over),
        "threshold": args.threshold,
        "passed": not over,
        "worst_tensor": rows[0].name if rows else None,
    }
    print(json.dumps(summary), flush=True)
    return 0 if not over else 1


def main(argv=None) -> int:
    """`align ...` or `align diff A B ...`; exit status 0 aligned, 1 not, 2 for a bad command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "diff":
        return run_command(build_diff_parser, diff, argv[1:], error_status=2, tensorflow=True)
    return run_command(build_parser, run, argv, error_status=2, tensorflow=True)
