"""The pictures: boxes land where their labels say, batches show their targets, evaluation figures count right."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.plots.batches import boxes_from_targets, draw_batch
from keras_yolo_mgpu.plots.boxes import class_colour, draw_boxes
from keras_yolo_mgpu.plots.evaluation import (
    confidence_curves,
    confusion_matrix,
    write_evaluation_pictures,
)


def _edge_pixels(image, box, colour, tolerance=0):
    """Whether the outline of `box` (x1, y1, x2, y2) is `colour` and the pixels just inside and outside are not."""
    x1, y1, x2, y2 = box
    mid_x, mid_y = (x1 + x2) // 2, (y1 + y2) // 2

    def near(y, x):
        return np.abs(image[y, x].astype(int) - colour).max() <= tolerance

    on_edges = [near(mid_y, x1), near(mid_y, x2 - 1), near(y2 - 1, mid_x)]
    off_edges = [near(mid_y, x1 - 1), near(mid_y, x1 + 1), near(mid_y, x2), near(mid_y, x2 - 2), near(y2, mid_x)]
    return all(on_edges) and not any(off_edges)


def test_a_drawn_box_lands_where_its_label_says():
    image = np.zeros((60, 80, 3), np.uint8)
    drawn = draw_boxes(image, [[10, 20, 40, 50, 1]], ["cat", "dog"])
    assert _edge_pixels(drawn, (10, 20, 40, 50), class_colour(1))
    assert drawn[35, 25].max() == 0  # inside the box: untouched
    assert (drawn[:19, 10:40] == class_colour(1)).all(axis=-1).any()  # the label's tag sits above the box
    assert image.max() == 0  # the input is not drawn on


def test_a_batch_picture_shows_the_boxes_its_targets_hold(tmp_path):
    """A record through the real validation pipeline (letterbox 64x48 -> 64x64: 8 px bars), then drawn."""
    from keras_yolo3_targets import dense_inputs

    from keras_yolo_mgpu.data.tf_dataset import make_dataset
    from keras_yolo_mgpu.resources import get_anchors, model_data_path

    path = str(tmp_path / "grey.png")
    cv2.imwrite(path, np.full((48, 64, 3), 90, np.uint8))
    record = Annotation(path, np.array([[10, 10, 30, 30, 1], [40, 4, 60, 44, 0]], np.float32))
    anchors = get_anchors(model_data_path("tiny_yolo_anchors.txt"))
    batch = next(make_dataset([record], (64, 64), anchors, 2, 1, training=False).as_numpy_iterator())[0]
    inputs = dense_inputs(batch, anchors, 2)  # finished as the training model's first layer finishes it
    targets = [inputs["y_true_0"], inputs["y_true_1"]]
    # keras-yolo3's targets hold centre (x1 + x2) // 2 and size: these boxes come back exactly.
    np.testing.assert_array_equal(boxes_from_targets(targets, (64, 64))[0], [[10, 18, 30, 38, 1], [40, 12, 60, 52, 0]])
    out = draw_batch(inputs, ["cat", "dog"], str(tmp_path / "train_batch0.jpg"))
    picture = cv2.cvtColor(cv2.imread(out), cv2.COLOR_BGR2RGB)
    assert picture.shape == (64, 64, 3)
    # JPEG blurs a one-pixel line: the edge is near the colour, its neighbours are not.
    assert _edge_pixels(picture, (10, 18, 30, 38), class_colour(1), tolerance=40)
    assert _edge_pixels(picture, (40, 12, 60, 52), class_colour(0), tolerance=40)


@pytest.fixture
def hand_checked():
    """evaluate's hand-checked case (tests/test_evaluate.py): two images, three boxes, three detections."""
    annotations = [
        Annotation("img0.jpg", np.array([[10, 10, 50, 50, 0]], np.float32)),
        Annotation("img1.jpg", np.array([[20, 20, 60, 40, 1], [0, 0, 10, 10, 0]], np.float32)),
    ]
    detections = [
        {"image_id": 0, "category_id": 0, "bbox": [10, 10, 40, 40], "score": 0.9},  # TP
        {"image_id": 1, "category_id": 1, "bbox": [29, 20, 40, 20], "score": 0.8},  # TP at IoU 0.633
        {"image_id": 0, "category_id": 1, "bbox": [60, 60, 10, 10], "score": 0.4},  # FP
    ]  # the cat in image 1 is missed
    return annotations, detections


def test_confusion_matrix_counts_matches_misses_and_false_alarms(hand_checked):
    annotations, detections = hand_checked
    # rows predicted, columns true: cat, dog, background
    np.testing.assert_array_equal(confusion_matrix(annotations, detections, 2, 0.5), [[1, 0, 0], [0, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(confusion_matrix(annotations, detections, 2, 0.3), [[1, 0, 0], [0, 1, 1], [1, 0, 0]])


def test_confidence_curves_agree_with_precision_and_recall_by_hand(hand_checked, tmp_path):
    annotations, detections = hand_checked
    curves = confidence_curves(annotations, detections, 2, thresholds=[0.3, 0.5, 0.95])
    np.testing.assert_allclose(curves["precision"][-1], [2 / 3, 1.0, np.nan])  # nothing scores 0.95
    np.testing.assert_allclose(curves["recall"][-1], [2 / 3, 2 / 3, 0.0])
    np.testing.assert_allclose(curves["f1"][-1], [2 / 3, 0.8, 0.0])
    np.testing.assert_allclose(curves["recall"][0], [0.5, 0.5, 0.0])  # cat: one of two found
    paths = write_evaluation_pictures(annotations, detections, ["cat", "dog"], str(tmp_path / "pr.png"), 0.5)
    for path in paths.values():
        assert cv2.imread(path).shape[0] > 100
