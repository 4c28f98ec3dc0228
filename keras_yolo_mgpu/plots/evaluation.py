"""evaluate.py's pictures beside the PR curve: a confusion matrix and F1 / precision / recall against confidence.

Detections match ground truth by `model.box_matching.greedy_matches`' rule, so one pass in score order gives the true
positives at every confidence threshold.
"""

from __future__ import annotations

import os

import numpy as np

from keras_yolo_mgpu.model.box_matching import MATCH_IOU, iou_matrix
from keras_yolo_mgpu.plots.results import _figure, _save

__all__ = [
    "confidence_curves",
    "confusion_matrix",
    "evaluation_picture_paths",
    "plot_confidence_curves",
    "plot_confusion_matrix",
    "write_evaluation_pictures",
]


def _by_image(detections: list[dict], num_images: int) -> list[list[dict]]:
    grouped: list[list[dict]] = [[] for _ in range(num_images)]
    for detection in detections:
        grouped[int(detection["image_id"])].append(detection)
    return [sorted(g, key=lambda d: -float(d["score"])) for g in grouped]


def _match(detection: dict, truth: np.ndarray, free: np.ndarray) -> int | None:
    """The index of the `free` ground-truth box with the highest IoU >= 0.5 with `detection`, else None."""
    if not free.any():
        return None
    x, y, w, h = (float(v) for v in detection["bbox"])
    ious = np.where(free, iou_matrix(np.array([[x, y, x + w, y + h]]), truth[:, :4])[0], -1)
    best = int(np.argmax(ious))
    return best if ious[best] >= MATCH_IOU else None


def confidence_curves(annotations, detections: list[dict], num_classes: int, thresholds=None) -> dict:
    """Precision, recall and F1 per class against the confidence threshold.

    Args:
        annotations: records, image_id = index (boxes (K, 5) pixels).
        detections: COCO results (`image_id`, `category_id`, `bbox` [x, y, w, h], `score`).
        thresholds: (T,) confidences (default 0, 0.01, ..., 1).

    Returns:
        `thresholds` (T,), `precision`, `recall`, `f1` (C + 1, T): one row per
        class, the last over all classes; precision is NaN (not drawn) where
        no detection scores that high.
    """
    thresholds = np.linspace(0, 1, 101) if thresholds is None else np.asarray(thresholds)
    scores, classes, hits = [], [], []
    gt_counts = np.zeros(num_classes + 1)
    for annotation, found in zip(annotations, _by_image(detections, len(annotations))):
        truth = np.asarray(annotation.boxes, np.float64).reshape(-1, 5)
        np.add.at(gt_counts, truth[:, 4].astype(int), 1)
        taken = np.zeros(len(truth), bool)
        for detection in found:
            best = _match(detection, truth, (truth[:, 4] == detection["category_id"]) & ~taken)
            if best is not None:
                taken[best] = True
            scores.append(float(detection["score"]))
            classes.append(int(detection["category_id"]))
            hits.append(best is not None)
    gt_counts[num_classes] = gt_counts[:num_classes].sum()
    scores, classes, hits = np.array(scores), np.array(classes, int), np.array(hits, bool)
    shape = (num_classes + 1, len(thresholds))
    precision, recall = np.zeros(shape), np.zeros(shape)
    for row in range(num_classes + 1):
        mine = np.ones(len(scores), bool) if row == num_classes else classes == row
        above = mine[None, :] & (scores[None, :] >= thresholds[:, None])  # (T, D)
        tp = (above & hits[None, :]).sum(axis=1)
        kept = above.sum(axis=1)
        precision[row] = np.where(kept > 0, tp / np.maximum(kept, 1), np.nan)  # no detection left: undefined
        recall[row] = tp / gt_counts[row] if gt_counts[row] else 0.0
    f1 = np.nan_to_num(2 * precision * recall / np.maximum(precision + recall, 1e-12))  # no detection: F1 0
    return {"thresholds": thresholds, "precision": precision, "recall": recall, "f1": f1}


def confusion_matrix(annotations, detections: list[dict], num_classes: int, score: float) -> np.ndarray:
    """(C + 1, C + 1) counts: rows the predicted class, columns the true class; index C is background.

    A detection scoring at least `score` matches the unmatched ground-truth
    box of any class with the highest IoU >= 0.5 (in score order); unmatched
    detections count as predicted-class vs background, missed boxes as
    background vs their class.
    """
    matrix = np.zeros((num_classes + 1, num_classes + 1), np.int64)
    for annotation, found in zip(annotations, _by_image(detections, len(annotations))):
        truth = np.asarray(annotation.boxes, np.float64).reshape(-1, 5)
        taken = np.zeros(len(truth), bool)
        for detection in (d for d in found if float(d["score"]) >= score):
            predicted = int(detection["category_id"])
            best = _match(detection, truth, ~taken)
            if best is not None:
                taken[best] = True
            matrix[predicted, num_classes if best is None else int(truth[best, 4])] += 1
        for box in truth[~taken]:
            matrix[num_classes, int(box[4])] += 1
    return matrix


def plot_confusion_matrix(matrix: np.ndarray, class_names, path: str, score: float) -> str:
    """The matrix, each column normalised by its true class's count, with the counts written in."""
    names = [*class_names, "background"]
    size = min(14, 3 + 0.5 * len(names))
    _, figure, axes = _figure(1, 1, (size + 1, size))
    totals = matrix.sum(axis=0, keepdims=True)
    shares = np.divide(matrix, totals, out=np.zeros(matrix.shape), where=totals > 0)
    image = axes[0].imshow(shares, cmap="Blues", vmin=0, vmax=1)
    figure.colorbar(image, ax=axes[0], fraction=0.046, label="share of the true class")
    axes[0].set_xticks(range(len(names)), names, rotation=90)
    axes[0].set_yticks(range(len(names)), names)
    axes[0].set_xlabel("true")
    axes[0].set_ylabel("predicted")
    axes[0].set_title(f"confusion matrix (score >= {score:g}, IoU >= {MATCH_IOU})")
    if len(names) <= 30:
        for (row, column), count in np.ndenumerate(matrix):
            if count:
                colour = "white" if shares[row, column] > 0.5 else "black"
                axes[0].text(column, row, str(count), ha="center", va="center", fontsize=7, color=colour)
    return _save(figure, path)


def plot_confidence_curves(curves: dict, class_names, path: str) -> str:
    """F1, precision and recall against confidence: a thin line per class, the bold line over all classes."""
    _, figure, axes = _figure(1, 3, (15, 4.2))
    thresholds = curves["thresholds"]
    for axis, key in zip(axes, ("f1", "precision", "recall")):
        values = curves[key]
        if len(class_names) <= 20:
            for row, name in enumerate(class_names):
                axis.plot(thresholds, values[row], linewidth=0.8, alpha=0.6, label=name)
        best = int(np.argmax(values[-1])) if key == "f1" else None
        label = "all classes" + (f" {values[-1][best]:.2f} at {thresholds[best]:.2f}" if best is not None else "")
        axis.plot(thresholds, values[-1], linewidth=2.5, color="black", label=label)
        axis.set_xlabel("confidence")
        axis.set_ylabel(key if key != "f1" else "F1")
        axis.set_xlim(0, 1)
        axis.set_ylim(0, 1.02)
        axis.grid(True, alpha=0.3)
        axis.set_title(f"{'F1' if key == 'f1' else key.capitalize()}-confidence")
        axis.legend(fontsize=7)
    return _save(figure, path)


def evaluation_picture_paths(pr_curve: str) -> dict:
    """`{"pr_curve", "confusion_matrix", "confidence_curves"}`: the files `--pr-curve PATH` writes, beside PATH."""
    stem = os.path.splitext(pr_curve)[0]
    return {
        "pr_curve": pr_curve,
        "confusion_matrix": f"{stem}_confusion_matrix.png",
        "confidence_curves": f"{stem}_confidence_curves.png",
    }


def write_evaluation_pictures(annotations, detections, class_names, pr_curve: str, score: float) -> dict:
    """`<pr_curve stem>_confusion_matrix.png` and `<stem>_confidence_curves.png` beside the PR curve; their paths."""
    paths = evaluation_picture_paths(pr_curve)
    num_classes = len(class_names)
    matrix = confusion_matrix(annotations, detections, num_classes, score)
    return {
        "confusion_matrix": plot_confusion_matrix(matrix, class_names, paths["confusion_matrix"], score),
        "confidence_curves": plot_confidence_curves(
            confidence_curves(annotations, detections, num_classes), class_names, paths["confidence_curves"]
        ),
    }
