"""scripts/jax_gpu_check.py as the suite can run it: its CPU rehearsal, with `import tensorflow` failing.

On a machine without a GPU the real check stops at its preflight, in
seconds, instead of timing the CPU; `--quick` runs its parts on tiny YOLOv3
at 64 px (here the two step timings, a slim version: the trainer and the
targets run without TensorFlow in test_jax_engine.py and test_host_pipeline.py).
"""

import json
import os
import subprocess
import sys

import pytest
from isolation import jax_environment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "jax_gpu_check.py")


def _check(out, *flags):
    env = dict(os.environ, **jax_environment(1), PYTHONUNBUFFERED="1")
    command = [sys.executable, SCRIPT, "--out", str(out), "--block-tensorflow", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=400, env=env, cwd=REPO)


def _records(out):
    lines = (out / "results.jsonl").read_text().splitlines()
    return {record["name"]: record for record in map(json.loads, lines)}


@pytest.mark.slow
def test_gpu_check_stops_without_a_gpu_and_rehearses_on_the_cpu(tmp_path):
    refused = _check(tmp_path / "gpu")
    assert refused.returncode == 1 and "preflight failed" in refused.stdout, refused.stdout[-2000:]
    assert list(_records(tmp_path / "gpu")) == ["preflight"]  # nothing else ran

    rehearsal = _check(tmp_path / "cpu", "--quick", "--parts", "step-f32,bare-f32")
    assert rehearsal.returncode == 0, rehearsal.stdout[-3000:]
    records = _records(tmp_path / "cpu")
    assert records["preflight"]["result"]["missing"] == []
    step, bare = records["step-f32"]["result"], records["bare-f32"]["result"]
    assert step["optimizer"] == "adam" and step["ema"] == 0.99 and step["images_per_sec"] > 0
    assert bare["dtype_policy"] == "float32" and bare["images_per_sec"] > 0
    # The closing table names each part and its figure.
    table = rehearsal.stdout[rehearsal.stdout.index("part ") :]
    assert f"{step['images_per_sec']} images/s" in table and f"{bare['images_per_sec']} images/s" in table
