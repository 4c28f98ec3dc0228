"""Training augmentation with keras-yolo3's distribution.

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
generator draw for draw), and decoding, resizing, placing, flipping and the
boxes are TF ops (no GIL, parallel). The HSV jitter runs in OpenCV
(`distort_hsv`, GIL released), which is 5x faster than TF's HSV kernels.
Differences from keras-yolo3, all deliberate:

- resampling: area averaging for shrinking axes (antialiased, like PIL's
  filters) and bilinear interpolation for growing ones instead of PIL BICUBIC
  on both: mean pixel difference ~0.3/255 (tested); a JPEG whose resized
  size is at most half its own is decoded at reduced size (the DCT
  downscale of PIL's `draft`);
- box coordinates stay floats (keras-yolo3 truncated them to integers, a bias
  of up to 1 px towards the top-left);
- HSV is computed in float32 with OpenCV instead of float64 with matplotlib
  (differences ~1e-6, tested).

Validation and training without augmentation use the letterbox
(`data.letterbox`), a different geometry with no randomness.
"""

from __future__ import annotations

import cv2
import numpy as np
import tensorflow as tf

from keras_yolo_mgpu.data.letterbox import GREY

JITTER = 0.3
MIN_SCALE, MAX_SCALE = 0.25, 2.0
HUE, SAT, VAL = 0.1, 1.5, 1.5
NUM_UNIFORMS = 11  # random numbers one augmentation draws

__all__ = [
    "augment_boxes",
    "augmentation_params",
    "distort_hsv",
    "jpeg_reduction",
    "pad_boxes",
    "place_image",
    "sample_augmentation",
]


# --- images (TF ops) -------------------------------------------------------


def jpeg_reduction(image_size, target_size):
    """log2 of PIL `draft`'s DCT reduction (0..3: 1x, 2x, 4x, 8x) for shrinking
    `image_size` to `target_size`, both (w, h): the largest that keeps the
    decoded image at least as large as the target."""
    scale = tf.minimum(image_size[0] // tf.maximum(target_size[0], 1), image_size[1] // tf.maximum(target_size[1], 1))
    return tf.where(scale >= 8, 3, tf.where(scale >= 4, 2, tf.where(scale >= 2, 1, 0)))


def place_image(image, extent, params, input_shape: tuple[int, int]):
    """keras-yolo3's resize to (nw, nh) + paste at (dx, dy) on a grey canvas, in TF ops.

    keras-yolo3 resizes with PIL BICUBIC, which averages when it shrinks.
    Here axes that shrink are averaged by area (antialiased) and axes that
    grow are interpolated bilinearly (TF's bicubic costs 2x for a barely
    sharper zoom); only the visible window is pasted.

    Args:
        image: (H, W, 3) uint8 decoded image.
        extent: (2,) float32 (width, height) of the whole stored image in
            `image` pixels (W, H unless it was decoded at reduced size).
        params: from `augmentation_params`.
        input_shape: (height, width) of the canvas.

    Returns:
        (height, width, 3) float32 canvas in [0, 255].
    """
    h, w = input_shape
    nw, nh, dx, dy = params["nw"], params["nh"], params["dx"], params["dy"]
    size = tf.shape(image)[:2]
    scale = tf.cast(tf.stack([nh, nw]), tf.float32) / extent[::-1]  # (y, x) resized pixels per decoded pixel
    shrunk = tf.where(scale < 1, tf.cast(tf.round(tf.cast(size, tf.float32) * scale), tf.int32), size)
    image = tf.cond(
        tf.reduce_any(scale < 1),
        lambda: tf.image.resize(image, tf.maximum(shrunk, 1), method="area"),
        lambda: tf.cast(image, tf.float32),
    )
    target = tf.stack([nh, nw])
    image = tf.cond(
        tf.reduce_all(tf.shape(image)[:2] == target),
        lambda: image,
        lambda: tf.image.resize(image, target, method="bilinear"),
    )
    x0, y0 = tf.clip_by_value(dx, 0, w), tf.clip_by_value(dy, 0, h)
    x1, y1 = tf.clip_by_value(dx + nw, x0, w), tf.clip_by_value(dy + nh, y0, h)
    window = image[y0 - dy : y1 - dy, x0 - dx : x1 - dx]
    canvas = tf.pad(window, [[y0, h - y1], [x0, w - x1], [0, 0]], constant_values=float(GREY))
    return tf.clip_by_value(tf.ensure_shape(canvas, [h, w, 3]), 0.0, 255.0)


def distort_hsv(image: np.ndarray, hue: float, sat: float, val: float) -> np.ndarray:
    """keras-yolo3's HSV jitter.

    Args:
        image: (h, w, 3) RGB, uint8 or float in [0, 255].
        hue: added to the hue in [0, 1), wrapped.
        sat, val: saturation and value multipliers; results clipped to 1.

    Returns:
        (h, w, 3) float32 RGB in [0, 1].
    """
    # OpenCV's float HSV: H in [0, 360), S in [0, 1], V = max(R, G, B), here
    # in [0, 255]; scaling V by val/255 returns RGB in [0, 1] directly. Its
    # HSV->RGB wraps hues >= 360 (not < 0), so the shift is made positive.
    # One affine pass (shift H, scale S and V), then clip S and V at 1.
    hsv = cv2.cvtColor(np.asarray(image, dtype=np.float32), cv2.COLOR_RGB2HSV)
    affine = np.array([[1, 0, 0, hue * 360.0 % 360.0], [0, sat, 0, 0], [0, 0, val / 255.0, 0]], np.float32)
    hsv = cv2.transform(hsv, affine)
    cv2.min(hsv, (720.0, 1.0, 1.0, 0.0), dst=hsv)  # H < 720 untouched
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


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


def pad_boxes(boxes, max_boxes: int):
    """(K, 5) boxes -> (max_boxes, 5): the first `max_boxes`, zero rows as padding."""
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
    return pad_boxes(tf.boolean_mask(boxes, keep), max_boxes)
