"""`python -m keras_yolo_mgpu.bench {pipeline,train,infer} ...`

Each benchmark prints progress, then one JSON object as its last line.
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "pipeline": "input pipeline images/sec with augmentation (and the reference generator)",
    "train": "training images/sec on N (simulated) devices",
    "infer": "video detection frames/sec against the bare forward pass",
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHMARKS:
        lines = [f"  {name:9s} {text}" for name, text in BENCHMARKS.items()]
        print("usage: python -m keras_yolo_mgpu.bench {" + ",".join(BENCHMARKS) + "} [options]\n" + "\n".join(lines))
        if argv and argv[0] not in ("-h", "--help"):
            print(f"error: unknown benchmark {argv[0]!r}", file=sys.stderr)
            return 2
        return 0
    module = importlib.import_module(f"keras_yolo_mgpu.bench.{argv[0]}")
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
