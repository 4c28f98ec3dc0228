"""One forward and backward pass of a training model outside `fit`, on either backend.

The start-up checks (`training.precision`) compare a step in float32 with
one in mixed precision, and a compiled step with an uncompiled one. Taking
gradients is where the backends differ in kind: TensorFlow records a tape,
JAX transforms a pure function of the variables (`stateless_call`). Both
versions are here, side by side; everything else in the model is
`keras.ops`.
"""

from __future__ import annotations

import keras
import numpy as np


def loss_and_gradients(train_model, inputs, jit_compile: bool = False) -> tuple[float, list[np.ndarray]]:
    """The mean of the per-sample loss (N, 1) a training model outputs, and its gradients.

    Args:
        train_model: inputs -> per-sample loss (N, 1).
        inputs: the model's inputs for one batch.
        jit_compile: compile the step with XLA (TensorFlow; JAX always compiles).

    Returns:
        `(loss, gradients)` as float32 numpy values, one gradient per
        trainable variable that has one.
    """
    if keras.backend.backend() == "jax":
        return _jax_loss_and_gradients(train_model, inputs)
    return _tensorflow_loss_and_gradients(train_model, inputs, jit_compile)


def _tensorflow_loss_and_gradients(train_model, inputs, jit_compile: bool):
    import tensorflow as tf

    def step(inputs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.cast(train_model(inputs, training=True), tf.float32))
        gradients = tape.gradient(loss, train_model.trainable_variables)
        return loss, [tf.cast(g, tf.float32) for g in gradients if g is not None]

    loss, gradients = tf.function(step, jit_compile=jit_compile)(inputs)
    return float(loss.numpy()), [g.numpy() for g in gradients]


def _jax_loss_and_gradients(train_model, inputs):
    import jax
    import jax.numpy as jnp

    trainable = [v.value for v in train_model.trainable_variables]
    non_trainable = [v.value for v in train_model.non_trainable_variables]

    def mean_loss(trainable_values):
        outputs, _ = train_model.stateless_call(trainable_values, non_trainable, inputs, training=True)
        return jnp.mean(outputs.astype(jnp.float32))

    loss, gradients = jax.jit(jax.value_and_grad(mean_loss))(trainable)
    return float(loss), [np.asarray(g, np.float32) for g in gradients]
