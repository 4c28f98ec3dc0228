"""`python -m keras_yolo_mgpu.bench train`: training images/sec on N (simulated) devices.

    python -m keras_yolo_mgpu.bench train --tiny --input-size 416 --num-classes 20 --batch-size 8
    python -m keras_yolo_mgpu.bench train --tiny --input-size 128 --gpus 2 --simulate-devices \\
        --optimizer adam --ema 0.99 --rounds 3

Prints one line per round, then a JSON object as the last line. `tools/train_step_compare.py` takes the same
flags and times keras-yolo3's step, variants of ours, the step's parts, or both Keras backends beside it.
"""

from __future__ import annotations

from collections.abc import Sequence

from keras_yolo_mgpu.cli import args as cli
from keras_yolo_mgpu.cli.bench import print_result
from keras_yolo_mgpu.cli.runner import run_command

# `bench.train`'s OPTIMIZERS and INPUTS, spelt out: importing that module starts Keras, which the parser must not.
OPTIMIZERS = ("sgd", "adam")
INPUTS = ("device", "dense")


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="python -m keras_yolo_mgpu.bench train", description="Training images/sec on N devices."
    )
    cli.add_device_args(parser)
    parser.add_argument(
        "--simulated-gpu-memory",
        type=cli.positive_int,
        default=None,
        metavar="MiB",
        help="with --simulate-devices on a GPU: memory of each logical GPU (default: the library's)",
    )
    cli.add_network_args(parser, default_help="yolov3")
    parser.add_argument("--input-size", type=cli.input_size, default=(416, 416), metavar="HxW")
    parser.add_argument("--num-classes", type=cli.positive_int, default=80)
    parser.add_argument(
        "--batch-size", type=cli.positive_int, default=None, help="GLOBAL batch (default: 8 per replica)"
    )
    cli.add_freeze_args(parser, default=0)
    cli.add_parallel_arg(parser)
    parser.add_argument("--mixed-precision", action="store_true", help="mixed_float16 (ours only)")
    parser.add_argument("--jit", action="store_true", help="XLA (jit_compile=True) with the static ignore mask")
    parser.add_argument(
        "--optimizer", choices=OPTIMIZERS, default="sgd", help="sgd (plain, default) or adam (train.py's)"
    )
    parser.add_argument("--ema", type=float, default=None, metavar="DECAY", help="weights' EMA (train.py's --ema)")
    parser.add_argument(
        "--steps-per-execution", type=cli.positive_int, default=1, help="steps per call of the compiled function"
    )
    parser.add_argument(
        "--inputs",
        choices=INPUTS,
        default="device",
        help="device: train.py's model on the host's batch (uint8, boxes; jitter and targets in the step); "
        "dense: keras-yolo3's inputs",
    )
    parser.add_argument("--warmup-steps", type=cli.positive_int, default=3)
    parser.add_argument("--steps", type=cli.positive_int, default=10, help="timed steps per round and side")
    parser.add_argument("--rounds", type=cli.positive_int, default=1)
    return parser


def _print_round(index, images_per_sec):
    line = "  ".join(f"{name} {value:7.2f}" for name, value in images_per_sec.items())
    print(f"round {index + 1}: images/sec  {line}", flush=True)


def bench_settings(function, args) -> dict:
    """`function`'s keyword arguments from the parsed flags: `run_train_benchmark`'s, or a tool's that extends it."""
    return cli.flag_values(
        function,
        args,
        simulate=args.simulate_devices,
        simulated_gpu_memory_mb=args.simulated_gpu_memory,
        sync_bn=not args.no_sync_bn,
        on_round=_print_round,
    )


def run(args) -> int:
    from keras_yolo_mgpu.bench.train import run_train_benchmark

    return print_result(run_train_benchmark(**bench_settings(run_train_benchmark, args)))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv, tensorflow=True)
