"""The training run's input streams on each backend: one place that says which pipeline feeds which engine.

The backend's `distribution.INPUT_PIPELINE` picks it: tf.data on TensorFlow
(`data.tf_dataset`, distributed by the strategy), a `keras.utils.PyDataset`
on JAX (`data.py_dataset`, no TensorFlow imported), both serving the same
`data.host.HostBatches`.
"""

from __future__ import annotations

import os

import keras
import numpy as np

from keras_yolo_mgpu.backend import distribution
from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.data.host import HostBatches
from keras_yolo_mgpu.data.py_dataset import make_py_dataset


def choose_feed(feed: str, workers: int | None, on_accelerators: bool, cores: int | None = None) -> tuple[str, str]:
    """The JAX feed a run uses, and why, for the log: `feed` unless it is "auto".

    "auto" takes worker processes where the steps run on accelerators and two
    workers or more feed them: each has its own interpreter lock, and two made
    more images per second at less CPU per image than two threads
    (BENCHMARKS.md, "grain's worker processes against the hand-written feeds").
    On one core, or where the step computes on the CPU, worker threads.
    """
    if feed != "auto":
        return feed, f"--feed {feed}"
    cores = cores or os.cpu_count() or 1
    count = workers or cores
    if on_accelerators and count >= 2:
        return "processes", f"auto: {count} workers feeding accelerators; --feed threads keeps them in this process"
    where = "the step runs on the CPU" if not on_accelerators else "one worker"
    return "threads", f"auto: {where}; --feed processes gives each worker its own process"


def training_stream(
    engine,
    annotations: list[Annotation],
    input_shape,
    anchors,
    num_classes: int,
    batch_size: int,
    *,
    feed: str = "threads",
    workers: int | None = None,
    **options,
):
    """The endless training stream for `engine` (`parallel.engine.Engine`).

    Args:
        batch_size: the GLOBAL batch.
        feed, workers: JAX's workers, "threads" or "processes", and how many
            (None: one per core); TensorFlow's tf.data has its own.
        **options: `make_dataset`'s (`masks` and `iou_thresh` are only
            checked there: the targets are built on the device).
    """
    if distribution.INPUT_PIPELINE == "tf.data":
        # tf.data is TensorFlow's: imported on its engine only, off the JAX path.
        from keras_yolo_mgpu.data.tf_dataset import distribute_training_dataset

        return distribute_training_dataset(
            engine.strategy, annotations, input_shape, anchors, num_classes, batch_size, **options
        )
    feeding = dict(workers=workers, use_multiprocessing=feed == "processes")
    return _py_dataset(engine, annotations, input_shape, num_classes, batch_size, training=True, **feeding, **options)


def validation_stream(
    engine, annotations: list[Annotation], input_shape, anchors, num_classes: int, batch_size: int, **options
):
    """One ordered pass over the validation images, the last batch padded with weight-0 images."""
    options = {key: value for key, value in options.items() if key not in ("start_position", "multi_scale", "mosaic")}
    if distribution.INPUT_PIPELINE == "tf.data":
        # tf.data is TensorFlow's: imported on its engine only, off the JAX path.
        from keras_yolo_mgpu.data.tf_dataset import make_dataset

        return make_dataset(annotations, input_shape, anchors, num_classes, batch_size, training=False, **options)
    return _py_dataset(engine, annotations, input_shape, num_classes, batch_size, training=False, **options)


def first_batch(annotations: list[Annotation], input_shape, num_classes: int, batch_size: int, **options) -> dict:
    """The model inputs of a training stream's first batch, made on the host alone (no pipeline, no devices).

    `{"image": (B, h, w, 3) uint8, "boxes": (B, max_boxes, 5), "hsv": (B, 12)}`:
    what the start-up checks (training/precision.py) run the step on.
    """
    options = {key: value for key, value in options.items() if key not in ("masks", "iou_thresh")}
    batch = HostBatches(annotations, input_shape, num_classes, batch_size, training=True, **options).batch(0)
    return {"image": batch.images, "boxes": batch.boxes, "hsv": batch.hsv.astype(np.float32)}


def _py_dataset(engine, annotations, input_shape, num_classes, batch_size, *, training, **options):
    options = {key: value for key, value in options.items() if key not in ("masks", "iou_thresh")}
    index, count = engine.processes
    if count == 1:
        # One process: the worker threads also copy each batch onto the devices, ahead of the step.
        finish = distribution.batch_placer(engine.strategy)
    elif training:
        # Several processes: each makes and hands Keras only its slice, which Keras
        # assembles across processes (`jax.make_array_from_process_local_data`).
        options.update(num_shards=count, shard_index=index)
        finish = None
    else:
        finish = _process_slice(index, count, batch_size)
    return make_py_dataset(
        annotations, input_shape, num_classes, batch_size, training=training, to_device=finish, **options
    )


def _process_slice(index: int, count: int, batch_size: int):
    """`batch -> this process's rows`: validation batches are made whole on every process, split as Keras joins them."""
    rows = slice(index * batch_size // count, (index + 1) * batch_size // count)

    def take(batch):
        return keras.tree.map_structure(lambda array: array[rows], batch)

    return take
