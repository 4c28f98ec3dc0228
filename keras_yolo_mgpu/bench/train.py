"""Training images/sec (`python -m keras_yolo_mgpu.bench train`).

Feeds one generated batch from memory (a repeated tf.data dataset on
TensorFlow; on JAX the batch placed on the devices once, with the data
sharding of the run's distribution), so the number measures the model step
and the replica communication, not the input pipeline (`bench pipeline`
measures that). Each round is one `fit` of `steps` steps, dispatched as `train.py`
dispatches them (`_step_timer`). It runs on Keras's backend; on JAX it needs no
TensorFlow.

The pieces (`set_up`, `build_our_side`, `time_rounds`, `side_figures`) also
serve `tools/train_step_compare.py`, which times keras-yolo3's step, variants
of ours and the step's parts beside ours, and the two backends against each other.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import statistics
import time

import keras
import numpy as np

from keras_yolo_mgpu.backend import distribution
from keras_yolo_mgpu.data.device_side import preprocess_true_boxes
from keras_yolo_mgpu.model.architectures import model_name
from keras_yolo_mgpu.model.boxes import MAX_BOXES
from keras_yolo_mgpu.model.loss import totalloss
from keras_yolo_mgpu.optional import tensorflow as tf
from keras_yolo_mgpu.parallel.engine import build_engine
from keras_yolo_mgpu.resources import get_anchors, resolve_resource
from keras_yolo_mgpu.training.ema import make_ema_kwargs, untie_averages
from keras_yolo_mgpu.training.fused_adam import FusedAdam
from keras_yolo_mgpu.training.precision import mixed_policy_name
from keras_yolo_mgpu.training.training_model import create_model

logger = logging.getLogger(__name__)

OPTIMIZERS = ("sgd", "adam")
#: What our step is fed: "device", `train.py`'s model on the host's batch (uint8 images, padded boxes, HSV
#: draws; jitter and targets in the step), or "dense", keras-yolo3's inputs (float images, dense targets).
INPUTS = ("device", "dense")
#: `run_train_benchmark`'s arguments that say how to time, not what: left out of the settings of a side.
TIMING = ("warmup_steps", "steps", "rounds", "on_round")
#: The timed steps' learning rate: small, so that weights stay near their start.
LEARNING_RATE = 1e-4


def our_optimizer(options):
    """The optimizer of our side: plain SGD, or train.py's Adam (`FusedAdam`); with the EMA if asked."""
    kwargs = make_ema_kwargs(options["ema"])
    if options["optimizer"] == "adam":
        return FusedAdam(LEARNING_RATE, **kwargs)
    return keras.optimizers.SGD(LEARNING_RATE, **kwargs)


def _random_boxes(rng, global_batch, max_boxes, input_shape, num_classes):
    """(N, max_boxes, 5) `x_min, y_min, x_max, y_max, class` in pixels: 1-10 random boxes per image, zero-padded."""
    height, width = input_shape
    boxes = np.zeros((global_batch, max_boxes, 5), np.float32)
    for b in range(global_batch):
        for t in range(rng.integers(1, 11)):
            w, h = rng.uniform(0.05, 0.6) * width, rng.uniform(0.05, 0.6) * height
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            boxes[b, t] = [x, y, x + w, y + h, rng.integers(num_classes)]
    return boxes


def synthetic_batch(global_batch, input_shape, anchors, num_classes, seed=0):
    """One batch: uniform random images, 1-10 random boxes per image and their targets.

    Returns:
        `(x, y)`: x a dict with `image` (N, H, W, 3) and `y_true_<l>` arrays,
        y zeros (N, 1) (the targets are model inputs).
    """
    rng = np.random.default_rng(seed)
    height, width = input_shape
    images = rng.random((global_batch, height, width, 3), dtype=np.float32)
    boxes = _random_boxes(rng, global_batch, 10, input_shape, num_classes)
    y_true = preprocess_true_boxes(boxes, input_shape, anchors, num_classes)
    x = {"image": images, **{f"y_true_{i}": t for i, t in enumerate(y_true)}}
    return x, np.zeros((global_batch, 1), np.float32)


def synthetic_host_batch(global_batch, input_shape, num_classes, seed=0):
    """One batch as the host hands it to `train.py`'s model: uint8 images, padded boxes, HSV draws.

    The same random boxes as `synthetic_batch` (1-10 per image, padded to
    `MAX_BOXES`); the HSV draws in keras-yolo3's ranges (hue +-0.1,
    saturation and value x[1, 1.5] or its reciprocal). The step then builds
    the targets and applies the jitter on the device, as in training.

    Returns:
        `(x, y)`: x `{"image": (N, H, W, 3) uint8, "boxes": (N, 20, 5), "hsv": (N, 12)}`, y zeros (N, 1).
    """
    rng = np.random.default_rng(seed)
    height, width = input_shape
    images = rng.integers(0, 256, (global_batch, height, width, 3), dtype=np.uint8)
    boxes = _random_boxes(rng, global_batch, MAX_BOXES, input_shape, num_classes)
    scales = rng.uniform(1.0, 1.5, (global_batch, 2)) ** rng.choice([-1.0, 1.0], (global_batch, 2))
    draws = np.concatenate([rng.uniform(-0.1, 0.1, (global_batch, 1)), scales], axis=1)
    hsv = np.tile(draws, (1, 4)).astype(np.float32)
    return {"image": images, "boxes": boxes, "hsv": hsv}, np.zeros((global_batch, 1), np.float32)


def _step_timer(callback_base):
    """A callback class (Keras 3 or Keras 2 base) timing one `fit` call of `steps` steps as the trainer runs it.

    The clock starts at the first step's batch-begin hook (the devices are
    idle: the previous round ended with a read) and stops at the epoch end,
    which Keras reaches after reading the last step's logs back, so the round
    covers every step's device time. No hook reads a value per step, so Keras
    dispatches asynchronously as in `train.py`, and Keras calling the batch
    hooks once per execution (`steps_per_execution` > 1) changes nothing.
    """

    class RoundTimer(callback_base):
        def __init__(self):
            super().__init__()
            self._start = None
            self.wall_seconds = self.cpu_seconds = None

        def on_train_batch_begin(self, batch, logs=None):
            if self._start is None:
                self._start = time.perf_counter(), time.process_time()

        def on_epoch_end(self, epoch, logs=None):
            self.wall_seconds = time.perf_counter() - self._start[0]
            self.cpu_seconds = time.process_time() - self._start[1]

    return RoundTimer


class Side:
    """One model to time: fits `steps` steps on the repeated batch, keeps each round's step times.

    `body` and `train_model` (the network and the unwrapped training model), where given, are for timing the
    step's parts.
    """

    def __init__(self, name, model, dataset, callback_base, global_batch, scope=None, callbacks=(), body=None,
                 train_model=None):  # fmt: skip
        self.name, self.model, self.dataset, self.global_batch = name, model, dataset, global_batch
        self.body, self.train_model = body, train_model
        self.callbacks = list(callbacks)  # the engine's, as train.py passes them
        # What `fit` runs under: on JAX the distribution's scope shards each batch.
        self.scope = scope or contextlib.nullcontext
        self.timer_class = _step_timer(callback_base)
        self.rounds: list[list[float]] = []
        self.cpu_times: list[float] = []

    def fit(self, steps: int) -> list[float]:
        """Runs `steps` steps in one `fit`; returns the round's mean seconds per step, as a one-element list."""
        timer = self.timer_class()
        with self.scope():
            # shuffle=False: a repeated in-memory batch; Keras cannot shuffle a dataset anyway.
            self.model.fit(
                self.dataset,
                steps_per_epoch=steps,
                epochs=1,
                verbose=0,
                callbacks=[*self.callbacks, timer],
                shuffle=False,
            )
            untie_averages(self.model)  # with an EMA: the next round's fit on the same optimizer
        self.cpu_times.append(timer.cpu_seconds / steps)
        return [timer.wall_seconds / steps]

    def images_per_sec(self, times) -> float:
        return self.global_batch / statistics.median(times)


def repeated_batch(x, y, engine):
    """The same global batch for every step, fed the cheapest way each backend has.

    TensorFlow: a repeated `tf.data` dataset (Keras distributes it over the
    replicas). JAX: the batch placed on the devices once, sharded as the
    run's distribution shards batches, then handed over again every step:
    Keras's `device_put` of an array that already has that sharding copies
    nothing, so the step is timed alone, as the bare jitted step was.
    """
    if distribution.batch_placer(engine.strategy) is None:  # the strategy distributes a tf.data dataset itself
        return tf.data.Dataset.from_tensors((x, y)).repeat().prefetch(2)

    def place(array):
        return keras.distribution.distribute_tensor(array, engine.strategy.get_data_layout(array.shape))

    placed = {key: place(value) for key, value in x.items()}, place(y)
    return (placed for _ in itertools.count())


def build_our_side(setup: dict, name: str = "ours", *, make_optimizer=None, jit: bool | None = None, adjust_body=None):
    """`train.py`'s training model on the benchmark's engine and batch, compiled: a side to time.

    Args:
        setup: `set_up`'s dict.
        make_optimizer: returns the optimizer, called in the distribution's scope (default: `our_optimizer`).
        jit: default the settings' (always on JAX).
        adjust_body: called with the network before the model is compiled.

    Returns:
        The side, with its network and unwrapped training model.
    """
    engine, options = setup["engine"], setup["options"]
    x, y = options["host_batch"] if options["inputs"] == "device" else (setup["x"], setup["y"])
    with engine.strategy.scope():
        body, train_model = create_model(
            options["input_size"],
            setup["anchors"],
            options["num_classes"],
            freeze_body=options["freeze_body"],
            sync_bn=engine.sync_bn,
            model=options["model"],
            device_inputs=options["inputs"] == "device",
        )
        if adjust_body is not None:
            adjust_body(body)
        model = engine.wrap(train_model)
        model.compile(
            optimizer=make_optimizer() if make_optimizer else our_optimizer(options),
            loss=totalloss,
            jit_compile=options["jit"] if jit is None else jit,
            steps_per_execution=options["steps_per_execution"],
        )
    dataset = repeated_batch(x, y, engine)
    global_batch = setup["record"]["global_batch"]
    scope, callbacks = engine.strategy.scope, engine.fit_callbacks()
    return Side(name, model, dataset, keras.callbacks.Callback, global_batch, scope, callbacks, body, train_model)


def time_rounds(sides: list, warmup_steps: int, steps: int, rounds: int, on_round) -> None:
    """Warms every side up, then times `rounds` x `steps` steps per side, alternating their order each round."""
    for side in sides:  # tracing, first-step allocations
        side.fit(warmup_steps)
        side.cpu_times.clear()
    for round_index in range(rounds):
        for side in sides if round_index % 2 == 0 else sides[::-1]:
            side.rounds.append(side.fit(steps))
        if on_round:
            on_round(round_index, {side.name: side.images_per_sec(side.rounds[-1]) for side in sides})


def side_figures(setup: dict, sides: list, steps: int, rounds: int) -> dict:
    """The result record: the settings, each side's images/sec, step and CPU times, every other side's ratio to ours."""
    result = {**setup["record"], "steps_per_round": steps, "rounds": rounds}
    for side in sides:
        per_round = [round(side.images_per_sec(times), 2) for times in side.rounds]
        key = "" if side.name == "ours" else f"{side.name}_"
        result[f"{key}images_per_sec_rounds"] = per_round
        result[f"{key}images_per_sec"] = round(statistics.median(per_round), 2)
        result[f"{key}median_step_ms"] = round(statistics.median([t for r in side.rounds for t in r]) * 1000, 2)
        # Process CPU time (all threads) per step: the work done, less sensitive to other jobs' load.
        result[f"{key}median_step_cpu_ms"] = round(statistics.median(side.cpu_times) * 1000, 2)
    ours = sides[0]
    for side in sides[1:]:
        ratios = [ours.images_per_sec(a) / side.images_per_sec(b) for a, b in zip(ours.rounds, side.rounds)]
        result[f"ratio_vs_{side.name}"] = round(result["images_per_sec"] / result[f"{side.name}_images_per_sec"], 3)
        result[f"ratio_vs_{side.name}_rounds"] = [round(r, 3) for r in ratios]
        # Rounds are back to back: their ratio is the least affected by load drifting during the run.
        result[f"ratio_vs_{side.name}_median_of_rounds"] = round(statistics.median(ratios), 3)
        result[f"cpu_ratio_vs_{side.name}"] = round(
            statistics.median(side.cpu_times) / statistics.median(ours.cpu_times), 3
        )
    return result


def run_train_benchmark(
    *,
    gpus: int | None = None,
    simulate: bool = False,
    simulated_gpu_memory_mb: int | None = None,
    tiny: bool = False,
    model: str | None = None,
    input_size: tuple[int, int] = (416, 416),
    num_classes: int = 80,
    batch_size: int | None = None,
    freeze_body: int = 0,
    parallel: str = "strategy",
    sync_bn: bool = True,
    mixed_precision: bool = False,
    jit: bool = False,
    optimizer: str = "sgd",
    ema: float | None = None,
    steps_per_execution: int = 1,
    inputs: str = "device",
    warmup_steps: int = 3,
    steps: int = 10,
    rounds: int = 1,
    on_round=None,
) -> dict:
    """Times `rounds` x `steps` training steps after `warmup_steps`; returns the result record.

    Args:
        batch_size: GLOBAL batch (default: 8 per replica); must divide over the replicas.
        model: the network (`model.architectures.MODEL_NAMES`); `tiny` is the
            alias of yolov3-tiny; default yolov3.
        simulated_gpu_memory_mb: with `simulate` on a GPU, the memory of each logical GPU.
        jit: XLA (`jit_compile=True`); always on JAX.
        mixed_precision: mixed_float16 on TensorFlow; on JAX mixed_bfloat16
            where the GPUs compute bfloat16 (Ampere and later).
        optimizer: "sgd" (plain, the default) or "adam" (train.py's, `FusedAdam`).
        ema: an EMA of the weights with this decay (train.py's `--ema`).
        steps_per_execution: steps Keras runs per call of the compiled
            function (`compile(steps_per_execution=...)`).
        inputs: `INPUTS`: "device" (what `train.py` trains) or "dense" (keras-yolo3's inputs).
        on_round: called with `(round_index, {"ours": images/sec})` after each round.
        Others: as `train.py`'s flags of the same names.

    Returns:
        `{"benchmark": "train", ..., "images_per_sec": ...}`: images/sec per
        round (global batch / median step), their median, step and CPU times.

    Raises:
        ValueError: a setting that cannot be timed (see the messages).
    """
    setup = set_up({name: value for name, value in locals().items() if name not in TIMING})
    sides = [build_our_side(setup)]
    time_rounds(sides, warmup_steps, steps, rounds, on_round)
    return side_figures(setup, sides, steps, rounds)


def set_up(settings: dict) -> dict:
    """The engine, dtype policy, anchors and generated batch of a benchmark, and the record of its settings.

    `settings`: `run_train_benchmark`'s arguments, less the timing ones (`TIMING`).
    """
    gpus, input_size, num_classes, inputs = (settings[k] for k in ("gpus", "input_size", "num_classes", "inputs"))
    if inputs not in INPUTS:
        raise ValueError(f"inputs must be one of {INPUTS}. Received: inputs={inputs!r}")
    if settings["optimizer"] not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}. Received: optimizer={settings['optimizer']!r}")
    if settings["simulate"] and settings["simulated_gpu_memory_mb"]:
        # TensorFlow's logical GPUs with a memory limit, whatever the backend: imported here, off the JAX path.
        from keras_yolo_mgpu.backend.tensorflow.distribution import simulate_devices

        names = simulate_devices(gpus or 2, memory_limit_mb=settings["simulated_gpu_memory_mb"])
    else:
        names = None
    engine = build_engine(
        gpus, simulate=settings["simulate"], parallel=settings["parallel"], sync_bn=settings["sync_bn"], devices=names
    )
    global_batch = settings["batch_size"] or 8 * engine.replicas
    if global_batch % engine.replicas:
        raise ValueError(f"global batch {global_batch} does not divide over {engine.replicas} replicas")
    kind = model_name(settings["model"], settings["tiny"]) or "yolov3"
    mixed_precision = settings["mixed_precision"]
    policy = mixed_policy_name(engine.backend, engine.bfloat16) if mixed_precision else keras.config.floatx()
    keras.mixed_precision.set_global_policy(policy)
    # JAX compiles every step (without jit it would time Python dispatching ops one by one).
    jit = settings["jit"] or engine.backend == "jax"
    anchors = get_anchors(resolve_resource(None, "anchors", model=kind))
    x, y = synthetic_batch(global_batch, input_size, anchors, num_classes)
    host_batch = synthetic_host_batch(global_batch, input_size, num_classes) if inputs == "device" else None
    options = {**settings, "model": kind, "tiny": kind == "yolov3-tiny", "jit": jit, "host_batch": host_batch}
    record = {
        "benchmark": "train",
        "model": kind,
        "input_size": list(input_size),
        "num_classes": num_classes,
        "replicas": engine.replicas,
        "devices": list(engine.devices),
        "parallel": settings["parallel"],
        "global_batch": global_batch,
        "backend": engine.backend,
        "mixed_precision": mixed_precision,
        "dtype_policy": policy,
        "jit": jit,
        **{key: settings[key] for key in ("steps_per_execution", "inputs", "optimizer", "ema")},
    }
    return dict(engine=engine, options=options, anchors=anchors, x=x, y=y, record=record)
