#!/usr/bin/env python3
"""CPU time per image of each worker's input pipeline under MultiWorkerMirroredStrategy.

    python scripts/make_bench_images.py --out /tmp/bench --num 64
    python scripts/multiworker_input_cpu.py --annotations /tmp/bench/train.txt --classes model_data/voc_classes.txt

Runs, one after the other, clusters of worker processes on 127.0.0.1 (as
train.py's multi-worker test does), each worker iterating the training
input exactly as training distributes it, with full augmentation (the
targets and the HSV jitter are the train step's), and no model:

* `shard` (train.py now): `distribute_training_dataset`, each worker reads,
  decodes and augments only its slice of every global batch;
* `replicate` (train.py before): the global stream handed to the strategy
  (`experimental_distribute_dataset`, what Keras does with a plain
  dataset): every worker builds every image and keeps 1/W of them.

Per worker it reports the process CPU time (all threads) per image of the
global batch, after warm-up. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_worker(args) -> dict:
    import tensorflow as tf

    from keras_yolo_mgpu.data.annotations import read_annotations
    from keras_yolo_mgpu.data.tf_dataset import distribute_training_dataset, make_dataset
    from keras_yolo_mgpu.resources import get_anchors, get_classes, resolve_resource

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    annotations = read_annotations(args.annotations)
    anchors = get_anchors(resolve_resource(None, "anchors"))
    num_classes = len(get_classes(args.classes))
    shape = (args.input_size, args.input_size)
    if args.mode == "shard":
        dataset = distribute_training_dataset(
            strategy, annotations, shape, anchors, num_classes, args.batch_size, seed=0
        )
    else:
        plain = make_dataset(annotations, shape, anchors, num_classes, args.batch_size, training=True, seed=0)
        dataset = strategy.experimental_distribute_dataset(plain)
    iterator = iter(dataset)

    def step():
        x, _ = next(iterator)
        for value in strategy.experimental_local_results(x["image"]):
            value.numpy()  # wait for the batch

    for _ in range(args.warmup):
        step()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(args.steps):
        step()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    images = args.steps * args.batch_size
    return {
        "worker": json.loads(os.environ["TF_CONFIG"])["task"]["index"],
        "cpu_seconds": round(cpu, 3),
        "wall_seconds": round(wall, 3),
        "global_images": images,
        "cpu_ms_per_global_image": round(1000 * cpu / images, 3),
    }


def run_cluster(args, workers: int, mode: str) -> list[dict]:
    cluster = {"worker": [f"127.0.0.1:{_free_port()}" for _ in range(workers)]}
    processes = []
    for index in range(workers):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
        command = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode]
        command += ["--annotations", args.annotations, "--classes", args.classes, "--input-size", str(args.input_size)]
        command += ["--batch-size", str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup)]
        processes.append(
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    results = []
    for process in processes:
        output = process.communicate(timeout=args.timeout)[0]
        lines = [line for line in output.splitlines() if line.startswith("{")]
        if process.returncode != 0 or not lines:
            raise RuntimeError(f"worker failed ({process.returncode}):\n{output[-3000:]}")
        results.append(json.loads(lines[-1]))
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--annotations", required=True)
    parser.add_argument("--classes", required=True)
    parser.add_argument("--input-size", type=int, default=416)
    parser.add_argument("--batch-size", type=int, default=8, help="GLOBAL batch (default: 8)")
    parser.add_argument("--steps", type=int, default=16, help="timed global batches (default: 16)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="workers of the multi-worker runs (default: 2)")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--mode", choices=("shard", "replicate"), default="shard", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(args)))
        return 0
    runs = []
    for workers, mode in ((1, "shard"), (args.workers, "shard"), (args.workers, "replicate")):
        per_worker = run_cluster(args, workers, mode)
        mean = sum(r["cpu_ms_per_global_image"] for r in per_worker) / len(per_worker)
        runs.append({"workers": workers, "mode": mode, "per_worker": per_worker, "mean_cpu_ms_per_global_image": mean})
        print(
            f"{workers} worker(s), {mode:9s}: CPU ms per global image, per worker: "
            f"{[r['cpu_ms_per_global_image'] for r in per_worker]}",
            flush=True,
        )
    print(
        json.dumps(
            {
                "benchmark": "multiworker_input",
                "input_size": args.input_size,
                "global_batch": args.batch_size,
                "steps": args.steps,
                "runs": runs,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
