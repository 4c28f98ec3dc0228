"""Probes of a training run's host side on this machine: the feed, its stages, the start and the memory.

Each subcommand measured a figure of BENCHMARKS.md or docs/gpu.md (which name
the command line); the last line each prints is its JSON record.

    python tools/feed_probes.py NAME --help
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing import shared_memory

import numpy as np
from subcommands import run_subcommand

PROG = "tools/feed_probes.py"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- ceiling ----------------------------------------------------------------------------------------------------------


def serial_fraction(threads: tuple[float, float], processes: tuple[float, float], workers: int) -> float | None:
    """Amdahl's serial fraction of `workers` threads, with processes' scaling as the lock-free one.

    `threads`, `processes`: images/s with one worker and with `workers`. Each
    feed's scaling is taken against its own one-worker rate, so what the
    processes pay once per batch (the hand-over) cancels out; what is left of
    the threads' shortfall is the lock's.
    """
    if workers < 2 or min(*threads, *processes) <= 0:
        return None
    speedup = workers * (threads[1] / threads[0]) / (processes[1] / processes[0])
    return max(0.0, (workers / speedup - 1.0) / (workers - 1))


def ceiling(argv=None) -> int:
    """How many images/s one process's worker threads can make, and the processes' feed against them.

        python scripts/make_bench_images.py --out /tmp/bench_images --num 256
        KERAS_BACKEND=jax python tools/feed_probes.py ceiling --annotations /tmp/bench_images/train.txt --rounds 3

    The method counts nothing twice: the same batches (the JAX training stream,
    YOLOv3-416 at batch 32 by default) are made by N worker threads of one
    process and by N worker processes, N = 1 .. the cores, in interleaved rounds.
    Processes share no lock, so their scaling from 1 to N workers says what N
    cores make of this work on this machine; the threads' shortfall against that
    scaling is the lock's doing alone (the cores, caches and memory bandwidth are
    the same). Amdahl's law on it gives the share of a batch's work that holds
    the lock,

        speedup = N * (threads(N) / threads(1)) / (processes(N) / processes(1))
        s = (N / speedup - 1) / (N - 1)

    and with the CPU-ms per image of one worker, the lock-held CPU-ms per image
    and the ceiling of any number of threads, 1000 / (s * CPU-ms per image)
    images/s. The processes' own serial part is what the training process does
    per image (takes each batch out of shared memory, hands it to Keras): its
    CPU-ms per image, measured alone (the workers' excluded), bounds the process
    feed at 1000 / (training process's CPU-ms per image) images/s whatever the
    number of workers and cores; an upper bound on the serial work (not all of it
    holds the lock), so a lower bound on the ceiling. `--cache ram` rows do the
    same from decoded images in memory.
    The last line is the JSON record; BENCHMARKS.md has the figures.
    """
    parser = argparse.ArgumentParser(prog=f"{PROG} ceiling", description=inspect.getdoc(ceiling).split("\n\n")[0])
    parser.add_argument("--annotations", required=True)
    parser.add_argument("--input-size", type=int, default=416)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default=None, help="comma-separated worker counts (default: 1 .. cores)")
    parser.add_argument("--cache", default=None, help="'ram': time from decoded images in memory")
    args = parser.parse_args(argv)

    from keras_yolo_mgpu.bench.pipeline import run_benchmark
    from keras_yolo_mgpu.data.annotations import read_annotations
    from keras_yolo_mgpu.resources import get_anchors, model_data_path

    annotations = read_annotations(args.annotations)
    anchors = get_anchors(model_data_path("yolo_anchors.txt"))
    counts = [int(n) for n in args.workers.split(",")] if args.workers else list(range(1, (os.cpu_count() or 1) + 1))
    shape = (args.input_size, args.input_size)
    figures: dict[tuple[str, int], list[dict]] = {}
    for round_index in range(args.rounds):
        for workers in counts:
            for generator in ("pydataset", "pyprocesses")[:: 1 if round_index % 2 == 0 else -1]:
                record = run_benchmark(
                    generator, annotations, shape, anchors, 80, args.batch_size, args.batches,
                    cache=args.cache, workers=workers,
                )  # fmt: skip
                figures.setdefault((generator, workers), []).append(record)
                print(f"round {round_index} {generator:<11} workers {workers}: {record['images_per_sec']:8.1f} "
                      f"images/s, {record['cpu_ms_per_image']:.2f} CPU-ms/image "
                      f"({record['main_cpu_ms_per_image']:.3f} in the training process)", flush=True)  # fmt: skip
    rows = []
    for workers in counts:
        threads = statistics.median(r["images_per_sec"] for r in figures[("pydataset", workers)])
        processes = statistics.median(r["images_per_sec"] for r in figures[("pyprocesses", workers)])
        cpu_ms = statistics.median(r["cpu_ms_per_image"] for r in figures[("pydataset", 1)])
        one = [statistics.median(r["images_per_sec"] for r in figures[(g, 1)]) for g in ("pydataset", "pyprocesses")]
        serial = serial_fraction((one[0], threads), (one[1], processes), workers)
        main_ms = statistics.median(r["main_cpu_ms_per_image"] for r in figures[("pyprocesses", workers)])
        rows.append(
            {
                "workers": workers,
                "threads_images_per_sec": round(threads, 1),
                "processes_images_per_sec": round(processes, 1),
                "threads_cpu_ms_per_image": statistics.median(
                    r["cpu_ms_per_image"] for r in figures[("pydataset", workers)]
                ),
                "processes_cpu_ms_per_image": statistics.median(
                    r["cpu_ms_per_image"] for r in figures[("pyprocesses", workers)]
                ),
                "serial_fraction": None if serial is None else round(serial, 3),
                "lock_ms_per_image": None if serial is None else round(serial * cpu_ms, 3),
                "threads_ceiling_images_per_sec": None if not serial else round(1000.0 / (serial * cpu_ms)),
                "processes_main_cpu_ms_per_image": main_ms,
                "processes_ceiling_images_per_sec": round(1000.0 / main_ms) if main_ms > 0 else None,
            }
        )
    print(json.dumps({"benchmark": "feed-ceiling", "cache": args.cache, "cpu_count": os.cpu_count(), "rows": rows}))
    return 0


# -- stages -----------------------------------------------------------------------------------------------------------


def _variants():
    """name -> (DatasetBuilder options, HostBatches subclass or None); None: decode-only."""
    from keras_yolo_mgpu.data import host
    from keras_yolo_mgpu.data.images import decode_image
    from keras_yolo_mgpu.data.letterbox import GREY

    class NoPlace(host.HostBatches):
        def augmented(self, params, index, out, order):
            self.source.read(self.source.decode, int(index), (int(params["nw"]), int(params["nh"])))
            out[...] = GREY
            boxes = host.augment_boxes(self.boxes_of(index), (1, 1), params, out.shape[:2], self.max_boxes, order)
            return boxes, (params["hue"], params["sat"], params["val"])

    class WholeDecodes(host.ImageSource):
        def decode(self, index, reduce_to=None):
            pixels, _, size = decode_image(self.annotations[index].image_path)
            return pixels, size, host.np.array(size, host.np.float32)

    class FullDecode(host.HostBatches):
        def __post_init__(self):
            super().__post_init__()
            self.source = WholeDecodes(self.annotations, self.input_shape, self.cache)

    return {
        "host": ({}, None),
        "no-place": ({}, NoPlace),
        "full-decode": ({}, FullDecode),
        "host-ram": ({"cache": "ram"}, None),
        "decode-only": None,
    }


def time_variant(variant, annotations, input_shape, anchors, num_classes, batch_size, batches, warmup=3):
    """CPU-ms per image (all threads) and images/s of `batches` batches after `warmup`."""
    from keras_yolo_mgpu.bench.pipeline import _decode_only_dataset, _wait_until_idle
    from keras_yolo_mgpu.data.tf_dataset import DatasetBuilder

    if variant is None:
        dataset = _decode_only_dataset(annotations, input_shape, batch_size)
    else:
        options, host_class = variant
        builder = DatasetBuilder(
            annotations, input_shape, anchors, num_classes, batch_size, training=True, seed=0, **options
        )
        if host_class is not None:
            old = builder.host
            builder.host = host_class(
                annotations, input_shape, num_classes, batch_size, training=True, seed=0, cache=old.cache
            )
        builder.host.source.warm()  # a cache, if any, is timed warm
        dataset = builder.build()
    iterator = iter(dataset)
    for _ in range(max(warmup, (os.cpu_count() or 1) + 1)):  # past the parallel calls' first batches
        next(iterator)
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(iterator)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    del iterator
    gc.collect()
    _wait_until_idle()  # what the closed pipeline's threads still finish is not the next variant's
    images = batches * batch_size
    return 1000 * cpu / images, images / seconds


def stages(argv=None) -> int:
    """Where the training pipeline's CPU time goes: each stage left out in turn, interleaved rounds.

        python scripts/make_bench_images.py --out /tmp/bench_images --num 256
        python tools/feed_probes.py stages --annotations /tmp/bench_images/train.txt --rounds 3

    Variants, each the real tf.data pipeline (`data.tf_dataset.DatasetBuilder`
    over `data.host.HostBatches`) with one stage changed (a subclass overrides
    one method), timed like `bench pipeline` (CPU time of every thread per image)
    in rounds that visit every variant, so that load from other processes
    disturbs all of them alike:

    - `host`: the host's share, what training reads (uint8 canvas, padded
      boxes, HSV draws: `make_dataset`);
    - `no-place`: `host` without resizing and placing the image (the decoded
      image is not touched; the canvas stays grey);
    - `full-decode`: `host` decoding every JPEG whole (no reduced-scale DCT
      decoding);
    - `host-ram`: `host` from a warm RAM cache (`--cache ram`): no decoding;
    - `decode-only`: `bench pipeline --generator decode-only`, the reference.

    Prints one line per round and a JSON summary: the median CPU-ms/image of
    each variant and its ratio to decode-only.
    """
    parser = argparse.ArgumentParser(prog=f"{PROG} stages", description=inspect.getdoc(stages).split("\n\n")[0])
    parser.add_argument("--annotations", required=True)
    parser.add_argument("--input-size", type=int, default=416)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=None, help="comma-separated variants (default: all)")
    args = parser.parse_args(argv)

    from keras_yolo_mgpu.data.annotations import read_annotations
    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors

    annotations = read_annotations(args.annotations)
    num_classes = 1 + max(int(a.boxes[:, 4].max()) for a in annotations if len(a.boxes))
    anchors = get_anchors(default_anchors_path(False))
    variants = _variants()
    names = args.only.split(",") if args.only else list(variants)
    shape = (args.input_size, args.input_size)
    results = {name: [] for name in names}
    for round_index in range(args.rounds):
        for name in names:
            cpu_ms, rate = time_variant(
                variants[name], annotations, shape, anchors, num_classes, args.batch_size, args.batches
            )
            results[name].append(cpu_ms)
            print(f"round {round_index}: {name:12s} {cpu_ms:6.2f} CPU-ms/image {rate:7.1f} images/s", flush=True)
    medians = {name: statistics.median(values) for name, values in results.items()}
    summary = {"cpu_ms_per_image": results, "median": medians}
    if "decode-only" in medians:
        summary["ratio_to_decode_only"] = {n: round(m / medians["decode-only"], 2) for n, m in medians.items()}
    print(json.dumps(summary))
    return 0


# -- shared-block -----------------------------------------------------------------------------------------------------


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def shared_block(argv=None) -> int:
    """CPU per image of handing a batch over in shared memory: a fresh block per batch against one reused.

        python tools/feed_probes.py shared-block --batch-size 32 --input-size 416 --batches 40

    What `data/host_processes.py`'s worker and training process do per batch,
    without the batch's making: the batch's uint8 images written into a shared
    block and copied out of it. "fresh" makes and unlinks a block per batch (the
    process feed before 2026-11-26), "reused" writes into one block made once
    (`host_processes.BatchSlots`). Prints CPU-ms per image (user + system, this
    process) for each, then one JSON line.
    """
    parser = argparse.ArgumentParser(
        prog=f"{PROG} shared-block", description=inspect.getdoc(shared_block).split("\n\n")[0]
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--input-size", type=int, default=416)
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args(argv)
    images = np.random.default_rng(0).integers(0, 256, (args.batch_size, args.input_size, args.input_size, 3), np.uint8)
    per_image = 1000.0 / (args.batches * args.batch_size)

    start = _cpu_seconds()
    for _ in range(args.batches):
        block = shared_memory.SharedMemory(create=True, size=images.nbytes)
        np.ndarray(images.shape, images.dtype, block.buf)[...] = images
        name = block.name
        block.close()
        reader = shared_memory.SharedMemory(name=name)
        np.ndarray(images.shape, images.dtype, reader.buf).copy()
        reader.close()
        reader.unlink()
    fresh = (_cpu_seconds() - start) * per_image

    block = shared_memory.SharedMemory(create=True, size=images.nbytes)
    try:
        slot = np.ndarray(images.shape, images.dtype, block.buf)
        slot[...] = images  # its pages faulted in once, as a reused block's are after its first batch
        start = _cpu_seconds()
        for _ in range(args.batches):
            slot[...] = images
            slot.copy()
        reused = (_cpu_seconds() - start) * per_image
        del slot
    finally:
        block.close()
        block.unlink()
    print(f"fresh block per batch: {fresh:.3f} CPU-ms/image; one block reused: {reused:.3f} CPU-ms/image")
    record = {"benchmark": "shared-block-cost", "batch_size": args.batch_size, "input_size": args.input_size}
    record.update(fresh_cpu_ms_per_image=round(fresh, 3), reused_cpu_ms_per_image=round(reused, 3))
    print(json.dumps(record))
    return 0


# -- multiworker ------------------------------------------------------------------------------------------------------


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
        command = [sys.executable, os.path.abspath(__file__), "multiworker", "--worker", "--mode", mode]
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


def multiworker(argv=None) -> int:
    """CPU time per image of each worker's input pipeline under MultiWorkerMirroredStrategy.

        python scripts/make_bench_images.py --out /tmp/bench --num 64
        python tools/feed_probes.py multiworker --annotations /tmp/bench/train.txt --classes model_data/voc_classes.txt

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
    parser = argparse.ArgumentParser(
        prog=f"{PROG} multiworker", description=inspect.getdoc(multiworker).splitlines()[0]
    )
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


# -- pool-memory ------------------------------------------------------------------------------------------------------


def pool_memory(argv=None) -> int:
    """The scratch memory and time of a JAX training step of tiny YOLOv3, with Keras's max pooling and the project's.

        KERAS_BACKEND=jax python tools/feed_probes.py pool-memory --input-size 416 --batch-size 8

    Tiny YOLOv3 (`model.yolo3.tiny_yolo_body`, 80 classes) forward and backward
    in one jitted function (the loss here is the sum of squared outputs: the
    pooling's share of the step does not depend on it), compiled twice: with
    the pooling of `backend/jax/pooling.py` (2x2 windows at stride 2 by a
    reshape) and with Keras's `max_pool` (`lax.reduce_window`, whose gradient
    XLA's CPU compiler expands into index arrays of the input's size). Prints
    XLA's scratch (`temp_size_in_bytes`) for each, and seconds per step (the
    median of `--steps` after one warm-up), then one JSON line.
    """
    parser = argparse.ArgumentParser(
        prog=f"{PROG} pool-memory", description=inspect.getdoc(pool_memory).split("\n\n")[0]
    )
    parser.add_argument("--input-size", type=int, default=416)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)

    import jax
    import keras

    from keras_yolo_mgpu.backend.tensorflow import pooling as keras_pooling  # Keras's op alone: no TensorFlow
    from keras_yolo_mgpu.model import pooling
    from keras_yolo_mgpu.model.yolo3 import tiny_yolo_body

    if keras.backend.backend() != "jax":
        raise SystemExit("run with KERAS_BACKEND=jax")
    size = args.input_size
    model = tiny_yolo_body(keras.Input((size, size, 3)), 3, 80)
    images = np.random.default_rng(0).uniform(0, 1, (args.batch_size, size, size, 3)).astype("float32")
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss(trainable, images):
        outputs, _ = model.stateless_call(trainable, non_trainable, images, training=True)
        return sum(keras.ops.sum(keras.ops.square(output)) for output in outputs)

    record = {"benchmark": "pool-memory", "input_size": size, "batch_size": args.batch_size}
    for name, module in (("project", pooling.backend_pooling), ("keras", keras_pooling)):
        pooling.backend_pooling = module
        step = jax.jit(jax.grad(loss))
        compiled = step.lower(trainable, images).compile()
        scratch = compiled.memory_analysis().temp_size_in_bytes
        jax.block_until_ready(compiled(trainable, images))
        seconds = []
        for _ in range(args.steps):
            start = time.perf_counter()
            jax.block_until_ready(compiled(trainable, images))
            seconds.append(time.perf_counter() - start)
        record[f"{name}_scratch_mb"] = round(scratch / 1e6, 1)
        record[f"{name}_seconds_per_step"] = round(statistics.median(seconds), 3)
        print(f"{name:8s} pooling: scratch {scratch / 1e6:8.1f} MB, {statistics.median(seconds):.3f} s per step")
    print(json.dumps(record))
    return 0


# -- start ------------------------------------------------------------------------------------------------------------

FIRST_STEP = "first training step done"
BEFORE_STEP = "Epoch 1/"  # Keras's line before the first step: the model built, the data read, nothing compiled


def rss_gb(pid: int, field: str = "VmHWM") -> float:
    """The process's peak resident set (`VmHWM`) or current one (`VmRSS`), in GB (10^9 bytes)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024 / 1e9
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def one_run(data: str, cache: str, hold: float, extra: list[str], timeout: float) -> dict:
    """Launches one training run; returns seconds to its first step and its peak RSS `hold` s later."""
    with tempfile.TemporaryDirectory() as log_dir:
        command = [sys.executable, os.path.join(REPO, "train.py"), "--data", data, "--tiny", "--input-size", "416"]
        command += ["--batch-size", "8", "--no-pictures", "--log-dir", log_dir, *extra]
        env = dict(os.environ, KERAS_YOLO_MGPU_CACHE=cache, PYTHONUNBUFFERED="1")
        started = time.perf_counter()
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first_step = before_step = None
        try:
            for line in process.stdout:
                if before_step is None and BEFORE_STEP in line:
                    # Everything but the first step: what stays on the host when the step runs on a GPU.
                    before_step = rss_gb(process.pid, "VmRSS")
                if FIRST_STEP in line:
                    first_step = time.perf_counter() - started
                    break
                if time.perf_counter() - started > timeout:
                    break
            if first_step is None:
                raise RuntimeError(f"no '{FIRST_STEP}' within {timeout:.0f} s: {' '.join(command)}")
            time.sleep(hold)
            rss = rss_gb(process.pid)
        finally:
            interrupted = time.perf_counter()
            process.send_signal(signal.SIGINT)
            try:
                process.communicate(timeout=120)  # read on: a full pipe would hold the process
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            stop = time.perf_counter() - interrupted
    before = None if before_step is None else round(before_step, 2)
    return {
        "first_step_s": round(first_step, 1),
        "peak_rss_gb": round(rss, 2),
        "rss_before_first_step_gb": before,
        "stop_s": round(stop, 1),
        "exit_status": process.returncode,
    }


def start(argv=None) -> None:
    """How long `train.py` takes from launch to its first training step, and the memory it then holds.

        python scripts/make_coco_size_dataset.py --out /tmp/coco_size
        python tools/feed_probes.py start --data /tmp/coco_size/train.json --runs 2
        KERAS_BACKEND=jax python tools/feed_probes.py start --data /tmp/coco_size/train.json --runs 2

    Each run launches `train.py --data D --tiny --input-size 416 --batch-size 8
    --no-pictures` (plus `--extra`) in a fresh run folder, reads its log for the
    line `first training step done`, keeps it training for `--hold` seconds, reads
    the process's peak resident memory (`VmHWM` of /proc, Linux), and stops it
    with a Ctrl-C (SIGINT), timing how long it takes to end (`stop_s`).
    The first run uses an empty scan-record cache (`KERAS_YOLO_MGPU_CACHE` in a
    temporary folder), later runs reuse that cache, as a user's second start does.
    The last line is the JSON record; BENCHMARKS.md has the figures.
    """
    parser = argparse.ArgumentParser(prog=f"{PROG} start", description=inspect.getdoc(start).split("\n")[0])
    parser.add_argument("--data", required=True, help="the dataset train.py reads (e.g. a COCO JSON)")
    parser.add_argument("--runs", type=int, default=2, help="runs; the first with an empty scan-record cache")
    parser.add_argument("--hold", type=float, default=60.0, help="seconds of training before reading the peak RSS")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the first step")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more train.py flags (last)")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for run in range(args.runs):
            row = {"run": run + 1, "records": "fresh" if run == 0 else "reused"}
            row.update(one_run(args.data, cache, args.hold, args.extra, args.timeout))
            print(row, flush=True)
            rows.append(row)
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    print(json.dumps({"backend": backend, "data": args.data, "extra": args.extra, "runs": rows}))


SUBCOMMANDS = {
    "ceiling": ceiling,
    "stages": stages,
    "shared-block": shared_block,
    "multiworker": multiworker,
    "pool-memory": pool_memory,
    "start": start,
}


def main(argv: list[str] | None = None) -> int:
    return run_subcommand(PROG, SUBCOMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
