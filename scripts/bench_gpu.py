#!/usr/bin/env python3
"""One-GPU benchmark for BENCHMARKS.md: training speed, input pipeline, replication cost.

    python scripts/bench_gpu.py --results /tmp/bench_gpu            # everything (~15 min on an H100)
    python scripts/bench_gpu.py --results DIR --parts train         # only some parts
    python scripts/bench_gpu.py --results DIR --report              # the Markdown table from DIR

Each measurement is its own process running one of the project's benchmarks
(`python -m keras_yolo_mgpu.bench train|pipeline`, `tools/train_step_compare.py`; a dtype policy or a
logical-device split cannot be undone inside one TensorFlow process), whose
last output line is JSON; it is appended to `DIR/results.jsonl` as soon as it
finishes, so an interrupted run keeps what it measured. Parts:

* `train`: training images/s of YOLOv3-416 and tiny YOLOv3-416 (80 classes)
  at float32 (interleaved with keras-yolo3's own step under Keras 2 by
  tools/train_step_compare.py, the ratio), mixed precision (mixed_float16), XLA (jit_compile) and both.
* `pipeline`: the tf.data input pipeline on real JPEGs (640x480, generated
  by scripts/make_bench_images.py), full augmentation (the host's share:
  the targets and the HSV jitter run in the step), and the bare decode:
  images/s against the training step's demand (is the GPU fed?).
* `replication`: the GPU split into 2 and 4 logical GPUs, MirroredStrategy
  at the same global batch: what replication itself costs (all-reduce,
  per-replica kernels on a smaller batch, synchronized BatchNormalization).

`--report` turns the results into Markdown tables (also written to
`DIR/report.md`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {"yolov3": [], "yolov3-tiny": ["--tiny"]}
MODES = {
    "float32": [],
    "mixed": ["--mixed-precision"],
    "xla": ["--jit"],
    "mixed+xla": ["--mixed-precision", "--jit"],
}
PARTS = ("train", "pipeline", "replication")


def _run(name: str, args: list[str], results: str, timeout: int) -> dict | None:
    """Runs one benchmark process; appends {name, command, result} to results.jsonl.

    `args`: `bench`'s (`train ...`), or a tool's path in the checkout and its flags.
    """
    program = [] if args[0].endswith(".py") else ["-m", "keras_yolo_mgpu.bench"]
    command = [sys.executable, *program, *args]  # run in the checkout (cwd=REPO): a tool's path is relative to it
    print(f"== {name}: {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
        output = run.stdout + run.stderr
        lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
        result = json.loads(lines[-1]) if run.returncode == 0 and lines else None
    except subprocess.TimeoutExpired as error:
        output, result = f"timeout after {timeout} s\n{error.stdout or ''}{error.stderr or ''}", None
    seconds = time.perf_counter() - start
    record = {"name": name, "command": " ".join(["python", *program, *args]), "result": result}
    record["seconds"] = round(seconds, 1)
    if result is None:
        record["error"] = output[-4000:]
        print(output[-4000:], flush=True)
    else:
        print(f"   {seconds:.0f} s: {json.dumps(result)[:400]}", flush=True)
    with open(os.path.join(results, "results.jsonl"), "a") as handle:
        handle.write(json.dumps(record) + "\n")
    return result


def _train_args(model: str, size: int, num_classes: int, batch: int, steps: int) -> list[str]:
    args = ["train", *MODELS[model], "--input-size", str(size), "--num-classes", str(num_classes)]
    return args + ["--batch-size", str(batch), "--steps", str(steps), "--warmup-steps", "5"]


def run_train(results: str, models, size, num_classes, batch: int, steps: int, timeout: int, modes) -> None:
    for model in models:
        for mode in modes:
            args = _train_args(model, size, num_classes, batch, steps) + MODES[mode]
            if mode == "float32":  # beside keras-yolo3's own step: the comparison tool, on bench train's flags
                args = ["tools/train_step_compare.py", *args[1:], "--reference", "keras-yolo3", "--rounds", "2"]
            _run(f"train {model} {mode}", args, results, timeout)


def run_pipeline(results: str, size: int, batch: int, timeout: int) -> None:
    images = os.path.join(results, "images")
    if not os.path.isfile(os.path.join(images, "train.txt")):
        subprocess.run(
            [sys.executable, os.path.join(REPO, "scripts", "make_bench_images.py"), "--out", images, "--num", "256"],
            check=True,
            cwd=REPO,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))),
        )
    classes = os.path.join(REPO, "model_data", "voc_classes.txt")
    for generator in ("tfdata-device", "decode-only"):
        args = ["pipeline", "--annotations", os.path.join(images, "train.txt"), "--classes", classes]
        args += ["--input-size", str(size), "--batch-size", str(batch), "--batches", "40", "--generator", generator]
        _run(f"pipeline {generator}", args, results, timeout)


def run_replication(results: str, models, size, num_classes, batch, steps, timeout, memory_mb: int) -> None:
    for model in models:
        for replicas in (2, 4):
            args = _train_args(model, size, num_classes, batch, steps) + ["--gpus", str(replicas), "--simulate-devices"]
            args += ["--simulated-gpu-memory", str(memory_mb // replicas)]
            _run(f"replication {model} {replicas}", args, results, timeout)


def _load(results: str) -> dict[str, dict]:
    records = {}
    path = os.path.join(results, "results.jsonl")
    if os.path.isfile(path):
        with open(path) as handle:
            for line in handle:
                record = json.loads(line)
                records[record["name"]] = record  # a later run of the same measurement wins
    return records


def report(results: str) -> str:
    """Markdown tables from results.jsonl."""
    records = _load(results)

    def result(name):
        record = records.get(name)
        return record and record["result"]

    lines = ["| model | mode | images/s | median step ms | vs float32 |", "| --- | --- | --- | --- | --- |"]
    first = next((r["result"] for r in records.values() if r["result"] and r["name"].startswith("train")), None)
    demand = 0.0
    for model in MODELS:
        base = result(f"train {model} float32")
        for mode in MODES:
            r = result(f"train {model} {mode}")
            if not r:
                lines.append(f"| {model} | {mode} | failed or not run | | |")
                continue
            speedup = f"{r['images_per_sec'] / base['images_per_sec']:.2f}x" if base else ""
            lines.append(f"| {model} | {mode} | {r['images_per_sec']:.1f} | {r['median_step_ms']:.1f} | {speedup} |")
            demand = max(demand, r["images_per_sec"])
        if base and "keras-yolo3_images_per_sec" in base:
            lines.append(
                f"| {model} | keras-yolo3 (Keras 2), float32 | {base['keras-yolo3_images_per_sec']:.1f} | "
                f"{base['keras-yolo3_median_step_ms']:.1f} | ours/keras-yolo3 = {base['ratio_vs_keras-yolo3']:.2f} "
                f"(rounds {base['ratio_vs_keras-yolo3_rounds']}) |"
            )
    if first:
        lines.append(
            f"\nInput {first['input_size'][0]}x{first['input_size'][1]}, {first['num_classes']} classes, global batch "
            f"{first['global_batch']}, {first['steps_per_round']} timed steps per round (median step)."
        )

    lines += ["", "| input pipeline (real 640x480 JPEGs) | images/s | CPU-ms/image |", "| --- | --- | --- |"]
    for generator in ("tfdata-device", "decode-only"):
        r = result(f"pipeline {generator}")
        if r:
            lines.append(f"| {generator} | {r['images_per_sec']:.1f} | {r.get('cpu_ms_per_image', float('nan')):.2f} |")
    fed = result("pipeline tfdata-device")
    if fed and demand:
        lines.append(
            f"\nFastest training step above: {demand:.1f} images/s; the pipeline delivers "
            f"{fed['images_per_sec']:.1f} ({fed['images_per_sec'] / demand:.2f}x the demand)."
        )

    lines += [
        "",
        "| model | logical GPUs | images/s | vs 1 GPU | cost of replication |",
        "| --- | --- | --- | --- | --- |",
    ]
    for model in MODELS:
        base = result(f"train {model} float32")
        if base:
            lines.append(f"| {model} | 1 | {base['images_per_sec']:.1f} | 1.00 | |")
        for replicas in (2, 4):
            r = result(f"replication {model} {replicas}")
            if r and base:
                ratio = r["images_per_sec"] / base["images_per_sec"]
                lines.append(f"| {model} | {replicas} | {r['images_per_sec']:.1f} | {ratio:.2f} | {1 - ratio:.0%} |")
            elif not r:
                lines.append(f"| {model} | {replicas} | failed or not run | | |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(results, "report.md"), "w") as handle:
        handle.write(text)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", required=True, help="folder for results.jsonl, images and report.md")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--modes", default=",".join(MODES), help=f"train modes: {','.join(MODES)}")
    parser.add_argument("--models", default=",".join(MODELS), help=f"subset of {','.join(MODELS)}")
    parser.add_argument("--input-size", type=int, default=416, help="square input size (default: 416)")
    parser.add_argument("--num-classes", type=int, default=80, help="classes (default: 80, COCO)")
    parser.add_argument("--batch-size", type=int, default=32, help="global batch (default: 32)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run (default: 20)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per benchmark process (default: 300)")
    parser.add_argument("--gpu-memory", type=int, default=64000, help="MiB split among the logical GPUs")
    parser.add_argument("--report", action="store_true", help="only write the report from existing results")
    args = parser.parse_args(argv)
    os.makedirs(args.results, exist_ok=True)
    if not args.report:
        parts = [p for p in args.parts.split(",") if p]
        unknown = sorted(set(parts) - set(PARTS))
        modes = [m for m in args.modes.split(",") if m]
        models = [m for m in args.models.split(",") if m]
        unknown += sorted(set(modes) - set(MODES)) + sorted(set(models) - set(MODELS))
        if unknown:
            parser.error(f"unknown part(s) or mode(s): {unknown}")
        if "train" in parts:
            size, classes = args.input_size, args.num_classes
            run_train(args.results, models, size, classes, args.batch_size, args.steps, args.timeout, modes)
        if "pipeline" in parts:
            run_pipeline(args.results, args.input_size, args.batch_size, args.timeout)
        if "replication" in parts:
            run_replication(
                args.results,
                models,
                args.input_size,
                args.num_classes,
                args.batch_size,
                args.steps,
                args.timeout,
                args.gpu_memory,
            )
    print(report(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
