"""BatchNormalization for both backends: TensorFlow's fused kernel there, float64-exact `keras.ops` elsewhere.

One layer class, so a network is defined once and its weight files load on
either backend (same variables, same class name as Keras's layer). What
differs per backend is how a training step computes, and it is decided in
`BatchNormalization.call`, nowhere else:

* **TensorFlow**: the fused `FusedBatchNormV3` kernel where it applies, with
  statistics all-reduced over MirroredStrategy replicas when
  `synchronized=True`; in float64, plain ops with the same written-out
  gradient, in float64 (`batch_norm_tf.py`); Keras's own path otherwise
  (inference, masks, renormalisation).
* **JAX** (and any other backend): Keras's formula in `keras.ops`, but in
  float64 for a float64 model (Keras 3.15 computes float64 inputs in
  float32). `synchronized` needs nothing there: N devices run one SPMD
  program, in which a mean over the batch axis is the global batch's mean.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_yolo_mgpu.serialization import SERIALIZABLE_PACKAGE


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class BatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` with a fused training kernel (TensorFlow) and float64 kept (JAX).

    Args:
        fused: TensorFlow: use the fused kernel in training where it applies
            (default). False always takes Keras's path (for comparisons).
        synchronized: TensorFlow: batch statistics over every replica of a
            MirroredStrategy. Accepted on every backend (on JAX the
            statistics are the global batch's by construction).
        **kwargs: `keras.layers.BatchNormalization` arguments.
    """

    def __init__(self, *, fused: bool = True, synchronized: bool = False, **kwargs):
        # Keras accepts `synchronized=True` on TensorFlow only. Elsewhere the
        # statistics are global anyway: JAX compiles N devices as one SPMD
        # program, in which a mean over the batch axis is the global batch's.
        on_tensorflow = keras.backend.backend() == "tensorflow"
        super().__init__(synchronized=bool(synchronized) and on_tensorflow, **kwargs)
        self.fused = bool(fused)
        # As asked, for get_config: a file written on one backend builds on the other.
        self._synchronized_as_asked = bool(synchronized)

    def call(self, inputs, training=None, mask=None):
        """(N, H, W, C) -> (N, H, W, C) in the layer's compute dtype."""
        if keras.backend.backend() == "tensorflow":
            from keras_yolo_mgpu.model import batch_norm_tf

            if batch_norm_tf.fused_applies(self, inputs, training, mask):
                return batch_norm_tf.fused_training_call(self, inputs)
            if batch_norm_tf.written_gradient_applies(self, inputs, training, mask):
                return batch_norm_tf.written_gradient_training_call(self, inputs)
            return super().call(inputs, training=training, mask=mask)
        if mask is not None or self.renorm:
            return super().call(inputs, training=training, mask=mask)
        return self._portable_call(inputs, training)

    def _portable_call(self, inputs, training):
        """Keras's batch normalization in `keras.ops`, computing in float64 for float64 inputs.

        Keras 3.15's `BatchNormalization.call` computes in
        `result_type(inputs.dtype, "float32")`, which is float32 even for
        float64 inputs: a float64 model would then carry float32 rounding
        (5e-7 relative) that differs with the batch layout, and the float64
        1-vs-N proofs would prove nothing. Here float64 stays float64; float16
        and bfloat16 are upcast to float32, as Keras does.
        """
        dtype = "float64" if keras.backend.standardize_dtype(inputs.dtype) == "float64" else "float32"
        x = ops.cast(inputs, dtype)
        gamma = ops.cast(self.gamma, dtype) if self.scale else None
        beta = ops.cast(self.beta, dtype) if self.center else None
        if training and self.trainable:
            reduction_axes = [axis for axis in range(len(inputs.shape)) if axis != self.axis % len(inputs.shape)]
            mean, variance = ops.moments(x, axes=reduction_axes)
            momentum = self.momentum
            self.moving_mean.assign(ops.cast(self.moving_mean, dtype) * momentum + mean * (1.0 - momentum))
            self.moving_variance.assign(ops.cast(self.moving_variance, dtype) * momentum + variance * (1.0 - momentum))
        else:
            mean, variance = ops.cast(self.moving_mean, dtype), ops.cast(self.moving_variance, dtype)
        outputs = ops.batch_normalization(
            x, mean, variance, axis=self.axis, offset=beta, scale=gamma, epsilon=self.epsilon
        )
        return ops.cast(outputs, self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config["fused"] = self.fused
        config["synchronized"] = self._synchronized_as_asked
        return config
