"""train.py as users run it: real subprocesses on a few generated images."""

import dataclasses
import json
import os
import shlex
import socket
import subprocess
import sys

import pytest

from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "train.py")


def _env(**extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def _run(args, timeout=300, **env):
    return subprocess.run(
        [sys.executable, TRAIN, *args], capture_output=True, text=True, timeout=timeout, env=_env(**env), cwd=REPO
    )


def _suggested_evaluation(train_stderr: str):
    """Runs the `python evaluate.py --weights W` that a finished run's last line suggests: (report, its log)."""
    (suggested,) = [
        line.split("next: ", 1)[1] for line in train_stderr.splitlines() if "next: python evaluate.py" in line
    ]
    argv = shlex.split(suggested.split(";")[0])
    assert argv[:3] == ["python", "evaluate.py", "--weights"] and len(argv) == 4, suggested
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "evaluate.py"), *argv[2:], "--no-progress"],
        capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return make_synthetic_dataset(root, num_train=12, num_val=4, image_size=64, seed=0)


def _small_run_args(dataset, log_dir, *extra):
    return [
        "--annotations",
        dataset.train,
        "--val-annotations",
        dataset.val,
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


def test_more_gpus_than_visible_stops_with_the_count(dataset, tmp_path):
    result = _run(_small_run_args(dataset, tmp_path / "run", "--gpus", "4", "--epochs", "1"), timeout=120)
    assert result.returncode != 0
    assert "TensorFlow sees 0" in result.stderr
    assert not (tmp_path / "run").exists()  # refused before writing anything


def test_global_batch_that_does_not_divide_is_refused(dataset, tmp_path):
    result = _run(
        _small_run_args(dataset, tmp_path / "run", "--gpus", "3", "--simulate-devices", "--epochs", "1"), timeout=120
    )
    assert result.returncode != 0
    assert "does not divide over 3 replicas" in result.stderr


def test_typo_in_flag_gets_a_suggestion():
    result = _run(["--epoch", "3"], timeout=60)
    assert result.returncode == 2
    assert "did you mean --epochs" in result.stderr


def test_no_annotations_explains_how_to_start():
    result = _run([], timeout=60)
    assert result.returncode == 2
    assert "python train.py --data" in result.stdout


def test_a_class_list_that_most_labels_overrun_is_refused_not_trained_on_the_rest(dataset, tmp_path):
    """The synthetic labels count 4 classes; a list of 2 leaves class ids 2 and 3 on most lines."""
    two = tmp_path / "two.txt"
    two.write_text("circle\nsquare\n")
    args = _small_run_args(dataset, tmp_path / "run", "--epochs", "1")
    args[args.index("--classes") + 1] = str(two)
    result = _run(args, timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert f"lines have class ids beyond the 2 classes of {two} (first: " in error
    assert "Give this dataset's class names (--classes FILE)" in error
    assert not (tmp_path / "run").exists()


def test_tiny_run_refuses_full_yolov3_weights_naming_the_layers(dataset, tmp_path):
    """Nothing trains on a half-loaded, frozen body: the run stops before its first step."""
    from keras_yolo_mgpu.model.yolo3 import build_body
    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors

    weights = str(tmp_path / "yolov3.weights.h5")
    build_body(get_anchors(default_anchors_path(False)), 4).save_weights(weights)
    log_dir = tmp_path / "run"
    result = _run(_small_run_args(dataset, log_dir, "--weights", weights, "--epochs", "1"), timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"Cannot load {weights}: 21 layer(s) do not match" in result.stderr
    assert "'darknet_conv2d_1' has weight shapes [(3, 3, 3, 16)]" in result.stderr
    assert "--weights-partial" in result.stderr and "Nothing was trained" in result.stderr
    assert not log_dir.exists()  # a refused run leaves no folder behind


def test_keras_archive_refused_by_safe_mode_says_so_and_leaves_no_folder(dataset, tmp_path):
    import keras

    image = keras.Input((8, 8, 3))
    output = keras.layers.Lambda(lambda t: t * 2)(keras.layers.Conv2D(4, 3, name="other_name")(image))
    archive = str(tmp_path / "lambda.keras")
    keras.Model(image, output).save(archive)
    log_dir = tmp_path / "run"
    result = _run(_small_run_args(dataset, log_dir, "--weights", archive, "--epochs", "1"), timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Keras's safe mode refuses" in result.stderr and "save_weights" in result.stderr
    assert "--weights-partial" not in result.stderr
    assert not log_dir.exists()


def test_yolo_format_folder_trains_without_classes_and_draws_the_run_pictures(tmp_path):
    from dataset_writers import CLASSES, write_yolo

    from keras_yolo_mgpu.data.annotations import read_annotations

    paths = make_synthetic_dataset(tmp_path / "data", num_train=8, num_val=2, image_size=64, seed=1, classes=CLASSES)
    write_yolo(tmp_path / "data", {"train": read_annotations(paths.train), "val": read_annotations(paths.val)})
    for name in ("train.txt", "val.txt", "classes.txt"):  # the YOLO-format folder alone
        (tmp_path / "data" / name).unlink()
    log_dir = tmp_path / "run"
    args = ["--data", str(tmp_path / "data"), "--tiny", "--input-size", "64", "--batch-size", "4", "--epochs", "1"]
    args += ["--freeze-epochs", "0", "--steps-per-epoch", "1", "--log-dir", str(log_dir), "--quiet"]
    result = _run(args, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "yolo dataset, classes ['circle', 'square']" in result.stderr
    assert "8 training and 2 validation images" in result.stderr  # the dataset's own split
    assert "no --weights: the network starts from random values" in result.stderr
    assert "--weights yolov3-tiny (downloaded once)" in result.stderr  # the official weights of --tiny, by name
    for name in ("results.png", "labels.jpg", "train_batch0.jpg", "train_batch2.jpg", "val_pred.jpg"):
        assert (log_dir / name).stat().st_size > 1000, name
    history = (log_dir / "history.csv").read_text().splitlines()
    assert history[1].startswith("1,") and "learning_rate" in history[0]  # epochs counted from 1, as ep001-...
    assert json.loads((log_dir / "args.json").read_text())["classes"] is None
    # The command the run's last line suggests scores the images the run validated on: the dataset's val split.
    report, log = _suggested_evaluation(result.stderr)
    assert report["num_listed"] == 2, log[-3000:]
    assert f"scoring the images the run validated on: the val split of --data {tmp_path / 'data'}" in log


def test_resume_refuses_flags_that_contradict_the_run(tmp_path):
    from keras_yolo_mgpu.training.trainer import TrainConfig

    log_dir = tmp_path / "run"
    log_dir.mkdir()
    saved = TrainConfig(annotations="train.txt", classes="classes.txt", epochs=10, seed=3, log_dir=str(log_dir))
    (log_dir / "args.json").write_text(saved.to_json())
    result = _run(["--resume", "--log-dir", str(log_dir), "--epochs", "20", "--lr2", "1e-4", "--seed", "4"], timeout=60)
    assert result.returncode == 2
    assert "--epochs 20 (the run has epochs=10)" in result.stderr
    assert "--seed 4 (the run has seed=3)" in result.stderr
    assert "--lr2 agrees with the saved run" in result.stderr and "--lr2 1e-4 (" not in result.stderr
    assert json.loads((log_dir / "args.json").read_text())["epochs"] == 10


def test_resume_takes_the_run_folder_or_a_file_in_it(tmp_path, monkeypatch, capsys):
    from keras_yolo_mgpu.cli.train import main
    from keras_yolo_mgpu.training.trainer import TrainConfig

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "logs" / "002"
    run.mkdir(parents=True)
    (run / "args.json").write_text(TrainConfig(annotations="t.txt", classes="c.txt", epochs=10, log_dir="x").to_json())
    (run / "last.weights.h5").write_bytes(b"")

    def refusal(*argv):
        with pytest.raises(SystemExit) as exit_:
            main(list(argv))
        assert exit_.value.code == 2
        return capsys.readouterr().err

    # The folder, found from itself or from a checkpoint in it: its args.json is read (and contradicted here).
    for named in (run, run / "last.weights.h5", "logs/002/"):
        assert "--epochs 20 (the run has epochs=10)" in refusal("--resume", str(named), "--epochs", "20")
    assert "--resume: not found: logs/009" in refusal("--resume", "logs/009")
    assert "but --log-dir names elsewhere: drop one" in refusal("--resume", str(run), "--log-dir", "elsewhere")
    assert "--resume RUN_FOLDER (the latest run here: logs/002)" in refusal("--resume")
    assert "--overwrite starts over in its folder: drop one" in refusal("--resume", str(run), "--overwrite")
    assert json.loads((run / "args.json").read_text())["epochs"] == 10


def test_existing_run_is_not_overwritten_unless_asked(dataset, tmp_path):
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    (log_dir / "args.json").write_text("{}")
    (log_dir / "trained_weights_final.h5").write_text("the earlier run's")
    result = _run(_small_run_args(dataset, log_dir, "--epochs", "1"), timeout=120)
    assert result.returncode == 1
    assert "already holds a run" in result.stderr and "--overwrite to start over there" in result.stderr
    assert (log_dir / "args.json").read_text() == "{}"
    # keras-yolo3's behaviour, asked for: the earlier run's files go, and the new run writes its own.
    unread = ("--val-split", "0.3", "--workers", "2")  # read by no part of this run: each warned of
    result = _run(_small_run_args(dataset, log_dir, "--epochs", "1", "--overwrite", "--no-pictures", *unread), 300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"--overwrite: deleted the earlier run in {log_dir} (2 files and folders)" in result.stderr
    assert f"--val-split 0.3 is not used: the run validates on --val-annotations {dataset.val}" in result.stderr
    assert "--workers is not used: it sizes the JAX feed" in result.stderr
    assert json.loads((log_dir / "args.json").read_text())["epochs"] == 1
    assert (log_dir / "trained_weights_final.h5").read_bytes()[:8] == b"\x89HDF\r\n\x1a\n"  # the new run's weights
    # The command the run's last line suggests scores the images the run validated on: its --val-annotations.
    report, log = _suggested_evaluation(result.stderr)
    assert report["num_listed"] == 4, log[-3000:]
    assert f"scoring the images the run validated on: --val-annotations {dataset.val}" in log


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_multiworker_two_processes_on_localhost(dataset, tmp_path):
    ports = [_free_port(), _free_port()]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    processes = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        args = _small_run_args(
            dataset,
            tmp_path / "run",
            "--strategy",
            "multiworker",
            "--epochs",
            "1",
            "--freeze-epochs",
            "0",
            "--steps-per-epoch",
            "2",
            *("--bottleneck-epochs", "1"),  # stage 0 runs in each process, outside the collective strategy
        )
        processes.append(
            subprocess.Popen(
                [sys.executable, TRAIN, *args],
                env=_env(TF_CONFIG=tf_config),
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=300)[0] for p in processes]
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-3000:]
    assert "2 replica(s)" in outputs[0]
    # Only the chief (worker 0) writes the run folder.
    assert (tmp_path / "run" / "trained_weights_final.weights.h5").exists()
    assert (tmp_path / "run" / "trained_weights_stage_0.weights.h5").exists()


def test_mixed_precision_policy_does_not_outlive_the_run(tmp_path, monkeypatch):
    """A run that set mixed_float16 (here: one that then fails) leaves the process's dtype policy as it found it."""
    from keras.src.backend.common import global_state

    from keras_yolo_mgpu.training.trainer import TrainConfig, _TrainingRun, train

    before = global_state.get_global_attribute("dtype_policy", None)
    seen = {}

    def record_policy_then_fail(self, freeze_body):
        seen["policy"] = global_state.get_global_attribute("dtype_policy", None)
        raise ValueError("stop after the policy is set")

    monkeypatch.setattr(_TrainingRun, "build_models", record_policy_then_fail)
    data = make_synthetic_dataset(tmp_path / "data", num_train=4, num_val=0, image_size=64, seed=0)
    config = TrainConfig(
        annotations=data.train,
        classes=data.classes,
        tiny=True,
        input_shape=(64, 64),
        val_split=0.0,
        mixed_precision=True,
        jit=False,
        log_dir=str(tmp_path / "run"),
    )
    with pytest.raises(ValueError, match="stop after the policy is set"):
        train(config)
    assert seen["policy"].name == "mixed_float16"  # the run did set it
    assert global_state.get_global_attribute("dtype_policy", None) is before


def test_progress_is_one_line_per_epoch_when_written_to_a_file(monkeypatch):
    """Keras's bar on a terminal; in a log file (`train.py > log.txt`) its redraws and colour codes would pile up."""
    import io

    from keras_yolo_mgpu.training.trainer import fit_verbosity

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert [fit_verbosity(v) for v in (0, 1, 2)] == [0, 2, 2]
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert [fit_verbosity(v) for v in (0, 1, 2)] == [0, 1, 2]


def test_the_hosts_memory_running_out_is_one_paragraph_naming_the_batch(tmp_path):
    # A MemoryError: the host's batches did not fit (seen under a process limit, `ulimit -d`; a worker process the
    # kernel's out-of-memory killer ends is tests/test_feed_processes.py's, through the command).
    from keras_yolo_mgpu.cli.train import out_of_memory_paragraph
    from keras_yolo_mgpu.training.config import TrainConfig

    config = TrainConfig(batch_size=32, input_shape=(2048, 2048), log_dir=str(tmp_path / "run"), backend="tensorflow")
    said = out_of_memory_paragraph(MemoryError(), config)
    assert said == (
        "the host ran out of memory (MemoryError), at global batch 32 (2048x2048 input): one batch's images alone "
        "take 384.0 MiB, and several are made ahead. To use less of the host's memory: --batch-size 16, or no --cache "
        "ram. Nothing was saved before it, and no run folder is left."
    )
    (tmp_path / "run").mkdir()
    said = out_of_memory_paragraph(MemoryError(), dataclasses.replace(config, backend="jax", batch_size=1))
    assert "one batch's images alone take 12.0 MiB" in said and "--batch-size 1, fewer --workers, or no" in said
    assert said.endswith(
        f"The run folder {tmp_path / 'run'} keeps what it saved (--resume {tmp_path / 'run'} goes on)."
    )
    assert out_of_memory_paragraph(ValueError("not memory"), config) is None
    # `--batch-size auto` (resolved inside the run): any other error goes through untouched, memory is named with it.
    automatic = dataclasses.replace(config, batch_size="auto")
    assert out_of_memory_paragraph(ValueError("not memory"), automatic) is None
    said = out_of_memory_paragraph(MemoryError(), automatic)
    assert said.startswith("the host ran out of memory (MemoryError), at --batch-size auto (2048x2048 input): ")
