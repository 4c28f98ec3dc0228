"""`python -m keras_yolo_mgpu.bench {pipeline,train,infer,e2e,exports} ...`: dispatch to one benchmark's command.

Each benchmark prints progress, then one JSON object as its last line. Each
has its own parser (`cli/bench_<name>.py`), so a misspelt flag gets a
suggestion from the flags of that benchmark.
"""

from __future__ import annotations

import difflib
import importlib
import json
import sys
from collections.abc import Sequence

BENCHMARKS = {
    "pipeline": "input pipeline images/sec with augmentation (and the reference generator)",
    "train": "training images/sec on N (simulated) devices",
    "infer": "video detection frames/sec against the bare forward pass",
    "e2e": "training from JPEG files (pipeline + step) against the step alone",
    "exports": "every export format's file size, mAP and images/sec",
}
USAGE = "usage: python -m keras_yolo_mgpu.bench {" + ",".join(BENCHMARKS) + "} [options]"


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


if __name__ == "__main__":
    sys.exit(main())
