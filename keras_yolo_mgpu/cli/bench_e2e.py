"""`python -m keras_yolo_mgpu.bench e2e`: training from JPEG files against the step alone, same device.

    python -m keras_yolo_mgpu.bench e2e --annotations /tmp/bench_images/train.txt \\
        --classes model_data/voc_classes.txt --input-size 416 --batch-size 32 [--gpus N]

Prints one line per round and input, then one JSON object as the last line
(`ratio`: pipeline-fed / in-memory images/s, see `bench/e2e.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

from keras_yolo_mgpu.cli import args as cli
from keras_yolo_mgpu.cli.bench import add_data_args, print_result, read_data
from keras_yolo_mgpu.cli.runner import run_command
from keras_yolo_mgpu.cli.train import add_precision_args


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="python -m keras_yolo_mgpu.bench e2e", description="Training from JPEG files against the step alone."
    )
    add_data_args(parser)
    cli.add_network_args(parser, default_help="yolov3")
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

    model = "yolov3-tiny" if args.tiny else args.model
    annotations, anchors, num_classes = read_data(args, tiny=args.tiny or (model or "").endswith("tiny"))
    result = run_e2e(
        annotations,
        args.input_size,
        anchors,
        num_classes,
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
