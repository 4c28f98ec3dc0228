"""Training augmentation with keras-yolo3's distribution, and letterboxing.

keras-yolo3's `get_random_data` draws, per image (input `w` x `h`):

- aspect jitter: `new_ar = w/h * U(.7, 1.3) / U(.7, 1.3)`; scale `U(.25, 2)`;
  the image is resized to `nw x nh` (`nh = int(scale*h)`, `nw = int(nh*new_ar)`
  when `new_ar < 1`, else `nw = int(scale*w)`, `nh = int(nw/new_ar)`) with PIL
  BICUBIC;
- placement: pasted at `dx = int(U(0, w-nw))`, `dy = int(U(0, h-nh))` on a grey
  (128) `w x h` canvas, so it may be cut off or leave grey borders;
- horizontal flip with probability .5;
- HSV: hue `+U(-.1, .1)` (wrapped), saturation and value multiplied by
  `U(1, 1.5)` or its reciprocal (each with probability .5), clipped to [0, 1];
- boxes: shuffled, scaled and shifted like the image, flipped, clipped to the
  canvas, dropped when 1 px wide/high or less, at most `max_boxes` kept.

Here the random numbers come from TensorFlow's stateless generators (one
seed per element: deterministic under parallel maps), the same formulas turn
them into parameters (`augmentation_params`, tested against the reference
generator draw for draw), and the boxes are transformed with TF ops. The pixel
work runs in `place_image`/`distort_hsv` (PIL and OpenCV, both release the
GIL, so tf.data's parallel map calls run on all cores); the pixels equal the
reference's up to float rounding (tested). Differences, all deliberate:

- only the visible part of the resized image is computed (PIL `resize(box=)`
  gives the same pixels as resize-then-crop), and a JPEG whose resized size
  is at most half of its own is decoded at reduced size (`draft`, the DCT
  downscale PIL's `thumbnail` uses): a different but antialiased filter;
- box coordinates stay floats (keras-yolo3 truncated them to integers, a bias
  of up to 1 px towards the top-left);
- HSV is computed in float32 with OpenCV instead of float64 with matplotlib
  (differences ~1e-6).
"""
from __future__ import annotations

import logging

import cv2
import numpy as np
import tensorflow as tf
from PIL import Image

logger = logging.getLogger(__name__)

GREY = 128  # keras-yolo3's canvas colour
JITTER = 0.3
MIN_SCALE, MAX_SCALE = 0.25, 2.0
HUE, SAT, VAL = 0.1, 1.5, 1.5
NUM_UNIFORMS = 11  # random numbers one augmentation draws

__all__ = [
    "GREY",
    "augment_boxes",
    "augmentation_params",
    "distort_hsv",
    "letterbox_boxes",
    "letterbox_size",
    "open_image_rgb",
    "place_image",
    "sample_augmentation",
]


# --- images (numpy / PIL / OpenCV; called from tf.numpy_function) ---------


def open_image_rgb(path: str, draft_size: tuple[int, int] | None = None) -> tuple[Image.Image, tuple[int, int], tuple[float, float]]:
    """Decodes an image file to 8-bit RGB.

    Grayscale, palette, CMYK and RGBA images are converted by PIL (alpha is
    dropped, as keras-yolo3 and `letterbox_image` do); 16- and 32-bit integer
    images are scaled to 8 bits (PIL's own conversion would clip them).

    Args:
        path: image file.
        draft_size: (width, height) the image will be shrunk to; a JPEG at
            least twice that size is decoded at 1/2, 1/4 or 1/8 scale.

    Returns:
        (RGB image, (width, height) of the stored image, extent): `extent` is
        the (width, height) of the whole stored image in decoded pixels (the
        stored size, or its fraction when decoded at reduced scale).

    Raises:
        OSError, ValueError, ...: whatever PIL raises for a missing, truncated
        or undecodable file.
    """
    with Image.open(path) as image:
        size = image.size
        extent = (float(size[0]), float(size[1]))
        if draft_size is not None and image.format == "JPEG":
            drafted = image.draft(None, draft_size)
            if drafted is not None:
                extent = drafted[1][2:4]
        image.load()  # full decode: truncated files fail here
        return (image if image.mode == "RGB" else _to_rgb(image)), size, extent


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        pixels = np.asarray(image)
        if image.mode == "F":
            peak = 1.0 if pixels.max(initial=0) <= 1.0 else 255.0
        else:  # integer images: 16-bit unless the values say 8-bit
            peak = 65535.0 if pixels.max(initial=0) > 255 else 255.0
        pixels = np.clip(pixels.astype(np.float32) * (255.0 / peak) + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(pixels, "L").convert("RGB")
    return image.convert("RGB")


def place_image(
    image: Image.Image, extent: tuple[float, float], canvas_size: tuple[int, int], nw: int, nh: int, dx: int, dy: int
) -> Image.Image:
    """keras-yolo3's resize to (nw, nh) + paste at (dx, dy) on a grey canvas.

    Only the visible part is resampled (PIL BICUBIC with the same filter
    positions as a full resize), so a 2x zoom costs no more than 1x.

    Args:
        image: decoded RGB image.
        extent: (width, height) of the whole stored image in `image`'s
            pixels (`image.size` unless it was decoded reduced or cached).
        canvas_size: (width, height) of the network input.
        nw, nh, dx, dy: size and top-left position of the resized image.
    """
    w, h = canvas_size
    canvas = Image.new("RGB", (w, h), (GREY, GREY, GREY))
    x0, y0, x1, y1 = max(dx, 0), max(dy, 0), min(dx + nw, w), min(dy + nh, h)
    if x1 <= x0 or y1 <= y0:
        return canvas
    sx, sy = extent[0] / nw, extent[1] / nh  # decoded pixels per resized pixel
    box = ((x0 - dx) * sx, (y0 - dy) * sy, (x1 - dx) * sx, (y1 - dy) * sy)
    canvas.paste(image.resize((x1 - x0, y1 - y0), Image.BICUBIC, box=box), (x0, y0))
    return canvas


def distort_hsv(image: np.ndarray, hue: float, sat: float, val: float) -> np.ndarray:
    """keras-yolo3's HSV jitter.

    Args:
        image: (h, w, 3) uint8 RGB.
        hue: added to the hue in [0, 1), wrapped.
        sat, val: saturation and value multipliers; results clipped to 1.

    Returns:
        (h, w, 3) float32 RGB in [0, 1].
    """
    # OpenCV's float HSV: H in [0, 360), S in [0, 1], V = max(R, G, B), here
    # in [0, 255]; scaling V by val/255 returns RGB in [0, 1] directly. Its
    # HSV->RGB wraps hues >= 360 (not < 0), so the shift is made positive.
    # One affine pass (shift H, scale S and V), then clip S and V at 1.
    hsv = cv2.cvtColor(image.astype(np.float32), cv2.COLOR_RGB2HSV)
    affine = np.array([[1, 0, 0, hue * 360.0 % 360.0], [0, sat, 0, 0], [0, 0, val / 255.0, 0]], np.float32)
    hsv = cv2.transform(hsv, affine)
    cv2.min(hsv, (720.0, 1.0, 1.0, 0.0), dst=hsv)  # H < 720 untouched
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


def letterbox_size(image_size: tuple[int, int], canvas_size: tuple[int, int]) -> tuple[int, int, int, int]:
    """(nw, nh, dx, dy) of keras-yolo3's letterbox (`letterbox_image`)."""
    (iw, ih), (w, h) = image_size, canvas_size
    scale = min(w / iw, h / ih)
    nw, nh = int(iw * scale), int(ih * scale)
    return nw, nh, (w - nw) // 2, (h - nh) // 2


# --- random parameters and boxes (TensorFlow) -----------------------------


def augmentation_params(uniforms, input_shape: tuple[int, int]) -> dict[str, tf.Tensor]:
    """keras-yolo3's augmentation parameters from 11 U(0, 1) numbers.

    Args:
        uniforms: (11,) float64, consumed in the order of keras-yolo3's
            `rand()` calls: 2 aspect jitter, scale, dx, dy, flip, hue, then
            (coin, factor) for saturation and for value.
        input_shape: (height, width).

    Returns:
        int32 `nw`, `nh`, `dx`, `dy`; bool `flip`; float64 `hue`, `sat`, `val`.
    """
    h, w = input_shape
    u = tf.unstack(tf.cast(uniforms, tf.float64), num=NUM_UNIFORMS)

    def rand(value, a, b):
        return value * (b - a) + a

    def trunc(x):  # Python's int(): towards zero
        return tf.cast(x, tf.int32)

    new_ar = w / h * rand(u[0], 1 - JITTER, 1 + JITTER) / rand(u[1], 1 - JITTER, 1 + JITTER)
    scale = rand(u[2], MIN_SCALE, MAX_SCALE)
    tall = new_ar < 1
    nh_tall = trunc(scale * h)
    nw_wide = trunc(scale * w)
    nw = tf.maximum(tf.where(tall, trunc(tf.cast(nh_tall, tf.float64) * new_ar), nw_wide), 1)
    nh = tf.maximum(tf.where(tall, nh_tall, trunc(tf.cast(nw_wide, tf.float64) / new_ar)), 1)
    dx = trunc(rand(u[3], 0.0, tf.cast(w - nw, tf.float64)))
    dy = trunc(rand(u[4], 0.0, tf.cast(h - nh, tf.float64)))
    sat = rand(u[8], 1.0, SAT)
    val = rand(u[10], 1.0, VAL)
    return {
        "nw": nw,
        "nh": nh,
        "dx": dx,
        "dy": dy,
        "flip": u[5] < 0.5,
        "hue": rand(u[6], -HUE, HUE),
        "sat": tf.where(u[7] < 0.5, sat, 1.0 / sat),
        "val": tf.where(u[9] < 0.5, val, 1.0 / val),
    }


def sample_augmentation(seed, input_shape: tuple[int, int]) -> dict[str, tf.Tensor]:
    """Random augmentation parameters, a pure function of `seed` ((2,) int)."""
    return augmentation_params(tf.random.stateless_uniform([NUM_UNIFORMS], seed, dtype=tf.float64), input_shape)


def _pad_boxes(boxes, max_boxes: int):
    boxes = boxes[:max_boxes]
    return tf.pad(boxes, [[0, max_boxes - tf.shape(boxes)[0]], [0, 0]])


def augment_boxes(boxes, image_size, params, input_shape: tuple[int, int], max_boxes: int, seed):
    """Moves boxes with the image: shuffle, scale, shift, flip, clip, filter.

    Args:
        boxes: (K, 5) float32 x_min, y_min, x_max, y_max, class in image pixels.
        image_size: (2,) int32 (width, height) of the stored image.
        params: from `augmentation_params`.
        max_boxes: boxes kept (a random subset when there are more).
        seed: (2,) int, for the shuffle.

    Returns:
        (max_boxes, 5) float32 in input pixels, zero rows as padding.
    """
    h, w = input_shape
    boxes = tf.gather(boxes, tf.argsort(tf.random.stateless_uniform([tf.shape(boxes)[0]], seed)))
    iw, ih = tf.unstack(tf.cast(image_size, tf.float32))
    scale_x = tf.cast(params["nw"], tf.float32) / iw
    scale_y = tf.cast(params["nh"], tf.float32) / ih
    x = boxes[:, 0:4:2] * scale_x + tf.cast(params["dx"], tf.float32)  # (K, 2) x_min, x_max
    y = boxes[:, 1:4:2] * scale_y + tf.cast(params["dy"], tf.float32)
    x = tf.where(params["flip"], w - x[:, ::-1], x)
    # keras-yolo3 clips only mins at 0 and maxes at the far side; a box
    # entirely outside then has a negative size and is dropped below.
    x = tf.stack([tf.maximum(x[:, 0], 0.0), tf.minimum(x[:, 1], float(w))], axis=1)
    y = tf.stack([tf.maximum(y[:, 0], 0.0), tf.minimum(y[:, 1], float(h))], axis=1)
    boxes = tf.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1], boxes[:, 4]], axis=1)
    keep = tf.logical_and(x[:, 1] - x[:, 0] > 1, y[:, 1] - y[:, 0] > 1)
    return _pad_boxes(tf.boolean_mask(boxes, keep), max_boxes)


def letterbox_boxes(boxes, image_size, input_shape: tuple[int, int], max_boxes: int):
    """Boxes of a letterboxed image: scaled, centred, clipped, first `max_boxes`.

    Boxes that end up with no width or height are dropped (none do when the
    boxes lie inside the image, which the dataset checker ensures).

    Returns:
        (max_boxes, 5) float32 in input pixels, zero rows as padding.
    """
    h, w = input_shape
    iw, ih = tf.unstack(tf.cast(image_size, tf.float64))
    scale = tf.minimum(w / iw, h / ih)
    dx = tf.cast((w - tf.cast(tf.cast(iw * scale, tf.int32), tf.float64)) // 2, tf.float32)
    dy = tf.cast((h - tf.cast(tf.cast(ih * scale, tf.int32), tf.float64)) // 2, tf.float32)
    scale = tf.cast(scale, tf.float32)
    x = tf.clip_by_value(boxes[:, 0:4:2] * scale + dx, 0.0, float(w))
    y = tf.clip_by_value(boxes[:, 1:4:2] * scale + dy, 0.0, float(h))
    boxes = tf.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1], boxes[:, 4]], axis=1)
    keep = tf.logical_and(x[:, 1] > x[:, 0], y[:, 1] > y[:, 0])
    return _pad_boxes(tf.boolean_mask(boxes, keep), max_boxes)
