"""`python -m keras_yolo_mgpu.copy_scripts FOLDER`: this project's scripts into a keras-yolo3 folder.

keras-yolo3's own train.py and train_bottleneck.py (tests/keras_yolo3_scripts/, verbatim) are
what the command finds there; a user's edits to them are made here as a user makes them.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from keras_yolo_mgpu.cli.copy_scripts import ORIGINALS, SCRIPTS, edited_defaults, edited_settings, main, script_text

REPO = Path(__file__).resolve().parents[1]
KERAS_YOLO3 = Path(__file__).resolve().parent / "keras_yolo3_scripts"


def _keras_yolo3(name: str, *edits: tuple[str, str]) -> str:
    """keras-yolo3's script `name`, each (old, new) edit made once."""
    text = (KERAS_YOLO3 / f"{name}.txt").read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_checkout_scripts_are_the_ones_the_command_writes(name):
    assert (REPO / name).read_text() == script_text(name)


def test_unedited_keras_yolo3_scripts_carry_nothing():
    for name in ("train.py", "train_bottleneck.py"):
        assert edited_settings(_keras_yolo3(name), name) == ({}, [])
    assert edited_defaults(_keras_yolo3("yolo.py")) == ({}, [])


def test_yolo_pys_edited_defaults_are_yolo_video_pys_settings():
    yolo = _keras_yolo3(
        "yolo.py",
        (""""model_path": 'model_data/yolo.h5',""", """"model_path": 'logs/000/trained_weights_final.h5',"""),
        (""""score" : 0.3,""", """"score" : 0.5,"""),
        (""""model_image_size" : (416, 416),""", """"model_image_size" : [320, 320],"""),
        (""""gpu_num" : 1,""", """"gpu_num" : int(GPUS),"""),
    )
    settings, notes = edited_defaults(yolo)
    assert settings == {"model_path": "logs/000/trained_weights_final.h5", "score": 0.5, "model_image_size": (320, 320)}
    assert notes == ["gpu_num = int(GPUS) is no plain value: set it in SETTINGS"]


def test_the_values_a_user_edited_are_found_by_their_place_in_main():
    train = _keras_yolo3(
        "train.py",
        ("annotation_path = 'train.txt'", "annotation_path = 'my_train.txt'"),
        ("input_shape = (416,416)", "input_shape = (320,320)"),
        ("batch_size = 32 # note", "batch_size = 8 # note"),  # the second stage's
        ("epochs=50,", "epochs=20,"),
        (
            "freeze_body=2, weights_path='model_data/tiny_yolo_weights.h5')",
            "freeze_body=2, weights_path='model_data/my_tiny.h5')",
        ),
    )
    settings, notes = edited_settings(train, "train.py")
    assert settings == {
        "annotation_path": "my_train.txt",
        "weights_path": "model_data/my_tiny.h5",
        "input_shape": (320, 320),
        "batch_size2": 8,
        "freeze_epochs": 20,
    }
    assert notes == []
    bottleneck = _keras_yolo3(
        "train_bottleneck.py",
        ("epochs=30,", "epochs=5,"),
        ("batch_size = 16", "batch_size = 12"),
        ("log_dir = 'logs/000/'", "log_dir = 'logs/' + name"),
    )
    settings, notes = edited_settings(bottleneck, "train_bottleneck.py")
    assert settings == {"bottleneck_epochs": 5, "batch_size": 12}
    assert notes == ["log_dir = 'logs/' + name is no plain value: set it in SETTINGS"]
    assert edited_settings("def _main(:\n", "train.py")[0] == {}


def test_the_command_moves_the_folders_scripts_aside_and_carries_the_edits(tmp_path, caplog):
    caplog.set_level("INFO")
    folder = tmp_path / "keras-yolo3"
    folder.mkdir()
    edited = _keras_yolo3("train.py", ("classes_path = 'model_data/voc_classes.txt'", "classes_path = 'mine.txt'"))
    (folder / "train.py").write_text(edited)
    (folder / "yolo_video.py").write_text("print('keras-yolo3')\n")
    (folder / "yolo.py").write_text(_keras_yolo3("yolo.py", ("'model_data/coco_classes.txt'", "'mine.txt'")))
    assert main([str(folder)]) == 0
    assert (folder / ORIGINALS / "train.py").read_text() == edited
    assert (folder / ORIGINALS / "yolo_video.py").read_text() == "print('keras-yolo3')\n"
    assert (folder / "train.py").read_text() == script_text("train.py", {"classes_path": "mine.txt"})
    assert (folder / "yolo_video.py").read_text() == script_text("yolo_video.py", {"classes_path": "mine.txt"})
    assert (folder / "yolo.py").read_text() == script_text("yolo.py", {"classes_path": "mine.txt"})
    for name in SCRIPTS:
        if name not in ("train.py", "yolo_video.py", "yolo.py"):
            assert (folder / name).read_text() == script_text(name)
    assert "train.py: written; the folder's own moved to keras-yolo3-originals/train.py; carried into SETTINGS " in (
        caplog.text
    )
    assert "carried into SETTINGS from train.py: classes_path='mine.txt'" in caplog.text
    assert caplog.text.count("carried into SETTINGS from yolo.py (YOLO._defaults): classes_path='mine.txt'") == 2
    # The written script runs: its settings parse into the command's flags.
    shown = subprocess.run(
        [sys.executable, "train.py", "--help"], capture_output=True, text=True, cwd=folder, timeout=60
    )
    assert shown.returncode == 0 and "usage: train.py" in shown.stdout, shown.stderr
    assert "Set there now: classes_path='mine.txt'." in " ".join(shown.stdout.split())
    # Again: this project's scripts stay as they are (a user may have edited them since).
    (folder / "kmeans.py").write_text(script_text("kmeans.py") + "# mine\n")
    assert main([str(folder)]) == 0
    assert (folder / "kmeans.py").read_text().endswith("# mine\n")
    assert "kmeans.py: already this project's, left as it is" in caplog.text


def test_a_different_file_already_kept_stops_it_before_anything_moves(tmp_path, capsys):
    (tmp_path / ORIGINALS).mkdir()
    (tmp_path / ORIGINALS / "yolo.py").write_text("an older one\n")
    (tmp_path / "yolo.py").write_text("keras-yolo3's\n")
    (tmp_path / "convert.py").write_text("keras-yolo3's convert\n")
    assert main([str(tmp_path)]) == 1
    assert "already holds another yolo.py: move it away first (nothing was changed)" in capsys.readouterr().err
    assert (tmp_path / "yolo.py").read_text() == "keras-yolo3's\n"
    assert (tmp_path / "convert.py").read_text() == "keras-yolo3's convert\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([ORIGINALS, "yolo.py", "convert.py"])
