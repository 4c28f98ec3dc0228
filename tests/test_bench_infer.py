"""`bench infer` on each engine: the full video path and the bare forward pass, through the command."""

import json
import os
import subprocess
import sys


def test_bench_infer_times_both_measurements_on_jax(tmp_path):
    backend = "jax"  # the engine this command did not run on before; TensorFlow's forward pass is unchanged
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND=backend)
    flags = ["--frames", "4", "--batch-size", "2", "--repeats", "1", "--input-size", "64", "--num-classes", "2"]
    result = subprocess.run(
        [sys.executable, "-m", "keras_yolo_mgpu.bench", "infer", *flags],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["backend"] == backend and record["frames"] == 4 and record["batch_size"] == 2
    assert record["fps"] > 0 and record["forward_fps"] > 0
