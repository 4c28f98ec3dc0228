"""`python -m keras_yolo_mgpu.bench pipeline`: input pipeline images/sec with augmentation.

    python -m keras_yolo_mgpu.bench pipeline --annotations /tmp/bench_images/train.txt \\
        --classes model_data/voc_classes.txt --input-size 416 --batch-size 32 --batches 20 \\
        --generator decode-only,tfdata-device,pydataset,pydataset@ram --rounds 3

Prints progress, then one JSON object as the last line (see `bench/pipeline.py`). `--without-tensorflow`
shows the pipeline runs, and what it costs, where TensorFlow is not installed.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from keras_yolo_mgpu.bench.pipeline import (  # light: TensorFlow loads later
    GENERATORS,
    NEEDS_TENSORFLOW,
    parse_rows,
    run_benchmark,
    run_rounds,
)
from keras_yolo_mgpu.cli import quiet
from keras_yolo_mgpu.cli.args import ArgumentParser, positive_int
from keras_yolo_mgpu.cli.bench import add_data_args, print_result, read_data
from keras_yolo_mgpu.cli.runner import UsageError, run_command
from keras_yolo_mgpu.cli.without_tensorflow import block_tensorflow

logger = logging.getLogger("bench")


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python -m keras_yolo_mgpu.bench pipeline", description="Input pipeline images/sec with augmentation."
    )
    add_data_args(parser)
    parser.add_argument("--tiny", action="store_true", help="tiny YOLOv3 anchors (2 output scales)")
    parser.add_argument("--batches", type=positive_int, default=20, help="timed batches (default: 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches first (default: 3)")
    parser.add_argument(
        "--generator",
        default="tfdata-device",
        help=f"rows to time, comma-separated, each one of {', '.join(GENERATORS)}, optionally with its own "
        "cache as NAME@ram or NAME@DIR (default: tfdata-device)",
    )
    parser.add_argument("--rounds", type=positive_int, default=1, help="interleaved rounds over the rows (default: 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache", default=None, help="cache of rows without their own: 'ram' or a directory (warmed before timing)"
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="pydataset: worker threads; pyprocesses, grain: worker processes (default: cores)",
    )
    parser.add_argument(
        "--without-tensorflow",
        action="store_true",
        help="make `import tensorflow` fail in this process (KERAS_BACKEND=jax; pydataset, grain, reference rows)",
    )
    parser.add_argument("--root", default=None, help="folder for relative image paths (default: the annotation file's)")
    return parser


def run(args) -> int:
    rows = parse_rows(args.generator, args.cache)
    if args.without_tensorflow:
        needing = sorted({generator for generator, _ in rows if generator in NEEDS_TENSORFLOW})
        if needing or quiet.keras_backend_name() == "tensorflow" or "tensorflow" in sys.modules:
            raise UsageError(
                "--without-tensorflow needs KERAS_BACKEND=jax and rows that do not use TensorFlow "
                f"(pydataset, pyprocesses, grain, reference). Received rows needing it: {needing or 'none'}"
            )
        block_tensorflow("bench pipeline --without-tensorflow")

    annotations, anchors, num_classes = read_data(args, tiny=args.tiny, root=args.root)
    logger.info(
        "timing %s: %d images, input %dx%d, batch %d, %d+%d batches, %d round(s)",
        args.generator,
        len(annotations),
        *args.input_size,
        args.batch_size,
        args.warmup,
        args.batches,
        args.rounds,
    )
    options = {"warmup": args.warmup, "seed": args.seed, "workers": args.workers}
    shape = (args.input_size, anchors, num_classes, args.batch_size, args.batches)
    if len(rows) == 1 and args.rounds == 1:
        ((generator, cache),) = rows
        result = run_benchmark(generator, annotations, *shape, cache=cache, **options)
    else:
        result = run_rounds(rows, args.rounds, annotations, *shape, **options)
    return print_result(result)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv, tensorflow=True)
