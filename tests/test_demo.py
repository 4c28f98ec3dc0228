"""`python -m keras_yolo_mgpu.demo --quick`: every stage runs, every output exists.

The learning result itself (mAP@0.5 >= 0.8) takes ~10 minutes and is
measured by `make demo` (BENCHMARKS.md); this is the smoke run.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from keras_yolo_mgpu.cli.demo import build_parser, format_summary, main

REPO = Path(__file__).resolve().parents[1]


def test_parser_refuses_misspelt_flags(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--epoch", "3"])
    assert "--epochs" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_demo_runs_end_to_end(tmp_path):
    # The folder of a demo run before its folders were marked: its summary.json says so, and its stale outputs go.
    out = tmp_path / "demo"
    (out / "train").mkdir(parents=True)
    (out / "train" / "stale.txt").write_text("an earlier demo's\n")
    (out / "summary.json").write_text(json.dumps({"mAP50": 0.9, "settings": {}, "outputs": {}}))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "keras_yolo_mgpu.demo", "--quick", "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads((out / "summary.json").read_text())
    # Without a GPU the demo trains on 2 simulated devices: the multi-GPU path.
    assert summary["replicas"] >= 2 or "GPU" in summary["devices"]
    assert summary["mAP50"] is None or 0.0 <= summary["mAP50"] <= 1.0
    for name in (
        "train_annotations",
        "val_annotations",
        "classes",
        "anchors",
        "weights",
        "metrics",
        "input_video",
        "output_video",
        "video_detections",
    ):
        assert Path(summary["outputs"][name]).is_file(), name
    assert summary["video"]["frames"] == 8
    assert "Demo outputs:" in proc.stdout and "mAP@0.5" in proc.stdout
    # The closing message is what format_summary makes of summary.json.
    assert format_summary(summary).strip() in proc.stdout
    assert not (out / "train" / "stale.txt").exists() and (out / ".keras-yolo-mgpu-demo").is_file()


def test_a_folder_whose_output_names_the_demo_did_not_write_is_refused(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.txt").write_text("a user's dataset\n")
    (tmp_path / "summary.json").write_text('{"mine": true}\n')
    assert main(["--quick", "--out", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert f"--out {tmp_path} holds data, summary.json, which no demo wrote" in error
    assert sorted(path.name for path in tmp_path.rglob("*")) == ["data", "mine.txt", "summary.json"]
    assert (tmp_path / "data" / "mine.txt").read_text() == "a user's dataset\n"


# The demo's device plan on JAX where `import tensorflow` fails: it asks JAX, and leaves JAX's CPU split free.
DEVICES_PLAN_ON_JAX = """
from keras_yolo_mgpu.cli.without_tensorflow import block_tensorflow
block_tensorflow("the demo on JAX runs without it")
from keras_yolo_mgpu.backend import distribution
from keras_yolo_mgpu.cli.demo import _devices_plan
count, simulate, _ = _devices_plan(None)
print(count, simulate, len(distribution.simulate_devices(count)))
"""


def test_demo_plans_its_devices_on_jax_without_tensorflow():
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", XLA_FLAGS="", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", DEVICES_PLAN_ON_JAX], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-3:] == ["2", "True", "2"]
