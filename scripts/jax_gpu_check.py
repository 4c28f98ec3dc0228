#!/usr/bin/env python3
"""Every GPU question of the JAX engine in one command that fits a short GPU window.

    KERAS_BACKEND=jax python scripts/jax_gpu_check.py --out /tmp/jax_gpu        # <= --deadline (480 s)
    KERAS_BACKEND=jax python scripts/jax_gpu_check.py --out /tmp/q --quick      # CPU rehearsal, tiny, 64 px

It stops within seconds when there is no GPU (`preflight`: the imports, JAX's
backend, the card and its memory), then runs the parts most important first,
each in its own process (a dtype policy cannot be undone inside one), under
one overall deadline, with one persistent compilation cache shared by all, and
appends each part's record to `OUT/results.jsonl` as it ends, so a run cut
short keeps what it measured. The last lines are a one-screen table.

1. `trainer`: `train.py` itself, the default recipe (Adam, EMA, validation
   mAP), the GPU's defaults (mixed_bfloat16 after its start-up check),
   YOLOv3-416, global batch 32, from generated 640x480 JPEGs through the
   TensorFlow-free pipeline; images/s from the run's own history.csv (the
   second epoch: steady steps).
2. `exact`: the device-side targets bit for bit against keras-yolo3's numpy
   `preprocess_true_boxes` on this card, centres on cell borders included,
   the HSV jitter, and how often the card's own division differs from
   numpy's (what the targets do not rely on).
3. `bare-bf16`: the baseline on the same card, in the same call: the same
   network as a plain Keras model, one jitted step, the batch on the device
   (`tools/jax_bare_step.py`). The table's `trainer / bare` is the goal's ratio.
4. `step-bf16`: `bench train`, the trainer's step alone (its model and
   optimizer, no input pipeline).
5. `e2e`: `bench e2e`, training from the JPEGs against the step alone.
6. `step-f32`, `bare-f32`, `step-bf16-spe4` (`steps_per_execution=4`), `e2e-ram`
   (`--cache ram`), and the trainer without its progress bar (`trainer-quiet`)
   and from decoded images in RAM (`trainer-ram`): where its time goes.

Nothing here imports TensorFlow; `--block-tensorflow` makes every part's
`import tensorflow` fail, as on the GPU machines (the suite's rehearsal).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = (
    "trainer", "exact", "bare-bf16", "step-bf16", "e2e", "step-f32", "bare-f32", "step-bf16-spe4", "e2e-ram",
    "trainer-quiet", "trainer-ram",
)  # fmt: skip
# A part is not started with less than this left before the deadline: it could not compile and time anything.
MIN_PART_SECONDS = 45

PREFLIGHT = """
import json, sys, importlib
missing = []
for name in ("jax", "keras", "PIL", "cv2", "h5py", "numpy"):
    try:
        importlib.import_module(name)
    except Exception as error:
        missing.append(f"{name}: {error}")
import jax
device = jax.devices()[0]
stats = device.memory_stats() or {}
print(json.dumps({"backend": jax.default_backend(), "device_kind": device.device_kind, "devices": len(jax.devices()),
                  "memory_gib": round(stats.get("bytes_limit", 0) / 2**30, 1), "jax": jax.__version__,
                  "keras": __import__("keras").__version__, "python": sys.version.split()[0], "missing": missing}))
"""
# The device-side targets and HSV jitter of tests/jax_input_checks.py on this machine's devices, as JSON.
EXACT = """
import json, sys
sys.path.insert(0, "tests")
import jax, jax_input_checks as checks
found = {}
checks._targets(found)
checks._hsv(found)
print(json.dumps({"device": str(jax.devices()[0]), "target_cases": found["target_cases"],
                  "target_mismatches": [list(map(str, m)) for m in found["target_mismatches"]],
                  "target_parts_wrong": found["target_parts_wrong"],
                  "floor_wrong": found["floor_wrong"], "division_wrong": found["division_wrong"],
                  "hsv_max_error": max(found["hsv_errors"]), "neutral_exact": found["neutral_exact"],
                  "to_float_exact": found["to_float_exact"]}))
"""
BARE = """
import json, sys
sys.path.insert(0, "tools")
from jax_bare_step import run_bare_step
print(json.dumps(run_bare_step(**json.loads({settings!r}))))
"""
# Prepended to a part's code with --block-tensorflow: `import tensorflow` fails from there on.
BLOCK_TENSORFLOW = """
from keras_yolo_mgpu.cli.without_tensorflow import block_tensorflow
block_tensorflow("the GPU check runs without it")
"""
# A script or module (`-m NAME`) run after BLOCK_TENSORFLOW.
RUN_BLOCKED = (
    BLOCK_TENSORFLOW
    + """
import runpy, sys
sys.argv = sys.argv[1:]
if sys.argv[0] == "-m":
    del sys.argv[0]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    runpy.run_path(sys.argv[0], run_name="__main__")
"""
)


class Check:
    """Runs the parts under one deadline and keeps their records."""

    def __init__(self, args):
        self.args = args
        self.deadline = time.monotonic() + args.deadline
        self.records: dict[str, dict] = {}
        self.env = dict(
            os.environ,
            KERAS_BACKEND="jax",
            PYTHONUNBUFFERED="1",
            PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
            # One persistent cache for every part: a rerun in the same window compiles nothing twice.
            JAX_COMPILATION_CACHE_DIR=os.path.join(args.out, "jax_cache"),
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            # On a GPU, a CUDA that fails to start is an error, not a silent run on the CPU.
            JAX_PLATFORMS="cpu" if args.quick else os.environ.get("JAX_PLATFORMS", "cuda"),
        )

    def command(self, argv: list[str], code: str | None = None) -> list[str]:
        """The part's command line: `code` run with `-c`, else `argv`; through the TensorFlow blocker if asked."""
        block = self.args.block_tensorflow
        if code is not None:
            return [sys.executable, "-c", (BLOCK_TENSORFLOW if block else "") + code]
        return [sys.executable, *(("-c", RUN_BLOCKED) if block else ()), *argv]

    def run(self, name: str, argv: list[str], code: str | None = None, parse=None) -> dict:
        left = self.deadline - time.monotonic()
        record = {"name": name}
        if left < MIN_PART_SECONDS:
            record.update(status="skipped", reason=f"{left:.0f} s left before the deadline")
            return self._keep(record)
        command = self.command(argv, code)
        print(f"== {name} ({left:.0f} s left): {' '.join(argv)[:300]}", flush=True)
        start = time.perf_counter()
        try:
            run = subprocess.run(command, capture_output=True, text=True, timeout=left, cwd=REPO, env=self.env)
            output, status = run.stdout + run.stderr, run.returncode
        except subprocess.TimeoutExpired as error:
            output, status = f"deadline after {left:.0f} s\n{error.stdout or ''}{error.stderr or ''}", "timeout"
        record.update(status=status, seconds=round(time.perf_counter() - start, 1))
        try:
            record["result"] = parse(output) if parse else _last_json(output) if status == 0 else None
        except (OSError, ValueError, KeyError, IndexError) as error:
            record["result"], record["parse_error"] = None, str(error)
        if record["result"] is None or status != 0:
            record["output_tail"] = str(output)[-3000:]
        return self._keep(record)

    def _keep(self, record: dict) -> dict:
        self.records[record["name"]] = record
        with open(os.path.join(self.args.out, "results.jsonl"), "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        shown = {k: v for k, v in record.items() if k != "output_tail"}
        print(json.dumps(shown)[:1500], flush=True)
        if "output_tail" in record:
            print(record["output_tail"][-1500:], flush=True)
        return record


def _last_json(output: str) -> dict | None:
    lines = [line for line in output.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def _trainer_result(run_dir: str):
    """The run's own figures: history.csv's images/s per epoch, args.json's dtype policy, the check's cost."""

    def parse(output: str) -> dict:
        with open(os.path.join(run_dir, "history.csv"), newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        with open(os.path.join(run_dir, "args.json"), encoding="utf-8") as handle:
            settings = json.load(handle)
        check = [line.split("INFO")[-1].strip() for line in output.splitlines() if "precision check" in line]
        return {
            "images_per_sec_epochs": [round(float(row["images_per_sec"]), 2) for row in rows],
            "images_per_sec": round(float(rows[-1]["images_per_sec"]), 2),
            "epoch_seconds": [row.get("epoch_seconds") for row in rows],
            "val_mAP_seconds": [row.get("val_mAP_seconds") for row in rows],
            "dtype_policy": settings.get("dtype_policy"),
            "backend": settings.get("backend"),
            "precision_check": check[-1] if check else None,
        }

    return parse


def _table(records: dict[str, dict]) -> str:
    """One screen: each part's status, time and headline figure, then the goal's ratios."""

    def figure(name):
        result = (records.get(name) or {}).get("result") or {}
        if name.startswith("e2e"):
            return result.get("pipeline_images_per_sec")
        return result.get("images_per_sec")

    lines = [f"{'part':<16}{'status':>10}{'seconds':>9}  figure"]
    for name, record in records.items():
        result = record.get("result") or {}
        if name == "preflight":
            shown = f"{result.get('device_kind')} {result.get('memory_gib')} GiB, {result.get('backend')}"
        elif name == "exact":
            shown = (
                f"targets: {len(result.get('target_mismatches', [])) if result else '?'} tensors differ in "
                f"{result.get('target_cases')} cases, floor wrong {result.get('floor_wrong')}, card's division "
                f"wrong {result.get('division_wrong')}, hsv {result.get('hsv_max_error')}"
            )
        elif name.startswith("e2e"):
            shown = f"{figure(name)} images/s from JPEGs, ratio to the step {result.get('ratio')}"
        else:
            shown = f"{figure(name)} images/s"
        lines.append(f"{name:<16}{str(record.get('status')):>10}{str(record.get('seconds', '')):>9}  {shown}")
    for top, bottom in (("trainer", "bare-bf16"), ("step-bf16", "bare-bf16"), ("trainer", "step-bf16")):
        if figure(top) and figure(bottom):
            lines.append(f"{top} / {bottom}: {figure(top) / figure(bottom):.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for results.jsonl, the images, the run and the cache")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, in order, from {', '.join(PARTS)}")
    parser.add_argument("--deadline", type=float, default=480, help="seconds for every part together (default: 480)")
    parser.add_argument("--quick", action="store_true", help="tiny YOLOv3 at 64 px on the CPU (a rehearsal)")
    parser.add_argument("--block-tensorflow", action="store_true", help="make `import tensorflow` fail in every part")
    args = parser.parse_args(argv)
    parts = [part for part in args.parts.split(",") if part]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    os.makedirs(args.out, exist_ok=True)
    check = Check(args)

    preflight = check.run("preflight", [], code=PREFLIGHT)
    found = preflight.get("result") or {}
    if not found or found.get("missing") or (found.get("backend") != "gpu" and not args.quick):
        print(f"preflight failed: {found or preflight.get('output_tail', '')[-500:]}", flush=True)
        print(_table(check.records), flush=True)
        return 1

    quick = args.quick
    network = ["--tiny", "--input-size", "64"] if quick else ["--input-size", "416"]
    size = 64 if quick else 416
    batch = 4 if quick else 32
    classes = os.path.join(REPO, "model_data", "coco_classes.txt")
    images = os.path.join(args.out, "images")
    if {"trainer", "trainer-quiet", "trainer-ram", "e2e", "e2e-ram"} & set(parts) and not os.path.isfile(
        os.path.join(images, "train.txt")
    ):
        script = os.path.join(REPO, "scripts", "make_bench_images.py")
        count = "40" if quick else "288"
        subprocess.run([sys.executable, script, "--out", images, "--num", count], check=True, cwd=REPO, env=check.env)
    annotations = os.path.join(images, "train.txt")
    run_dir = os.path.join(args.out, "trainer_run")
    trainer = [
        os.path.join(REPO, "train.py"), "--annotations", annotations, "--classes", classes, *network,
        "--batch-size", str(batch), "--epochs", "2", "--steps-per-epoch", "4" if quick else "100",
        "--val-split", "0.1" if quick else "0.111", "--seed", "0", "--no-pictures", "--log-dir", run_dir,
    ]  # fmt: skip
    step = [
        "-m", "keras_yolo_mgpu.bench", "train", *(["--tiny", "--num-classes", "4"] if quick else []),
        "--input-size", str(size), "--batch-size", str(batch), "--optimizer", "adam", "--ema", "0.99",
        *(["--steps", "3", "--warmup-steps", "1", "--rounds", "1"] if quick else
          ["--steps", "30", "--warmup-steps", "3", "--rounds", "3"]),
    ]  # fmt: skip
    e2e = [
        "-m", "keras_yolo_mgpu.bench", "e2e", "--annotations", annotations, "--classes", classes, *network,
        "--batch-size", str(batch),
        *(["--steps", "3", "--warmup", "1", "--rounds", "1"] if quick else ["--steps", "30", "--rounds", "3"]),
    ]  # fmt: skip
    bare = dict(tiny=quick, input_size=[size, size], num_classes=4 if quick else 80, batch_size=batch)
    bare.update(dict(steps=3, warmup=1, rounds=1) if quick else dict(steps=30, warmup=3, rounds=3))
    commands = {
        "trainer": (trainer, None, _trainer_result(run_dir)),
        # Where the trainer's time goes: without the progress bar, and with decoded images in RAM.
        "trainer-quiet": ([*trainer[:-1], run_dir + "_quiet", "--quiet"], None, _trainer_result(run_dir + "_quiet")),
        "trainer-ram": ([*trainer[:-1], run_dir + "_ram", "--cache", "ram"], None, _trainer_result(run_dir + "_ram")),
        "exact": ([], EXACT, None),
        "bare-bf16": ([], BARE.format(settings=json.dumps({**bare, "mixed_precision": True})), None),
        "bare-f32": ([], BARE.format(settings=json.dumps({**bare, "mixed_precision": False})), None),
        "step-bf16": ([*step, "--mixed-precision"], None, None),
        "step-f32": (step, None, None),
        "step-bf16-spe4": ([*step, "--mixed-precision", "--steps-per-execution", "4"], None, None),
        "e2e": (e2e, None, None),
        "e2e-ram": ([*e2e, "--cache", "ram"], None, None),
    }
    for part in parts:
        argv, code, parse = commands[part]
        check.run(part, argv, code=code, parse=parse)
    print(_table(check.records), flush=True)
    failed = [name for name, record in check.records.items() if record.get("status") not in (0, "skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
