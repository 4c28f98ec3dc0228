"""evaluate.py: COCO mAP through faster-coco-eval, P/R at a threshold, PR curve, CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from keras_yolo_mgpu.cli.evaluate import main
from keras_yolo_mgpu.evaluation.mean_ap import evaluate_detections

REPO = Path(__file__).resolve().parents[1]
CLASSES = ["cat", "dog"]
# 101-point interpolation: precision 1 up to recall 0.5 covers 51 of 101 points.
HALF_RECALL_AP = 51 / 101


@pytest.fixture
def dataset(tmp_path):
    """Two images (a blank line between them), three boxes, and hand-checked detections."""
    annotations = tmp_path / "val.txt"
    annotations.write_text("img0.jpg 10,10,50,50,0\n\nimg1.jpg 20,20,60,40,1 0,0,10,10,0\n", encoding="utf-8")
    classes = tmp_path / "classes.txt"
    classes.write_text("\n".join(CLASSES) + "\n", encoding="utf-8")
    detections = [
        {"image_id": 0, "category_id": 0, "bbox": [10, 10, 40, 40], "score": 0.9},  # exact: TP at every IoU
        # Shifted 9 px: IoU 31/49 = 0.633, a TP at IoU .50, .55, .60 only.
        {"image_id": 1, "category_id": 1, "bbox": [29, 20, 40, 20], "score": 0.8},
        {"image_id": 0, "category_id": 1, "bbox": [60, 60, 10, 10], "score": 0.4},  # FP, ranked after the TP
    ]  # the cat in image 1 is missed
    path = tmp_path / "detections.json"
    path.write_text(json.dumps(detections))
    return {"annotations": str(annotations), "classes": str(classes), "detections": str(path), "list": detections}


def test_hand_computed_map_precision_and_recall(dataset, tmp_path):
    result = evaluate_detections(
        dataset["detections"], dataset["annotations"], dataset["classes"], score=0.5, pr_curve=str(tmp_path / "pr.png")
    )
    cat, dog = result["per_class"]["cat"], result["per_class"]["dog"]
    assert cat["AP"] == pytest.approx(HALF_RECALL_AP) and cat["AP50"] == pytest.approx(HALF_RECALL_AP)
    assert dog["AP"] == pytest.approx(0.3) and dog["AP50"] == pytest.approx(1.0)
    assert (cat["ground_truth"], dog["ground_truth"], dog["detections"]) == (2, 1, 2)
    assert result["mAP"] == pytest.approx((HALF_RECALL_AP + 0.3) / 2)
    assert result["mAP50"] == pytest.approx((HALF_RECALL_AP + 1.0) / 2)
    # Score >= 0.5 keeps the two true positives: precision 1, recall 2/3.
    assert (result["tp"], result["fp"], result["fn"]) == (2, 0, 1)
    assert result["precision"] == 1.0 and result["recall"] == pytest.approx(2 / 3)
    assert (tmp_path / "pr.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    lower = evaluate_detections(dataset["list"], dataset["annotations"], CLASSES, score=0.3)
    assert (lower["tp"], lower["fp"], lower["precision"]) == (2, 1, pytest.approx(2 / 3))
    assert lower["mAP"] == pytest.approx(result["mAP"])  # the threshold does not touch mAP


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"image_id": 2, "category_id": 0, "bbox": [0, 0, 1, 1], "score": 1}, "image_id 2 is not an image index"),
        ({"image_id": 0, "category_id": 5, "bbox": [0, 0, 1, 1], "score": 1}, "category_id 5"),
        ({"image_id": 0, "category_id": 0, "bbox": [0, 0, 1], "score": 1}, "bbox must be"),
        ({"image_id": 0, "category_id": 0, "bbox": [0, 0, 1, 1]}, "missing score"),
    ],
)
def test_bad_detections_are_named(dataset, entry, message):
    with pytest.raises(ValueError, match=message):
        evaluate_detections([entry], dataset["annotations"], CLASSES)


def test_cli_detections_last_line_is_json(dataset, tmp_path, capsys):
    argv = [
        "--annotations",
        dataset["annotations"],
        "--classes",
        dataset["classes"],
        "--detections",
        dataset["detections"],
        "--pr-curve",
        str(tmp_path / "curve.png"),
    ]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["mAP"] == pytest.approx((HALF_RECALL_AP + 0.3) / 2)
    assert result["mAP50"] == pytest.approx((HALF_RECALL_AP + 1.0) / 2)
    assert any(line.startswith("cat ") for line in lines) and (tmp_path / "curve.png").is_file()
    assert main(argv) == 0  # a re-run replaces its own three pictures
    # A picture the user made where one of the three would go is refused before anything is scored.
    users = tmp_path / "curve_confusion_matrix.png"
    users.write_bytes(b"the user's picture")
    assert main(argv) == 1
    assert f"--pr-curve {users} already exists and was not written by keras-yolo-mgpu" in capsys.readouterr().err
    assert users.read_bytes() == b"the user's picture"

    assert (
        main(
            [
                "--annotations",
                dataset["annotations"],
                "--classes",
                dataset["classes"],
                "--detections",
                str(tmp_path / "no.json"),
            ]
        )
        == 1
    )
    assert "error: detections file not found" in capsys.readouterr().err


def test_cli_writes_no_plot_unless_asked(dataset, tmp_path, monkeypatch, capsys):
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    argv = ["--annotations", dataset["annotations"], "--classes", dataset["classes"]]
    assert main([*argv, "--detections", dataset["detections"]]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["pr_curve"] is None
    assert os.listdir(workdir) == []  # nothing dropped in the current folder


def test_weights_alone_take_the_runs_validation_only_for_the_val_split(dataset, tmp_path, capsys):
    """--split test asks for a dataset's test split: the run's validation images are not scored in its place."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "args.json").write_text(json.dumps({"val_annotations": dataset["annotations"], "data": None}))
    (run / "val_split.txt").write_text(Path(dataset["annotations"]).read_text())
    with pytest.raises(SystemExit) as exited:
        main(["--weights", str(run / "best.weights.h5"), "--split", "test"])
    assert exited.value.code == 2
    assert "--split test scores that split of a dataset, and the run of --weights named none" in capsys.readouterr().err


@pytest.mark.parametrize("runs_validation", [False, True])
def test_scoring_images_the_run_trained_on_says_what_to_score_instead(tmp_path, caplog, runs_validation):
    """The way out depends on where the images came from: a dataset given here (score the run's own validation
    instead), or the run's own validation, which overlapped its training images (the dataset needs its own)."""
    from keras_yolo_mgpu.cli.evaluate import _say_if_trained_on
    from keras_yolo_mgpu.data.annotations import read_annotations

    for name in ("a.png", "b.png"):
        (tmp_path / name).write_bytes(name.encode())
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train_split.txt").write_text(f"{tmp_path / 'a.png'} 1,1,5,5,0\n")
    scored = tmp_path / "scored.txt"
    scored.write_text(f"{tmp_path / 'a.png'} 1,1,5,5,0\n{tmp_path / 'b.png'} 1,1,5,5,0\n")
    weights = str(tmp_path / "run" / "best.weights.h5")
    _say_if_trained_on(weights, read_annotations(str(scored)), runs_validation)
    (warning,) = [record.getMessage() for record in caplog.records]
    assert f"1 of the 2 images scored here are images the run of {weights} trained on" in warning
    own_validation = "These are the images the run validated on, so its val_mAP and best.weights.h5 counted them"
    assert (own_validation in warning) is runs_validation
    assert ("alone scores the images the run validated on" in warning) is not runs_validation


def test_missing_weights_are_named_before_their_classes_are_compared_with_the_dataset(tmp_path, capsys):
    """A typo in --weights is "not found", not the default model's 80 COCO classes against the dataset's names."""
    from dataset_writers import CLASSES as DATASET_CLASSES
    from dataset_writers import write_yolo

    from keras_yolo_mgpu.data.annotations import read_annotations
    from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset

    paths = make_synthetic_dataset(tmp_path / "data", num_train=0, num_val=2, image_size=64, classes=DATASET_CLASSES)
    write_yolo(tmp_path / "data", {"val": read_annotations(paths.val)})
    missing = str(tmp_path / "best.weigths.h5")
    assert main(["--weights", missing, "--data", str(tmp_path / "data"), "--no-progress"]) == 1
    error = capsys.readouterr().err
    assert f"error: weights file not found: {missing}" in error and "detects ['person'" not in error


def test_weights_alone_score_another_split_of_the_dataset_the_run_trained_on(tmp_path, capsys, caplog):
    """--split test with a run's weights: the test split of the run's --data (its args.json), as its log says."""
    from dataset_writers import CLASSES as DATASET_CLASSES
    from dataset_writers import write_yolo
    from inference_helpers import TINY_ANCHORS, make_body

    from keras_yolo_mgpu.data.annotations import read_annotations
    from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
    from keras_yolo_mgpu.training.checkpoint import save_weights_atomic
    from keras_yolo_mgpu.weights.metadata import make_metadata

    data = tmp_path / "data"
    paths = make_synthetic_dataset(data, num_train=2, num_val=3, image_size=64, classes=DATASET_CLASSES)
    write_yolo(data, {"train": read_annotations(paths.train), "val": read_annotations(paths.val)})
    (data / "labels" / "test").symlink_to(data / "labels" / "val")  # a test split: the val images, under test/
    (data / "images" / "test").symlink_to(data / "images" / "val")
    (data / "data.yaml").write_text((data / "data.yaml").read_text() + "test: images/test\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "args.json").write_text(json.dumps({"data": str(data), "image_dir": None, "val_annotations": None}))
    weights = str(run / "best.weights.h5")
    metadata = make_metadata(TINY_ANCHORS, DATASET_CLASSES, (64, 64))
    save_weights_atomic(make_body(num_classes=len(DATASET_CLASSES)), weights, metadata)
    caplog.set_level("INFO")
    assert main(["--weights", weights, "--split", "test", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["num_listed"] == 3
    assert f"scoring the test split of the run's --data {data} (its args.json)" in caplog.text
