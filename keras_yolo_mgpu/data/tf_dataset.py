"""tf.data input pipeline: the host's batches (`data.host`), as TensorFlow and Keras consume them.

    annotations = read_annotations("train.txt")            # or check_annotations(...).annotations
    train = make_dataset(annotations, (416, 416), anchors, num_classes, 32, training=True, seed=0)
    model.fit(train, steps_per_epoch=steps_per_epoch(len(annotations), 32), ...)

`data.host.HostBatches` runs in a parallel tf.data map (`tf.numpy_function`,
one batch per call; decoding, resizing and OpenCV release the GIL), which
MirroredStrategy and multi-worker training take as they are. Elements are
`(x, y)` for training and `(x, y, sample_weight)` for validation: `x` is the
host's batch (`data.host_processes.batch_arrays`), `y` float32 zeros (B, 1)
(the model's output is its loss). Batches always hold exactly `batch_size`
(the global batch) samples, so every replica gets the same share.

At exit, `stop_pipelines()` ends the pipelines before Python shuts down:
see its docstring for the hang it prevents.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref

import numpy as np
import tensorflow as tf

from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.data.host import HSV_PARAMS, HostBatches, steps_per_epoch
from keras_yolo_mgpu.model.boxes import resolve_masks

__all__ = ["DatasetBuilder", "distribute_training_dataset", "make_dataset", "steps_per_epoch", "stop_pipelines"]

# Every builder whose pipeline may still make batches (`stop_pipelines`).
_LIVE_BUILDERS: weakref.WeakSet = weakref.WeakSet()


class DatasetBuilder:
    """`make_dataset`'s pipeline: batch numbers -> `load_batch` (`host.batch(k)` in parallel) -> `to_model_inputs`.

    Takes `make_dataset`'s arguments; `host` is the `HostBatches` the
    options other than `masks` and `iou_thresh` go to.
    """

    def __init__(
        self, annotations, input_shape, anchors, num_classes, batch_size, *, masks=None, iou_thresh=None, **options
    ):
        # The targets are the device's; their settings are checked here so that a
        # bad one fails when the data is set up, not at the first step.
        if iou_thresh is not None and not 0.0 < iou_thresh <= 1.0:
            raise ValueError(f"`iou_thresh` must be in (0, 1] (1: best anchor only). Received: {iou_thresh}")
        resolve_masks(masks, len(np.asarray(anchors)))  # also validates the anchor count
        self.host = HostBatches(annotations, input_shape, num_classes, batch_size, **options)
        self._calls = threading.Lock()
        self._started = 0  # calls begun, refused ones included
        self._running = 0
        self._stopped = False
        _LIVE_BUILDERS.add(self)

    def _numpy_batch(self, k):
        """The `tf.numpy_function` body: batch `k` as arrays."""
        with self._calls:
            self._started += 1
            if self._stopped:
                return self._no_batch()
            self._running += 1
        try:
            batch = self.host.batch(int(k))
        finally:
            with self._calls:
                self._running -= 1
        arrays = (batch.images, batch.boxes, batch.hsv.astype(np.float32))
        return arrays if batch.weights is None else (*arrays, batch.weights)

    def _no_batch(self):
        """What a call returns once the pipeline is stopped: arrays of no image, made at once (nothing reads them).

        Not an exception: TensorFlow would log each one's traceback.
        """
        side = self.host.input_shape
        arrays = (
            np.zeros((0, *side, 3), np.uint8),
            np.zeros((0, self.host.max_boxes, 5), np.float32),
            np.zeros((0, HSV_PARAMS), np.float32),
        )
        return arrays if self.host.training else (*arrays, np.zeros(0, np.float32))

    def refuse_batches(self) -> tuple[int, int]:
        """From now on every call returns `_no_batch()`. Returns (calls begun, calls running) (`stop_pipelines`)."""
        with self._calls:
            self._stopped = True
            return self._started, self._running

    def load_batch(self, k):
        """Batch `k` (int64 scalar) -> (images, boxes, hsv[, weights]) tensors with their static shapes."""
        size = self.host.shard_batch_size
        dtypes = [tf.uint8, tf.float32, tf.float32]
        if not self.host.training:
            dtypes.append(tf.float32)
        tensors = tf.numpy_function(self._numpy_batch, [k], dtypes, name="host_batch")
        side = (None, None) if self.host.multi_scale else self.host.input_shape
        shapes = [[size, *side, 3], [size, self.host.max_boxes, 5], [size, HSV_PARAMS], [size]]
        for tensor, shape in zip(tensors, shapes):
            tensor.set_shape(shape)
        return tuple(tensors)

    def to_model_inputs(self, images, boxes, hsv, *weights):
        """A batch -> (x, zeros[, weights]): x as `make_dataset` describes it."""
        x = {"image": images, "boxes": boxes, "hsv": hsv}
        y = tf.zeros([self.host.shard_batch_size, 1], tf.float32)
        return (x, y, *weights)

    def build(self) -> tf.data.Dataset:
        """The whole pipeline (see the class docstring)."""
        if self.host.training:
            numbers = tf.data.Dataset.counter()
        else:
            numbers = tf.data.Dataset.range(self.host.num_batches)
        dataset = numbers.map(_graph_only(self.load_batch), num_parallel_calls=tf.data.AUTOTUNE)
        dataset = dataset.map(_graph_only(self.to_model_inputs), num_parallel_calls=tf.data.AUTOTUNE)
        return dataset.prefetch(tf.data.AUTOTUNE)


def stop_pipelines(quiet_for: float = 0.05, timeout: float = 30.0) -> None:
    """Ends every pipeline built in this process; runs when the interpreter exits.

    An iterator still alive then (a `fit` ended by Ctrl-C, SIGTERM or an
    error keeps its own in the exception's frames) is deleted while Python
    shuts down. A map call that then asks for the GIL ends its thread
    (`pthread_exit`), so the iterator's destructor waited for it forever (the
    process hung) or the C++ runtime aborted it ("terminate called without an
    active exception"). Here every builder refuses further batches, and this
    waits, without the GIL, until no call runs or is about to: a call
    tf.data has started may still wait for the GIL before it enters
    `_numpy_batch`, so the pipelines are taken as idle once no call began for
    `quiet_for` seconds and none runs. Refused calls end at once, so each map
    fills its buffers with empty batches nobody reads, and stops calling.
    """
    builders = list(_LIVE_BUILDERS)
    deadline = time.monotonic() + timeout
    seen = None
    while builders and time.monotonic() < deadline:
        counts = [builder.refuse_batches() for builder in builders]
        if counts == seen and not any(running for _, running in counts):
            break
        seen = counts
        time.sleep(quiet_for)


# atexit runs before the interpreter begins to shut down, and, registered after TensorFlow's import, before
# TensorFlow's own exit handlers.
atexit.register(stop_pipelines)


def _graph_only(function):
    """`function` for `Dataset.map` without AutoGraph's source conversion.

    The pipeline's functions hold no Python control flow on tensors; converting
    their source cost ~1.5 s of every `make_dataset` call (BENCHMARKS.md).
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
    **options,
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
        **options: keyword arguments, all optional:
            augment (bool, default True): with `training`, keras-yolo3's
                random augmentation; otherwise letterbox only. Validation is
                never augmented.
            seed (int): makes shuffling and augmentation reproducible
                (default: random).
            max_boxes (int, default 20): boxes kept per image (a random
                subset in training, the first ones in validation).
            cache (str): None, "ram", or a writable directory for decoded
                images at letterbox size (`data.host.ImageSource`).
            masks: anchor indices per scale for the targets (default
                keras-yolo3's); must be the loss's. Checked here, used by
                `DeviceInputs`.
            start_position (int, default 0): training only: the stream
                element to start at (a later stage, a resumed run).
            num_shards, shard_index (int, default 1 and 0): training only:
                build only this slice of every global batch
                (`distribute_training_dataset`, `data.host`).
            multi_scale ((MIN, MAX)): training only: a new square size every
                10 steps (`data.multiscale`); images are then
                (B, None, None, 3) and `input_shape` is not used.
            mosaic (float, default 0): training only: probability that an
                element is a mosaic of four images (`data.mosaic`).
            iou_thresh (float): Darknet's `iou_thresh` for the targets, in
                (0, 1]: a box also goes to every other anchor of the masks
                with IoU above it; None: its best anchor only (keras-yolo3).
                Checked here, used by `DeviceInputs`.
            An unknown keyword raises TypeError.

    Returns:
        A `tf.data.Dataset` of `(x, y)` (training) or `(x, y, sample_weight)`.
    """
    return DatasetBuilder(
        annotations, input_shape, anchors, num_classes, batch_size, training=training, **options
    ).build()


def distribute_training_dataset(strategy, annotations, input_shape, anchors, num_classes, batch_size, **kwargs):
    """The training stream for `strategy`, each input pipeline reading only its own images.

    Under `MultiWorkerMirroredStrategy`, tf.data's own sharding would make
    every worker read and augment every image and keep 1/W of them. Here each
    pipeline builds only its slice of every global batch (`num_shards`), so the
    global batch is the one-worker batch. With one input pipeline this is
    `make_dataset` itself.

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
