"""Where a training step's time goes: forward, loss, backward, optimizer, Keras.

Each part is timed as a cumulative `tf.function` on one in-memory batch:

* `forward`: the network in training mode (BatchNormalization on batch statistics);
* `forward+loss`: the training model's loss, reduced as its fit reduces it;
* `gradients`: the same plus the regularisation losses, differentiated with a tape;
* `step`: the same plus the optimizer update (a whole step without Keras);
* `loss`, `loss+grad`: the loss alone on fixed head outputs, and with its
  gradient with respect to them (the ignore mask's cost is inside).

The differences between consecutive parts give the forward pass, loss,
backward pass and optimizer; `fit` step time minus `step` is what Keras's
train step adds. The same functions time Keras 3 (ours) and Keras 2
(keras-yolo3 under `tf_keras`), so the parts compare side by side.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import tensorflow as tf

PARTS = ("forward", "forward+loss", "gradients", "step", "loss", "loss+grad")


@dataclass
class StepParts:
    """What one side's parts are timed on.

    Attributes:
        body: the network, images (N, H, W, 3) -> head outputs.
        train_model: `[image, *y_true]` -> loss, per sample (N, 1) or a scalar.
        loss_fn: `[*head_outputs, *y_true]` -> the same loss.
        apply_gradients: `(gradients, variables)` -> None, the optimizer update.
        inputs: `[image, *y_true]` tensors of one batch.
        jit: compile the parts with XLA.
    """

    body: Callable
    train_model: Callable
    loss_fn: Callable
    apply_gradients: Callable
    inputs: Sequence[tf.Tensor]
    jit: bool = False
    functions: dict[str, Callable] = field(default_factory=dict)

    def __post_init__(self):
        image, targets = self.inputs[0], list(self.inputs[1:])
        model = self.train_model
        variables = model.trainable_variables

        def mean_loss():
            # Per-sample losses are averaged as fit averages them; a scalar
            # (keras-yolo3's) stays as it is.
            return tf.reduce_mean(model(list(self.inputs), training=True))

        def total_loss():
            return mean_loss() + tf.add_n(model.losses)

        def gradients():
            with tf.GradientTape() as tape:
                loss = total_loss()
            return tape.gradient(loss, variables)

        def step():
            grads = gradients()
            self.apply_gradients(grads, variables)
            return grads[0]

        outputs = [tf.identity(t) for t in self.body(image, training=False)]

        def loss_grad():
            with tf.GradientTape() as tape:
                tape.watch(outputs)
                loss = tf.reduce_mean(self.loss_fn([*outputs, *targets]))
            return tape.gradient(loss, outputs)

        functions = {
            "forward": lambda: self.body(image, training=True),
            "forward+loss": mean_loss,
            "gradients": gradients,
            "step": step,
            "loss": lambda: self.loss_fn([*outputs, *targets]),
            "loss+grad": loss_grad,
        }
        self.functions = {part: tf.function(fn, jit_compile=self.jit or None) for part, fn in functions.items()}

    def time_part(self, part: str) -> float:
        """Seconds for one call, waiting for the result (asynchronous on GPUs)."""
        start = time.perf_counter()
        result = self.functions[part]()
        _ = [t.numpy() for t in tf.nest.flatten(result)[:1]]
        return time.perf_counter() - start


def time_parts(sides: dict[str, StepParts], rounds: int, warmup: int = 2) -> dict[str, dict[str, list[float]]]:
    """Interleaved timings: every round calls each part once on each side.

    Returns:
        {side: {part: [seconds per round]}}.
    """
    for parts in sides.values():
        for part in PARTS:
            for _ in range(warmup):
                parts.time_part(part)
    times = {name: {part: [] for part in PARTS} for name in sides}
    for round_index in range(rounds):
        order = list(sides) if round_index % 2 == 0 else list(sides)[::-1]
        for part in PARTS:
            for name in order:
                times[name][part].append(sides[name].time_part(part))
    return times
