"""Detections matched to ground truth by COCO's greedy rule, in numpy, for mAP, the export check and the pictures.

Apart from `model.boxes` (Keras ops): the commands import this at their tops, and Keras would start TensorFlow
before a command could start it quietly.
"""

from __future__ import annotations

import numpy as np

# COCO's greedy rule: detections, best score first, each take the free ground-truth box of highest IoU >= 0.5,
# so a detection's match depends only on higher-scored ones.
MATCH_IOU = 0.5


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of (n, 4) and (m, 4) x1, y1, x2, y2 boxes -> (n, m); 0 where the union is empty."""
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=-1)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=-1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=-1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def greedy_matches(ious: np.ndarray, threshold: float = MATCH_IOU) -> int:
    """How many rows of (n, m) `ious` (detections, best first) take a column (ground truth, m >= 1).

    Each row takes the free column of highest IoU >= `threshold`, if any.
    """
    taken = np.zeros(ious.shape[1], bool)
    for row in ious:
        row = np.where(taken, -1.0, row)
        best = int(np.argmax(row))
        if row[best] >= threshold:
            taken[best] = True
    return int(taken.sum())
