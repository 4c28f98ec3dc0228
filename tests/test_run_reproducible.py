"""A run is the run the user asked for: `--seed` repeats it, `--resume` continues it exactly.

Real `train.py` subprocesses in float64 (Keras's `floatx` from a keras.json
in KERAS_HOME, the setting users have), so that equality is exact
arithmetic, not rounding luck: tiny YOLOv3 at 64 px, 2 classes, 8 images,
augmentation on, both stages.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "train.py")
FINAL = "trained_weights_final.weights.h5"


@pytest.fixture(scope="module")
def float64_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("keras_home")
    (home / "keras.json").write_text(json.dumps({"floatx": "float64", "backend": "tensorflow"}))
    return str(home)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return make_synthetic_dataset(root, num_train=8, num_val=0, image_size=64, seed=0, classes=("circle", "square"))


def _command(dataset, log_dir, *extra):
    return [
        sys.executable,
        TRAIN,
        "--annotations",
        dataset.train,
        "--val-split",
        "0",
        "--classes",
        dataset.classes,
        "--tiny",
        "--input-size",
        "64",
        "--batch-size",
        "4",
        "--log-dir",
        str(log_dir),
        "--quiet",
        *("--recipe", "keras-yolo3"),  # these tests check the run's mechanics, not the recipe
        *extra,
    ]


def _start(command, keras_home, cwd=REPO):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_HOME=keras_home, PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _file_bytes(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _finish(process, timeout=600):
    output = process.communicate(timeout=timeout)[0]
    assert process.returncode == 0, output[-3000:]
    return output


def _weights(path):
    arrays = {}
    with h5py.File(path, "r") as handle:
        # visititems stops at the first callback that returns anything but None.
        handle.visititems(
            lambda name, obj: arrays.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None
        )
    assert arrays, path
    return arrays


def _max_difference(first, second):
    assert first.keys() == second.keys()
    return max(float(np.max(np.abs(first[k] - second[k]))) for k in first)


@pytest.mark.slow
def test_same_seed_same_weights_and_a_drawn_seed_is_recorded(dataset, float64_home, tmp_path):
    """Without --weights: the seed alone fixes the start; without --seed one is drawn and recorded.

    That the seeded start does not depend on the device count either is
    proven where every option runs on 1 and 4 replicas from a seeded fresh
    build: tests/test_recipe_equivalence.py (`all`, both backends).
    """
    recipe = ("--epochs", "2", "--freeze-epochs", "1", "--optimizer", "sgd")
    runs = {
        "one": _command(dataset, tmp_path / "one", *recipe, "--seed", "7"),
        "again": _command(dataset, tmp_path / "again", *recipe, "--seed", "7"),
        "unseeded": _command(dataset, tmp_path / "unseeded", *recipe),
    }
    # Two at a time: float64 runs at once (~1.2 GB each) beside the other
    # xdist worker's float64 child were the suite's memory peak.
    outputs = {}
    for pair in (("one", "again"), ("unseeded",)):
        processes = {name: _start(runs[name], float64_home) for name in pair}
        outputs.update({name: _finish(process) for name, process in processes.items()})
    final = {name: _weights(tmp_path / name / FINAL) for name in runs}
    assert final["one"]["layers/conv2d/vars/0"].dtype == np.float64
    assert _max_difference(final["one"], final["again"]) == 0.0  # bit for bit
    # Without --seed a seed is drawn, recorded, and gives another run.
    drawn = json.loads((tmp_path / "unseeded" / "args.json").read_text())["seed"]
    assert isinstance(drawn, int) and f"--seed {drawn}" in outputs["unseeded"]
    assert _max_difference(final["one"], final["unseeded"]) > 1e-3


def _check_run_folder_opens(log_dir):
    """Every checkpoint and state file the run folder holds opens (no half-written file)."""
    from keras_yolo_mgpu.model.yolo3 import build_body
    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors

    body = build_body(get_anchors(default_anchors_path(True)), 2)
    checked = 0
    for folder, _, names in os.walk(log_dir):
        for name in names:
            path = os.path.join(folder, name)
            if name.endswith(".weights.h5"):
                with h5py.File(path, "r") as handle:
                    assert "layers" in handle, path
                if not name.startswith("stage"):  # backup/stage*: the trained model with its optimizer
                    body.load_weights(path)
                checked += 1
            elif name.endswith(".json"):
                with open(path, encoding="utf-8") as handle:
                    json.load(handle)
                checked += 1
    return checked


@pytest.mark.slow
def test_killed_in_stage_two_and_resumed_ends_with_the_uninterrupted_weights(dataset, float64_home, tmp_path):
    """kill -9 at a random moment of stage 2, --resume: the same final weights as a run never killed."""
    recipe = ("--epochs", "4", "--freeze-epochs", "1", "--seed", "11")
    reference = _start(_command(dataset, tmp_path / "reference", *recipe), float64_home)
    killed_dir = tmp_path / "killed"
    victim = _start(_command(dataset, killed_dir, *recipe), float64_home)
    state_file = killed_dir / "run_state.json"
    deadline = time.time() + 400
    while victim.poll() is None and time.time() < deadline:
        if state_file.exists() and json.loads(state_file.read_text())["stage"] == 2:
            break
        time.sleep(0.05)
    # Stage 2 (3 epochs) has begun: anywhere from its compilation to its last epoch's saves.
    time.sleep(random.Random().uniform(0.0, 1.5))
    assert victim.poll() is None, "the run ended before it could be killed"
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    assert _check_run_folder_opens(killed_dir) >= 3  # args.json, run_state.json, stage-1 weights at least
    state = json.loads(state_file.read_text())
    assert state["stage"] == 2 and not state["finished"]

    # The run folder is the run: a copy resumes where it is, from another working folder, and its original
    # stays as the kill left it.
    original, killed_dir = killed_dir, tmp_path / "moved" / "killed"
    shutil.copytree(original, killed_dir)
    before = _file_bytes(original)
    resumed = _start(_command(dataset, killed_dir, "--resume", *recipe), float64_home, cwd=tmp_path)
    output = _finish(resumed)
    assert f"resume: {state['epoch']} epoch(s) done" in output
    assert _file_bytes(original) == before
    _finish(reference)
    difference = _max_difference(_weights(tmp_path / "reference" / FINAL), _weights(killed_dir / FINAL))
    assert difference <= 1e-9, difference
    _check_run_folder_opens(killed_dir)
    history = (killed_dir / "history.csv").read_text().splitlines()
    assert [int(row.split(",")[0]) for row in history[1:]] == [1, 2, 3, 4]  # each epoch once, as the logs number them


# train.py with a SIGTERM sent to itself as stage 2 begins: after stage 1's fit has ended, before stage 2's starts,
# where no Keras callback runs.
SIGTERM_BETWEEN_STAGES = """
import os, runpy, signal, sys
from keras_yolo_mgpu.training import trainer
def run_stage2(self, *args):
    os.kill(os.getpid(), signal.SIGTERM)
    return stage2(self, *args)
stage2, trainer._TrainingRun.run_stage2 = trainer._TrainingRun.run_stage2, run_stage2
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_a_sigterm_between_stages_stops_the_run_as_ctrl_c_does(dataset, float64_home, tmp_path):
    """SIGTERM outside a `fit` (here between the stages) stops the run as inside one: status 143, what it kept."""
    log_dir = tmp_path / "run"
    command = _command(dataset, log_dir, "--epochs", "2", "--freeze-epochs", "1", "--seed", "3")
    process = _start([sys.executable, "-c", SIGTERM_BETWEEN_STAGES, *command[1:]], float64_home)
    output = process.communicate(timeout=600)[0]
    assert process.returncode == 143 and output.rstrip().endswith("terminated (SIGTERM)"), output[-3000:]
    assert f"python train.py --resume {log_dir} continues it from epoch 2 of 2" in output, output[-3000:]
    state = json.loads((log_dir / "run_state.json").read_text())
    assert state["epoch"] == 1 and not state["finished"]
    assert (log_dir / "trained_weights_stage_1.weights.h5").is_file()
    assert not (log_dir / FINAL).exists()
