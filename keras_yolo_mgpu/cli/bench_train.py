"""`python -m keras_yolo_mgpu.bench train`: training images/sec on N (simulated) devices.

Prints one line per timed step, then a JSON object as the last line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli import args as cli
from keras_yolo_mgpu.cli.runner import run_command
from keras_yolo_mgpu.model.architectures import MODEL_NAMES


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="python -m keras_yolo_mgpu.bench train", description="Training images/sec on N devices."
    )
    cli.add_device_args(parser)
    parser.add_argument("--tiny", action="store_true", help="alias of --model yolov3-tiny")
    parser.add_argument("--model", choices=MODEL_NAMES, default=None, help="network (default: yolov3)")
    parser.add_argument("--input-size", type=cli.input_size, default=(416, 416), metavar="HxW")
    parser.add_argument("--num-classes", type=cli.positive_int, default=80)
    parser.add_argument(
        "--batch-size", type=cli.positive_int, default=None, help="GLOBAL batch (default: 8 per replica)"
    )
    parser.add_argument("--freeze-body", type=int, choices=(0, 1, 2), default=0)
    parser.add_argument("--parallel", choices=("strategy", "multi_gpu_model"), default="strategy")
    parser.add_argument("--no-sync-bn", action="store_true")
    parser.add_argument("--mixed-precision", action="store_true")
    parser.add_argument("--warmup-steps", type=cli.positive_int, default=3)
    parser.add_argument("--steps", type=cli.positive_int, default=10, help="timed steps")
    return parser


def run(args) -> int:
    from keras_yolo_mgpu.bench.train import run_train_benchmark

    result = run_train_benchmark(
        gpus=args.gpus,
        simulate=args.simulate_devices,
        tiny=args.tiny,
        model=args.model,
        input_size=args.input_size,
        num_classes=args.num_classes,
        batch_size=args.batch_size,
        freeze_body=args.freeze_body,
        parallel=args.parallel,
        sync_bn=not args.no_sync_bn,
        mixed_precision=args.mixed_precision,
        warmup_steps=args.warmup_steps,
        steps=args.steps,
    )
    for index, seconds in enumerate(result.pop("step_seconds"), 1):
        print(f"step {index:3d}: {seconds * 1000:8.1f} ms  {result['global_batch'] / seconds:8.1f} images/sec")
    print(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv, tensorflow=True)


if __name__ == "__main__":
    sys.exit(main())
