"""Training augmentation with keras-yolo3's distribution: the host's part, in numpy and OpenCV.

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

Here the random numbers are TensorFlow's stateless ones, made in numpy
(`stateless_random`), one seed per stream position, turned into parameters by
the same formulas (`augmentation_params`). The HSV jitter is only drawn here:
it runs on the device (`data.device_side.distort_hsv`). Differences from
keras-yolo3, all deliberate:

- resampling: area averaging for shrinking axes (antialiased, like PIL's
  filters) and bilinear interpolation for growing ones instead of PIL BICUBIC
  on both, in uint8: mean pixel difference ~0.3/255 (tested); a JPEG whose
  resized size is at most half its own is decoded at reduced size (the DCT
  downscale of PIL's `draft`);
- box coordinates stay floats (keras-yolo3 truncated them to integers, a bias
  of up to 1 px towards the top-left);
- HSV is computed in float32 (`keras.ops`, on the device)
  instead of float64 with matplotlib (differences ~1e-6, tested).
"""

from __future__ import annotations

import cv2
import numpy as np

from keras_yolo_mgpu.data import stateless_random
from keras_yolo_mgpu.data.letterbox import GREY

JITTER = 0.3
MIN_SCALE, MAX_SCALE = 0.25, 2.0
HUE, SAT, VAL = 0.1, 1.5, 1.5
NUM_UNIFORMS = 11  # random numbers one augmentation draws

__all__ = [
    "augment_boxes",
    "augmentation_params",
    "box_orders",
    "pad_boxes",
    "place_image",
    "resize_image",
    "sample_augmentation",
    "shuffled_order",
]


# --- random parameters ------------------------------------------------------------


def augmentation_params(uniforms, input_shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """keras-yolo3's augmentation parameters from 11 U(0, 1) numbers per image.

    Args:
        uniforms: (..., 11) float64, consumed in the order of keras-yolo3's
            `rand()` calls: 2 aspect jitter, scale, dx, dy, flip, hue, then
            (coin, factor) for saturation and for value.
        input_shape: (height, width) of the canvas.

    Returns:
        Arrays of shape (...): int32 `nw`, `nh`, `dx`, `dy`; bool `flip`;
        float64 `hue`, `sat`, `val`. Python's `int()` truncates towards zero,
        as `astype(int32)` does, on the same float64 values.
    """
    h, w = input_shape
    u = np.moveaxis(np.asarray(uniforms, np.float64), -1, 0)

    def rand(value, a, b):
        return value * (b - a) + a

    new_ar = w / h * rand(u[0], 1 - JITTER, 1 + JITTER) / rand(u[1], 1 - JITTER, 1 + JITTER)
    scale = rand(u[2], MIN_SCALE, MAX_SCALE)
    tall = new_ar < 1
    nh_tall = (scale * h).astype(np.int32)
    nw_wide = (scale * w).astype(np.int32)
    nw = np.maximum(np.where(tall, (nh_tall * new_ar).astype(np.int32), nw_wide), 1)
    nh = np.maximum(np.where(tall, nh_tall, (nw_wide / new_ar).astype(np.int32)), 1)
    sat = rand(u[8], 1.0, SAT)
    val = rand(u[10], 1.0, VAL)
    return {
        "nw": nw,
        "nh": nh,
        "dx": rand(u[3], 0.0, (w - nw).astype(np.float64)).astype(np.int32),
        "dy": rand(u[4], 0.0, (h - nh).astype(np.float64)).astype(np.int32),
        "flip": u[5] < 0.5,
        "hue": rand(u[6], -HUE, HUE),
        "sat": np.where(u[7] < 0.5, sat, 1.0 / sat),
        "val": np.where(u[9] < 0.5, val, 1.0 / val),
    }


def sample_augmentation(seeds, input_shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """Random augmentation parameters, a pure function of each seed ((..., 2) int64)."""
    return augmentation_params(stateless_random.uniform_float64(seeds, NUM_UNIFORMS), input_shape)


def shuffled_order(seed, count: int) -> np.ndarray:
    """A permutation of `count` items drawn from `seed` ((2,) int64): `tf.argsort` of uniforms.

    `tf.argsort` sorts like a stable sort (equal values keep their order), so
    ties, which float32 uniforms have in large sets, fall the same way.
    """
    if count == 0:
        return np.zeros(0, np.int64)
    return np.argsort(stateless_random.uniform_float32(seed, count), kind="stable")


def box_orders(seeds, counts) -> list[np.ndarray]:
    """Each image's box shuffle, from its element seed: `shuffled_order(fold_in(seed, 1), count)`.

    Drawn for all images at once: the first `count` numbers of a stateless
    stream do not depend on how many are drawn.

    Args:
        seeds: (N, 2) int64 element (or tile) seeds.
        counts: N box counts.
    """
    counts = [int(count) for count in counts]
    longest = max(counts, default=0)
    if longest == 0:
        return [np.zeros(0, np.int64) for _ in counts]
    uniforms = stateless_random.uniform_float32(stateless_random.fold_in(seeds, 1, "int32"), longest)
    return [np.argsort(row[:count], kind="stable") for row, count in zip(uniforms, counts)]


# --- the image --------------------------------------------------------------------


def resize_image(pixels: np.ndarray, extent, width: int, height: int) -> np.ndarray:
    """The decoded image resized to `width` x `height` of the whole image's extent.

    Axes that shrink are averaged by area (antialiased, as PIL's bicubic
    averages when it shrinks), axes that grow are interpolated bilinearly
    (bicubic costs more for a barely sharper zoom).

    Args:
        pixels: (H, W, 3) uint8, the decoded image.
        extent: (width, height) float32 of the whole image in `pixels`'
            pixels (W, H, unless it was decoded at reduced scale: the image's
            size over the reduction, not rounded).
        width, height: the size keras-yolo3 resizes the whole image to.

    Returns:
        (height, width, 3) uint8.
    """
    size = np.array(pixels.shape[:2], np.float32)  # (H, W)
    scale = np.array([height, width], np.float32) / np.asarray(extent, np.float32)[::-1]
    if (scale < 1).any():
        shrunk = np.where(scale < 1, np.round(size * scale), size).astype(np.int64)
        pixels = cv2.resize(pixels, (max(int(shrunk[1]), 1), max(int(shrunk[0]), 1)), interpolation=cv2.INTER_AREA)
    if pixels.shape[:2] != (height, width):
        pixels = cv2.resize(pixels, (width, height), interpolation=cv2.INTER_LINEAR)
    return pixels


def place_image(pixels: np.ndarray, extent, params: dict, out: np.ndarray) -> np.ndarray:
    """keras-yolo3's resize to (nw, nh), paste at (dx, dy) on grey, and flip, written into `out`.

    Only the visible window is pasted; with `flip` it is pasted mirrored
    (the whole canvas flipped, as keras-yolo3 flips it).

    Args:
        pixels: (H, W, 3) uint8 decoded image.
        extent: see `resize_image`.
        params: one image's `augmentation_params` (scalars).
        out: (h, w, 3) uint8 canvas to fill (a view into the batch).

    Returns:
        `out`.
    """
    h, w = out.shape[:2]
    nw, nh, dx, dy = int(params["nw"]), int(params["nh"]), int(params["dx"]), int(params["dy"])
    out[...] = GREY
    x0, y0 = min(max(dx, 0), w), min(max(dy, 0), h)
    x1, y1 = min(max(dx + nw, x0), w), min(max(dy + nh, y0), h)
    if x1 <= x0 or y1 <= y0:
        return out  # pasted entirely off the canvas
    window = resize_image(pixels, extent, nw, nh)[y0 - dy : y1 - dy, x0 - dx : x1 - dx]
    if params["flip"]:
        cv2.flip(window, 1, dst=out[y0:y1, w - x1 : w - x0])  # mirrored in the copy
    else:
        out[y0:y1, x0:x1] = window
    return out


# --- boxes ------------------------------------------------------------------------


def pad_boxes(boxes: np.ndarray, max_boxes: int) -> np.ndarray:
    """(K, 5) boxes -> (max_boxes, 5) float32: the first `max_boxes`, zero rows as padding."""
    padded = np.zeros((max_boxes, 5), np.float32)
    boxes = boxes[:max_boxes]
    padded[: len(boxes)] = boxes
    return padded


def augment_boxes(
    boxes: np.ndarray, image_size, params: dict, input_shape: tuple[int, int], max_boxes: int, order
) -> np.ndarray:
    """Moves boxes with the image: shuffle, scale, shift, flip, clip, filter.

    The arithmetic is float32, step by step: `x * float32(nw / iw) + dx`.

    Args:
        boxes: (K, 5) float32 x_min, y_min, x_max, y_max, class in image pixels.
        image_size: (width, height) of the image (as displayed: `data.images`).
        params: one image's `augmentation_params` (scalars).
        max_boxes: boxes kept (a random subset when there are more).
        order: the boxes' shuffle, a permutation of K (`box_orders`).

    Returns:
        (max_boxes, 5) float32 in input pixels, zero rows as padding.
    """
    h, w = input_shape
    boxes = np.asarray(boxes, np.float32).reshape(-1, 5)[np.asarray(order, np.int64)]
    iw, ih = np.float32(image_size[0]), np.float32(image_size[1])
    scale_x, scale_y = np.float32(params["nw"]) / iw, np.float32(params["nh"]) / ih
    x = boxes[:, 0:4:2] * scale_x + np.float32(params["dx"])  # (K, 2) x_min, x_max
    y = boxes[:, 1:4:2] * scale_y + np.float32(params["dy"])
    if params["flip"]:
        x = np.float32(w) - x[:, ::-1]
    # keras-yolo3 clips only mins at 0 and maxes at the far side; a box
    # entirely outside then has a negative size and is dropped below.
    x = np.stack([np.maximum(x[:, 0], np.float32(0)), np.minimum(x[:, 1], np.float32(w))], axis=1)
    y = np.stack([np.maximum(y[:, 0], np.float32(0)), np.minimum(y[:, 1], np.float32(h))], axis=1)
    moved = np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1], boxes[:, 4]], axis=1)
    keep = (x[:, 1] - x[:, 0] > 1) & (y[:, 1] - y[:, 0] > 1)
    return pad_boxes(moved[keep], max_boxes)
