#!/usr/bin/env python3
"""Prints how far N replicas are from one device, per training step.

Runs the exact procedure of tests/test_parallel.py (tiny YOLOv3, 64 px,
2 classes, global batch 8, plain SGD 1e-4, 3 steps, float64 unless
--floatx float32) on 2 and 4 logical CPU
devices with both engines, frozen and unfrozen, and prints one JSON line per
configuration: the largest change of a trainable weight in each single-device
step (`step_size`) and the largest difference of any weight, BatchNormalization
statistics included, after the replica step (`max_abs_difference`; each
replica step starts from the single-device weights before it). Usage:

    .venv/bin/python scripts/equivalence_report.py [--floatx float32]
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from isolation import configure_test_devices  # noqa: E402

configure_test_devices()  # splits the CPU into logical devices before TF starts

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
import test_parallel as procedure  # noqa: E402

from keras_yolo_mgpu.parallel.align import max_difference  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="per-step difference of N replicas from one device")
    parser.add_argument("--floatx", choices=("float64", "float32"), default="float64", help="the tests use float64")
    args = parser.parse_args(argv)
    keras.config.set_floatx(args.floatx)
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    initial = procedure.create_model(procedure.INPUT_SHAPE, procedure.ANCHORS, procedure.NUM_CLASSES, freeze_body=0)[
        0
    ].get_weights()
    for freeze_body in (2, 0):
        reference, _ = procedure._trajectory(initial, freeze_body, "strategy", devices[:1])
        trainable = procedure._trainable_mask(freeze_body)
        steps = [max_difference(reference[k + 1], reference[k], trainable) for k in range(procedure.STEPS)]
        for engine in ("strategy", "multi_gpu_model"):
            for count in (2, 4):
                results = procedure._forced_steps(reference, freeze_body, engine, devices[:count])
                differences = [max_difference(reference[k + 1], w) for k, w in enumerate(results)]
                print(
                    json.dumps(
                        {
                            "floatx": args.floatx,
                            "engine": engine,
                            "replicas": count,
                            "stage": "frozen" if freeze_body else "unfrozen",
                            "step_size": [float(f"{s:.3g}") for s in steps],
                            "max_abs_difference": [float(f"{d:.3g}") for d in differences],
                        }
                    ),
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
