#!/usr/bin/env python3
"""How long `train.py` takes from launch to its first training step, and the memory it then holds.

    python scripts/make_coco_size_dataset.py --out /tmp/coco_size
    python scripts/start_report.py --data /tmp/coco_size/train.json --runs 2
    KERAS_BACKEND=jax python scripts/start_report.py --data /tmp/coco_size/train.json --runs 2

Each run launches `train.py --data D --tiny --input-size 416 --batch-size 8
--no-pictures` (plus `--extra`) in a fresh run folder, reads its log for the
line `first training step done`, keeps it training for `--hold` seconds, reads
the process's peak resident memory (`VmHWM` of /proc, Linux), and stops it
with a Ctrl-C (SIGINT), timing how long it takes to end (`stop_s`).
The first run uses an empty scan-record cache (`KERAS_YOLO_MGPU_CACHE` in a
temporary folder), later runs reuse that cache, as a user's second start does.
The last line is the JSON record; BENCHMARKS.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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


if __name__ == "__main__":
    main()
