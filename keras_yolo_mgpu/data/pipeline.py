"""tf.data input pipeline: the host's batches (`data.host`), as TensorFlow and Keras consume them.

    annotations = read_annotations("train.txt")            # or check_annotations(...).annotations
    train = make_dataset(annotations, (416, 416), anchors, num_classes, 32, training=True, seed=0)
    model.fit(train, steps_per_epoch=steps_per_epoch(len(annotations), 32), ...)

The host's work (read, decode, resize, place, flip, move the boxes, draw the
HSV jitter) is `data.host.HostBatches`, one definition shared with the
TensorFlow-free pipeline (`data.py_dataset`); here it runs in a parallel
tf.data map (`tf.numpy_function`, one batch per call; decoding, resizing and
OpenCV release the GIL), which MirroredStrategy and multi-worker training
(`distribute_training_dataset`) take as they are. Two outputs:

- `device_targets=True`, the split of work for fast training: `x = {"image":
  (B, h, w, 3) uint8, "boxes": (B, max_boxes, 5) float32, "hsv": (B, 12)
  float32}` (see `data.host`); the train step does the HSV jitter, the
  scaling and the targets on the device (`data.device_side.DeviceInputs`).
- `device_targets=False` (the default, as before): the host finishes the
  batch too: `x = {"image": (B, h, w, 3) float32 in [0, 1] (HSV jitter in
  OpenCV), "y_true_0": (B, h/32, w/32, 3, 5+C), "y_true_1": (B, h/16, ...),
  ["y_true_2": (B, h/8, ...)]}` (`build_targets`).

Elements are `(x, y)` for training and `(x, y, sample_weight)` for
validation; `y` is float32 zeros (B, 1) (the model's output is its loss),
`sample_weight` float32 (B,). Batches always hold exactly `batch_size` (the
global batch) samples, so every replica of a multi-device run gets the same
share; the stream, the validation weights and the handling of unreadable
images are `data.host`'s.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.data.host import HSV_PARAMS, HostBatches, hsv_to_float, steps_per_epoch
from keras_yolo_mgpu.model.boxes import num_output_layers, output_strides, resolve_masks

__all__ = ["DatasetBuilder", "build_targets", "make_dataset", "steps_per_epoch"]


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


# --- the dataset ---------------------------------------------------------------


class DatasetBuilder:
    """`make_dataset`'s pipeline: the host's batches in a parallel tf.data map, then the model's inputs.

    `build()` chains:

    1. batch numbers: `Dataset.counter()` (training) or one pass
       (`host.num_batches`, validation);
    2. `load_batch`: `host.batch(k)` in `tf.numpy_function`, in parallel,
       in order (`data.host.HostBatches`);
    3. `to_model_inputs`: the dict Keras feeds the model (with
       `device_targets=False`, targets per output scale, `build_targets`).

    Attributes: `host` (the `HostBatches`), and `make_dataset`'s arguments.
    """

    def __init__(
        self,
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
        device_targets: bool = False,
    ):
        if iou_thresh is not None and not 0.0 < iou_thresh <= 1.0:
            raise ValueError(f"`iou_thresh` must be in (0, 1] (1: best anchor only). Received: {iou_thresh}")
        self.anchors = np.asarray(anchors, dtype=np.float32)
        self.masks = resolve_masks(masks, len(self.anchors))  # also validates the anchor count
        self.num_classes = num_classes
        self.iou_thresh = iou_thresh
        self.device_targets = device_targets
        self.host = HostBatches(
            annotations,
            input_shape,
            num_classes,
            batch_size,
            training=training,
            augment=augment,
            seed=seed,
            max_boxes=max_boxes,
            cache=cache,
            start_position=start_position,
            num_shards=num_shards,
            shard_index=shard_index,
            multi_scale=multi_scale,
            mosaic=mosaic,
        )

    @property
    def training(self) -> bool:
        return self.host.training

    @property
    def seed(self) -> int:
        return self.host.seed

    def _numpy_batch(self, k):
        """The `tf.numpy_function` body: batch `k` as arrays (float images when the host finishes it)."""
        batch = self.host.batch(int(k))
        images = batch.images if self.device_targets else hsv_to_float(batch.images, batch.hsv)
        arrays = (images, batch.boxes, batch.hsv.astype(np.float32))
        return arrays if batch.weights is None else (*arrays, batch.weights)

    def load_batch(self, k):
        """Batch `k` (int64 scalar) -> (images, boxes, hsv[, weights]) tensors with their static shapes."""
        size = self.host.shard_batch_size
        dtypes = [tf.uint8 if self.device_targets else tf.float32, tf.float32, tf.float32]
        if not self.training:
            dtypes.append(tf.float32)
        tensors = tf.numpy_function(self._numpy_batch, [k], dtypes, name="host_batch")
        side = (None, None) if self.host.multi_scale else self.host.input_shape
        shapes = [[size, *side, 3], [size, self.host.max_boxes, 5], [size, HSV_PARAMS], [size]]
        for tensor, shape in zip(tensors, shapes):
            tensor.set_shape(shape)
        return tuple(tensors)

    def to_model_inputs(self, images, boxes, hsv, *weights):
        """A batch -> (x, zeros[, weights]): x as `make_dataset` describes it."""
        if self.device_targets:
            x = {"image": images, "boxes": boxes, "hsv": hsv}
        else:
            x = {"image": images}
            # Multi-scale batches come in several sizes: targets at the batch's own.
            input_shape = (tf.shape(images)[1], tf.shape(images)[2]) if self.host.multi_scale else self.host.input_shape
            targets = build_targets(boxes, input_shape, self.anchors, self.num_classes, self.masks, self.iou_thresh)
            for layer, y_true in enumerate(targets):
                x[f"y_true_{layer}"] = y_true
        y = tf.zeros([self.host.shard_batch_size, 1], tf.float32)
        return (x, y, *weights)

    def build(self) -> tf.data.Dataset:
        """The whole pipeline (see the class docstring)."""
        if self.training:
            numbers = tf.data.Dataset.counter()
        else:
            numbers = tf.data.Dataset.range(self.host.num_batches)
        dataset = numbers.map(_graph_only(self.load_batch), num_parallel_calls=tf.data.AUTOTUNE)
        dataset = dataset.map(_graph_only(self.to_model_inputs), num_parallel_calls=tf.data.AUTOTUNE)
        return dataset.prefetch(tf.data.AUTOTUNE)


def _graph_only(function):
    """`function` for `Dataset.map` without AutoGraph's source conversion.

    The pipeline's functions hold no Python control flow on tensors, so
    converting their source buys nothing; it cost ~1.5 s of every
    `make_dataset` call on the 2-core machine (BENCHMARKS.md), paid at every
    `train.py` start and stage.
    """
    return tf.autograph.experimental.do_not_convert(function)


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
    device_targets: bool = False,
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
            size (`data.host.ImageSource`). RAM: about h*w*3 bytes per image
            for the life of the process (shared by training stages and the
            validation set). A directory may be reused between runs; it must
            be writable (ValueError otherwise).
        masks: anchor indices per scale for the targets (default
            keras-yolo3's); must be the loss's masks.
        start_position: training only: the stream element to start at, so
            a later stage or a resumed run continues the stream where it
            stopped (element `p` is always the same image with the same
            augmentation for a given seed).
        num_shards, shard_index: training only: build only the
            `shard_index`-th of `num_shards` equal, contiguous slices of every
            global batch (one per input pipeline of a multi-worker cluster, see
            `distribute_training_dataset`); batches then hold
            `batch_size // num_shards` elements and only those images are read.
        multi_scale: training only: (MIN, MAX), a new square size every 10
            steps (`data.multiscale`); images (and targets) are then
            (B, None, None, ...) and `input_shape` is not used.
        mosaic: training only: probability that an element is a mosaic of
            four images (`data.mosaic`).
        iou_thresh: Darknet's `iou_thresh` for the targets: a box also goes
            to every other anchor of the masks with IoU above it
            (`build_targets`); None: its best anchor only (keras-yolo3).
        device_targets: yield uint8 images, padded boxes and HSV draws for
            the device to finish (`data.device_side.DeviceInputs`) instead of
            float images and dense targets.

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
        device_targets=device_targets,
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

    (JAX's processes get their slices from `data.streams`.)

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
