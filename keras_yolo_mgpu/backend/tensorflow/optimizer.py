"""The Adam update on TensorFlow: the fused `ResourceApplyAdam` kernel, for `training.fused_adam.FusedAdam`.

Keras 3's Adam (TensorFlow backend) updates each variable with about ten
separate element-wise ops, each a full pass over the weight with a
temporary the size of the weight. keras-yolo3 trained with Keras 2's Adam,
which called TensorFlow's fused kernel: one multi-threaded pass over the
weight, both moments and the gradient. The kernel computes Keras 3's
formula step for step (TensorFlow's `training_ops`, `ApplyAdam`):

    alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)
    m += (g - m) * (1 - beta_1)
    v += (g^2 - v) * (1 - beta_2)
    w -= m * alpha / (sqrt(v) + epsilon)

The JAX side: `backend/jax/optimizer.py`, the same function.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_yolo_mgpu.keras_compat import adam_moments


def _handle(variable):
    """The resource handle of a Keras or TensorFlow variable.

    Inside a tf.distribute `update` call a mirrored variable's handle is the
    copy on the device being updated.
    """
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle


def fused_adam_step(optimizer: keras.optimizers.Adam, gradient, variable, learning_rate) -> bool:
    """Applies `optimizer`'s Adam update to `variable` with the fused kernel; False where Keras's update must run.

    AMSGrad and sparse gradients (`tf.IndexedSlices`) take Keras's update.
    """
    if optimizer.amsgrad or isinstance(gradient, tf.IndexedSlices):
        return False
    dtype = variable.dtype
    momentum, velocity = adam_moments(optimizer, variable)
    step = tf.cast(optimizer.iterations + 1, dtype)
    # tf.constant, not tf.cast: casting a Python float goes through float32 (0.9 -> 0.899999976).
    beta_1, beta_2 = tf.constant(optimizer.beta_1, dtype), tf.constant(optimizer.beta_2, dtype)
    tf.raw_ops.ResourceApplyAdam(
        var=_handle(variable),
        m=_handle(momentum),
        v=_handle(velocity),
        beta1_power=tf.pow(beta_1, step),
        beta2_power=tf.pow(beta_2, step),
        lr=tf.cast(learning_rate, dtype),
        beta1=beta_1,
        beta2=beta_2,
        epsilon=tf.constant(optimizer.epsilon, dtype),
        grad=tf.cast(gradient, dtype),
    )
    return True
