"""Shared helpers for the inference tests (detector, video, evaluation, export).

A tiny YOLOv3 with 2 classes and random weights whose output convolutions
are scaled up, so scores spread over [0, 1] and random images give a dozen
well-separated detections instead of thousands of ties at 0.25.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_yolo_mgpu.model.yolo3 import build_body
from keras_yolo_mgpu.resources import default_anchors_path, get_anchors

TINY_ANCHORS_PATH = default_anchors_path(True)
TINY_ANCHORS = get_anchors(TINY_ANCHORS_PATH)
CLASS_NAMES = ["circle", "square"]
INPUT_SHAPE = (96, 128)  # (height, width)


def make_body(num_classes: int = 2, seed: int = 0, gain: float = 20.0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    body = build_body(TINY_ANCHORS, num_classes)
    for name in ("yolo_output_0", "yolo_output_1"):
        layer = body.get_layer(name)
        kernel, bias = layer.get_weights()
        layer.set_weights([kernel * gain, bias])
    return body


def write_classes(path, names=CLASS_NAMES) -> str:
    path.write_text("\n".join(names) + "\n", encoding="utf-8")
    return str(path)


def random_images(count: int, seed: int = 0, sizes=((96, 128), (200, 300), (480, 100), (64, 64))) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (*sizes[i % len(sizes)], 3), dtype=np.uint8) for i in range(count)]


def compare_detections(reference: dict, other: dict) -> dict:
    """Largest differences between two sets of padded detections (`export_check.compare_detection_lists`).

    Returns:
        `{"valid_equal", "classes_equal", "max_box_diff", "max_score_diff"}`
        over the valid rows (the padding is not compared).
    """
    from keras_yolo_mgpu.inference.export_check import compare_detection_lists

    result = compare_detection_lists(reference, other)
    valid_equal = bool(np.array_equal(reference["valid_detections"], other["valid_detections"]))
    return {"valid_equal": valid_equal, **{k: result[k] for k in ("classes_equal", "max_box_diff", "max_score_diff")}}
