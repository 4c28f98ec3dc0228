"""Anchor boxes by k-means on box sizes with the IoU distance.

    python kmeans.py --annotations train.txt --clusters 9 --output model_data/my_anchors.txt
    python kmeans.py --annotations train.txt --clusters 6 --output model_data/my_tiny_anchors.txt

Boxes are compared by shape only: both are centred at the origin, so the
distance ``1 - IoU(box, anchor)`` depends on width and height alone, which
is also how ``preprocess_true_boxes`` picks the anchor for a box. Cluster
centres move to the median of their boxes (keras-yolo3's choice, robust to
the long tail of huge boxes); initial centres are picked by k-means++ with
that distance, several restarts keep the best mean IoU, everything seeded.

Sizes are in pixels of the annotated images, as in keras-yolo3. Anchors are
used in pixels of the network input, so with ``--input-size 416`` every box
is first scaled like the letterboxed image (``min(416 / w, 416 / h)``),
which reads each image's size from its header.
"""

from __future__ import annotations

import logging

import numpy as np

from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.images import image_size
from keras_yolo_mgpu.progress import progress_bar

logger = logging.getLogger(__name__)


def iou_wh(boxes: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """IoU of origin-centred boxes.

    Args:
        boxes: ``(N, 2)`` widths and heights.
        clusters: ``(K, 2)`` widths and heights.

    Returns:
        ``(N, K)`` IoU.
    """
    boxes = np.asarray(boxes, dtype=np.float64)[:, None, :]
    clusters = np.asarray(clusters, dtype=np.float64)[None, :, :]
    inter = np.minimum(boxes[..., 0], clusters[..., 0]) * np.minimum(boxes[..., 1], clusters[..., 1])
    union = boxes[..., 0] * boxes[..., 1] + clusters[..., 0] * clusters[..., 1] - inter
    return inter / union


def mean_iou(boxes: np.ndarray, anchors: np.ndarray) -> float:
    """Mean over boxes of the IoU with their best anchor."""
    return float(iou_wh(boxes, anchors).max(axis=1).mean())


def sort_by_area(anchors: np.ndarray) -> np.ndarray:
    """Anchors ordered by ``w * h``, smallest first (ties by width)."""
    anchors = np.asarray(anchors)
    order = np.lexsort((anchors[:, 0], anchors[:, 0] * anchors[:, 1]))
    return anchors[order]


def _kmeans_pp_init(boxes: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding with the ``1 - IoU`` distance, over distinct sizes."""
    unique = np.unique(boxes, axis=0)
    centres = [unique[rng.integers(len(unique))]]
    closest = 1.0 - iou_wh(unique, np.array(centres))[:, 0]
    for _ in range(1, k):
        weights = closest**2
        total = weights.sum()
        if total <= 0:  # every distinct size is already a centre
            break
        choice = unique[rng.choice(len(unique), p=weights / total)]
        centres.append(choice)
        closest = np.minimum(closest, 1.0 - iou_wh(unique, choice[None])[:, 0])
    return np.array(centres, dtype=np.float64)


def _lloyd(boxes: np.ndarray, centres: np.ndarray, max_iter: int, centre_fn) -> tuple[np.ndarray, int]:
    assignment = None
    for iteration in range(1, max_iter + 1):
        iou = iou_wh(boxes, centres)
        new_assignment = iou.argmax(axis=1)
        if assignment is not None and np.array_equal(new_assignment, assignment):
            return centres, iteration
        assignment = new_assignment
        best = iou.max(axis=1)
        counts = np.bincount(assignment, minlength=len(centres))
        for j in np.flatnonzero(counts == 0):
            # Empty cluster: restart it on the worst-fitted box of a cluster
            # that can spare one.
            for candidate in np.argsort(best):
                if counts[assignment[candidate]] > 1:
                    break
            counts[assignment[candidate]] -= 1
            counts[j] += 1
            assignment[candidate] = j
            best[candidate] = 1.0
        centres = np.array([centre_fn(boxes[assignment == j], axis=0) for j in range(len(centres))])
    return centres, max_iter


def kmeans_anchors(
    boxes: np.ndarray,
    num_clusters: int,
    *,
    seed: int = 0,
    restarts: int = 5,
    max_iter: int = 300,
    centre: str = "median",
) -> tuple[np.ndarray, float]:
    """Clusters box sizes into anchors.

    Args:
        boxes: ``(N, 2)`` positive widths and heights.
        num_clusters: number of anchors (9 for YOLOv3, 6 for tiny).
        seed: random seed; equal seeds give equal anchors.
        restarts: independent k-means++ runs; the best mean IoU wins.
        max_iter: iteration cap per run (runs stop when assignments settle).
        centre: ``"median"`` (keras-yolo3) or ``"mean"``.

    Returns:
        ``(anchors, mean_iou)``: float ``(num_clusters, 2)`` anchors sorted by
        area, and the mean best-anchor IoU of ``boxes``.

    Raises:
        ValueError: non-positive sizes, or fewer distinct sizes than clusters.
    """
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 2)
    if num_clusters < 1:
        raise ValueError(f"`num_clusters` must be positive. Received: num_clusters={num_clusters}")
    if centre not in ("median", "mean"):
        raise ValueError(f"`centre` must be 'median' or 'mean'. Received: centre={centre!r}")
    if len(boxes) and (boxes <= 0).any():
        raise ValueError("box widths and heights must be positive")
    distinct = len(np.unique(boxes, axis=0)) if len(boxes) else 0
    if distinct < num_clusters:
        raise ValueError(
            f"{num_clusters} clusters need at least {num_clusters} distinct box sizes; "
            f"found {distinct} among {len(boxes)} boxes. Use fewer clusters or more annotations."
        )
    centre_fn = np.median if centre == "median" else np.mean
    rng = np.random.default_rng(seed)
    best_anchors, best_iou = None, -1.0
    for run in range(max(1, restarts)):
        centres = _kmeans_pp_init(boxes, num_clusters, rng)
        centres, iterations = _lloyd(boxes, centres, max_iter, centre_fn)
        score = mean_iou(boxes, centres)
        logger.debug("k-means run %d: mean IoU %.4f after %d iterations", run, score, iterations)
        if score > best_iou:
            best_anchors, best_iou = centres, score
    return sort_by_area(best_anchors), best_iou


def round_anchors(anchors: np.ndarray) -> np.ndarray:
    """Integer anchors (at least 1 px), re-sorted by area."""
    return sort_by_area(np.maximum(np.rint(anchors), 1).astype(np.int64))


def box_sizes_from_annotations(
    annotation_path: str, *, root: str | None = None, input_size: int | None = None
) -> np.ndarray:
    """Widths and heights of every box in a keras-yolo3 annotation file.

    Args:
        annotation_path: ``path x1,y1,x2,y2,c ...`` lines.
        root: folder for relative image paths (see ``annotations.read_annotations``).
        input_size: when given, scale each image's boxes by
            ``min(input_size / width, input_size / height)`` as the letterbox does
            (reads image headers).

    Returns:
        ``(N, 2)`` float64 sizes; boxes with zero or negative size are dropped.
    """
    return box_sizes_from_records(read_annotations(annotation_path, root=root), input_size=input_size)


def box_sizes_from_records(annotations, *, input_size: int | None = None) -> np.ndarray:
    """`box_sizes_from_annotations` of records already read (`data.annotations.Annotation`, any format)."""
    sizes = []
    dropped = 0
    # Sizes not in the records are read from the images' headers: worth a progress display on a large set.
    shown = input_size is not None and len(annotations) >= 1000
    with progress_bar(len(annotations), unit="image", desc="image sizes", enabled=shown) as bar:
        for annotation in annotations:
            wh = annotation.boxes[:, 2:4].astype(np.float64) - annotation.boxes[:, 0:2]
            if input_size is not None and len(wh):
                width, height = annotation.size or image_size(annotation.image_path)  # the check's scan read it
                wh = wh * min(input_size / width, input_size / height)
            keep = (wh > 0).all(axis=1)
            dropped += int((~keep).sum())
            sizes.append(wh[keep])
            bar.update(1)
    if dropped:
        logger.warning("Dropped %d boxes with zero or negative width/height", dropped)
    return np.concatenate(sizes) if sizes else np.zeros((0, 2))
