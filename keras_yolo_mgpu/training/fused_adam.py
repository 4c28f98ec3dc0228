"""Adam whose per-variable update is TensorFlow's fused `ResourceApplyAdam` kernel.

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

With N replicas every replica applies the update to its own copy of the
weights, so the saving counts N times per step (BENCHMARKS.md, "Multi-GPU
training"). AMSGrad, sparse gradients and other backends take Keras's own
update. Everything else (schedules, EMA, gradient all-reduce, saved state)
is Keras's: the moments are the same variables, so a run state saved with
Keras's Adam resumes with this one and back.
"""

from __future__ import annotations

import keras

from keras_yolo_mgpu.serialization import SERIALIZABLE_PACKAGE


def _handle(variable):
    """The resource handle of a Keras or TensorFlow variable.

    Inside a tf.distribute `update` call a mirrored variable's handle is the
    copy on the device being updated.
    """
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` (same arguments) with the fused update kernel."""

    def update_step(self, gradient, variable, learning_rate):
        if keras.backend.backend() != "tensorflow":  # JAX: Keras's update, which XLA fuses into the step
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf

        if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        step = tf.cast(self.iterations + 1, dtype)
        # tf.constant, not tf.cast: casting a Python float goes through float32 (0.9 -> 0.899999976).
        beta_1, beta_2 = tf.constant(self.beta_1, dtype), tf.constant(self.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable),
            m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.constant(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype),
        )
