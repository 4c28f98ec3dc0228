"""What `--seed` guarantees, measured through the real `train.py`.

Runs the same small command (tiny YOLOv3, 64 px, 2 classes, 8 synthetic
images, augmentation on, 1 frozen + 1 unfrozen epoch, `--seed 7`, no
`--weights`) on one device twice and on N simulated replicas, in the given
floatx (Keras's `keras.json` in a temporary KERAS_HOME), and prints the
largest absolute difference of the final weights against the first run,
and the largest weight for scale.

    python scripts/seed_report.py --floatx float32 --replicas 4 [--optimizer sgd]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def _weights(path):
    arrays = {}
    with h5py.File(path, "r") as handle:
        # visititems stops at the first callback that returns anything but None.
        handle.visititems(
            lambda name, obj: arrays.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None
        )
    return arrays


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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


if __name__ == "__main__":
    sys.exit(main())
