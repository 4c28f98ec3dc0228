"""tf.data input pipeline: decode, augment, build targets, batch, prefetch.

    annotations = read_annotations("train.txt")            # or check_annotations(...).annotations
    train = make_dataset(annotations, (416, 416), anchors, num_classes, 32, training=True, seed=0)
    model.fit(train, steps_per_epoch=steps_per_epoch(len(annotations), 32), ...)

Elements are `(x, y)` for training and `(x, y, sample_weight)` for
validation: `x = {"image": (B, h, w, 3) float32 in [0, 1], "y_true_0":
(B, h/32, w/32, 3, 5+C), "y_true_1": (B, h/16, ...), ["y_true_2": (B, h/8, ...)]}`,
`y` float32 zeros (B, 1) (the model's output is its loss), `sample_weight`
float32 (B,).

Batches always hold exactly `batch_size` (the global batch) samples, so every
replica of a multi-device run gets the same share:

- training: an endless stream, reshuffled (seeded) on every pass over the
  data and batched with `drop_remainder=True`; one epoch is
  `steps_per_epoch(n, batch_size) = ceil(n / batch_size)` batches, so the last
  batch of an epoch borrows images from the next pass and no image is ever
  left out;
- validation (`training=False`): letterboxed images in file order, one pass;
  the last batch is padded with grey, box-less images of weight 0, and the
  real images all weigh `num_batches * batch_size / n`, so Keras's mean over
  batches of `sum(weight * loss) / batch_size` is exactly the mean loss over
  the n real images.

Training images are read in Python (bytes only) and decoded, resized and
placed by TF ops (the JPEGs and PNGs that TF decodes exactly like
`images.read_image`; `read_image` decodes the rest); the HSV jitter runs in
OpenCV through `tf.numpy_function` (GIL released); random parameters, boxes
and targets are TF ops. Everything runs in parallel maps. Validation images
are read by `images.read_image` and letterboxed by `letterbox.letterbox_array`'s
code: the pixels the detector, evaluation and export inputs get.

An image that fails to decode during training or validation (deleted,
truncated, corrupt since the dataset check) does not stop the run: a warning
names the file once, and the sample becomes a grey image with no boxes (with
weight 0 in validation, so the validation loss is then the sum over the
readable images divided by n; nothing is dropped).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
import os
import threading

import numpy as np
import tensorflow as tf

from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.data.augment import (
    augment_boxes,
    distort_hsv,
    jpeg_reduction,
    pad_boxes,
    place_image,
    sample_augmentation,
)
from keras_yolo_mgpu.data.images import OTHER, read_image, sniff_image
from keras_yolo_mgpu.data.letterbox import (
    GREY,
    letterbox_boxes,
    letterbox_geometry,
    paste_letterbox,
    resize_for_letterbox,
)
from keras_yolo_mgpu.data.mosaic import mosaic_element
from keras_yolo_mgpu.data.multiscale import check_size_range, rescale_batch, size_of_batch
from keras_yolo_mgpu.model.boxes import num_output_layers, output_strides, resolve_masks

logger = logging.getLogger(__name__)

__all__ = ["DatasetBuilder", "build_targets", "make_dataset", "steps_per_epoch"]

_RAM_CACHE_NAMES = ("ram", "memory")
# The RAM cache is shared by every dataset of the process (training stages,
# training and validation): (image path, mtime, size, canvas (w, h)) ->
# (pixels, stored size). The file's mtime and size are part of the key, so an
# image changed on disk is decoded again.
_ram_cache: dict[tuple[str, int, int, tuple[int, int]], tuple[np.ndarray, tuple[int, int]]] = {}
# Files already reported as unreadable: warn once per file, not once per use.
_warned_paths: set[str] = set()
_warned_lock = threading.Lock()


def steps_per_epoch(num_samples: int, batch_size: int) -> int:
    """Batches per epoch: `ceil(num_samples / batch_size)` (see module docstring)."""
    if num_samples <= 0 or batch_size <= 0:
        raise ValueError(f"`num_samples` and `batch_size` must be positive. Received: {num_samples}, {batch_size}")
    return math.ceil(num_samples / batch_size)


# --- targets -----------------------------------------------------------------


def build_targets(
    boxes, input_shape: tuple[int, int], anchors, num_classes: int, masks=None, iou_thresh: float | None = None
) -> list[tf.Tensor]:
    """`targets.preprocess_true_boxes` with vectorised TF ops (same numbers).

    Args:
        boxes: (B, T, 5) float32 x_min, y_min, x_max, y_max, class_id in
            input pixels; rows of zero width are padding.
        input_shape: (height, width), multiples of 32: Python ints, or int32
            scalar tensors when the size changes per batch (multi-scale).
        anchors: (num_anchors, 2) (w, h) in input pixels; 9 or 6 anchors.
        num_classes: number of classes.
        masks: anchor indices per scale (default keras-yolo3's, see
            `boxes.resolve_masks`).
        iou_thresh: Darknet's `iou_thresh`: a box also goes to every other
            anchor of the masks with IoU above it (None: the best anchor only).

    Returns:
        One float32 tensor per output scale, coarsest first, of shape
        (B, height/stride, width/stride, 3, 5 + num_classes).

    keras-yolo3's quirks are reproduced: centre `(x_min + x_max) // 2`; a
    later box in the same cell and anchor wins xywh and objectness while
    the class bits of all of them stay set; a box whose best anchor is in no
    mask (anchor 0 with tiny masks) gets no target, one in two masks gets two.
    The arithmetic follows the numpy version's dtypes step by step (float32,
    cell index in float64) so the results are bitwise equal.
    """
    anchors = np.asarray(anchors, dtype=np.float32)
    num_layers = num_output_layers(len(anchors))
    masks = resolve_masks(masks, len(anchors))
    height, width = input_shape
    boxes = tf.convert_to_tensor(boxes, tf.float32)
    batch, num_boxes = tf.shape(boxes)[0], tf.shape(boxes)[1]

    input_wh = tf.cast(tf.stack([width, height]), tf.float32)
    boxes_xy = tf.math.floordiv(boxes[..., 0:2] + boxes[..., 2:4], 2.0)  # (B, T, 2)
    boxes_wh = boxes[..., 2:4] - boxes[..., 0:2]
    rel_xywh = tf.concat([boxes_xy / input_wh, boxes_wh / input_wh], axis=-1)  # (B, T, 4)
    valid = boxes_wh[..., 0] > 0  # (B, T)

    # Best anchor by IoU of centred boxes, first index on ties (np.argmax).
    wh = boxes_wh[..., None, :]  # (B, T, 1, 2)
    anchor_maxes = tf.constant(anchors / 2.0)  # (A, 2)
    intersect_wh = tf.maximum(tf.minimum(wh / 2.0, anchor_maxes) - tf.maximum(-wh / 2.0, -anchor_maxes), 0.0)
    intersect_area = intersect_wh[..., 0] * intersect_wh[..., 1]  # (B, T, A)
    box_area = wh[..., 0] * wh[..., 1]  # (B, T, 1)
    anchor_area = tf.constant(anchors[:, 0] * anchors[:, 1])  # (A,)
    iou = intersect_area / (box_area + anchor_area - intersect_area)
    is_best = tf.equal(iou, tf.reduce_max(iou, axis=-1, keepdims=True))
    anchor_ids = tf.range(len(anchors), dtype=tf.int32)
    best_anchor = tf.reduce_min(tf.where(is_best, anchor_ids, len(anchors)), axis=-1)  # (B, T)

    classes = tf.cast(boxes[..., 4], tf.int32)
    batch_ids = tf.broadcast_to(tf.range(batch)[:, None], [batch, num_boxes])
    # later[b, t, u]: box u comes after box t in the same image.
    later = tf.range(num_boxes)[None, :] > tf.range(num_boxes)[:, None]
    values = tf.concat([rel_xywh, tf.ones_like(rel_xywh[..., :1])], axis=-1)  # (B, T, 5)

    # numpy multiplies a float32 scalar by an int32 scalar in float64.
    x64, y64 = tf.cast(rel_xywh[..., 0], tf.float64), tf.cast(rel_xywh[..., 1], tf.float64)
    y_true = []
    for layer, stride in enumerate(output_strides(num_layers)):
        grid_h, grid_w = height // stride, width // stride
        i = tf.clip_by_value(tf.cast(tf.floor(x64 * tf.cast(grid_w, tf.float64)), tf.int32), 0, grid_w - 1)
        j = tf.clip_by_value(tf.cast(tf.floor(y64 * tf.cast(grid_h, tf.float64)), tf.int32), 0, grid_h - 1)
        cell = j * grid_w + i  # (B, T); the clips only matter for out-of-image boxes
        indices = tf.stack([batch_ids, j, i], axis=-1)  # (B, T, 3)
        box_parts, class_parts = [], []
        for anchor in masks[layer]:  # one slot per anchor of the scale
            assigned = tf.equal(best_anchor, anchor)
            if iou_thresh is not None and iou_thresh < 1.0:
                assigned = tf.logical_or(assigned, iou[..., anchor] > iou_thresh)
            assigned = tf.logical_and(valid, assigned)  # (B, T)
            # Last box wins: drop a box when a later box takes its cell at this anchor.
            same_cell = tf.logical_and(tf.equal(cell[..., :, None], cell[..., None, :]), assigned[..., None, :])
            overwritten = tf.reduce_any(tf.logical_and(same_cell, later), axis=-1)
            winner = tf.logical_and(assigned, tf.logical_not(overwritten))
            box_parts.append(
                tf.scatter_nd(
                    tf.boolean_mask(indices, winner),
                    tf.boolean_mask(values, winner),
                    tf.stack([batch, grid_h, grid_w, 5]),
                )
            )
            one_hot = tf.one_hot(tf.boolean_mask(classes, assigned), num_classes, dtype=tf.float32)
            class_shape = tf.stack([batch, grid_h, grid_w, num_classes])
            class_parts.append(tf.minimum(tf.scatter_nd(tf.boolean_mask(indices, assigned), one_hot, class_shape), 1.0))
        y_true.append(tf.concat([tf.stack(box_parts, axis=3), tf.stack(class_parts, axis=3)], axis=-1))
    return y_true


# --- images -------------------------------------------------------------------


class _ImageSource:
    """Reads a dataset's images by index, with an optional RAM or disk cache.

    Its methods run in `tf.numpy_function` calls, so in several threads at
    once. Without a cache, training reads the file bytes here and TF decodes
    the JPEGs and PNGs it reads like `images.read_image` (see
    `images.sniff_image`); `read_image` decodes the rest. Validation and the
    caches decode with `read_image`. Cached images are stored resized to
    their letterbox size (`letterbox.resize_for_letterbox`): validation pastes
    them unchanged, augmentation resamples them (a
    zoom beyond 1x is then a little softer than from the file). The RAM cache
    lives as long as the process and is shared by all its datasets; both
    caches key an entry by the image's path, mtime and size and the input
    size, so a changed image is decoded again.
    """

    def __init__(self, paths: list[str], input_shape: tuple[int, int], cache: str | None):
        self.paths = paths
        self.canvas_size = (input_shape[1], input_shape[0])  # PIL order (w, h)
        self.ram = cache in _RAM_CACHE_NAMES
        self.cache_dir = None if cache is None or self.ram else os.fspath(cache)
        if self.cache_dir is not None:
            os.makedirs(self.cache_dir, exist_ok=True)

    @property
    def cached(self) -> bool:
        return self.ram or self.cache_dir is not None

    def _cache_file(self, path: str) -> str:
        stat = os.stat(path)
        # v2: resized by the OpenCV letterbox (v1 entries, Pillow-resized, are not reused).
        key = f"{os.path.abspath(path)}|{stat.st_mtime_ns}|{stat.st_size}|{self.canvas_size}|v2"
        return os.path.join(self.cache_dir, hashlib.sha1(key.encode()).hexdigest() + ".bin")

    def _decode(self, index: int) -> tuple[np.ndarray, tuple[int, int]]:
        """`images.read_image` through the cache: ((H, W, 3) uint8, stored (w, h))."""
        path = self.paths[index]
        if not self.cached:
            pixels = read_image(path)
            return pixels, (pixels.shape[1], pixels.shape[0])
        ram_key = None
        if self.ram:
            stat = os.stat(path)
            ram_key = (os.path.abspath(path), stat.st_mtime_ns, stat.st_size, self.canvas_size)
            if ram_key in _ram_cache:
                return _ram_cache[ram_key]
        cache_file = self._cache_file(path) if self.cache_dir is not None else None
        if cache_file is not None and os.path.exists(cache_file):
            header = np.fromfile(cache_file, dtype=np.int32, count=4)
            pixels = np.fromfile(cache_file, dtype=np.uint8, offset=16).reshape(header[3], header[2], 3)
            return pixels, (int(header[0]), int(header[1]))
        pixels = read_image(path)
        size = (pixels.shape[1], pixels.shape[0])
        pixels = resize_for_letterbox(pixels, letterbox_geometry(size, self.canvas_size))
        if self.ram:
            _ram_cache[ram_key] = (pixels, size)
        else:
            temporary = f"{cache_file}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(temporary, "wb") as f:
                f.write(np.array([*size, pixels.shape[1], pixels.shape[0]], np.int32).tobytes())
                f.write(pixels.tobytes())
            os.replace(temporary, cache_file)  # atomic: readers never see half a file
        return pixels, size

    def _failed(self, index: int, error: Exception):
        path = self.paths[index]
        with _warned_lock:
            first = path not in _warned_paths
            _warned_paths.add(path)
        if first:
            logger.warning(
                "cannot read image %s (%s: %s); using a grey image with no boxes in its place",
                path,
                type(error).__name__,
                error,
            )

    # The tf.numpy_function bodies.

    def read(self, index):
        """-> (file bytes, decoder kind, stored (w, h) int32) for TF to decode.

        The kind is `images.JPEG`/`PNG` (TF decodes the bytes), `OTHER`
        (call `decode`) or -1: the file cannot be read (warned; no bytes).
        """
        try:
            with open(self.paths[int(index)], "rb") as f:
                data = f.read()
        except OSError as error:
            self._failed(int(index), error)
            return b"", np.int32(-1), np.zeros(2, np.int32)
        kind, width, height = sniff_image(data)
        return (data if kind != OTHER else b""), np.int32(kind), np.array([width, height], np.int32)

    def decode(self, index):
        """-> ((H, W, 3) uint8 RGB, stored (w, h) int32, ok); a grey pixel when not ok."""
        try:
            pixels, size = self._decode(int(index))
            return pixels, np.array(size, np.int32), np.bool_(True)
        except Exception as error:  # noqa: BLE001 - one bad file must not end the run
            self._failed(int(index), error)
            return np.full((1, 1, 3), GREY, np.uint8), np.zeros(2, np.int32), np.bool_(False)

    def letterboxed(self, index, canvas_size=None):
        """-> (h, w, 3) uint8 letterboxed image (`letterbox.letterbox_array`'s pixels), stored (w, h) int32, ok.

        `canvas_size`: (w, h) of another canvas than the input's (a mosaic
        tile). Cached images are stored resized for the input's canvas; on
        another canvas they are resized again from that copy.
        """
        canvas = self.canvas_size if canvas_size is None else (int(canvas_size[0]), int(canvas_size[1]))
        pixels, size, ok = self.decode(index)
        if not ok:
            return np.full((canvas[1], canvas[0], 3), GREY, np.uint8), size, ok
        geometry = letterbox_geometry(tuple(size), canvas)
        if not self.cached or canvas != self.canvas_size:  # cached images are stored resized
            pixels = resize_for_letterbox(pixels, geometry)
        return paste_letterbox(pixels, geometry), size, ok


def decode_jpeg_tf(data, log2_ratio=0):
    """A file `images.sniff_image` calls `JPEG`, decoded by TF at 1/2**log2_ratio scale.

    At full scale (`log2_ratio` 0) the pixels equal `images.read_image`'s:
    INTEGER_ACCURATE is libjpeg's default IDCT, the one Pillow uses.

    Returns:
        (H, W, 3) uint8 RGB.
    """
    branches = [
        lambda r=r: tf.io.decode_jpeg(data, channels=3, ratio=r, dct_method="INTEGER_ACCURATE") for r in (1, 2, 4, 8)
    ]
    return tf.switch_case(tf.convert_to_tensor(log2_ratio, tf.int32), branches)


def decode_png_tf(data):
    """A file `images.sniff_image` calls `PNG`, decoded by TF: (H, W, 3) uint8, equal to `images.read_image`'s."""
    return tf.io.decode_png(data, channels=3, dtype=tf.uint8)


def _distort_hsv(image, hue, sat, val):
    return distort_hsv(image, float(hue), float(sat), float(val))


# --- the dataset ---------------------------------------------------------------


def element_seed(seed: int, position):
    """Stateless seed of the `position`-th training element (augmentation, box shuffle)."""
    augment_seed = tf.random.experimental.stateless_fold_in(tf.constant([seed, 0], tf.int64), 2)
    # The seed's dtype follows the folded-in value's: always int64.
    return tf.random.experimental.stateless_fold_in(augment_seed, tf.cast(position, tf.int64))


def shuffled_indices(num_samples: int, seed, start_position: int = 0) -> tf.data.Dataset:
    """Endless stream of indices, a fresh permutation (a function of `seed`) per pass, from `start_position`."""

    def permutation(epoch):
        epoch_seed = tf.random.experimental.stateless_fold_in(seed, epoch)
        return tf.data.Dataset.from_tensor_slices(tf.argsort(tf.random.stateless_uniform([num_samples], epoch_seed)))

    # Element p of the stream is element p % n of pass p // n: start at that
    # pass and skip into it instead of replaying the passes before.
    first_pass, offset = divmod(start_position, num_samples)
    return tf.data.Dataset.counter(start=first_pass).flat_map(permutation).skip(offset)


@dataclasses.dataclass(eq=False, repr=False)  # the repr would list every annotation
class DatasetBuilder:
    """`make_dataset`'s pipeline as named steps, each callable (and testable) alone.

    `build()` chains them:

    1. index stream: `training_indices` yields `(position, index)`, the
       position counting elements since the start of training (it seeds the
       element) and the index naming the annotation; `validation_indices`
       yields indices in file order, padded to whole batches.
    2. per element (in parallel maps): `element_seed(position)` ->
       `sample_augmentation` -> `decode` -> `augment_image` +
       `augment_boxes` (`augmented_element`), or the letterbox
       (`letterboxed_element`, `validation_element`).
    3. `batch`: exactly `batch_size` elements per batch.
    4. `to_model_inputs`: targets per output scale, the model's dict input.

    The start position (a later stage, a resumed run) changes only the index
    stream, as a per-worker shard would; mosaic is an element step reading
    several indices; multi-scale changes `input_shape` per batch between
    steps 3 and 4.

    Attributes: `make_dataset`'s arguments; `seed` is drawn at random when None.
    """

    annotations: list[Annotation]
    input_shape: tuple[int, int]
    anchors: np.ndarray
    num_classes: int
    batch_size: int
    _: dataclasses.KW_ONLY
    training: bool
    augment: bool = True
    seed: int | None = None
    max_boxes: int = 20
    cache: str | None = None
    masks: list[list[int]] | None = None
    start_position: int = 0
    num_shards: int = 1
    shard_index: int = 0
    multi_scale: tuple[int, int] | None = None
    mosaic: float = 0.0
    iou_thresh: float | None = None

    def __post_init__(self):
        self._check_arguments()
        self.input_shape = (int(self.input_shape[0]), int(self.input_shape[1]))
        if self.multi_scale is not None:
            # Images are made at the largest size, then each batch shrinks to its step's size.
            low, high = check_size_range(self.multi_scale)
            self.multi_scale = (low, high)
            self.input_shape = (high, high)
        self.anchors = np.asarray(self.anchors, dtype=np.float32)
        self.masks = resolve_masks(self.masks, len(self.anchors))  # also validates the anchor count
        if self.seed is None:
            self.seed = int.from_bytes(os.urandom(4), "little")
            logger.debug("make_dataset: random seed %d", self.seed)
        self.num_samples = len(self.annotations)
        self.source = _ImageSource([a.image_path for a in self.annotations], self.input_shape, self.cache)
        # Boxes of all images, flat, with row splits: boxes of image i are rows splits[i]:splits[i + 1].
        boxes = [a.boxes for a in self.annotations]
        self._flat_boxes = tf.constant(np.concatenate(boxes).reshape(-1, 5), tf.float32)
        self._row_splits = tf.constant(np.cumsum([0] + [len(b) for b in boxes]), tf.int64)

    def _check_arguments(self):
        """ValueError naming the first bad argument (or annotation line)."""
        input_shape, batch_size, max_boxes = self.input_shape, self.batch_size, self.max_boxes
        num_classes = self.num_classes
        if not self.annotations:
            raise ValueError("`annotations` is empty: no image to build a dataset from")
        if len(input_shape) != 2 or any(int(s) <= 0 or int(s) % 32 for s in input_shape):
            raise ValueError(
                f"`input_shape` must be (height, width), positive multiples of 32. Received: input_shape={input_shape}"
            )
        if batch_size <= 0 or max_boxes <= 0 or num_classes <= 0:
            raise ValueError(
                f"`batch_size`, `max_boxes` and `num_classes` must be positive. "
                f"Received: batch_size={batch_size}, max_boxes={max_boxes}, num_classes={num_classes}"
            )
        if (self.multi_scale is not None or self.mosaic) and not self.training:
            raise ValueError("multi-scale and mosaic are for training datasets; validation keeps one size")
        if not 0.0 <= self.mosaic <= 1.0:
            raise ValueError(f"`mosaic` is a probability in [0, 1]. Received: mosaic={self.mosaic}")
        if self.iou_thresh is not None and not 0.0 < self.iou_thresh <= 1.0:
            raise ValueError(f"`iou_thresh` must be in (0, 1] (1: best anchor only). Received: {self.iou_thresh}")
        if self.cache is not None and not isinstance(self.cache, (str, os.PathLike)):
            raise ValueError(f"`cache` must be None, 'ram' or a directory path. Received: cache={self.cache!r}")
        if self.start_position < 0 or (self.start_position and not self.training):
            raise ValueError(
                f"`start_position` must be >= 0, and is for training streams only. "
                f"Received: start_position={self.start_position}, training={self.training}"
            )
        if not 0 <= self.shard_index < self.num_shards or batch_size % self.num_shards:
            raise ValueError(
                f"`num_shards` must divide `batch_size` and 0 <= `shard_index` < `num_shards`. Received: "
                f"batch_size={batch_size}, num_shards={self.num_shards}, shard_index={self.shard_index}"
            )
        if self.num_shards > 1 and not self.training:
            raise ValueError("`num_shards` > 1 is for training streams only (validation is sharded by Keras)")
        for annotation in self.annotations:
            classes = annotation.boxes[:, 4]
            bad = classes[(classes < 0) | (classes >= num_classes)]
            if len(bad):
                raise ValueError(
                    f"{annotation.source}:{annotation.line_number}: class id {int(bad[0])} is out of range "
                    f"for {num_classes} classes (run keras_yolo_mgpu.data.check)"
                )

    # --- 1. index stream ---------------------------------------------------------

    def training_indices(self) -> tf.data.Dataset:
        """Endless `(position, index)` int64 pairs, reshuffled every pass, from `start_position`."""
        shuffle_seed = tf.random.experimental.stateless_fold_in(tf.constant([self.seed, 0], tf.int64), 1)
        indices = shuffled_indices(self.num_samples, shuffle_seed, self.start_position).enumerate(
            start=self.start_position
        )
        if self.num_shards > 1:
            # Keep this shard's slice of every global batch before any image
            # is read: the other slices are other workers' to decode.
            slice_size = self.batch_size // self.num_shards
            indices = indices.filter(
                lambda position, index: (position % self.batch_size) // slice_size == self.shard_index
            )
        return indices

    def num_validation_batches(self) -> int:
        return steps_per_epoch(self.num_samples, self.batch_size)

    def validation_indices(self) -> tf.data.Dataset:
        """0, 1, ... up to whole batches; indices >= `num_samples` are padding."""
        return tf.data.Dataset.range(self.num_validation_batches() * self.batch_size)

    # --- 2. elements -------------------------------------------------------------

    def element_seed(self, position):
        """(2,) int64 stateless seed of the `position`-th training element."""
        return element_seed(self.seed, position)

    def boxes_of(self, index):
        """(K, 5) float32 boxes of image `index`, in image pixels."""
        return self._flat_boxes[self._row_splits[index] : self._row_splits[index + 1]]

    def _boxes_if_decoded(self, index, size, ok):
        """The image's boxes and its size (>= 1), or no boxes when it failed to decode (no size)."""
        size.set_shape([2])
        ok.set_shape([])
        boxes = self.boxes_of(index)
        return boxes[: tf.shape(boxes)[0] * tf.cast(ok, tf.int32)], tf.maximum(size, 1)

    def letterbox(self, index, input_shape: tuple[int, int] | None = None):
        """-> (h, w, 3) float32 letterboxed image in [0, 1], (max_boxes, 5) boxes, ok.

        `input_shape`: (h, w) of the canvas (default: the input's; a mosaic tile's is smaller).
        """
        height, width = input_shape = input_shape or self.input_shape
        pixels, size, ok = tf.numpy_function(
            self.source.letterboxed,
            [index, tf.constant([width, height], tf.int32)],
            [tf.uint8, tf.int32, tf.bool],
            name="letterbox_image",
        )
        pixels.set_shape([height, width, 3])
        boxes, size = self._boxes_if_decoded(index, size, ok)
        image = tf.cast(pixels, tf.float32) / 255.0
        return image, pad_boxes(letterbox_boxes(boxes, size, input_shape), self.max_boxes), ok

    def letterboxed_element(self, position, index):
        """Training without augmentation: (image, boxes) of the letterbox."""
        del position  # no randomness
        return self.letterbox(index)[:2]

    def validation_element(self, index):
        """-> (image, boxes, sample weight); a grey, box-less image of weight 0 past the last sample."""
        height, width = self.input_shape
        real_weight = self.num_validation_batches() * self.batch_size / self.num_samples

        def real():
            image, boxes, ok = self.letterbox(index)
            return image, boxes, tf.where(ok, real_weight, 0.0)

        def blank():
            return tf.fill([height, width, 3], GREY / 255.0), tf.zeros([self.max_boxes, 5]), tf.constant(0.0)

        return tf.cond(index < self.num_samples, real, blank)

    def _decode_with_read_image(self, index):
        """-> (H, W, 3) uint8, stored (w, h), extent (w, h) float32 in decoded pixels, ok."""
        pixels, size, ok = tf.numpy_function(
            self.source.decode, [index], [tf.uint8, tf.int32, tf.bool], name="decode_image"
        )
        pixels.set_shape([None, None, 3])
        return pixels, size, tf.cast(tf.shape(pixels)[1::-1], tf.float32), ok

    def _decode_with_tf(self, index, decode, size):
        """TF's `decode()` -> (pixels, extent), guarded: `read_image` takes over when TF raises.

        TF's decoder raises on a file that is corrupt past its header; a
        raising op would end the pipeline, so it runs in a one-element
        dataset that drops errors, and `read_image` (warned with the path
        when it fails too) takes over.
        """

        def attempt_decode(_):
            pixels, extent = decode()
            return pixels, size, extent, tf.constant(True)

        attempt = tf.data.Dataset.from_tensors(0).map(_graph_only(attempt_decode)).ignore_errors()
        fallback = tf.data.Dataset.from_tensors(index).map(_graph_only(self._decode_with_read_image))
        return attempt.concatenate(fallback).take(1).get_single_element()

    def decode(self, index, params):
        """Image `index` for augmentation, decoded at the smallest size `params` allow.

        Returns:
            (H, W, 3) uint8, stored (w, h) int32, extent (w, h) float32 of the
            whole image in decoded pixels (smaller than the stored size when a
            JPEG is decoded at reduced scale), ok.
        """
        if self.source.cached:
            return self._decode_with_read_image(index)
        data, kind, size = tf.numpy_function(
            self.source.read, [index], [tf.string, tf.int32, tf.int32], name="read_image"
        )
        size.set_shape([2])

        def jpeg():
            # Decode at 1/2, 1/4 or 1/8 scale when the image will shrink that much.
            log2_ratio = jpeg_reduction(size, tf.stack([params["nw"], params["nh"]]))
            pixels = decode_jpeg_tf(data, log2_ratio)
            return pixels, tf.cast(size, tf.float32) / tf.cast(2**log2_ratio, tf.float32)

        def png():
            return decode_png_tf(data), tf.cast(size, tf.float32)

        def failed():
            return tf.fill([1, 1, 3], tf.constant(GREY, tf.uint8)), size, tf.ones([2]), tf.constant(False)

        # kind: -1 unreadable (warned), JPEG, PNG, OTHER (read_image).
        return tf.switch_case(
            kind + 1,
            [
                failed,
                lambda: self._decode_with_tf(index, jpeg, size),
                lambda: self._decode_with_tf(index, png, size),
                lambda: self._decode_with_read_image(index),
            ],
        )

    def augment_image(self, pixels, extent, params, input_shape=None):
        """keras-yolo3's resize + placement, flip and HSV jitter -> (h, w, 3) float32 in [0, 1].

        `input_shape` defaults to the dataset's (a mosaic tile passes its own).
        """
        input_shape = input_shape or self.input_shape
        canvas = place_image(pixels, extent, params, input_shape)
        canvas = tf.cond(params["flip"], lambda: tf.reverse(canvas, [1]), lambda: canvas)
        image = tf.numpy_function(
            _distort_hsv, [canvas, params["hue"], params["sat"], params["val"]], tf.float32, name="distort_hsv"
        )
        image.set_shape([*input_shape, 3])
        return image

    def augmented_element(self, position, index):
        """Training with augmentation: (image, boxes), a pure function of (seed, position, index)."""
        return self.augmented_at(self.element_seed(position), index, self.input_shape)

    def augmented_at(self, seed, index, input_shape):
        """Image `index` augmented with the draws of `seed` into an `input_shape` canvas: (image, boxes)."""
        params = sample_augmentation(seed, input_shape)
        pixels, size, extent, ok = self.decode(index, params)
        image = self.augment_image(pixels, extent, params, input_shape)
        boxes, size = self._boxes_if_decoded(index, size, ok)
        box_seed = tf.random.experimental.stateless_fold_in(seed, 1)
        return image, augment_boxes(boxes, size, params, input_shape, self.max_boxes, box_seed)

    # --- 3. batches, 4. targets ----------------------------------------------------

    @property
    def shard_batch_size(self) -> int:
        """Elements per batch this pipeline yields: the global batch over `num_shards`."""
        return self.batch_size // self.num_shards

    def batch(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """Batches of exactly `shard_batch_size` (the global batch with one shard)."""
        return dataset.batch(self.shard_batch_size, drop_remainder=True)

    def rescale_to_step_size(self, images, boxes, positions):
        """Multi-scale: the batch shrunk to the size of its step (`multiscale.size_of_batch`).

        The batch number comes from the elements' stream positions, so it
        follows the stream wherever it starts.
        """
        size = size_of_batch(self.seed, positions[0] // self.batch_size, self.multi_scale)
        return rescale_batch(images, boxes, size)

    def to_model_inputs(self, images, boxes, *weights):
        """A batch of (images, boxes[, weights]) -> ({"image", "y_true_0", ...}, zeros[, weights])."""
        x = {"image": images}
        # Multi-scale batches come in several sizes: targets at the batch's own.
        input_shape = (tf.shape(images)[1], tf.shape(images)[2]) if self.multi_scale else self.input_shape
        targets = build_targets(boxes, input_shape, self.anchors, self.num_classes, self.masks, self.iou_thresh)
        for layer, y_true in enumerate(targets):
            x[f"y_true_{layer}"] = y_true
        y = tf.zeros([self.shard_batch_size, 1], tf.float32)
        return (x, y, *weights)

    def build(self) -> tf.data.Dataset:
        """The whole pipeline (see the class docstring)."""
        if self.training:
            element = self.augmented_element if self.augment else self.letterboxed_element
            if self.mosaic:
                element = functools.partial(mosaic_element, self, element)
            if self.multi_scale:
                element = _with_position(element)
            dataset = self.training_indices().map(_graph_only(element), num_parallel_calls=tf.data.AUTOTUNE)
        else:
            dataset = self.validation_indices().map(
                _graph_only(self.validation_element), num_parallel_calls=tf.data.AUTOTUNE
            )
        dataset = self.batch(dataset)
        if self.training and self.multi_scale:
            dataset = dataset.map(_graph_only(self.rescale_to_step_size), num_parallel_calls=tf.data.AUTOTUNE)
        dataset = dataset.map(_graph_only(self.to_model_inputs), num_parallel_calls=tf.data.AUTOTUNE)
        return dataset.prefetch(tf.data.AUTOTUNE)


def _graph_only(function):
    """`function` for `Dataset.map` without AutoGraph's source conversion.

    The pipeline's functions are written with TF control flow (`tf.cond`,
    `tf.where`), so converting their Python source buys nothing; it cost
    ~1.5 s of every `make_dataset` call on the 2-core machine (`bench
    pipeline`: the pipeline ready after its first batch in 0.9-1.0 s instead
    of 2.4-2.6 s; BENCHMARKS.md), paid at every `train.py` start and stage.
    """
    return tf.autograph.experimental.do_not_convert(function)


def _with_position(element):
    """`element(position, index)` that also returns its position (multi-scale reads it per batch)."""

    def element_and_position(position, index):
        return (*element(position, index), position)

    return element_and_position


def make_dataset(
    annotations: list[Annotation],
    input_shape: tuple[int, int],
    anchors: np.ndarray,
    num_classes: int,
    batch_size: int,
    *,
    training: bool,
    augment: bool = True,
    seed: int | None = None,
    max_boxes: int = 20,
    cache: str | None = None,
    masks=None,
    start_position: int = 0,
    num_shards: int = 1,
    shard_index: int = 0,
    multi_scale: tuple[int, int] | None = None,
    mosaic: float = 0.0,
    iou_thresh: float | None = None,
) -> tf.data.Dataset:
    """Builds the training or validation dataset (see the module docstring).

    Args:
        annotations: the images and boxes, e.g. `read_annotations(path)` or
            the good lines of `check_dataset.check_annotations(...)`.
        input_shape: (height, width), multiples of 32.
        anchors: (9, 2) or (6, 2) anchors, (w, h) in input pixels.
        num_classes: number of classes; class ids outside raise ValueError.
        batch_size: the GLOBAL batch size; every batch has exactly this many.
        training: endless shuffled stream (True) or one ordered, padded
            validation pass (False).
        augment: with `training`, keras-yolo3's random augmentation;
            otherwise letterbox only. Validation is never augmented.
        seed: makes shuffling and augmentation reproducible (default: random).
        max_boxes: boxes kept per image (a random subset in training, the
            first ones in validation).
        cache: None, "ram", or a directory for decoded images at letterbox
            size (see `_ImageSource`). RAM: about h*w*3 bytes per image for
            the life of the process (shared by training stages and the
            validation set). A directory may be reused between runs.
        masks: anchor indices per scale for the targets (default
            keras-yolo3's); must be the loss's masks.
        start_position: training only: the stream element to start at, so
            a later stage or a resumed run continues the stream where it
            stopped (the images drawn so far; element `p` is always the same
            image with the same augmentation for a given seed).
        num_shards, shard_index: training only: build only the
            `shard_index`-th of `num_shards` equal, contiguous slices of every
            global batch (one per input pipeline of a multi-worker cluster, see
            `distribute_training_dataset`); batches then hold
            `batch_size // num_shards` elements and only those images are read.
        multi_scale: training only: (MIN, MAX), a new square size every 10
            steps (`data.multiscale`); images and targets are then
            (B, None, None, ...) and `input_shape` is not used.
        mosaic: training only: probability that an element is a mosaic of
            four images (`data.mosaic`).
        iou_thresh: Darknet's `iou_thresh` for the targets: a box also goes
            to every other anchor of the masks with IoU above it
            (`build_targets`); None: its best anchor only (keras-yolo3).

    Returns:
        A `tf.data.Dataset` of `(x, y)` (training) or `(x, y, sample_weight)`.
    """
    return DatasetBuilder(
        annotations,
        input_shape,
        anchors,
        num_classes,
        batch_size,
        training=training,
        augment=augment,
        seed=seed,
        max_boxes=max_boxes,
        cache=cache,
        masks=masks,
        start_position=start_position,
        num_shards=num_shards,
        shard_index=shard_index,
        multi_scale=multi_scale,
        mosaic=mosaic,
        iou_thresh=iou_thresh,
    ).build()


def distribute_training_dataset(strategy, annotations, input_shape, anchors, num_classes, batch_size, **kwargs):
    """The training stream for `strategy`, each input pipeline reading only its own images.

    Under `MultiWorkerMirroredStrategy` (several input pipelines), handing
    Keras the global stream makes every worker read, decode and augment every
    image and keep 1/W of them (tf.data's data sharding). Here each pipeline
    builds only its slice of every global batch (`make_dataset`'s
    `num_shards`): the global batch holds the same images, with the same
    augmentation, as with one worker, so N workers still train like one
    device. With one input pipeline this is `make_dataset` itself.

    Args:
        strategy: the `tf.distribute.Strategy` training runs under.
        batch_size: the GLOBAL batch size.
        **kwargs: `make_dataset`'s keyword arguments (`training=True` is implied).

    Returns:
        A `tf.data.Dataset`, or a distributed dataset Keras's `fit` accepts.
    """
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return make_dataset(annotations, input_shape, anchors, num_classes, batch_size, training=True, **kwargs)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = make_dataset(
            annotations,
            input_shape,
            anchors,
            num_classes,
            batch_size,
            training=True,
            num_shards=context.num_input_pipelines,
            shard_index=context.input_pipeline_id,
            **kwargs,
        )
        per_replica = context.get_per_replica_batch_size(batch_size)
        if per_replica != batch_size // context.num_input_pipelines:  # several replicas per worker
            dataset = dataset.rebatch(per_replica)
        return dataset

    return strategy.distribute_datasets_from_function(dataset_fn)
