"""IoU k-means anchors: recovery of known clusters, file format, CLI."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from keras_yolo_mgpu.cli.kmeans import main
from keras_yolo_mgpu.data.annotations import format_annotation_line
from keras_yolo_mgpu.data.kmeans import (
    _lloyd,
    box_sizes_from_annotations,
    iou_wh,
    kmeans_anchors,
    mean_iou,
    round_anchors,
)
from keras_yolo_mgpu.resources import get_anchors

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CENTRES = np.array(
    [[10, 13], [16, 30], [33, 23], [30, 61], [62, 45], [59, 119], [116, 90], [156, 198], [373, 326]], float
)


def clustered_boxes(centres, per_cluster=200, noise=0.05, seed=0):
    rng = np.random.default_rng(seed)
    boxes = [c * np.exp(rng.normal(0, noise, (per_cluster, 2))) for c in centres]
    return np.concatenate(boxes)


def test_iou_wh_by_hand():
    iou = iou_wh(np.array([[2.0, 2.0], [1.0, 4.0]]), np.array([[1.0, 4.0], [2.0, 2.0], [4.0, 4.0]]))
    np.testing.assert_allclose(iou, [[2 / 6, 1, 4 / 16], [1, 2 / 6, 4 / 16]])


def test_recovers_known_clusters():
    boxes = clustered_boxes(CENTRES)
    anchors, score = kmeans_anchors(boxes, 9, seed=0)
    # Sorted by area on both sides, each anchor within 5 % of its true centre.
    np.testing.assert_allclose(anchors, CENTRES[np.argsort(CENTRES.prod(axis=1))], rtol=0.05)
    assert score > 0.85
    assert np.all(np.diff(anchors.prod(axis=1)) >= 0)


def test_seeded_and_mean_centre():
    boxes = clustered_boxes(CENTRES[:6], seed=1)
    a, s = kmeans_anchors(boxes, 6, seed=3)
    b, t = kmeans_anchors(boxes, 6, seed=3)
    np.testing.assert_array_equal(a, b)
    assert s == t
    mean_anchors, _ = kmeans_anchors(boxes, 6, seed=3, centre="mean")
    np.testing.assert_allclose(mean_anchors, a, rtol=0.05)


def test_too_few_distinct_boxes():
    boxes = np.repeat(CENTRES[:5], 10, axis=0)
    with pytest.raises(ValueError, match="9 clusters need at least 9 distinct box sizes; found 5 among 50 boxes"):
        kmeans_anchors(boxes, 9)
    anchors, score = kmeans_anchors(boxes, 5)  # exactly enough: every size is an anchor
    assert score == pytest.approx(1.0)
    with pytest.raises(ValueError, match="positive"):
        kmeans_anchors(np.array([[0.0, 3.0]] * 10), 1)


def test_empty_cluster_is_reseeded():
    boxes = np.concatenate([clustered_boxes([[5, 5]], 20), clustered_boxes([[50, 50]], 20, seed=1)])
    centres, _ = _lloyd(boxes, np.array([[5.0, 5.0], [6.0, 6.0], [1000.0, 1000.0]]), 100, np.median)
    assert np.isfinite(centres).all() and len(np.unique(centres, axis=0)) == 3
    assert mean_iou(boxes, centres) > 0.8


def write_annotations(path, boxes_wh, image="img.jpg"):
    lines = []
    for i, (w, h) in enumerate(boxes_wh):
        lines.append(format_annotation_line(image, [[3, 4, 3 + w, 4 + h, i % 3]]))
    path.write_text("\n".join(lines) + "\n")


def test_cli_writes_model_data_format(tmp_path, capsys, caplog):
    annotations = tmp_path / "train.txt"
    write_annotations(annotations, np.rint(clustered_boxes(CENTRES, 30)))
    output = tmp_path / "model_data" / "my_anchors.txt"
    with caplog.at_level(logging.INFO, logger="kmeans"):
        assert main(["--annotations", str(annotations), "--clusters", "9"]) == 0  # printed only, and said so
        assert not output.exists() and "not written: --output FILE writes them" in caplog.text
        assert "the anchors are in image pixels" in caplog.text and "--input-size N" in caplog.text
        caplog.clear()
        assert main(["--annotations", str(annotations), "--clusters", "9", "--output", str(output)]) == 0
        assert "not written" not in caplog.text
    printed = capsys.readouterr().out
    assert "Mean IoU: " in printed
    text = output.read_text()
    assert text.count("\n") == 1 and ",  " in text
    anchors = get_anchors(output)
    assert anchors.shape == (9, 2)
    np.testing.assert_allclose(anchors, CENTRES[np.argsort(CENTRES.prod(axis=1))], rtol=0.1)
    assert np.all(np.diff(anchors.prod(axis=1)) >= 0)


def test_tiny_round_trip_and_rounding(tmp_path):
    boxes = clustered_boxes(CENTRES[:6], 40)
    anchors = round_anchors(kmeans_anchors(boxes, 6)[0])
    assert anchors.dtype.kind == "i" and anchors.min() >= 1
    annotations = tmp_path / "a.txt"
    write_annotations(annotations, np.rint(boxes))
    output = tmp_path / "tiny.txt"
    assert main(["--annotations", str(annotations), "--clusters", "6", "--output", str(output)]) == 0
    assert get_anchors(output).shape == (6, 2)


def test_input_size_scales_like_the_letterbox(tmp_path):
    Image.new("RGB", (200, 100)).save(tmp_path / "wide.jpg")
    Image.new("RGB", (100, 100)).save(tmp_path / "square.jpg")
    annotations = tmp_path / "a.txt"
    annotations.write_text(
        "wide.jpg 0,0,40,20,0\nsquare.jpg 10,10,30,50,1 5,5,5,9,0\n"  # the last box has zero width
    )
    np.testing.assert_allclose(box_sizes_from_annotations(str(annotations)), [[40, 20], [20, 40]])
    np.testing.assert_allclose(
        box_sizes_from_annotations(str(annotations), root=str(tmp_path), input_size=50), [[10, 5], [10, 20]]
    )


def test_script_reports_errors(tmp_path):
    annotations = tmp_path / "a.txt"
    write_annotations(annotations, [[10, 10], [20, 20]])
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "kmeans.py"), "--annotations", str(annotations), "--clusters", "9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "9 clusters need at least 9 distinct box sizes; found 2" in proc.stderr
