"""End to end: training from JPEG files against the step alone, on the same device (`cli/bench_e2e.py`).

Builds what `train.py` trains (the model, its compile settings, mixed
precision and XLA as the device's defaults, `training.precision`) and fits
it, in interleaved rounds, on two inputs:

- `pipeline`: the training stream over the JPEG files, as `train.py` feeds
  `fit` on the backend (`data.streams`: tf.data on TensorFlow, the
  `PyDataset` of worker threads on JAX; the host decodes and places, the
  step does the HSV jitter and the targets on the device);
- `in-memory`: the pipeline's first batch, held on the devices and repeated
  (`bench.train.repeated_batch`): the step alone.

With `cache` ("ram" or a folder) the pipeline reads decoded images from the
cache, timed warm: the warm-up covers one full pass over the images first.

Each round times `steps` steps after `warmup` (the pipeline's buffers fill
and the step compiles during warm-up). `ratio` = pipeline images/s /
in-memory images/s: 1.0 means the input pipeline keeps up with the step.
Unlike `train.py`, the start-up checks of mixed precision and XLA do not run.
"""

from __future__ import annotations

import logging
import statistics
import time

import numpy as np

from keras_yolo_mgpu.model.architectures import get_architecture, resolve_iou_thresh

logger = logging.getLogger(__name__)


def _wall_times(engine, model, dataset, steps: int) -> list[float]:
    """`fit` for `steps` steps; the wall time at the end of each step, in step order.

    As `train.py`'s `Throughput`: the hook waits for its step's loss in
    Keras's callback threads (`async_safe`), so the step loop dispatches
    ahead without waiting for the device, and the clock reads when each
    step has finished.
    """
    # Keras, and the modules that import it, when the benchmark runs: importing this module starts no backend.
    import keras

    ends: list[tuple[int, float]] = []

    class StepEnds(keras.callbacks.Callback):
        async_safe = True

        def on_train_batch_end(self, batch, logs=None):
            float(logs["loss"])  # waits for this step, in the callback thread
            ends.append((batch, time.perf_counter()))

    with engine.strategy.scope():
        model.fit(
            dataset,
            steps_per_epoch=steps,
            epochs=1,
            verbose=0,
            callbacks=[*engine.fit_callbacks(), StepEnds()],
            shuffle=False,
        )
    return [end for _, end in sorted(ends)]


def _images_per_sec(ends: list[float], warmup: int, batch_size: int) -> float:
    timed = ends[warmup - 1 :] if warmup else ends
    return batch_size * (len(timed) - 1) / (timed[-1] - timed[0])


# Over 60 lines: one benchmark read top to bottom (setup, interleaved rounds of both sides,
# the report); its parts are used nowhere else.
def run_e2e(
    annotations,
    input_shape: tuple[int, int],
    anchors,
    num_classes: int,
    batch_size: int,
    *,
    model: str | None = None,
    gpus: int | None = None,
    simulate: bool = False,
    mixed_precision: bool | None = None,
    jit: bool | None = None,
    steps: int = 20,
    warmup: int = 5,
    rounds: int = 3,
    seed: int = 0,
    cache: str | None = None,
) -> dict:
    """Pipeline-fed and in-memory training images/s, interleaved; returns the result record.

    Args:
        annotations: training images and boxes (`read_annotations`).
        input_shape: (height, width), multiples of 32.
        anchors: (9, 2) or (6, 2) anchors.
        batch_size: the GLOBAL batch.
        model: `architectures.MODEL_NAMES` entry (default by anchor count).
        gpus, simulate: the devices, as `train.py --gpus N [--simulate-devices]`.
        mixed_precision, jit: None for the device's default (`training.precision`).
        steps, warmup, rounds: timed steps per round, untimed steps first, rounds.
        cache: None, "ram" or a folder: the pipeline's decoded-image cache, timed warm.
    """
    # Keras, and the modules that import it, when the benchmark runs: importing this module starts no backend.
    import keras

    from keras_yolo_mgpu.bench.train import repeated_batch
    from keras_yolo_mgpu.data.streams import first_batch, training_stream
    from keras_yolo_mgpu.model.boxes import MAX_BOXES, resolve_masks
    from keras_yolo_mgpu.model.loss import totalloss
    from keras_yolo_mgpu.parallel.engine import build_engine
    from keras_yolo_mgpu.training import precision
    from keras_yolo_mgpu.training.training_model import create_model

    if warmup < 1 or steps < 2:
        raise ValueError(f"need warmup >= 1 and steps >= 2. Received: warmup={warmup}, steps={steps}")
    engine = build_engine(gpus, simulate=simulate)
    device_kind = precision.training_device_kind(engine.devices)
    plan = precision.plan_settings(
        device_kind,
        mixed_precision=mixed_precision,
        jit=jit,
        multi_scale=None,
        replicas=engine.replicas,
        backend=engine.backend,
        bfloat16=engine.bfloat16,
    )
    kind = get_architecture(model, len(anchors)).name
    masks = resolve_masks(None, len(anchors))
    iou_thresh = resolve_iou_thresh(None, kind)
    # A cache is timed warm: the first (untimed) steps read every image once.
    pipeline_warmup = max(warmup, -(-len(annotations) // batch_size) + 1) if cache else warmup
    previous_policy = keras.config.dtype_policy()
    precision.apply_policy(plan.mixed_precision, plan.mixed_policy)
    try:
        with engine.strategy.scope():  # `train.py`'s training model, compiled as `train.py` compiles it
            _, train_model = create_model(
                input_shape,
                anchors,
                num_classes,
                freeze_body=0,
                sync_bn=engine.sync_bn,
                masks=masks,
                model=kind,
                device_inputs=True,
                iou_thresh=iou_thresh,
            )
            train_model = engine.wrap(train_model)
            train_model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=totalloss, jit_compile=plan.jit)
        stream_options = dict(seed=seed, max_boxes=MAX_BOXES, masks=masks, iou_thresh=iou_thresh)
        pipeline = training_stream(
            engine, annotations, input_shape, anchors, num_classes, batch_size, cache=cache, **stream_options
        )
        x = first_batch(annotations, input_shape, num_classes, batch_size, seed=seed, max_boxes=MAX_BOXES)
        in_memory = repeated_batch(x, np.zeros((batch_size, 1), np.float32), engine)
        sources = {"in-memory": (in_memory, warmup), "pipeline": (pipeline, pipeline_warmup)}
        rates: dict[str, list[float]] = {name: [] for name in sources}
        for round_index in range(rounds):
            for name, (dataset, first_steps) in sources.items():
                ends = _wall_times(engine, train_model, dataset, first_steps + steps)
                rates[name].append(_images_per_sec(ends, first_steps, batch_size))
                logger.info("round %d: %-9s %.1f images/s", round_index, name, rates[name][-1])
                if name == "pipeline":
                    pipeline_warmup = 1  # the stream goes on where it stopped: the cache stays warm
                    sources[name] = (dataset, pipeline_warmup)
    finally:
        keras.config.set_dtype_policy(previous_policy)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    return {
        "benchmark": "e2e",
        "backend": engine.backend,
        "device": device_kind,
        "devices": list(engine.devices),
        "cache": cache,
        "dtype_policy": plan.mixed_policy if plan.mixed_precision else keras.config.floatx(),
        "replicas": engine.replicas,
        "model": kind,
        "mixed_precision": plan.mixed_precision,
        "jit": plan.jit,
        "input_size": list(input_shape),
        "batch_size": batch_size,
        "steps": steps,
        "warmup_steps": warmup,
        "rounds": rounds,
        "images_per_sec": {name: [round(v, 2) for v in values] for name, values in rates.items()},
        "pipeline_images_per_sec": round(medians["pipeline"], 2),
        "in_memory_images_per_sec": round(medians["in-memory"], 2),
        "ratio": round(medians["pipeline"] / medians["in-memory"], 3),
    }
