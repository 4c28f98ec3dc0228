"""The commands as Python functions: the same flags, the same defaults, the same run."""

import csv
import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from inference_helpers import INPUT_SHAPE, TINY_ANCHORS_PATH, make_body
from PIL import Image

import keras_yolo_mgpu as kym
import keras_yolo_mgpu.check_dataset as check_dataset_module
import keras_yolo_mgpu.export as export_module
from keras_yolo_mgpu import api, check_dataset
from keras_yolo_mgpu.api import command_line
from keras_yolo_mgpu.cli import detect, evaluate, train
from keras_yolo_mgpu.cli import export as export_command
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
from keras_yolo_mgpu.resources import get_classes
from keras_yolo_mgpu.training.config import TrainConfig, TrainResult

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_keywords_become_the_command_line_the_command_parses():
    parser = train.build_parser()
    argv = command_line(
        parser,
        {"data": "d.yaml", "input_size": (320, 416), "multi_scale": (320, 608), "no_augment": True, "jit": False,
         "masks": ([3, 4, 5], [1, 2, 3]), "lr": 0.01, "seed": None, "quiet": False},
    )  # fmt: skip
    assert argv == [
        "--data", "d.yaml", "--input-size", "320,416", "--multi-scale", "320,608", "--no-augment", "--no-jit",
        "--masks", "3,4,5 1,2,3", "--lr", "0.01",
    ]  # fmt: skip
    args = parser.parse_args(argv)
    assert args.input_size == (320, 416) and args.multi_scale == (320, 608) and args.jit is False
    assert args.masks == [[3, 4, 5], [1, 2, 3]] and args.no_augment and args.lr1 == 0.01
    # yolo_video.py's --model is keras-yolo3's weights file (dest `weights`), not --architecture (dest `model`).
    argv = command_line(detect.build_parser(), {"model": "w.h5", "image": ["a.jpg", "b.jpg"]})
    assert argv == ["--model", "w.h5", "--image", "a.jpg", "b.jpg"]
    assert detect.build_parser().parse_args(argv).weights == "w.h5"
    # --resume [RUN]: True is the flag alone, a path its value, False leaves it off.
    for resume, expected in ((True, ["--resume"]), ("logs/003", ["--resume", "logs/003"]), (False, [])):
        argv = command_line(parser, {"resume": resume, "quiet": True})
        assert argv == [*expected, "--quiet"] and parser.parse_args(argv).resume == resume
    # keras-yolo3's bare --image (ask for file names): image=True.
    assert command_line(detect.build_parser(), {"image": True}) == ["--image"]
    assert detect.build_parser().parse_args(["--image"]).image == []
    # --precision shares its dest with the --mixed-precision switch: a value, not a switch.
    argv = command_line(parser, {"precision": "float32"})
    assert argv == ["--precision", "float32"] and parser.parse_args(argv).mixed_precision is False
    # A flag that takes a value is not a switch: True would become a file named "True".
    with pytest.raises(TypeError, match="pr_curve=True: --pr-curve takes a value \\(PNG\\), not a switch"):
        command_line(evaluate.build_parser(), {"pr_curve": True})
    # Leaving --mixed-precision off is the device's choice, not float32: refused, naming the keyword that says it.
    with pytest.raises(TypeError, match="mixed_precision=False is not one of \\[True\\]; set precision instead"):
        command_line(parser, {"mixed_precision": False})


def test_an_unknown_keyword_names_the_closest_one():
    with pytest.raises(TypeError, match="unknown keyword 'epoch'; did you mean 'epochs'"):
        command_line(train.build_parser(), {"epoch": 3})


def test_a_resolved_run_cannot_be_changed():
    config = TrainConfig(annotations="a.txt", classes="c.txt")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.epochs = 3
    assert dataclasses.replace(config, epochs=3).epochs == 3 and config.epochs == 100


def test_the_commands_a_run_suggests_paste_into_a_shell_whatever_its_folder_is_named(tmp_path):
    folder = tmp_path / "my runs" / "001"
    best = str(folder / "best.weights.h5")
    history = {"loss": [2.0, 1.0], "val_loss": [2.5, 1.5]}
    result = TrainResult(
        str(folder), str(folder / "last.weights.h5"), history, best_weights=best, best_epoch=2, best_value=0.5
    )
    (line,) = [line for line in train.closing_lines(result) if line.startswith("next: ")]
    assert [shlex.split(command) for command in line.removeprefix("next: ").split("; ")] == [
        ["python", "evaluate.py", "--weights", best],
        ["python", "yolo_video.py", "--model", best, "--image"],
    ]
    # A run that validated on no images: evaluate.py --weights alone has nothing to score, and the line says so.
    result = dataclasses.replace(result, history={"loss": [2.0, 1.0]})
    (line,) = [line for line in train.closing_lines(result) if line.startswith("next: ")]
    assert f"evaluate.py --weights {shlex.quote(best)} --data VAL_DATASET (the run validated on no images)" in line


def _weights(path):
    arrays = {}
    with h5py.File(path, "r") as handle:
        handle.visititems(
            lambda name, obj: arrays.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None
        )
    return arrays


@pytest.mark.slow
def test_train_function_and_train_py_resolve_and_train_the_same_run(tmp_path):
    paths = make_synthetic_dataset(tmp_path / "data", num_train=8, num_val=0, image_size=64, seed=0)
    home = tmp_path / "keras_home"
    home.mkdir()
    (home / "keras.json").write_text(json.dumps({"floatx": "float64", "backend": "tensorflow"}))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_HOME=str(home))
    flags = {
        "annotations": paths.train, "classes": paths.classes, "tiny": True, "input_size": 64, "batch_size": 4,
        "epochs": 2, "val_split": 0.25, "seed": 3, "quiet": True, "no_pictures": True, "save_period": 1,
    }  # fmt: skip
    argv = command_line(train.build_parser(), flags)
    by_command = subprocess.run(
        [sys.executable, os.path.join(REPO, "train.py"), *argv, "--log-dir", str(tmp_path / "command")],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert by_command.returncode == 0, by_command.stderr[-3000:]
    script = (
        "import dataclasses, json, sys, keras_yolo_mgpu as kym\n"
        "result = kym.train(**json.loads(sys.argv[1]))\n"
        "print(json.dumps(dataclasses.asdict(result)))\n"
    )
    by_function = subprocess.run(
        [sys.executable, "-c", script, json.dumps({**flags, "log_dir": str(tmp_path / "function")})],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert by_function.returncode == 0, by_function.stderr[-3000:]
    command_args = json.loads((tmp_path / "command" / "args.json").read_text())
    function_args = json.loads((tmp_path / "function" / "args.json").read_text())
    assert command_args.pop("log_dir") != function_args.pop("log_dir")
    assert command_args == function_args and command_args["recipe"] == "default"  # the command's own defaults
    final = "trained_weights_final.weights.h5"
    result = json.loads(by_function.stdout.strip().splitlines()[-1])
    assert result["final_weights"] == str(tmp_path / "function" / final)
    ours, theirs = _weights(tmp_path / "function" / final), _weights(tmp_path / "command" / final)
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    # The best weights: the first epoch with the highest val_mAP50 (the default recipe's monitor) in history.csv,
    # saved as that epoch's own checkpoint (--save-period 1) was.
    with open(tmp_path / "function" / "history.csv", newline="") as handle:
        scores = [float(row["val_mAP50"]) for row in csv.DictReader(handle)]
    epoch = scores.index(max(scores)) + 1
    assert result["history"]["epoch"] == [1, 2] and result["history"]["val_mAP50"] == scores
    assert result["best_weights"] == str(tmp_path / "function" / "best.weights.h5")
    assert (result["monitor"], result["best_epoch"], result["best_value"]) == ("val_mAP50", epoch, max(scores))
    (epoch_file,) = (tmp_path / "function").glob(f"ep{epoch:03d}-*.weights.h5")
    (other_file,) = (tmp_path / "function").glob(f"ep{3 - epoch:03d}-*.weights.h5")
    best = _weights(result["best_weights"])
    assert best.keys() == _weights(epoch_file).keys()
    assert all(np.array_equal(best[name], array) for name, array in _weights(epoch_file).items())
    assert not all(np.array_equal(best[name], array) for name, array in _weights(other_file).items())
    # The command's closing lines say the same, with the commands that use them; the function, in a program that
    # set up no logging, logs them too, and the run's lines before them.
    for folder, stderr in (("command", by_command.stderr), ("function", by_function.stderr)):
        best_path = tmp_path / folder / "best.weights.h5"
        assert f"best weights by val_mAP50: {best_path} (epoch {epoch}, val_mAP50 {max(scores):.4f})" in stderr
        assert f"next: python evaluate.py --weights {best_path}; python yolo_video.py --model {best_path}" in stderr
        assert "INFO keras_yolo_mgpu.training.trainer: stage 1: epochs 1-2" in stderr


def test_what_the_command_refuses_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="--annotations: file not found: .*missing.txt"):
        api.train(annotations=str(tmp_path / "missing.txt"), classes=str(tmp_path / "classes.txt"))
    with pytest.raises(ValueError, match="train.py: argument --batch-size: expected a positive integer"):
        api.train(data=str(tmp_path), batch_size=0)


def test_export_and_check_dataset_are_called_as_the_package_names_them(tmp_path):
    """`kym.export` and `kym.check_dataset` are also the `python -m` modules: called, they are the functions."""
    assert kym.export is export_module and kym.check_dataset is check_dataset_module is check_dataset
    paths = make_synthetic_dataset(tmp_path / "data", num_train=4, num_val=0, image_size=64, seed=0)
    assert kym.check_dataset(annotations=paths.train, classes=paths.classes) is True
    assert api.check_dataset(annotations=paths.train, classes=paths.classes) is True
    missing = tmp_path / "missing.weights.h5"
    with pytest.raises(FileNotFoundError, match=f"model weights not found: {missing}"):
        kym.export(weights=str(missing), format="onnx")
    with pytest.raises(TypeError, match="unknown keyword 'formats'; did you mean 'format'"):
        kym.export(weights=str(missing), formats="onnx")


def test_detect_evaluate_and_export_as_functions_write_what_their_commands_write(tmp_path, capsys):
    """The API's detect, evaluate and export against the commands' own main() with the same flags: the same
    detections, annotated images, report, PR pictures and export files."""
    paths = make_synthetic_dataset(tmp_path / "data", num_train=3, num_val=0, image_size=64, seed=0)
    weights = str(tmp_path / "w.weights.h5")
    make_body(num_classes=len(get_classes(paths.classes))).save_weights(weights)
    model = {"anchors": TINY_ANCHORS_PATH, "classes": paths.classes, "input_size": INPUT_SHAPE, "score": 0.3}
    images = os.path.dirname(Path(paths.train).read_text().split()[0])

    def both(command, function, flags_of):
        """(the command's stdout, the function's result), each given `flags_of(side)`."""
        capsys.readouterr()
        assert command.main(command_line(command.build_parser(), flags_of("command"))) == 0
        printed = capsys.readouterr().out
        return printed, function(**flags_of("function"))

    both(detect, kym.detect, lambda side: {
        "model": weights, **model, "image": [images], "output": str(tmp_path / f"{side}_annotated"),
        "save_json": str(tmp_path / f"{side}.jsonl"), "no_progress": True,
    })  # fmt: skip
    detected = [
        (tmp_path / f"{side}.jsonl").read_text().replace(f"{side}_annotated", "") for side in ("command", "function")
    ]
    assert detected[0] == detected[1] and detected[0].count("\n") == 3
    for drawn in (tmp_path / "command_annotated").iterdir():
        assert np.array_equal(
            np.asarray(Image.open(drawn)), np.asarray(Image.open(tmp_path / "function_annotated" / drawn.name))
        )

    printed, report = both(evaluate, kym.evaluate, lambda side: {
        "weights": weights, **model, "annotations": paths.train, "pr_curve": str(tmp_path / f"{side}_pr.png"),
        "no_progress": True,
    })  # fmt: skip
    printed_report = printed.strip().splitlines()[-1].replace(str(tmp_path / "command_"), str(tmp_path / "function_"))
    assert json.loads(printed_report) == json.loads(json.dumps(report)) and report["pr_curve"]
    for ending in ("pr", "pr_confusion_matrix", "pr_confidence_curves"):
        assert (tmp_path / f"command_{ending}.png").read_bytes() == (tmp_path / f"function_{ending}.png").read_bytes()

    printed, exported = both(export_command, kym.export, lambda side: {
        "weights": weights, **model, "format": "tflite", "output": str(tmp_path / f"{side}.tflite"),
        "validation": paths.train,
    })  # fmt: skip
    for name in ("keras", "export"):  # --validation's comparison, printed by the command, returned by the function
        row = exported["map"][name]
        assert f"{name:>6}: mAP@.5 {row['mAP50']:.3f}   mAP@[.5:.95] {row['mAP']:.3f}" in printed
    assert (tmp_path / "command.tflite").read_bytes() == (tmp_path / "function.tflite").read_bytes()
    sidecars = [json.loads((tmp_path / f"{side}.tflite.metadata.json").read_text()) for side in ("command", "function")]
    assert sidecars[0] == sidecars[1]
