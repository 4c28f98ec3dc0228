"""The JAX engine as users run it: `KERAS_BACKEND=jax python train.py ...` in real subprocesses.

What no JAX option has a meaning for is refused with what to use instead;
a run records its backend and refuses to resume on another; two JAX
processes (`jax.distributed` over gloo, one CPU device each, every process
reading its own slice of each global batch) train exactly what one process
trains on two devices; and a run killed after its first epoch resumes to the
same final weights. The runs are float64 (a `keras.json` of their own), so
"the same" means rounding, ~1e-16, against steps of ~1e-2.
"""

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from isolation import jax_environment

from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
from keras_yolo_mgpu.training.config import TrainConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "train.py")
TOLERANCE = 1e-9
FINAL = "trained_weights_final.weights.h5"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_synthetic_dataset(tmp_path_factory.mktemp("data"), num_train=8, num_val=4, image_size=64, seed=0)


@pytest.fixture(scope="module")
def keras_home(tmp_path_factory):
    """A KERAS_HOME whose keras.json asks for JAX and float64 (how a user makes a whole run float64)."""
    home = tmp_path_factory.mktemp("keras_home")
    (home / "keras.json").write_text(json.dumps({"backend": "jax", "floatx": "float64"}))
    return home


def _env(keras_home, devices=2, **extra):
    env = dict(os.environ, **jax_environment(devices), KERAS_HOME=str(keras_home), PYTHONUNBUFFERED="1")
    for name in ("KERAS_BACKEND", "TF_CONFIG"):  # keras.json decides the backend
        env.pop(name, None)
    env.update(extra)
    return env


def _args(dataset, log_dir, *extra):
    return [
        *("--annotations", dataset.train, "--val-annotations", dataset.val, "--classes", dataset.classes),
        *("--tiny", "--input-size", "64", "--batch-size", "4", "--steps-per-epoch", "2", "--seed", "0"),
        *("--recipe", "keras-yolo3", "--freeze-epochs", "0", "--freeze-body", "0", "--optimizer", "sgd"),
        *("--lr", "1e-3", "--no-pictures", "--log-dir", str(log_dir), "--quiet"),
        *extra,
    ]


# train.py where `import tensorflow` fails, as on a JAX machine without it
# (and Keras's TensorBoard callback, which needs it).
WITHOUT_TENSORFLOW = """
import runpy, sys
from keras_yolo_mgpu.cli.without_tensorflow import block_tensorflow
block_tensorflow("the JAX test runs without it")
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _command(args, without_tensorflow=False):
    return [sys.executable, *(("-c", WITHOUT_TENSORFLOW) if without_tensorflow else ()), TRAIN, *args]


def _run(args, env, timeout=300, without_tensorflow=False):
    return subprocess.run(
        _command(args, without_tensorflow), capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO
    )


def _weights(path):
    """Every array of a .weights.h5 file by name (a visitor that returns a value would stop at the first)."""
    arrays = {}

    def collect(name, item):
        if isinstance(item, h5py.Dataset):
            arrays[name] = np.array(item)

    with h5py.File(path, "r") as handle:
        handle.visititems(collect)
    return arrays


def _max_difference(first, second):
    assert first.keys() == second.keys() and len(first) > 10  # every layer's arrays, not one
    return max(float(np.max(np.abs(first[key] - second[key]))) for key in first)


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--no-sync-bn"], "--no-sync-bn has no meaning on JAX"),
        (["--parallel", "multi_gpu_model"], "one SPMD program"),
        (["--strategy", "multiworker"], "KERAS_DISTRIBUTION_JOB_ADDRESSES"),
    ],
)
def test_tensorflow_only_options_are_refused_on_jax_with_what_to_use(dataset, keras_home, tmp_path, flags, says):
    log_dir = tmp_path / "run"
    result = _run(
        _args(dataset, log_dir, "--gpus", "2", "--simulate-devices", "--epochs", "1", *flags), _env(keras_home)
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert says in result.stderr
    assert not log_dir.exists()  # refused before the run folder


def test_resume_on_another_backend_is_refused(dataset, tmp_path):
    """A run that trained on JAX does not continue on TensorFlow (this process's backend)."""
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    config = TrainConfig(annotations=dataset.train, classes=dataset.classes, log_dir=str(log_dir), backend="jax")
    (log_dir / "args.json").write_text(config.to_json() + "\n")
    before = {p.name: p.read_bytes() for p in log_dir.iterdir()}

    from keras_yolo_mgpu.cli.train import main

    assert main(["--resume", "--log-dir", str(log_dir), "--quiet"]) == 1
    assert {p.name: p.read_bytes() for p in log_dir.iterdir()} == before  # nothing touched


@pytest.fixture(scope="module")
def two_device_run(dataset, keras_home, tmp_path_factory):
    """One process, two simulated devices, two epochs, no TensorFlow: the reference run (its folder)."""
    log_dir = tmp_path_factory.mktemp("reference") / "run"
    args = _args(dataset, log_dir, "--gpus", "2", "--simulate-devices", "--epochs", "2")
    result = _run(args, _env(keras_home), without_tensorflow=True)
    assert result.returncode == 0, result.stderr[-3000:]
    (log_dir.parent / "stderr.txt").write_text(result.stderr)
    return log_dir


@pytest.mark.slow
def test_jax_run_records_its_backend_and_dtype_and_needs_no_tensorflow(two_device_run):
    args = json.loads((two_device_run / "args.json").read_text())
    assert (args["backend"], args["dtype_policy"], args["jit"]) == ("jax", "float64", True)
    # It trained, validated and saved where `import tensorflow` fails.
    assert (two_device_run / FINAL).exists() and (two_device_run / "best.weights.h5").exists()
    # Its TensorBoard curves too: written with the tensorboard package's own writer.
    assert os.listdir(two_device_run / "tensorboard" / "train") and os.listdir(
        two_device_run / "tensorboard" / "validation"
    )
    # Its closing lines name the best weights: the first epoch with the lowest val_loss (the keras-yolo3 recipe's
    # monitor) in history.csv.
    with open(two_device_run / "history.csv", newline="") as handle:
        losses = [float(row["val_loss"]) for row in csv.DictReader(handle)]
    best = two_device_run / "best.weights.h5"
    stderr = (two_device_run.parent / "stderr.txt").read_text()
    epoch = losses.index(min(losses)) + 1
    assert f"best weights by val_loss: {best} (epoch {epoch}, val_loss {min(losses):.4f})" in stderr, stderr[-2000:]
    assert f"next: python evaluate.py --weights {best}; python yolo_video.py --model {best} --image" in stderr


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_jax_processes_train_what_one_process_trains_on_two_devices(dataset, keras_home, two_device_run, tmp_path):
    address = f"127.0.0.1:{_free_port()}"
    log_dir = tmp_path / "run"
    processes = []
    for index in range(2):
        env = _env(
            keras_home,
            devices=1,
            KERAS_DISTRIBUTION_JOB_ADDRESSES=address,
            KERAS_DISTRIBUTION_NUM_PROCESSES="2",
            KERAS_DISTRIBUTION_PROCESS_ID=str(index),
        )
        processes.append(
            subprocess.Popen(
                [sys.executable, TRAIN, *_args(dataset, log_dir, "--epochs", "2")],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [process.communicate(timeout=300)[0] for process in processes]
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output[-3000:]
    reference, two_processes = _weights(two_device_run / FINAL), _weights(log_dir / FINAL)
    assert _max_difference(reference, two_processes) <= TOLERANCE
    # The check can fail: the second epoch alone moved the weights by far more than the tolerance.
    (first_epoch,) = two_device_run.glob("ep001-*.weights.h5")
    assert _max_difference(reference, _weights(first_epoch)) > 1e3 * TOLERANCE


@pytest.mark.slow
def test_killed_jax_run_resumes_to_the_uninterrupted_weights(dataset, keras_home, two_device_run, tmp_path):
    # Fed by worker processes (recorded, so the resumed run is too), whose batches reach the devices as views of
    # shared blocks (data/host_processes.take_batch): the reference was fed by threads.
    log_dir = tmp_path / "run"
    env = _env(keras_home)
    feed = ("--feed", "processes", "--workers", "2")
    process = subprocess.Popen(
        [sys.executable, TRAIN, *_args(dataset, log_dir, "--gpus", "2", "--simulate-devices", "--epochs", "2", *feed)],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    state = log_dir / "run_state.json"
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None and not state.exists():
        time.sleep(0.1)
    assert process.poll() is None, "the run ended before it could be interrupted"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (log_dir / FINAL).exists()

    result = _run(["--resume", "--log-dir", str(log_dir), "--quiet"], env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((log_dir / "args.json").read_text())["feed"] == "processes"
    assert _max_difference(_weights(two_device_run / FINAL), _weights(log_dir / FINAL)) <= TOLERANCE
