"""The bare step on JAX: the trainer's yardstick, on the same card in the same call.

What `train.py` is held against (`scripts/jax_gpu_check.py`): the same
network as a plain Keras model (`keras.layers` only: Keras's own
BatchNormalization in place of the project's), keras-yolo3's loss in
`keras.ops` (`model.loss.yolo_loss`) on dense targets made once on the host,
Adam with the default recipe's EMA of the weights, the whole step one
`jax.jit` of `stateless_call` + `stateless_apply` with the state donated,
and the batch placed on the device once. No callbacks, no `fit`, no input
pipeline, no targets on the device: the fastest this network trains through
Keras on this card, so "trainer / bare step" says what everything else costs.

Each round runs `steps` steps and blocks once, on the last loss.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from keras_yolo_mgpu.resources import get_anchors, resolve_resource


def _plain_keras_copy(body):
    """`body` rebuilt from `keras.layers` alone: the project's BatchNormalization becomes Keras's."""
    # Keras, JAX and the modules that import them when the step is built: importing this module starts no backend.
    import keras

    from keras_yolo_mgpu.model.batch_norm import BatchNormalization

    def clone(layer):
        if isinstance(layer, BatchNormalization):
            config = {k: v for k, v in layer.get_config().items() if k not in ("fused", "synchronized")}
            return keras.layers.BatchNormalization.from_config(config)
        return layer.__class__.from_config(layer.get_config())

    return keras.models.clone_model(body, clone_function=clone)


def run_bare_step(
    *,
    tiny: bool = False,
    input_size: tuple[int, int] = (416, 416),
    num_classes: int = 80,
    batch_size: int = 32,
    mixed_precision: bool = True,
    ema: float | None = 0.99,
    learning_rate: float = 1e-4,
    steps: int = 30,
    warmup: int = 3,
    rounds: int = 3,
) -> dict:
    """Times the bare jitted step on JAX's first device; returns the result record.

    Args:
        tiny: tiny YOLOv3 instead of YOLOv3.
        input_size: (height, width), multiples of 32.
        batch_size: images per step.
        mixed_precision: `mixed_bfloat16` (what `train.py` uses on GPUs that compute bfloat16).
        ema: the weights' EMA decay (the default recipe's 0.99), None for none.
        steps, warmup, rounds: timed steps per round, untimed steps first, rounds.

    Returns:
        `{"benchmark": "bare-step", ..., "images_per_sec": median over rounds, "images_per_sec_rounds": [...]}`.
    """
    # Keras, JAX and the modules that import them when the step is built: importing this module starts no backend.
    import jax
    import keras

    from keras_yolo_mgpu.bench.train import synthetic_batch
    from keras_yolo_mgpu.model.boxes import MAX_BOXES
    from keras_yolo_mgpu.model.loss import yolo_loss
    from keras_yolo_mgpu.model.yolo3 import tiny_yolo_body, yolo_body

    if keras.backend.backend() != "jax":
        raise ValueError(f"the bare step is JAX's; this process runs Keras on {keras.backend.backend()}")
    kind = "yolov3-tiny" if tiny else "yolov3"
    anchors = get_anchors(resolve_resource(None, "anchors", model=kind))
    per_scale = 3
    policy = "mixed_bfloat16" if mixed_precision else "float32"
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        inputs = keras.Input((*input_size, 3))
        build = tiny_yolo_body if tiny else yolo_body
        model = _plain_keras_copy(build(inputs, per_scale, num_classes))
        kwargs = {"use_ema": True, "ema_momentum": ema} if ema else {}
        optimizer = keras.optimizers.Adam(learning_rate, **kwargs)
        optimizer.build(model.trainable_variables)
    finally:
        keras.config.set_dtype_policy(previous)
    x, _ = synthetic_batch(batch_size, input_size, anchors, num_classes)
    device = jax.devices()[0]
    images = jax.device_put(x["image"], device)
    y_true = [jax.device_put(x[key], device) for key in sorted(k for k in x if k.startswith("y_true_"))]

    def loss_of(trainable, non_trainable, images, y_true):
        outputs, non_trainable, losses = model.stateless_call(
            trainable, non_trainable, images, training=True, return_losses=True
        )
        outputs = [keras.ops.cast(output, "float32") for output in outputs]
        per_sample = yolo_loss([*outputs, *y_true], anchors, num_classes, max_true_boxes=MAX_BOXES * per_scale)
        loss = keras.ops.mean(per_sample) + sum(keras.ops.cast(term, "float32") for term in losses)
        return loss, non_trainable

    def step(state, images, y_true):
        trainable, non_trainable, optimizer_state = state
        (loss, non_trainable), gradients = jax.value_and_grad(loss_of, has_aux=True)(
            trainable, non_trainable, images, y_true
        )
        trainable, optimizer_state = optimizer.stateless_apply(optimizer_state, gradients, trainable)
        return loss, (trainable, non_trainable, optimizer_state)

    step = jax.jit(step, donate_argnums=0)
    state = (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in optimizer.variables],
    )
    started = time.perf_counter()
    for _ in range(warmup):
        loss, state = step(state, images, y_true)
    first_loss = float(loss)
    compile_seconds = time.perf_counter() - started
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            loss, state = step(state, images, y_true)
        final_loss = float(loss)  # the one read: waits for the round's last step
        rates.append(batch_size * steps / (time.perf_counter() - start))
    if not (np.isfinite(first_loss) and np.isfinite(final_loss)):
        raise FloatingPointError(f"the bare step's loss is not finite ({first_loss}, {final_loss})")
    return {
        "benchmark": "bare-step",
        "model": kind,
        "input_size": list(input_size),
        "num_classes": num_classes,
        "batch_size": batch_size,
        "dtype_policy": policy,
        "ema": ema,
        "device": str(device),
        "steps_per_round": steps,
        "warmup_steps": warmup,
        "warmup_seconds": round(compile_seconds, 1),
        "loss_first_last": [round(first_loss, 3), round(final_loss, 3)],
        "images_per_sec_rounds": [round(rate, 2) for rate in rates],
        "images_per_sec": round(statistics.median(rates), 2),
    }
