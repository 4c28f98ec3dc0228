"""`python -m keras_yolo_mgpu.bench train`: training images/sec on N (simulated) devices, against keras-yolo3.

    python -m keras_yolo_mgpu.bench train --tiny --input-size 416 --num-classes 20 --batch-size 8 \\
        --reference keras-yolo3 [--variants keras-bn,keras-adam,xla] [--breakdown]
    python -m keras_yolo_mgpu.bench train --tiny --input-size 128 --gpus 2 --simulate-devices \\
        --optimizer adam --ema 0.99 --variants keras-adam,keras-bn --rounds 3

    python -m keras_yolo_mgpu.bench train --backends tensorflow,jax --tiny --input-size 128 --rounds 3

Prints one line per round, a table of the step's parts with `--breakdown`, then a JSON object as the
last line (`ratio_vs_keras-yolo3`: ours / keras-yolo3; `ratio_jax_vs_tensorflow` with `--backends`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from keras_yolo_mgpu.bench.backend_rounds import BACKENDS, compare_backends
from keras_yolo_mgpu.cli import args as cli
from keras_yolo_mgpu.cli.bench import print_result
from keras_yolo_mgpu.cli.runner import run_command


def _variant_list(text: str) -> list[str]:
    from keras_yolo_mgpu.bench.train import VARIANTS

    names = [name for name in text.split(",") if name]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    return names


def _backend_pair(text: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    if len(names) != 2 or len(set(names)) != 2 or not set(names) <= set(BACKENDS):
        raise argparse.ArgumentTypeError(f"expected two of {', '.join(BACKENDS)}, e.g. tensorflow,jax")
    return names


def build_parser() -> cli.ArgumentParser:
    from keras_yolo_mgpu.bench.train import INPUTS, OPTIMIZERS, REFERENCES, VARIANTS

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
    parser.add_argument("--reference", choices=REFERENCES, default=None, help="also time keras-yolo3's step")
    parser.add_argument(
        "--variants", type=_variant_list, default=[], help=f"comma-separated variants of ours: {', '.join(VARIANTS)}"
    )
    parser.add_argument("--breakdown", action="store_true", help="also time forward/loss/backward/optimizer parts")
    parser.add_argument(
        "--backends",
        type=_backend_pair,
        default=None,
        metavar="A,B",
        help="time the step on two Keras backends (tensorflow,jax), one process each, in interleaved rounds",
    )
    parser.add_argument(
        "--steps-per-execution", type=cli.positive_int, default=1, help="steps per call of the compiled function"
    )
    parser.add_argument(
        "--inputs",
        choices=INPUTS,
        default=None,
        help="device: train.py's model on the host's batch (uint8, boxes; jitter and targets in the step); "
        "dense: keras-yolo3's inputs (default: device, dense with --reference, --variants or --breakdown)",
    )
    parser.add_argument("--warmup-steps", type=cli.positive_int, default=3)
    parser.add_argument("--steps", type=cli.positive_int, default=10, help="timed steps per round and side")
    parser.add_argument("--rounds", type=cli.positive_int, default=None, help="default: 3 with --reference, else 1")
    return parser


def _print_round(index, images_per_sec):
    line = "  ".join(f"{name} {value:7.2f}" for name, value in images_per_sec.items())
    print(f"round {index + 1}: images/sec  {line}", flush=True)


def _print_breakdown(breakdown):
    names = list(breakdown)
    print(f"{'part (ms, median)':22s}" + "".join(f"{name:>14s}" for name in names))
    for part in (*breakdown[names[0]]["parts_ms"], "keras_fit_overhead", "fit_step"):
        values = [breakdown[n]["parts_ms"].get(part, breakdown[n]["split_ms"].get(part)) for n in names]
        print(f"{part:22s}" + "".join(f"{value:14.1f}" for value in values))


def run(args) -> int:
    from keras_yolo_mgpu.bench.train import run_train_benchmark

    settings = cli.flag_values(
        run_train_benchmark,
        args,
        simulate=args.simulate_devices,
        simulated_gpu_memory_mb=args.simulated_gpu_memory,
        sync_bn=not args.no_sync_bn,
        variants=tuple(args.variants),
        rounds=args.rounds or (3 if args.reference or args.backends else 1),
        on_round=_print_round,
    )
    if args.backends:
        if args.variants or args.reference or args.breakdown:
            raise ValueError("--backends times our step only: drop --variants, --reference and --breakdown")
        for unused in ("variants", "reference", "breakdown"):
            del settings[unused]
        return print_result(compare_backends(args.backends, **settings))

    result = run_train_benchmark(**settings)
    if "breakdown" in result:
        _print_breakdown(result["breakdown"])
    return print_result(result)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv, tensorflow=True)
