"""`labels.jpg`: what the training labels hold: class counts, box centres, box sizes against the anchors."""

from __future__ import annotations

import os

import numpy as np

from keras_yolo_mgpu.data.images import image_size
from keras_yolo_mgpu.plots.boxes import class_colour
from keras_yolo_mgpu.plots.results import _figure, _save

__all__ = ["letterboxed_boxes", "plot_labels"]


def letterboxed_boxes(annotations, input_hw: tuple[int, int]) -> np.ndarray:
    """Every box as the letterbox scales it into the network input: (N, 5) cx, cy, w, h (input pixels), class.

    Each image's size is the one the dataset check read (`Annotation.size`),
    else read from the header (no decode). One array operation over all
    boxes: 828k boxes take a fraction of a second.
    """
    height, width = input_hw
    boxed = [a for a in annotations if len(a.boxes)]
    if not boxed:
        return np.zeros((0, 5))
    sizes = np.array([a.size or image_size(a.image_path) for a in boxed], np.float64).reshape(-1, 2)
    counts = [len(a.boxes) for a in boxed]
    scale = np.minimum(width / sizes[:, 0], height / sizes[:, 1])
    dx, dy = (width - sizes[:, 0] * scale) / 2, (height - sizes[:, 1] * scale) / 2
    scale, dx, dy = (np.repeat(v, counts) for v in (scale, dx, dy))  # one per box
    boxes = np.concatenate([a.boxes for a in boxed]).astype(np.float64)
    cx = (boxes[:, 0] + boxes[:, 2]) / 2 * scale + dx
    cy = (boxes[:, 1] + boxes[:, 3]) / 2 * scale + dy
    w, h = (boxes[:, 2] - boxes[:, 0]) * scale, (boxes[:, 3] - boxes[:, 1]) * scale
    return np.stack([cx, cy, w, h, boxes[:, 4]], axis=1)


def plot_labels(annotations, class_names, anchors, input_hw: tuple[int, int], output_path: str) -> str:
    """Draws class counts, box centres (input pixels) and box sizes with the anchors over them.

    Args:
        annotations: the training records.
        class_names: names by class id.
        anchors: (N, 2) anchor (w, h) in input pixels.
        input_hw: (height, width) of the network input.
        output_path: `.jpg` or `.png`.
    """
    boxes = letterboxed_boxes(annotations, input_hw)
    height, width = input_hw
    _, figure, axes = _figure(1, 3, (14, 4.2))
    counts = np.bincount(boxes[:, 4].astype(int), minlength=len(class_names))[: len(class_names)]
    colours = [tuple(v / 255 for v in class_colour(i)) for i in range(len(class_names))]
    axes[0].bar(range(len(class_names)), counts, color=colours)
    axes[0].set_xticks(range(len(class_names)), class_names, rotation=90 if len(class_names) > 8 else 0)
    axes[0].set_title(f"boxes per class ({len(boxes)} boxes, {len(annotations)} images)")
    axes[1].hist2d(boxes[:, 0], boxes[:, 1], bins=32, range=[[0, width], [0, height]], cmap="Blues")
    axes[1].set_xlim(0, width)
    axes[1].set_ylim(height, 0)  # image coordinates: y down
    axes[1].set_aspect("equal")
    axes[1].set_title("box centres (input pixels)")
    axes[2].scatter(boxes[:, 2], boxes[:, 3], s=4, alpha=0.4, c=[colours[int(c)] for c in boxes[:, 4]])
    anchors = np.asarray(anchors, np.float64).reshape(-1, 2)
    axes[2].scatter(anchors[:, 0], anchors[:, 1], marker="x", s=80, color="red", label="anchors")
    for index, (w, h) in enumerate(anchors):
        axes[2].annotate(str(index), (w, h), textcoords="offset points", xytext=(4, 4), color="red", fontsize=8)
    axes[2].set_xlabel("width (input pixels)")
    axes[2].set_ylabel("height (input pixels)")
    axes[2].set_title(f"box sizes at {height}x{width} and the anchors")
    axes[2].legend(fontsize=8)
    axes[2].grid(True, alpha=0.3)
    jpeg = os.path.splitext(output_path)[1].lower() in (".jpg", ".jpeg")
    return _save(figure, output_path, pil_kwargs={"quality": 90} if jpeg else None)
