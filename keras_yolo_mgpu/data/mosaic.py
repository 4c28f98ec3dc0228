"""Mosaic (`--mosaic P`): four images combined into one training image.

With probability P a training element becomes a 2 x 2 mosaic: its own image
and three others drawn at random from the dataset, each made into one tile of
half the input's height and width (keras-yolo3's augmentation at the tile
size, or the letterbox with `--no-augment`), with their boxes moved into
the tile. The picture of YOLOv4 / ultralytics' mosaic (more objects per
image, objects at half the size, context cut at the seams) on a fixed grid;
their random centre and the extra crop are left out, the augmentation's own
scale and placement jitter already varies every tile.

Every draw (whether a mosaic, which images, each tile's augmentation) comes
from the element's stateless seed, so the element is a pure function of
(run seed, stream position, index): the same on 1 and N replicas, on any
number of parallel map calls, and after a resume at the same position.
"""

from __future__ import annotations

import tensorflow as tf

from keras_yolo_mgpu.data.augment import pad_boxes

_MOSAIC_STREAM = 7  # fold-in tag of the mosaic's draws within an element's seed


def tile_shape(input_shape: tuple[int, int]) -> tuple[int, int]:
    """(height, width) of one of the four tiles."""
    return input_shape[0] // 2, input_shape[1] // 2


def mosaic_of_four(builder, seed, index):
    """Image `index` and three random others in a 2 x 2 grid: (image, (max_boxes, 5) boxes).

    Args:
        builder: the `DatasetBuilder` (decoding, augmentation, sizes).
        seed: (2,) int64, the mosaic's own seed.
        index: int64 index of the element's image (the top-left tile).
    """
    tile = tile_shape(builder.input_shape)
    others = tf.random.stateless_uniform(
        [3], tf.random.experimental.stateless_fold_in(seed, 0), 0, builder.num_samples, dtype=tf.int64
    )
    indices = tf.concat([tf.reshape(tf.cast(index, tf.int64), [1]), others], axis=0)
    images, boxes = [], []
    for position in range(4):
        tile_seed = tf.random.experimental.stateless_fold_in(seed, position + 1)
        if builder.augment:
            image, tile_boxes = builder.augmented_at(tile_seed, indices[position], tile)
        else:
            # The pipeline's one letterbox (letterbox.letterbox_array's pixels), on the tile's canvas.
            image, tile_boxes, _ = builder.letterbox(indices[position], tile)
        row, column = divmod(position, 2)
        offset = tf.constant([column * tile[1], row * tile[0]] * 2 + [0], tf.float32)
        real = tf.cast(tile_boxes[:, 2] > tile_boxes[:, 0], tf.float32)[:, None]  # padding rows stay zero
        images.append(image)
        boxes.append(tile_boxes + offset * real)
    image = tf.concat([tf.concat(images[:2], axis=1), tf.concat(images[2:], axis=1)], axis=0)
    image = tf.ensure_shape(image, [*builder.input_shape, 3])
    boxes = tf.concat(boxes, axis=0)  # (4 * max_boxes, 5)
    boxes = tf.boolean_mask(boxes, boxes[:, 2] > boxes[:, 0])
    # More boxes than max_boxes: keep a random subset, as the augmentation does.
    order = tf.argsort(
        tf.random.stateless_uniform([tf.shape(boxes)[0]], tf.random.experimental.stateless_fold_in(seed, 9))
    )
    return image, pad_boxes(tf.gather(boxes, order), builder.max_boxes)


def mosaic_element(builder, element, position, index):
    """`element(position, index)`, or with probability `builder.mosaic` a mosaic of four.

    Args:
        builder: the `DatasetBuilder`.
        element: the plain element function (augmented or letterboxed).
        position: int64 stream position (seeds every draw).
        index: int64 image index.

    Returns:
        (image (h, w, 3) float32 in [0, 1], (max_boxes, 5) boxes).
    """
    seed = tf.random.experimental.stateless_fold_in(builder.element_seed(position), _MOSAIC_STREAM)
    use_mosaic = tf.random.stateless_uniform([], tf.random.experimental.stateless_fold_in(seed, 100)) < builder.mosaic
    return tf.cond(use_mosaic, lambda: mosaic_of_four(builder, seed, index), lambda: element(position, index))
