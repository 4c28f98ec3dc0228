"""Mosaic (`--mosaic P`): four images combined into one training image.

With probability P a training element becomes a 2 x 2 mosaic: its own image
and three others drawn at random from the dataset, each made into one tile of
half the input's height and width (keras-yolo3's augmentation at the tile
size, or the letterbox with `--no-augment`), with their boxes moved into
the tile. YOLOv4 / ultralytics' mosaic on a fixed grid: their random centre
and extra crop are left out, as the augmentation's own scale and placement
jitter already varies every tile.

Every draw comes from the element's stateless seed (`data.host`), and each tile
keeps its own HSV draw (the device jitters per quadrant).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from keras_yolo_mgpu.data import stateless_random
from keras_yolo_mgpu.data.augment import pad_boxes, shuffled_order

_MOSAIC_STREAM = 7  # fold-in tag of the mosaic's draws within an element's seed

__all__ = ["MosaicDraws", "draw_mosaics", "join_tile_boxes", "tile_shape"]


def tile_shape(input_shape: tuple[int, int]) -> tuple[int, int]:
    """(height, width) of one of the four tiles."""
    return input_shape[0] // 2, input_shape[1] // 2


class MosaicDraws(NamedTuple):
    """One element's mosaic draws.

    Attributes:
        seed: (2,) int64, the mosaic's own seed.
        indices: (4,) int64: the element's image (top-left tile), then three drawn at random.
        tile_seeds: (4, 2) int64, each tile's augmentation seed.
    """

    seed: np.ndarray
    indices: np.ndarray
    tile_seeds: np.ndarray


def draw_mosaics(element_seeds, indices, probability: float, num_samples: int) -> list[MosaicDraws | None]:
    """Which elements become mosaics, and their draws.

    Args:
        element_seeds: (B, 2) int64, the elements' seeds.
        indices: (B,) the elements' image indices.
        probability: of a mosaic.
        num_samples: images in the dataset (the others are drawn among them).

    Returns:
        Per element, its `MosaicDraws`, or None for a plain element.
    """
    seeds = stateless_random.fold_in(element_seeds, _MOSAIC_STREAM, "int32")  # (B, 2)
    coins = stateless_random.uniform_float32(stateless_random.fold_in(seeds, 100, "int32"), 1)[:, 0]
    draws = []
    for seed, index, coin in zip(seeds, indices, coins):
        if not coin < np.float32(probability):
            draws.append(None)
            continue
        others = stateless_random.uniform_int64(stateless_random.fold_in(seed, 0, "int32"), 3, 0, num_samples)
        tile_seeds = stateless_random.fold_in(seed, np.arange(1, 5), "int32")
        draws.append(MosaicDraws(seed, np.concatenate([[index], others]).astype(np.int64), tile_seeds))
    return draws


def join_tile_boxes(draws: MosaicDraws, tile_boxes: list[np.ndarray], tile: tuple[int, int], max_boxes: int):
    """The four tiles' boxes moved into their quadrants, a random `max_boxes` of them kept.

    Args:
        draws: the element's `MosaicDraws`.
        tile_boxes: four (max_boxes, 5) float32, each in its tile's pixels (zero rows: padding).
        tile: (height, width) of a tile.

    Returns:
        (max_boxes, 5) float32 in the mosaic's pixels.
    """
    moved = []
    for position, boxes in enumerate(tile_boxes):
        row, column = divmod(position, 2)
        offset = np.array([column * tile[1], row * tile[0]] * 2 + [0], np.float32)
        real = (boxes[:, 2] > boxes[:, 0]).astype(np.float32)[:, None]  # padding rows stay zero
        moved.append(boxes + offset * real)
    boxes = np.concatenate(moved)  # (4 * max_boxes, 5)
    boxes = boxes[boxes[:, 2] > boxes[:, 0]]
    # More boxes than max_boxes: keep a random subset, as the augmentation does.
    order = shuffled_order(stateless_random.fold_in(draws.seed, 9, "int32"), len(boxes))
    return pad_boxes(boxes[order], max_boxes)
