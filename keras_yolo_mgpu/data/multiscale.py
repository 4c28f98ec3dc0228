"""Multi-scale training (`--multi-scale MIN,MAX`), Darknet's `random=1`.

Every `BLOCK_STEPS` batches the training size changes to a new square size,
a multiple of 32 in [MIN, MAX], a pure function of the run's seed and the
batch's number in the stream (`size_of_batch`): the global batch is made at
that size and then split, so 1 and N replicas see the same sizes.

The host makes each image at MAX x MAX (augmentation or letterbox, as
without multi-scale) and `rescale_batch` shrinks the whole batch to the
step's size (area averaging, boxes scaled alike); the targets are then built
at that size. On TensorFlow the dataset's image and target shapes are
`(B, None, None, ...)`, so Keras traces its train step once for all sizes;
on JAX each size is one compilation (at most (MAX - MIN) / 32 + 1).
Validation keeps `--input-size`.
"""

from __future__ import annotations

import cv2
import numpy as np

from keras_yolo_mgpu.data import stateless_random

# Darknet changes the size every 10 batches.
BLOCK_STEPS = 10
_SIZE_STREAM = 3  # fold-in tag: the size draws' own random stream of the seed


def check_size_range(size_range) -> tuple[int, int]:
    """(MIN, MAX) as ints; ValueError unless multiples of 32 with 32 <= MIN <= MAX."""
    low, high = (int(v) for v in size_range)
    if low % 32 or high % 32 or not 32 <= low <= high:
        raise ValueError(
            f"multi-scale sizes must be multiples of 32 with 32 <= MIN <= MAX. Received: {tuple(size_range)}"
        )
    return low, high


def size_of_batch(seed: int, batch_number: int, size_range) -> int:
    """The training size of batch `batch_number` (0-based, in the stream).

    Args:
        seed: the run's seed.
        batch_number: the global batch's number in the training stream.
        size_range: (MIN, MAX), multiples of 32.
    """
    low, high = check_size_range(size_range)
    base = stateless_random.fold_in(np.array([seed, 0], np.int64), _SIZE_STREAM, "int32")
    block_seed = stateless_random.fold_in(base, int(batch_number) // BLOCK_STEPS)
    return int(stateless_random.uniform_int32(block_seed, 1, low // 32, high // 32 + 1)[0]) * 32


def sizes_of_batches(seed: int, num_batches: int, size_range) -> list[int]:
    """The sizes of the first `num_batches` batches (for logs and tests)."""
    return [size_of_batch(seed, b, size_range) for b in range(num_batches)]


def rescale_batch(images: np.ndarray, boxes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """A batch made at its canvas size -> the step's `size`.

    Args:
        images: (B, C, C, 3) uint8, C = MAX.
        boxes: (B, T, 5) float32 x_min, y_min, x_max, y_max, class in canvas
            pixels; zero rows are padding.
        size: at most C.

    Returns:
        (B, size, size, 3) uint8 images (area averaging) and (B, T, 5) boxes
        in the new pixels; boxes no longer wider and higher than 1 px (the
        pipeline's rule) become padding.
    """
    canvas = images.shape[1]
    if size != canvas:
        images = np.stack([cv2.resize(image, (size, size), interpolation=cv2.INTER_AREA) for image in images])
    scale = np.float32(size) / np.float32(canvas)
    coordinates = boxes[..., :4] * scale
    keep = (coordinates[..., 2] - coordinates[..., 0] > 1) & (coordinates[..., 3] - coordinates[..., 1] > 1)
    boxes = np.concatenate([coordinates, boxes[..., 4:]], axis=-1) * keep.astype(np.float32)[..., None]
    return images, boxes


def first_sizes_message(seed: int, size_range, num_batches: int = 5 * BLOCK_STEPS) -> str:
    """A log line with the first sizes, e.g. 'multi-scale 320-608: 416, 352, ...' (one per block)."""
    sizes = sizes_of_batches(seed, num_batches, size_range)[::BLOCK_STEPS]
    low, high = check_size_range(size_range)
    return f"multi-scale {low}-{high}, a new size every {BLOCK_STEPS} steps: " + ", ".join(map(str, sizes)) + ", ..."


__all__ = [
    "BLOCK_STEPS",
    "check_size_range",
    "first_sizes_message",
    "rescale_batch",
    "size_of_batch",
    "sizes_of_batches",
]
