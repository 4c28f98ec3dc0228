"""One forward and backward pass of a training model outside `fit`, on TensorFlow: a gradient tape.

For the start-up checks (`training.precision`): a step in float32 against one
in mixed precision, and a compiled step against an uncompiled one.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def loss_and_gradients(train_model, inputs, jit_compile: bool = False) -> tuple[float, list[np.ndarray]]:
    """The mean of the per-sample loss (N, 1) a training model outputs, and its gradients.

    Args:
        train_model: inputs -> per-sample loss (N, 1).
        inputs: the model's inputs for one batch.
        jit_compile: compile the step with XLA.

    Returns:
        `(loss, gradients)` as float32 numpy values, one gradient per
        trainable variable that has one.
    """

    def step(inputs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.cast(train_model(inputs, training=True), tf.float32))
        gradients = tape.gradient(loss, train_model.trainable_variables)
        return loss, [tf.cast(g, tf.float32) for g in gradients if g is not None]

    loss, gradients = tf.function(step, jit_compile=jit_compile)(inputs)
    return float(loss.numpy()), [g.numpy() for g in gradients]
