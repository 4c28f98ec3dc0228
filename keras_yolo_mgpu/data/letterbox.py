"""The letterbox: an image scaled to fit the network input, aspect kept, centred on grey.

One geometry, keras-yolo3's (`letterbox_geometry`), and one set of pixels
(`letterbox_array`) for validation, evaluation, the detector, video, export
inputs and benchmarks, so the same image gives the same pixels on every path;
`letterbox_image` is keras-yolo3's PIL name for it, and the pipeline's cache
uses the two halves (`resize_for_letterbox`, `paste_letterbox`).

The resampler is OpenCV's, fixed per scale: bicubic when enlarging
(keras-yolo3's filter), bilinear for scale >= 0.5, area averaging below
(anti-aliased, like Pillow's bicubic). OpenCV because the detector and the
video path run it on every frame, where it is several times faster than
Pillow; validation adopts it so that the validation loss is measured on the
pixels the deployed model sees. keras-yolo3's Pillow BICUBIC differs by a few
levels at edges, the geometry not at all.

The inverse is keras-yolo3's `yolo_correct_boxes` (`model.boxes`), kept as
keras-yolo3 wrote it: it rounds `nw, nh` and centres without flooring, so it
differs from the exact inverse of this geometry by under one input pixel. The
training augmentation is a different geometry (`data.augment`).
"""

from __future__ import annotations

from typing import NamedTuple

import cv2
import numpy as np
from PIL import Image

from keras_yolo_mgpu.data.images import to_rgb_array

GREY = 128  # keras-yolo3's canvas colour

__all__ = [
    "GREY",
    "LetterboxGeometry",
    "letterbox_array",
    "letterbox_boxes",
    "letterbox_bytes",
    "letterbox_geometry",
    "letterbox_image",
    "paste_letterbox",
    "resize_for_letterbox",
]


class LetterboxGeometry(NamedTuple):
    """Where an image lands in the letterboxed input (image `iw x ih`, input `w x h`).

    Attributes:
        scale: input pixels per image pixel, `min(w / iw, h / ih)`.
        width, height: size of the resized image, `int(iw * scale)`,
            `int(ih * scale)`, at least 1.
        left, top: its offset on the canvas, `(w - width) // 2`, `(h - height) // 2`.
        canvas_width, canvas_height: the input size.
    """

    scale: float
    width: int
    height: int
    left: int
    top: int
    canvas_width: int
    canvas_height: int


def letterbox_geometry(image_size: tuple[int, int], canvas_size: tuple[int, int]) -> LetterboxGeometry:
    """keras-yolo3's letterbox of an image into a canvas (a box's `x` moves to `x * scale + left`).

    Args:
        image_size: (width, height) of the image.
        canvas_size: (width, height) of the network input (PIL order, as
            keras-yolo3's `letterbox_image`).
    """
    (iw, ih), (w, h) = image_size, canvas_size
    scale = min(w / iw, h / ih)
    nw, nh = max(1, int(iw * scale)), max(1, int(ih * scale))
    return LetterboxGeometry(scale, nw, nh, (w - nw) // 2, (h - nh) // 2, w, h)


def letterbox_bytes(image_size: tuple[int, int] | None, canvas_size: tuple[int, int]) -> int:
    """Bytes of an image's RGB pixels at its letterbox size in `canvas_size` (w, h); the whole canvas when unknown."""
    geometry = letterbox_geometry(image_size, canvas_size) if image_size else None
    return 3 * (geometry.width * geometry.height if geometry else canvas_size[0] * canvas_size[1])


def resize_for_letterbox(image: np.ndarray, geometry: LetterboxGeometry) -> np.ndarray:
    """The image resized to `geometry.width x geometry.height` (OpenCV, see module docstring).

    Args:
        image: (ih, iw, C) uint8.

    Returns:
        (height, width, C) uint8; `image` itself when no resize is needed.
    """
    size = (geometry.width, geometry.height)
    if size == (image.shape[1], image.shape[0]):
        return image
    scale = geometry.scale
    interpolation = cv2.INTER_CUBIC if scale > 1 else cv2.INTER_LINEAR if scale >= 0.5 else cv2.INTER_AREA
    return cv2.resize(image, size, interpolation=interpolation)


def paste_letterbox(resized: np.ndarray, geometry: LetterboxGeometry) -> np.ndarray:
    """`resize_for_letterbox`'s output pasted on the grey canvas.

    Returns:
        (canvas_height, canvas_width, C) uint8.
    """
    canvas = np.full((geometry.canvas_height, geometry.canvas_width, resized.shape[2]), GREY, np.uint8)
    top, left = geometry.top, geometry.left
    canvas[top : top + geometry.height, left : left + geometry.width] = resized
    return canvas


def letterbox_array(image: np.ndarray, input_shape: tuple[int, int]) -> np.ndarray:
    """Letterboxes an image array into the network input.

    Args:
        image: (H, W, 3) uint8, RGB (or BGR: channels are not touched).
        input_shape: (height, width) of the network input.

    Returns:
        (height, width, 3) uint8.
    """
    geometry = letterbox_geometry((image.shape[1], image.shape[0]), (input_shape[1], input_shape[0]))
    return paste_letterbox(resize_for_letterbox(image, geometry), geometry)


def letterbox_image(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """keras-yolo3's `letterbox_image`: the same pixels as `letterbox_array`, as a PIL image.

    Args:
        image: a PIL image of any mode (converted as `images.to_rgb_array` does).
        size: (width, height) of the result, keras-yolo3's order.

    Returns:
        An RGB PIL image of `size`.
    """
    return Image.fromarray(letterbox_array(to_rgb_array(image), (size[1], size[0])))


def letterbox_boxes(boxes: np.ndarray, image_size: tuple[int, int], input_shape: tuple[int, int]) -> np.ndarray:
    """Boxes of a letterboxed image: scaled, centred, clipped to the input.

    The geometry is `letterbox_geometry`'s (float64, so `int()` truncates the
    same values); the boxes are moved in float32 (`x * float32(scale) + dx`).
    Boxes left with no width or height are dropped (none are when the boxes
    lie inside the image, which the dataset checker ensures).

    Args:
        boxes: (K, 5) float32 x_min, y_min, x_max, y_max, class in image pixels.
        image_size: (width, height) of the image.
        input_shape: (height, width) of the network input.

    Returns:
        (K', 5) float32 in input pixels, K' <= K, in the original order.
    """
    h, w = input_shape
    geometry = letterbox_geometry((int(image_size[0]), int(image_size[1])), (w, h))
    boxes = np.asarray(boxes, np.float32).reshape(-1, 5)
    scale = np.float32(geometry.scale)
    x = np.clip(boxes[:, 0:4:2] * scale + np.float32(geometry.left), np.float32(0), np.float32(w))
    y = np.clip(boxes[:, 1:4:2] * scale + np.float32(geometry.top), np.float32(0), np.float32(h))
    moved = np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1], boxes[:, 4]], axis=1)
    return moved[(x[:, 1] > x[:, 0]) & (y[:, 1] > y[:, 0])]
