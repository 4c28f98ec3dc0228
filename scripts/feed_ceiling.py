#!/usr/bin/env python3
"""How many images/s one process's worker threads can make, and the processes' feed against them.

    python scripts/make_bench_images.py --out /tmp/bench_images --num 256
    KERAS_BACKEND=jax python scripts/feed_ceiling.py --annotations /tmp/bench_images/train.txt --rounds 3

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

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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


if __name__ == "__main__":
    sys.exit(main())
