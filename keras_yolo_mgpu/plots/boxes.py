"""Labelled boxes drawn on images with OpenCV, and the image grids the pictures are made of."""

from __future__ import annotations

import colorsys
import os

import cv2
import numpy as np

__all__ = ["class_colour", "draw_boxes", "image_grid", "write_image"]


def class_colour(class_id: int) -> tuple[int, int, int]:
    """A bright RGB colour per class, far from its neighbours (golden-ratio hues)."""
    hue = (int(class_id) * 0.618033988749895) % 1.0
    r, g, b = colorsys.hsv_to_rgb(hue, 0.9, 1.0)
    return int(r * 255), int(g * 255), int(b * 255)


def draw_boxes(image: np.ndarray, boxes, class_names, scores=None, thickness: int = 1) -> np.ndarray:
    """A copy of `image` with each box outlined in its class colour and labelled.

    Args:
        image: (H, W, 3) uint8 RGB.
        boxes: (K, 5) x_min, y_min, x_max, y_max, class_id in the image's pixels.
        class_names: names by class id (an id past them is labelled by its number).
        scores: (K,) confidences shown after the name, or None.
        thickness: line width in pixels.

    Returns:
        (H, W, 3) uint8 RGB. The outline covers the pixels from (x_min, y_min)
        to (x_max - 1, y_max - 1) rounded, so a box's edge lands on its label's coordinates.
    """
    canvas = np.ascontiguousarray(image.copy())
    boxes = np.asarray(boxes, np.float64).reshape(-1, 5)
    scale = float(np.clip(min(canvas.shape[:2]) / 700, 0.3, 1.0))
    for index, (x1, y1, x2, y2, c) in enumerate(boxes.tolist()):
        colour = class_colour(int(c))
        top_left = (int(round(x1)), int(round(y1)))
        bottom_right = (max(int(round(x2)) - 1, top_left[0]), max(int(round(y2)) - 1, top_left[1]))
        cv2.rectangle(canvas, top_left, bottom_right, colour, thickness)
        name = class_names[int(c)] if 0 <= int(c) < len(class_names) else str(int(c))
        text = name if scores is None else f"{name} {float(scores[index]):.2f}"
        (width, height), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
        # The label sits above the box, inside the image when the box touches its top.
        y_text = (
            top_left[1] - 2 if top_left[1] - height - 2 >= 0 else min(bottom_right[1] + height + 2, canvas.shape[0])
        )
        cv2.rectangle(canvas, (top_left[0], y_text - height - 1), (top_left[0] + width, y_text + 1), colour, -1)
        cv2.putText(canvas, text, (top_left[0], y_text), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 1, cv2.LINE_AA)
    return canvas


def image_grid(images: list[np.ndarray], columns: int | None = None, gap: int = 2) -> np.ndarray:
    """Images of one size side by side, `columns` per row (default: a square-ish grid), white gaps between."""
    count = len(images)
    columns = columns or int(np.ceil(np.sqrt(count)))
    rows = int(np.ceil(count / columns))
    height, width = images[0].shape[:2]
    grid = np.full((rows * height + (rows - 1) * gap, columns * width + (columns - 1) * gap, 3), 255, np.uint8)
    for index, image in enumerate(images):
        row, column = divmod(index, columns)
        y, x = row * (height + gap), column * (width + gap)
        grid[y : y + image.shape[0], x : x + image.shape[1]] = image
    return grid


def write_image(path: str, rgb: np.ndarray, quality: int = 95) -> str:
    """Writes an RGB image (JPEG or PNG by the extension) through a temporary file; returns `path`.

    JPEGs keep full-resolution colour (4:4:4): with the usual 4:2:0 a one-pixel
    box outline loses most of its colour.
    """
    root, extension = os.path.splitext(path)
    temporary = f"{root}.tmp{extension}"
    options = [
        cv2.IMWRITE_JPEG_QUALITY,
        quality,
        cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
        cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
    ]
    if not cv2.imwrite(temporary, cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), options):
        raise OSError(f"cannot write {path}")
    os.replace(temporary, path)
    return path
