#!/usr/bin/env python3
"""Measures what `python -m keras_yolo_mgpu.align` sees in float32 and float64.

Runs the alignment (tiny YOLOv3, 64 px, 2 classes, global batch 8, every
layer trained) on generated images for 2 and 4 simulated devices, with and
without synchronised BatchNormalization, for the optimizers given, and
prints one JSON line per configuration: the largest weight difference, the
largest step of the one-device run and their ratio. These figures justify
`parallel/align.py`'s float32 default threshold (BENCHMARKS.md). Usage:

    .venv/bin/python scripts/align_float32_report.py [--steps 5] [--floatx float32] [--optimizers sgd adam]
"""

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--floatx", choices=("float32", "float64"), default="float32")
    parser.add_argument("--optimizers", nargs="+", default=["sgd", "adam"], choices=("sgd", "momentum", "adam"))
    parser.add_argument("--replicas", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from keras_yolo_mgpu.backend.tensorflow.distribution import simulate_devices

    devices = simulate_devices(max(args.replicas))
    from keras_yolo_mgpu.cli.align import build_parser, run_alignment

    with tempfile.TemporaryDirectory() as root:
        from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset

        data = make_synthetic_dataset(root, num_train=8 * args.steps, num_val=1, image_size=64, seed=args.seed)
        for optimizer in args.optimizers:
            # The CLI's default (1e-4) for SGD; train.py's stage-1 rate for Adam.
            lr = {"adam": 1e-3}.get(optimizer, 1e-4)
            for count in args.replicas:
                for sync in (True, False):
                    flags = [
                        *("--annotations", data.train, "--classes", data.classes, "--tiny", "--input-size", "64"),
                        *("--steps", str(args.steps), "--batch-size", "8", "--optimizer", optimizer, "--lr", str(lr)),
                        *("--gpus", str(count), "--seed", str(args.seed)),
                        *(["--float64"] if args.floatx == "float64" else []),
                        *([] if sync else ["--no-sync-bn"]),
                    ]
                    report = run_alignment(build_parser().parse_args(flags), devices[:count])
                    print(
                        json.dumps(
                            {
                                "floatx": args.floatx,
                                "optimizer": optimizer,
                                "lr": lr,
                                "replicas": count,
                                "sync_bn": sync,
                                "steps": args.steps,
                                "max_abs_diff": float(f"{report.max_abs_diff:.3g}"),
                                "max_step": float(f"{report.max_step:.3g}"),
                                "max_ratio": float(f"{report.max_ratio:.3g}"),
                                "worst_layer": report.worst_layer,
                                "passed": report.passed,
                            }
                        ),
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
