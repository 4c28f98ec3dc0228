"""`python -m keras_yolo_mgpu.bench e2e`: training from JPEG files against the step alone, same device.

    python -m keras_yolo_mgpu.bench e2e --annotations /tmp/bench_images/train.txt \\
        --classes model_data/voc_classes.txt --input-size 416 --batch-size 32 [--gpus N]

Prints one line per round and input, then one JSON object as the last line
(`ratio`: pipeline-fed / in-memory images/s, see `bench/e2e.py`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli import args as cli
from keras_yolo_mgpu.cli.bench import print_result
from keras_yolo_mgpu.cli.runner import CommandError, run_command
from keras_yolo_mgpu.cli.train import add_precision_args


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="python -m keras_yolo_mgpu.bench e2e", description="Training from JPEG files against the step alone."
    )
    parser.add_argument("--annotations", required=True, help="keras-yolo3 annotation file (the JPEGs to read)")
    parser.add_argument("--classes", required=True, help="class names file, one per line")
    parser.add_argument("--anchors", default=None, help="anchors file (default: the model's)")
    cli.add_network_args(parser, default_help="yolov3")
    parser.add_argument("--input-size", type=cli.input_size, default=(416, 416), metavar="HxW")
    parser.add_argument("--batch-size", type=cli.positive_int, default=32, help="GLOBAL batch (default: 32)")
    parser.add_argument("--steps", type=cli.positive_int, default=20, help="timed steps per round (default: 20)")
    parser.add_argument("--warmup", type=cli.positive_int, default=5, help="untimed steps first (default: 5)")
    parser.add_argument("--rounds", type=cli.positive_int, default=3, help="interleaved rounds (default: 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache", default=None, help="the pipeline's decoded-image cache: 'ram' or a folder (timed warm)"
    )
    cli.add_device_args(parser)
    add_precision_args(parser)
    return parser


def run(args) -> int:
    from keras_yolo_mgpu.bench.e2e import run_e2e
    from keras_yolo_mgpu.data.annotations import read_annotations
    from keras_yolo_mgpu.resources import get_anchors, get_classes, resolve_resource

    model = "yolov3-tiny" if args.tiny else args.model
    tiny = args.tiny or (model or "").endswith("tiny")
    anchors = get_anchors(resolve_resource(args.anchors, "anchors", tiny=tiny))
    annotations = read_annotations(args.annotations)
    if not annotations:
        raise CommandError(f"{args.annotations} holds no image")
    result = run_e2e(
        annotations,
        args.input_size,
        anchors,
        len(get_classes(args.classes)),
        args.batch_size,
        model=model,
        gpus=args.gpus,
        simulate=args.simulate_devices,
        mixed_precision=args.mixed_precision,
        jit=args.jit,
        steps=args.steps,
        warmup=args.warmup,
        rounds=args.rounds,
        seed=args.seed,
        cache=args.cache,
    )
    return print_result(result)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv, tensorflow=True)


if __name__ == "__main__":
    sys.exit(main())
