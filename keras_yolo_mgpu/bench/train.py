"""Training images/sec on N devices (`python -m keras_yolo_mgpu.bench train`).

Feeds generated images and targets from memory (a repeated tf.data
dataset), so the number measures the model step and the replica
communication, not the input pipeline (`bench pipeline` measures that).
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)


def _synthetic_batch(global_batch, input_shape, anchors, num_classes, seed=0):
    import numpy as np

    from keras_yolo_mgpu.model.targets import preprocess_true_boxes

    rng = np.random.default_rng(seed)
    height, width = input_shape
    images = rng.random((global_batch, height, width, 3), dtype=np.float32)
    boxes = np.zeros((global_batch, 10, 5), np.float32)
    for b in range(global_batch):
        for t in range(rng.integers(1, 11)):
            w, h = rng.uniform(0.05, 0.6) * width, rng.uniform(0.05, 0.6) * height
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            boxes[b, t] = [x, y, x + w, y + h, rng.integers(num_classes)]
    y_true = preprocess_true_boxes(boxes, input_shape, anchors, num_classes)
    x = {"image": images, **{f"y_true_{i}": t for i, t in enumerate(y_true)}}
    return x, np.zeros((global_batch, 1), np.float32)


def run_train_benchmark(
    *,
    gpus: int | None = None,
    simulate: bool = False,
    tiny: bool = False,
    model: str | None = None,
    input_size: tuple[int, int] = (416, 416),
    num_classes: int = 80,
    batch_size: int | None = None,
    freeze_body: int = 0,
    parallel: str = "strategy",
    sync_bn: bool = True,
    mixed_precision: bool = False,
    warmup_steps: int = 3,
    steps: int = 10,
) -> dict:
    """Times `steps` training steps after `warmup_steps`; returns the result record.

    Args:
        batch_size: GLOBAL batch (default: 8 per replica); must divide over the replicas.
        model: the network (`model.architectures.MODEL_NAMES`); `tiny` is the
            alias of yolov3-tiny; default yolov3.
        Others: as `train.py`'s flags of the same names.

    Returns:
        `{"benchmark": "train", ..., "step_seconds": [...], "images_per_sec": ...}`
        (images/sec from the median step).

    Raises:
        ValueError: the global batch does not divide over the replicas.
    """
    from keras_yolo_mgpu.parallel.engine import build_engine

    engine = build_engine(gpus, simulate=simulate, parallel=parallel, sync_bn=sync_bn)  # before any TF op
    import keras
    import tensorflow as tf

    from keras_yolo_mgpu.model.architectures import model_name
    from keras_yolo_mgpu.model.loss import totalloss
    from keras_yolo_mgpu.model.yolo3 import create_model
    from keras_yolo_mgpu.resources import get_anchors, resolve_resource

    if mixed_precision:
        keras.mixed_precision.set_global_policy("mixed_float16")
    global_batch = batch_size or 8 * engine.replicas
    if global_batch % engine.replicas:
        raise ValueError(f"global batch {global_batch} does not divide over {engine.replicas} replicas")
    kind = model_name(model, tiny) or "yolov3"
    anchors = get_anchors(resolve_resource(None, "anchors", model=kind))
    with engine.strategy.scope():
        _, train_model = create_model(
            input_size, anchors, num_classes, freeze_body=freeze_body, sync_bn=engine.sync_bn, model=kind
        )
        model = engine.wrap(train_model)
        model.compile(optimizer=keras.optimizers.SGD(1e-4), loss=totalloss)
    x, y = _synthetic_batch(global_batch, input_size, anchors, num_classes)
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat().prefetch(2)

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self._start)

    timer = Timer()
    # shuffle=False: a repeated in-memory batch; Keras warns that it cannot shuffle a dataset anyway.
    model.fit(dataset, steps_per_epoch=warmup_steps + steps, epochs=1, verbose=0, callbacks=[timer], shuffle=False)
    timed = timer.times[warmup_steps:]
    seconds_per_step = sorted(timed)[len(timed) // 2]
    return {
        "benchmark": "train",
        "model": kind,
        "input_size": list(input_size),
        "replicas": engine.replicas,
        "devices": list(engine.devices),
        "parallel": parallel,
        "global_batch": global_batch,
        "step_seconds": [round(t, 6) for t in timed],
        "median_step_ms": round(seconds_per_step * 1000, 2),
        "images_per_sec": round(global_batch / seconds_per_step, 2),
        "mean_images_per_sec": round(global_batch * len(timed) / sum(timed), 2),
    }
