"""`python convert.py`: a Darknet `.cfg` + `.weights` pair to a Keras file.

python convert.py yolov3.cfg yolov3.weights model_data/yolo.weights.h5
python convert.py yolov3-tiny.cfg yolov3-tiny.weights model_data/tiny_yolo.weights.h5 --anchors-output A
python convert.py yolov3.cfg yolov3.weights model_data/yolo.h5              (keras-yolo3's line: Keras 2 HDF5)
python convert.py -w yolov3.cfg yolov3.weights model_data/yolo_weights.h5   (keras-yolo3's -w: weights only)

Every output goes through `keras_yolo_mgpu.outputs`' rule, checked before converting.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli import quiet
from keras_yolo_mgpu.cli.args import ArgumentParser, add_overwrite_arg
from keras_yolo_mgpu.cli.runner import CommandError, UsageError, run_command
from keras_yolo_mgpu.fileio import atomic_write, write_text_atomic
from keras_yolo_mgpu.outputs import check_output, record_written
from keras_yolo_mgpu.resources import format_anchors, get_classes, model_data_path
from keras_yolo_mgpu.weights import darknet
from keras_yolo_mgpu.weights.convert import check_output_path, convert, parse_masks
from keras_yolo_mgpu.weights.download import resolve_weights

logger = logging.getLogger("convert")


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="convert.py",
        description="Convert Darknet .cfg + .weights to a Keras 3 model file.",
        epilog="A yolov3/yolov3-tiny cfg is saved as yolo_body/tiny_yolo_body weights; other cfgs as the "
        "generic cfg-built model (prefer .keras for those).",
    )
    parser.add_argument("config_path", help="Darknet .cfg file")
    parser.add_argument("weights_path", help="Darknet .weights file")
    parser.add_argument(
        "output_path",
        help="output: .h5 (Keras 2 HDF5 as keras-yolo3's: the whole model, or its weights with -w), "
        ".weights.h5 (Keras 3 weights) or .keras (Keras 3 whole model)",
    )
    parser.add_argument(
        "-w",
        "--weights_only",
        action="store_true",
        help="save as Keras weights file instead of model file (keras-yolo3's flag; a .weights.h5 output "
        "holds weights either way)",
    )
    parser.add_argument(
        "-p",
        "--plot_model",
        action="store_true",
        help="plot the model to <output without extension>.png (keras-yolo3's flag; needs pydot and graphviz, "
        "else a warning)",
    )
    add_conversion_args(parser)
    add_overwrite_arg(parser)
    return parser


def add_conversion_args(parser) -> None:
    """How the Darknet file is read and what the output holds: --generic, --darknet-bn, --masks, ..."""
    parser.add_argument(
        "--generic",
        action="store_true",
        help="save the generic cfg-built model even when the cfg is a yolo_body/tiny_yolo_body",
    )
    parser.add_argument(
        "--darknet-bn",
        choices=("pjreddie", "alexeyab"),
        default=None,
        help="which Darknet's batch-norm formula to reproduce (a .weights file does not say): pjreddie "
        "(default; sqrt(var) + 1e-6, the original Darknet that trained the official YOLOv3 weights) or "
        "alexeyab (sqrt(var + 1e-5), AlexeyAB/darknet)",
    )
    parser.add_argument(
        "--keras-yolo3-compat",
        action="store_true",
        help="store the raw Darknet arrays with Keras's epsilon 1e-3, exactly as keras-yolo3's convert.py "
        "(about 0.5-0.9%% off Darknet's outputs); for comparing with old keras-yolo3 files",
    )
    parser.add_argument(
        "--classes",
        default=None,
        help="class names file stored in the output's metadata (default: COCO's names for an 80-class cfg)",
    )
    parser.add_argument(
        "--masks",
        default="auto",
        metavar="cfg|keras-yolo3|'3,4,5 1,2,3'",
        help="anchor masks of the converted model, coarsest scale first (default: the cfg's, except keras-yolo3's "
        "3,4,5 1,2,3 for a tiny cfg, which the official yolov3-tiny weights were trained with)",
    )
    parser.add_argument(
        "--anchors-output", default=None, help="also write the cfg's anchors to this file (model_data format)"
    )


def run(args) -> int:
    try:
        check_output_path(args.output_path, args.weights_only)
        masks = parse_masks(args.masks)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.keras_yolo3_compat and args.darknet_bn:
        raise UsageError(
            f"--keras-yolo3-compat keeps keras-yolo3's batch norm; it contradicts --darknet-bn {args.darknet_bn}"
        )
    darknet_bn = "keras-yolo3" if args.keras_yolo3_compat else (args.darknet_bn or darknet.DEFAULT_DARKNET_BN)
    args.config_path = _shipped_cfg_if_absent(args.config_path)
    # keras-yolo3's README fetches yolov3.weights by hand first; an official name absent here is downloaded.
    args.weights_path = resolve_weights(args.weights_path)
    for label, path in (("classes", args.classes), ("config", args.config_path), ("weights", args.weights_path)):
        if path is not None and not os.path.isfile(path):
            raise UsageError(f"{label} file not found: {path}")
    # Every output is checked before the conversion (and TensorFlow) starts.
    inputs = (args.config_path, args.weights_path, args.classes)
    plot_path = os.path.splitext(args.output_path)[0] + ".png" if args.plot_model else None
    for flag, path in (
        ("output_path", args.output_path),
        ("--anchors-output", args.anchors_output),
        ("--plot_model", plot_path),
    ):
        if path is not None:
            check_output(path, inputs=inputs, overwrite=args.overwrite, flag=flag)
    class_names = get_classes(args.classes) if args.classes else None
    quiet.import_tensorflow(args.verbose)
    result = convert(
        args.config_path,
        args.weights_path,
        args.output_path,
        generic=args.generic,
        darknet_bn=darknet_bn,
        masks=masks,
        class_names=class_names,
        weights_only=args.weights_only,
    )
    if args.anchors_output:
        if result.anchors is None:
            raise CommandError("the cfg has no [yolo] anchors to write")
        write_text_atomic(args.anchors_output, format_anchors(result.anchors) + "\n")
        record_written([args.anchors_output])
    print(
        f"Converted {args.config_path} ({result.num_floats} floats) to {result.output_path} "
        f"as {result.architecture}" + (f"; cfg copy: {result.cfg_copy_path}" if result.cfg_copy_path else "")
    )
    if plot_path:
        _plot(result.model, plot_path)
    return 0


def _plot(model, path: str) -> None:
    """keras-yolo3's `-p`: `keras.utils.plot_model` to `path`; a warning, not an error, without pydot/graphviz."""
    import keras

    try:
        atomic_write(path, lambda temporary: keras.utils.plot_model(model, to_file=temporary, show_shapes=True))
        record_written([path])  # a re-run of the same line replaces it
    except ImportError as error:  # Keras raises it for a missing pydot or graphviz
        logger.warning(
            "model converted, but not plotted: -p needs pydot and graphviz "
            "(pip install pydot; apt install graphviz or brew install graphviz) [%s]",
            error,
        )
        return
    record_written([path])
    print(f"Saved model plot to {path}")


def _shipped_cfg_if_absent(config_path: str) -> str:
    """`config_path`, or when absent model_data/'s copy of an official cfg (keras-yolo3's sit beside convert.py)."""
    if os.path.exists(config_path) or os.path.dirname(config_path):
        return config_path
    try:
        shipped = model_data_path(config_path)
    except FileNotFoundError:
        return config_path
    logger.info("%s is not in this folder: using the shipped official %s", config_path, shipped)
    return shipped


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
