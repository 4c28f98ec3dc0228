"""One forward and backward pass of a training model outside `fit`, on JAX: `jax.value_and_grad`.

For the start-up checks (`training.precision`): a step in float32 against one
in mixed precision. JAX transforms a pure function of the variables
(`stateless_call`); TensorFlow records a tape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def loss_and_gradients(train_model, inputs, jit_compile: bool = False) -> tuple[float, list[np.ndarray]]:
    """The mean of the per-sample loss (N, 1) a training model outputs, and its gradients.

    Args:
        train_model: inputs -> per-sample loss (N, 1).
        inputs: the model's inputs for one batch.
        jit_compile: unused: JAX always compiles the step.

    Returns:
        `(loss, gradients)` as float32 numpy values, one gradient per
        trainable variable.
    """
    trainable = [v.value for v in train_model.trainable_variables]
    non_trainable = [v.value for v in train_model.non_trainable_variables]

    def mean_loss(trainable_values):
        outputs, _ = train_model.stateless_call(trainable_values, non_trainable, inputs, training=True)
        return jnp.mean(outputs.astype(jnp.float32))

    loss, gradients = jax.jit(jax.value_and_grad(mean_loss))(trainable)
    return float(loss), [np.asarray(g, np.float32) for g in gradients]
