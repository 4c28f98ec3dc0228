"""`python -m keras_yolo_mgpu.bench {pipeline,train,infer,e2e,exports} ...`: dispatch to one benchmark's command.

Each benchmark has its own parser (`cli/bench_<name>.py`) and prints one JSON object as its last line.
"""

from __future__ import annotations

import difflib
import importlib
import json
import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli.args import input_size, positive_int
from keras_yolo_mgpu.cli.runner import CommandError
from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.resources import get_anchors, get_classes, resolve_resource

BENCHMARKS = {
    "pipeline": "input pipeline images/sec with augmentation (and the reference generator)",
    "train": "training images/sec on N (simulated) devices",
    "infer": "video detection frames/sec against the bare forward pass",
    "e2e": "training from JPEG files (pipeline + step) against the step alone",
    "exports": "every export format's file size, mAP and images/sec",
}
USAGE = "usage: python -m keras_yolo_mgpu.bench {" + ",".join(BENCHMARKS) + "} [options]"


def add_data_args(parser) -> None:
    """--annotations, --classes, --anchors, --input-size, --batch-size: what `bench pipeline` and `bench e2e` read."""
    parser.add_argument("--annotations", required=True, help="keras-yolo3 annotation file (the JPEGs to read)")
    parser.add_argument("--classes", required=True, help="class names file, one per line")
    parser.add_argument(
        "--anchors", default=None, help="anchors file (default: model_data/yolo_anchors.txt, or tiny with --tiny)"
    )
    parser.add_argument(
        "--input-size", type=input_size, default=(416, 416), metavar="HxW", help="network input (default: 416)"
    )
    parser.add_argument("--batch-size", type=positive_int, default=32, help="GLOBAL batch size (default: 32)")


def read_data(args, *, tiny: bool, root: str | None = None) -> tuple[list, object, int]:
    """(annotations, anchors (N, 2), number of classes) of the `add_data_args` flags; refuses an empty file."""
    num_classes = len(get_classes(args.classes))
    anchors = get_anchors(resolve_resource(args.anchors, "anchors", tiny=tiny))
    annotations = read_annotations(args.annotations, root=root)
    if not annotations:
        raise CommandError(f"{args.annotations} holds no image")
    return annotations, anchors, num_classes


def print_result(result: dict) -> int:
    """Prints a benchmark's result as the one JSON object on its last line; the command's exit status (0)."""
    print(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n" + "\n".join(f"  {name:9s} {text}" for name, text in BENCHMARKS.items()))
        return 0
    if argv[0] not in BENCHMARKS:
        close = difflib.get_close_matches(argv[0], list(BENCHMARKS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        print(f"{USAGE}\nerror: unknown benchmark {argv[0]!r}{hint}", file=sys.stderr)
        return 2
    return importlib.import_module(f"keras_yolo_mgpu.cli.bench_{argv[0]}").main(argv[1:])
