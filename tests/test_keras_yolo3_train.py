"""`python train.py` and `train_bottleneck.py` as keras-yolo3's README runs them: no flags for the data, in its folder.

The folder is laid out as keras-yolo3's (`train.txt`, `model_data/voc_classes.txt`,
`model_data/yolo_anchors.txt`, `model_data/tiny_yolo_weights.h5` for 6 anchors);
the scripts run in it as subprocesses. Only the size of the run is set: by flags,
or, as keras-yolo3's README has its users do ("Modify train.py"), in a copy of
train.py in the folder with its settings edited.
"""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from keras_yolo_mgpu.cli import train_bottleneck
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
from keras_yolo_mgpu.model.yolo3 import tiny_yolo_body
from keras_yolo_mgpu.weights.loading import load_weights
from keras_yolo_mgpu.weights.metadata import read_metadata

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_RUN = ("--epochs", "1", "--input-size", "64", "--batch-size", "4", "--quiet", "--no-pictures", "--seed", "0")


def _env(**extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **extra)
    env.pop("TF_CONFIG", None)
    return env


def _script(name, *args, cwd, timeout=300, stdin=None, **env):
    return subprocess.run(
        [sys.executable, os.path.join(REPO, name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(**env),
        cwd=cwd,
        input=stdin,
    )


def _keras_yolo3_folder(root, *, weights=True):
    """A keras-yolo3 folder: train.txt, model_data/ with 6 anchors (tiny YOLOv3) and its start weights."""
    paths = make_synthetic_dataset(root / "data", num_train=10, num_val=0, image_size=64, seed=0)
    lines = open(paths.train).read().splitlines()
    (root / "train.txt").write_text("\n".join([*lines, lines[0]]) + "\n")  # one image listed twice
    (root / "model_data").mkdir()
    shutil.copy(paths.classes, root / "model_data" / "voc_classes.txt")
    shutil.copy(os.path.join(REPO, "model_data", "tiny_yolo_anchors.txt"), root / "model_data" / "yolo_anchors.txt")
    if weights:
        # keras-yolo3's start weights have COCO's 80 classes: the output convs differ from the folder's classes.
        body = tiny_yolo_body(keras.Input((None, None, 3)), 3, 80)
        body.save_weights(str(root / "model_data" / "start.weights.h5"))
        os.replace(root / "model_data" / "start.weights.h5", root / "model_data" / "tiny_yolo_weights.h5")
    return root


def _edited_script(root, name, **settings):
    """A copy of this project's script `name` in `root`, its SETTINGS edited as a user edits them; returns its path."""
    text = open(os.path.join(REPO, name)).read()
    for setting, value in settings.items():
        unset = f"    {setting}=None,"
        assert text.count(unset) == 1, setting
        text = text.replace(unset, f"    {setting}={value!r},")
    (root / name).write_text(text)
    return root / name


def _run_edited(script, *args, cwd, timeout=300):
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout, env=_env(), cwd=cwd
    )


@pytest.fixture(scope="module")
def trained_folder(tmp_path_factory):
    """The folder after its own `python train.py` (one small epoch), and that run's result.

    The run's size is set in the folder's train.py, as keras-yolo3's README has
    its users do, but for the batch: a flag given on the command line wins.
    """
    root = _keras_yolo3_folder(tmp_path_factory.mktemp("keras_yolo3"))
    script = _edited_script(root, "train.py", epochs=1, input_shape=(64, 64), batch_size=8)
    return root, _run_edited(script, "--batch-size", "4", "--quiet", "--no-pictures", "--seed", "0", cwd=root)


def test_train_py_without_flags_reads_the_keras_yolo3_folder(trained_folder):
    root, result = trained_folder
    assert result.returncode == 0, result.stderr[-3000:]
    taken = "took train.txt, model_data/voc_classes.txt, model_data/yolo_anchors.txt, model_data/tiny_yolo_weights.h5"
    assert taken in result.stderr
    # The settings edited in train.py are the run's, as their flags would be; the flag given wins.
    edited = "train.py sets input_shape = (64, 64), batch_size = 8 (--batch-size 4 given wins), epochs = 1"
    assert edited in result.stderr
    settings = json.loads((root / "logs" / "000" / "args.json").read_text())
    assert (settings["input_shape"], settings["batch_size"], settings["epochs"]) == ([64, 64], 4, 1)
    assert "--recipe keras-yolo3 trains keras-yolo3's two stages" in result.stderr
    image = open(root / "train.txt").readline().split()[0]
    assert f"1 image(s) listed more than once in training (they weigh double): {image}" in result.stderr


def test_the_run_leaves_keras_yolo3s_file_names_that_load(trained_folder):
    root, result = trained_folder
    assert result.returncode == 0, result.stderr[-3000:]
    run = root / "logs" / "000"
    for name in ("trained_weights_stage_1", "trained_weights_final"):
        assert (run / f"{name}.h5").read_bytes() == (run / f"{name}.weights.h5").read_bytes()
    final = str(run / "trained_weights_final.h5")
    assert read_metadata(final).class_names == ("circle", "square", "triangle", "cross")
    body = tiny_yolo_body(keras.Input((None, None, 3)), 3, 4)
    assert load_weights(body, final).metadata is not None


def test_yolo_video_loads_the_keras_yolo3_final_weights(trained_folder):
    root, result = trained_folder
    assert result.returncode == 0, result.stderr[-3000:]
    image = sorted((root / "data" / "images" / "train").iterdir())[0]
    detected = _script(
        "yolo_video.py", "--model", "logs/000/trained_weights_final.h5", "--image", str(image), cwd=root, timeout=120
    )
    assert detected.returncode == 0, detected.stderr[-3000:]
    assert (root / "detections" / image.name).is_file()
    assert "INFO yolo_video: 1 image, " in detected.stderr  # the summary takes the noun's number


def test_gpus_4_in_the_folder_takes_the_next_run_folder_and_names_the_gpus_it_found(trained_folder):
    root, result = trained_folder
    assert result.returncode == 0, result.stderr[-3000:]
    refused = _script("train.py", "--gpus", "4", *SMALL_RUN, cwd=root, timeout=120)
    assert refused.returncode == 1
    assert "run folder logs/001 (logs/000 holds an earlier run" in refused.stderr
    assert "--log-dir logs/000 --overwrite writes over it as keras-yolo3 did" in refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--gpus 4 asked for 4 GPUs but TensorFlow sees 0" in errors[0]
    assert not (root / "logs" / "001").exists()


def test_missing_start_weights_are_named_with_the_command_that_makes_them(tmp_path):
    root = _keras_yolo3_folder(tmp_path, weights=False)
    result = _script("train.py", *SMALL_RUN, cwd=root, timeout=120)
    assert result.returncode == 1
    assert "model_data/tiny_yolo_weights.h5" in result.stderr
    assert "python convert.py -w yolov3-tiny.cfg yolov3-tiny.weights model_data/tiny_yolo_weights.h5" in result.stderr
    assert "--weights yolov3-tiny (the official weights by name)" in result.stderr
    assert not (root / "logs").exists()


def test_dataset_files_set_in_train_bottleneck_py_replace_keras_yolo3s(tmp_path):
    """annotation_path and classes_path edited in the script take the place of keras-yolo3's files (checked up to the
    devices, where --gpus 4 stops a CPU machine)."""
    root = _keras_yolo3_folder(tmp_path)
    os.replace(root / "train.txt", root / "mine.txt")
    shutil.copy(root / "model_data" / "voc_classes.txt", root / "model_data" / "mine_classes.txt")
    script = _edited_script(
        root, "train_bottleneck.py", annotation_path="mine.txt", classes_path="model_data/mine_classes.txt"
    )
    result = _run_edited(script, "--gpus", "4", "--input-size", "64", cwd=root, timeout=120)
    assert result.returncode == 1 and "--gpus 4 asked for 4 GPUs" in result.stderr, result.stderr[-3000:]
    assert "train_bottleneck.py sets annotation_path = 'mine.txt', classes_path = 'model_data/mine_classes.txt'" in (
        result.stderr
    )
    assert "took mine.txt, model_data/mine_classes.txt, model_data/yolo_anchors.txt" in result.stderr


def test_a_misspelt_setting_or_one_its_flag_refuses_stops_the_script_first(tmp_path, monkeypatch, capsys):
    root = _keras_yolo3_folder(tmp_path)
    monkeypatch.chdir(root)
    status = train_bottleneck.main([], settings={"anotation_path": "x.txt", "input_shape": (100, 100), "epochs": None})
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert status == 1 and len(errors) == 1
    assert errors[0].startswith(
        "error: train_bottleneck.py's settings: anotation_path is not one of its settings; input_shape = (100, 100): "
    )
    assert "positive multiples of 32" in errors[0]
    assert not (root / "logs").exists()


def test_a_folder_without_train_txt_gets_the_start_help(tmp_path):
    result = _script("train.py", cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert "no keras-yolo3 train.txt in this folder" in result.stdout


def _evaluated(root, *flags):
    result = _script("evaluate.py", *flags, "--no-progress", cwd=root, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def test_evaluate_scores_the_images_the_run_held_out_and_warns_on_a_dataset_without_them(trained_folder):
    root, result = trained_folder
    assert result.returncode == 0, result.stderr[-3000:]
    held_out = (root / "logs" / "000" / "val_split.txt").read_text().splitlines()
    assert len(held_out) == 1  # --val-split 0.1 of 11 lines
    weights = "logs/000/trained_weights_final.h5"
    alone, log = _evaluated(root, "--weights", weights)
    assert alone["num_listed"] == 1 and "scoring the images the run held out" in log
    assert "trained on" not in log  # the held-out image is no training image
    with_data, log = _evaluated(root, "--weights", weights, "--data", "train.txt")
    assert with_data["num_listed"] == 1 and "has no val split; " in log and "scoring those images" in log
    shutil.copy(root / "train.txt", root / "other.txt")  # a dataset the run did not train on: all of it, said
    other, log = _evaluated(root, "--weights", weights, "--data", "other.txt")
    assert other["num_listed"] == 11 and "WARNING" in log and "has no val split: scoring all of its images" in log
    # ... and most of them are the ones the run trained on: said, naming the run's list of them.
    trained_on = (root / "logs" / "000" / "train_split.txt").read_text().splitlines()
    assert len(trained_on) == 10 and not set(trained_on) & set(held_out)
    scored = {os.path.realpath(root / line.split()[0]) for line in (root / "other.txt").read_text().splitlines()}
    learnt = scored & {os.path.realpath(line.split()[0]) for line in trained_on}
    assert 0 < len(learnt) < len(scored)  # the held-out image is not counted
    assert f"{len(learnt)} of the {len(scored)} images scored here are images the run of {weights} trained on" in log
    assert f"evaluate.py --weights {weights} alone scores the images the run validated on" in log


def _data_limit():
    # The process's data limit plays the card's memory: above it an allocation fails as on a full GPU.
    resource.setrlimit(resource.RLIMIT_DATA, (4 * 2**30, resource.RLIM_INFINITY))


def test_out_of_memory_in_the_first_step_is_one_paragraph_with_a_batch_to_try(tmp_path):
    root = _keras_yolo3_folder(tmp_path)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="jax")
    env.pop("TF_CONFIG", None)
    # 32 images of 1024x1024: the first step asks for 8 GiB at once, twice the limit. (At 2048 px the host's
    # prefetched batches alone held 5 GB before the step failed; at 1024 the process peaks near 2 GB.)
    flags = ("--input-size", "1024", "--batch-size", "32", "--epochs", "1", "--quiet", "--no-pictures", "--seed", "0")
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "train.py"), *flags],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=root,
        preexec_fn=_data_limit,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert errors[0].startswith("error: out of memory at global batch 32 (1024x1024 input): an allocation asked for ")
    assert "the device has 4.0 GiB" in errors[0] and "--batch-size 16, and halve again" in errors[0]
    assert not (root / "logs" / "000").exists()  # it had saved nothing


# --- train_bottleneck.py --------------------------------------------------------------------------------------

BOTTLENECK_RUN = ("--epochs", "2", "--bottleneck-epochs", "2", "--input-size", "64", "--quiet", "--no-pictures")
STAGE0 = os.path.join("logs", "000", "trained_weights_stage_0.weights.h5")


def _layer_weights(path) -> list[tuple[str, list]]:
    """(layer name, weights) of the float64 tiny YOLOv3 (COCO's 80 classes) that `path` holds, in layer order."""
    keras.config.set_floatx("float64")
    try:
        body = tiny_yolo_body(keras.Input((None, None, 3)), 3, 80)
    finally:
        keras.config.set_floatx("float32")
    load_weights(body, str(path))
    return [(layer.name, layer.get_weights()) for layer in body.layers]


@pytest.fixture(scope="module")
def bottleneck_runs(tmp_path_factory):
    """train_bottleneck.py in two copies of a keras-yolo3 folder, in float64: run through; killed after stage 0.

    Returns (the run-through folder and its result, the killed folder and its `--resume` result).
    """
    root = tmp_path_factory.mktemp("bottleneck")
    (root / "home").mkdir()
    (root / "home" / "keras.json").write_text(json.dumps({"floatx": "float64", "backend": "tensorflow"}))
    home = str(root / "home")
    through = _keras_yolo3_folder(root / "through")
    killed = root / "killed"
    shutil.copytree(through, killed)  # train.txt names the same images
    command = [sys.executable, os.path.join(REPO, "train_bottleneck.py"), *BOTTLENECK_RUN, "--seed", "3"]
    victim = subprocess.Popen(command, cwd=killed, env=_env(KERAS_HOME=home), stdout=subprocess.DEVNULL)
    deadline = time.time() + 300
    while victim.poll() is None and time.time() < deadline and not (killed / STAGE0).exists():
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert (killed / STAGE0).exists() and not (killed / "logs" / "000" / "run_state.json").exists()
    resumed = _script("train_bottleneck.py", "--resume", "logs/000", cwd=killed, KERAS_HOME=home)
    result = _script("train_bottleneck.py", *BOTTLENECK_RUN, "--seed", "3", cwd=through, KERAS_HOME=home)
    return (through, result), (killed, resumed)


@pytest.mark.slow
def test_train_bottleneck_py_runs_keras_yolo3s_script_and_leaves_its_file_names(bottleneck_runs):
    (root, result), _ = bottleneck_runs
    assert result.returncode == 0, result.stderr[-3000:]
    assert "keras-yolo3's train_bottleneck.py paths" in result.stderr
    assert "no model_data/coco_classes.txt here; using the shipped" in result.stderr  # that script's classes
    assert "stage 0: the output convolutions alone on the body's features of 11 letterboxed images" in result.stderr
    run = root / "logs" / "000"
    settings = json.loads((run / "args.json").read_text())
    assert (settings["recipe"], settings["bottleneck_epochs"]) == ("keras-yolo3", 2)
    assert (settings["batch_size"], settings["batch_size2"]) == (16, 4)  # keras-yolo3's script's batches
    for name in ("trained_weights_stage_0", "trained_weights_stage_1", "trained_weights_final"):
        assert (run / f"{name}.h5").read_bytes() == (run / f"{name}.weights.h5").read_bytes()


@pytest.mark.slow
def test_stage_0_trains_the_output_convolutions_alone(bottleneck_runs):
    (root, result), _ = bottleneck_runs
    assert result.returncode == 0, result.stderr[-3000:]
    start, stage0 = _layer_weights(root / "model_data" / "tiny_yolo_weights.h5"), _layer_weights(root / STAGE0)
    moved = {
        name for (name, before), (_, after) in zip(start, stage0) if any(map(np.any, map(np.not_equal, before, after)))
    }
    assert moved == {"yolo_output_0", "yolo_output_1"}


@pytest.mark.slow
def test_a_run_killed_after_stage_0_resumes_from_its_weights_as_if_never_stopped(bottleneck_runs):
    (through, result), (killed, resumed) = bottleneck_runs
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "stage 0 was done before the run stopped: its weights logs/000/trained_weights_stage_0" in resumed.stderr
    assert "stage 0: the output convolutions alone" not in resumed.stderr
    assert result.returncode == 0, result.stderr[-3000:]
    final = "logs/000/trained_weights_final.weights.h5"
    reference, continued = _layer_weights(through / final), _layer_weights(killed / final)
    differences = [
        np.max(np.abs(a - b)) for (_, ours), (_, theirs) in zip(reference, continued) for a, b in zip(ours, theirs)
    ]
    assert max(differences) <= 1e-9
