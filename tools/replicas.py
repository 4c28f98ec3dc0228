"""Replicas against one device, measured: per-step differences, `align` in float32, `--seed`, the trace time.

Each subcommand printed figures of BENCHMARKS.md, docs/multi-gpu.md or
docs/reproducibility.md (which name the command line).

    python tools/replicas.py NAME --help
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
from subcommands import run_subcommand

PROG = "tools/replicas.py"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- equivalence ------------------------------------------------------------------------------------------------------


def equivalence(argv=None) -> int:
    """Prints how far N replicas are from one device, per training step.

    Runs the exact procedure of tests/test_parallel.py (tiny YOLOv3, 64 px,
    2 classes, global batch 8, plain SGD 1e-4, 3 steps, float64 unless
    --floatx float32) on 2 and 4 logical CPU
    devices with both engines, frozen and unfrozen, and prints one JSON line per
    configuration: the largest change of a trainable weight in each single-device
    step (`step_size`) and the largest difference of any weight, BatchNormalization
    statistics included, after the replica step (`max_abs_difference`; each
    replica step starts from the single-device weights before it). Usage:

        .venv/bin/python tools/replicas.py equivalence [--floatx float32]
    """
    parser = argparse.ArgumentParser(
        prog=f"{PROG} equivalence", description="per-step difference of N replicas from one device"
    )
    parser.add_argument("--floatx", choices=("float64", "float32"), default="float64", help="the tests use float64")
    args = parser.parse_args(argv)
    # The procedure is the test's own; the CPU is split into logical devices before TensorFlow starts.
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from isolation import configure_test_devices

    configure_test_devices()
    import keras
    import tensorflow as tf
    import test_parallel as procedure

    from keras_yolo_mgpu.parallel.align import max_difference

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
                # Each replica step starts again from the one-device weights before it (`restart_from`).
                body, fit_model = procedure.replicate(procedure._build(freeze_body), devices[:count], engine)
                batches = procedure._global_batches()
                forced, _ = procedure.train_steps(body, fit_model, batches, reference[0], restart_from=reference)
                differences = [max_difference(reference[k + 1], w) for k, w in enumerate(forced[1:])]
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


# -- align-float32 ----------------------------------------------------------------------------------------------------


def align_float32(argv=None) -> int:
    """Measures what `python -m keras_yolo_mgpu.align` sees in float32 and float64.

    Runs the alignment (tiny YOLOv3, 64 px, 2 classes, global batch 8, every
    layer trained) on generated images for 2 and 4 simulated devices, with and
    without synchronised BatchNormalization, for the optimizers given, and
    prints one JSON line per configuration: the largest weight difference, the
    largest step of the one-device run and their ratio. These figures justify
    `parallel/align.py`'s float32 default threshold (BENCHMARKS.md). Usage:

        .venv/bin/python tools/replicas.py align-float32 [--steps 5] [--floatx float32] [--optimizers sgd adam]
    """
    parser = argparse.ArgumentParser(
        prog=f"{PROG} align-float32", description=inspect.getdoc(align_float32).splitlines()[0]
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--floatx", choices=("float32", "float64"), default="float32")
    parser.add_argument("--optimizers", nargs="+", default=["sgd", "adam"], choices=("sgd", "momentum", "adam"))
    parser.add_argument("--replicas", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

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


# -- seed -------------------------------------------------------------------------------------------------------------


def _weights(path):
    arrays = {}
    with h5py.File(path, "r") as handle:
        # visititems stops at the first callback that returns anything but None.
        handle.visititems(
            lambda name, obj: arrays.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None
        )
    return arrays


def seed(argv=None) -> int:
    """What `--seed` guarantees, measured through the real `train.py`.

    Runs the same small command (tiny YOLOv3, 64 px, 2 classes, 8 synthetic
    images, augmentation on, 1 frozen + 1 unfrozen epoch, `--seed 7`, no
    `--weights`) on one device twice and on N simulated replicas, in the given
    floatx (Keras's `keras.json` in a temporary KERAS_HOME), and prints the
    largest absolute difference of the final weights against the first run,
    and the largest weight for scale.

        python tools/replicas.py seed --floatx float32 --replicas 4 [--optimizer sgd]
    """
    parser = argparse.ArgumentParser(
        prog=f"{PROG} seed", description=inspect.getdoc(seed), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--floatx", choices=("float32", "float64"), default="float32")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    args = parser.parse_args(argv)

    from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset

    with tempfile.TemporaryDirectory() as folder:
        data = make_synthetic_dataset(
            os.path.join(folder, "data"), num_train=8, num_val=0, image_size=64, seed=0, classes=("circle", "square")
        )
        home = os.path.join(folder, "keras_home")
        os.makedirs(home)
        with open(os.path.join(home, "keras.json"), "w") as f:
            json.dump({"floatx": args.floatx, "backend": "tensorflow"}, f)
        env = dict(os.environ, KERAS_HOME=home, TF_CPP_MIN_LOG_LEVEL="2")
        common = [
            sys.executable,
            os.path.join(REPO, "train.py"),
            "--annotations",
            data.train,
            "--val-split",
            "0",
            "--classes",
            data.classes,
            "--tiny",
            "--input-size",
            "64",
            "--batch-size",
            str(args.replicas),
            "--epochs",
            str(args.epochs),
            "--freeze-epochs",
            "1",
            "--seed",
            str(args.seed),
            "--optimizer",
            args.optimizer,
            "--quiet",
        ]
        runs = {
            "one device": [],
            "one device, again": [],
            f"{args.replicas} replicas": ["--gpus", str(args.replicas), "--simulate-devices"],
        }
        processes = {
            name: subprocess.Popen(
                [*common, "--log-dir", os.path.join(folder, str(i)), *extra],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for i, (name, extra) in enumerate(runs.items())
        }
        final = {}
        for i, (name, process) in enumerate(processes.items()):
            output = process.communicate()[0]
            if process.returncode:
                print(output[-3000:], file=sys.stderr)
                return 1
            final[name] = _weights(os.path.join(folder, str(i), "trained_weights_final.weights.h5"))
    reference = final["one device"]
    scale = max(float(np.max(np.abs(a))) for a in reference.values())
    print(
        f"floatx {args.floatx}, TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')}, "
        f"{args.optimizer}, seed {args.seed}, {args.epochs} epochs; largest weight {scale:.3g}"
    )
    for name, weights in final.items():
        if name != "one device":
            difference = max(float(np.max(np.abs(reference[k] - weights[k]))) for k in reference)
            print(f"  {name:>22}: max |difference| from one device = {difference:.3g}")
    return 0


# -- trace-time -------------------------------------------------------------------------------------------------------


def trace_time(argv=None) -> int:
    """How long the first replicated training step takes (its tracing) against the steps after it.

    Builds the training model of a tiny network at 64 px on N logical CPU
    devices (MirroredStrategy, synchronized BatchNormalization, plain SGD, the
    path `parallel.align` and the equivalence tests use), then times the first
    step, which traces the replicated graph, and the next two. The first step is
    what a multi-GPU run pays before its first batch; with the graph walk that
    `backend/tensorflow/batch_norm.py`'s `_all_reduce_sum` avoids, it grew with the square of
    the network's BatchNormalization layers.

        python tools/replicas.py trace-time --model yolov4-tiny --replicas 4 [--floatx float64]
    """
    parser = argparse.ArgumentParser(
        prog=f"{PROG} trace-time",
        description=inspect.getdoc(trace_time),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="yolov4-tiny", choices=("yolov3-tiny", "yolov4-tiny"))
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--floatx", default="float32", choices=("float32", "float64"))
    args = parser.parse_args(argv)

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
    import keras

    keras.config.set_floatx(args.floatx)
    keras.config.set_dtype_policy(args.floatx)
    from keras_yolo_mgpu import create_model, get_anchors, model_data_path, preprocess_true_boxes
    from keras_yolo_mgpu.parallel.align import replicate, train_steps

    anchors, num_classes, size, batch = get_anchors(model_data_path("tiny_yolo_anchors.txt")), 2, 64, 8
    rng = np.random.default_rng(0)
    images = rng.random((3 * batch, size, size, 3))
    boxes = np.zeros((3 * batch, 1, 5), np.float32)
    boxes[:, 0] = [8, 8, 40, 48, 1]
    y_true = preprocess_true_boxes(boxes, (size, size), anchors, num_classes)
    x = {"image": images, "y_true_0": y_true[0], "y_true_1": y_true[1]}
    x = {name: value.astype(args.floatx) for name, value in x.items()}
    batches = [({k: v[s * batch : (s + 1) * batch] for k, v in x.items()}, np.zeros((batch, 1))) for s in range(3)]

    devices = [d.name for d in tf.config.list_logical_devices("CPU")]

    def build(sync_bn):
        return create_model((size, size), anchors, num_classes, freeze_body=0, sync_bn=sync_bn, model=args.model)

    body, fit_model = replicate(build, devices, "strategy")
    start = body.get_weights()
    began = time.perf_counter()
    train_steps(body, fit_model, batches[:1], start)
    first = time.perf_counter() - began
    began = time.perf_counter()
    train_steps(body, fit_model, batches[1:], start)
    later = (time.perf_counter() - began) / 2
    report = {"model": args.model, "replicas": args.replicas, "floatx": args.floatx}
    print(json.dumps({**report, "first_step_s": round(first, 2), "later_step_s": round(later, 2)}))
    return 0


SUBCOMMANDS = {
    "equivalence": equivalence,
    "align-float32": align_float32,
    "seed": seed,
    "trace-time": trace_time,
}


def main(argv: list[str] | None = None) -> int:
    return run_subcommand(PROG, SUBCOMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
