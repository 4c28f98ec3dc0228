"""How well a run's anchors fit its training boxes, and `--anchors auto`.

At the start of every run `report_anchor_fit` logs, at the network's input
size, YOLOv5 AutoAnchor's best possible recall (BPR: the fraction of boxes
whose best anchor's ratio metric r = min(w / aw, aw / w, h / ah, ah / h)
exceeds 1 / 4) and the mean best IoU (keras-yolo3's assignment measure).
Only anchors an output scale uses count (the tiny masks leave anchor 0
out). A BPR under 0.98 is warned about; `--anchors auto` fits the used
anchors with k-means (data/kmeans.py) instead. So are the boxes that get
no target at all: keras-yolo3's targets give a box to its best anchor by
IoU over all anchors, and a box whose best is anchor 0 of the tiny masks
(with Darknet's `--iou-thresh`, and no used anchor above it) trains nothing.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from keras_yolo_mgpu.data.kmeans import kmeans_anchors, mean_iou, round_anchors
from keras_yolo_mgpu.plots.labels import letterboxed_boxes
from keras_yolo_mgpu.resources import format_anchors, get_anchors

logger = logging.getLogger(__name__)

# YOLOv5's `anchor_t`: a box and an anchor match when neither side is more than 4x off.
RATIO_THRESHOLD = 4.0
# Below this BPR, YOLOv5 re-fits its anchors.
GOOD_BPR = 0.98
AUTO = "auto"
ANCHORS_FILE = "anchors.txt"


def box_sizes_at_input(annotations, input_shape) -> np.ndarray:
    """`(N, 2)` float64 widths and heights of every box, scaled into the `(height, width)` input as the letterbox does.

    Boxes without area are left out. The geometry is `labels.jpg`'s (`plots.labels.letterboxed_boxes`).
    """
    sizes = letterboxed_boxes(annotations, input_shape)[:, 2:4]
    return sizes[(sizes > 0).all(axis=1)]


def best_ratio(sizes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """`(N,)` best ratio metric of each box (`(N, 2)`) over the anchors (`(A, 2)`), in (0, 1]."""
    ratio = np.asarray(sizes, np.float64)[:, None, :] / np.asarray(anchors, np.float64)[None, :, :]
    return np.minimum(ratio, 1.0 / ratio).min(axis=2).max(axis=1)


def best_possible_recall(sizes: np.ndarray, anchors: np.ndarray, threshold: float = RATIO_THRESHOLD) -> float:
    """Fraction of boxes whose best anchor's ratio metric exceeds `1 / threshold` (YOLOv5's BPR)."""
    if not len(sizes):
        return float("nan")
    return float((best_ratio(sizes, anchors) > 1.0 / threshold).mean())


def boxes_without_target(sizes: np.ndarray, anchors: np.ndarray, masks, iou_thresh: float | None = None) -> np.ndarray:
    """`(N,)` bool: the boxes (`(N, 2)` sizes) that keras-yolo3's targets give to no anchor.

    A box goes to its best anchor by IoU of centred boxes over all `(A, 2)`
    anchors (the first on ties), when a mask holds it; with `iou_thresh`
    (Darknet's) also to every anchor of the masks with IoU above it
    (`data.device_side.build_targets`).
    """
    sizes, anchors = np.asarray(sizes, np.float64), np.asarray(anchors, np.float64)
    intersection = np.minimum(sizes[:, None, :], anchors[None, :, :]).prod(axis=2)
    iou = intersection / (sizes.prod(axis=1)[:, None] + anchors.prod(axis=1)[None, :] - intersection)
    used = sorted({index for mask in masks for index in mask})
    assigned = np.isin(iou.argmax(axis=1), used)
    if iou_thresh is not None and iou_thresh < 1.0:
        assigned |= (iou[:, used] > iou_thresh).any(axis=1)
    return ~assigned


def used_anchors(anchors: np.ndarray, masks) -> np.ndarray:
    """The anchors some output scale uses, in index order."""
    return np.asarray(anchors)[sorted({index for mask in masks for index in mask})]


def report_anchor_fit(
    sizes: np.ndarray, anchors: np.ndarray, masks, input_shape, iou_thresh: float | None = None
) -> tuple[float, float]:
    """Logs BPR and mean best IoU of the used anchors; warns when BPR < `GOOD_BPR` or a box gets no target.

    Returns:
        (BPR, mean best IoU).
    """
    if not len(sizes):
        logger.info("anchor fit: no boxes to measure")
        return float("nan"), float("nan")
    used = used_anchors(anchors, masks)
    bpr, iou = best_possible_recall(sizes, used), mean_iou(sizes, used)
    text = "anchor fit at input %dx%d: best possible recall %.4f (YOLOv5's, ratio < 4), mean best IoU %.3f, %d boxes"
    logger.info(text, *input_shape, bpr, iou, len(sizes))
    if bpr < GOOD_BPR:
        logger.warning(
            "the anchors fit this dataset badly: best possible recall %.4f < %.2f (%.1f %% of the boxes are more "
            "than 4x off every anchor in width or height). Consider --anchors auto (k-means on these boxes); "
            "pretrained output layers were trained for their own anchors.",
            bpr,
            GOOD_BPR,
            100 * (1 - bpr),
        )
    untrained = boxes_without_target(sizes, anchors, masks, iou_thresh)
    if untrained.any():
        unused = sorted(set(range(len(anchors))) - {index for mask in masks for index in mask})
        logger.warning(
            "%d of %d training boxes (%.1f %%) get no target, so the model never learns them: their best anchor by "
            "IoU (keras-yolo3's assignment) is anchor %s, which no output scale predicts (the run's train_batch "
            "pictures show them without a box). --anchors auto refits the anchors so that no box is left out.",
            untrained.sum(),
            len(sizes),
            100 * untrained.mean(),
            ", ".join(map(str, unused)),
        )
    return bpr, iou


def fit_anchors(sizes: np.ndarray, num_anchors: int, masks, seed: int = 0) -> np.ndarray:
    """`(num_anchors, 2)` anchors fitted to `sizes` by k-means, one per index the masks use.

    The used indices get the centres in order of area; an unused index (anchor 0 of the tiny masks)
    gets a quarter of the smallest box, so it is never a box's best anchor and no box goes without a target.
    """
    used = sorted({index for mask in masks for index in mask})
    if len(sizes) < len(used):
        raise ValueError(f"--anchors auto needs at least {len(used)} boxes; the training set has {len(sizes)}")
    fitted, _ = kmeans_anchors(sizes, len(used), seed=seed)
    anchors = np.tile(np.maximum(np.floor(sizes.min(axis=0) / 4), 1), (num_anchors, 1))
    anchors[used] = round_anchors(fitted)
    return anchors.astype(np.float32)


def run_anchors(
    config, anchors: np.ndarray, masks, train_annotations, run_dir: str, iou_thresh: float | None = None
) -> np.ndarray:
    """The run's anchors: `anchors`, or with `config.anchors == "auto"` k-means ones; logs their fit.

    A fitted set is written to `run_dir/anchors.txt`; a resumed run reads it back. `iou_thresh` is the
    run's resolved one (the targets').
    """
    sizes = box_sizes_at_input(train_annotations, config.input_shape)
    if config.anchors == AUTO:
        path = os.path.join(run_dir, ANCHORS_FILE)
        if config.resume and os.path.isfile(path):
            anchors = get_anchors(path)
        else:
            report_anchor_fit(sizes, anchors, masks, config.input_shape, iou_thresh)
            anchors = fit_anchors(sizes, len(anchors), masks, seed=0)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(format_anchors(anchors) + "\n")
            logger.info("--anchors auto: k-means anchors %s (written to %s)", format_anchors(anchors), path)
    report_anchor_fit(sizes, anchors, masks, config.input_shape, iou_thresh)
    return anchors
