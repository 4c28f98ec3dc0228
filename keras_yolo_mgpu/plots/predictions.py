"""`val_pred.jpg`: ground truth beside the predictions on a few validation images."""

from __future__ import annotations

import logging

import cv2
import numpy as np

from keras_yolo_mgpu.data.images import read_image
from keras_yolo_mgpu.plots.boxes import draw_boxes, image_grid, write_image

logger = logging.getLogger(__name__)

__all__ = ["draw_predictions"]


def _fit(image: np.ndarray, side: int) -> tuple[np.ndarray, float]:
    """(`image` scaled to fit a side x side square, on grey; the scale): the pictures' tiles share one size."""
    height, width = image.shape[:2]
    scale = side / max(height, width)
    resized = cv2.resize(image, (max(1, round(width * scale)), max(1, round(height * scale))))
    tile = np.full((side, side, 3), 114, np.uint8)
    tile[: resized.shape[0], : resized.shape[1]] = resized
    return tile, scale


def _scaled(boxes: np.ndarray, scale: float) -> np.ndarray:
    boxes = np.asarray(boxes, np.float64).reshape(-1, 5).copy()
    boxes[:, :4] *= scale
    return boxes


def _labelled(image: np.ndarray, text: str) -> np.ndarray:
    canvas = image.copy()
    cv2.putText(canvas, text, (4, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (255, 255, 255), 2, cv2.LINE_AA)
    cv2.putText(canvas, text, (4, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    return canvas


def draw_predictions(
    detector, annotations, class_names, path: str, count: int = 8, side: int = 320, max_boxes: int = 30
) -> str | None:
    """Writes `count` validation images, each as a pair: ground truth (left), the detector's boxes (right).

    Args:
        detector: an `inference.detector.YOLO`.
        annotations: validation records; the first `count` readable ones are drawn.
        class_names: names by class id.
        path: the JPEG to write.
        side: each tile's size in pixels.
        max_boxes: most predictions drawn per image (the best scores; the tile says how many there were).

    Returns:
        `path`, or None when no image could be read.
    """
    tiles = []
    for annotation in annotations:
        if len(tiles) >= 2 * count:
            break
        try:
            image = read_image(annotation.image_path)
        except (OSError, ValueError) as error:
            logger.warning("val_pred: cannot read %s (%s): skipped", annotation.image_path, error)
            continue
        found = detector.detect(image)
        keep = slice(0, max_boxes)  # best first: a flood of low scores stays readable
        predicted = np.concatenate([found.boxes[keep], found.classes[keep, None].astype(np.float32)], axis=1)
        tile, scale = _fit(image, side)  # boxes drawn at the tile's size, so labels stay legible
        truth = draw_boxes(tile, _scaled(annotation.boxes, scale), class_names)
        guess = draw_boxes(tile, _scaled(predicted, scale), class_names, scores=found.scores[keep])
        tiles += [_labelled(truth, "ground truth"), _labelled(guess, f"predicted ({found.num_boxes})")]
    if not tiles:
        return None
    return write_image(path, image_grid(tiles, columns=4))
