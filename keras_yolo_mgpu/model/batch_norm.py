"""BatchNormalization whose training step runs TensorFlow's fused kernel.

Keras 3's `BatchNormalization` trains with separate ops: `tf.nn.moments`
(two reductions), `tf.nn.batch_normalization`, and their gradients through
the batch statistics, several passes over every activation. Keras 2 used
the fused `FusedBatchNormV3` kernel (one op forward, one backward, cuDNN on
GPUs). Measured on the 2-core CPU (BENCHMARKS.md, "Training step"), that
difference is most of the gap between a Keras 3 YOLOv3 training step and
keras-yolo3's.

This layer computes the same function: normalisation by the biased batch
variance, moving statistics updated with Keras 3's formula from the biased
variance (the kernel returns the Bessel-corrected one; it is scaled back),
gradients through the batch statistics. Layers built with it store the same
variables under the same class name, so Keras 3 weight files load either
way. It falls back to Keras's own path where the kernel does not apply:
inference, float64 (the equivalence tests), masks, renormalisation, inputs
that are not 4-D channels-last, and synchronized statistics over several
replicas.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_yolo_mgpu.serialization import SERIALIZABLE_PACKAGE

_FUSED_DTYPES = ("float16", "bfloat16", "float32")


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class BatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` with a fused training kernel.

    Args:
        fused: use the fused kernel in training where it applies (default).
            False always takes Keras's path (for comparisons).
        **kwargs: `keras.layers.BatchNormalization` arguments.
    """

    def __init__(self, *, fused: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.fused = bool(fused)

    def _fused_applies(self, inputs, training, mask) -> bool:
        if not (self.fused and training is True and self.trainable) or mask is not None or self.renorm:
            return False
        if keras.backend.backend() != "tensorflow" or len(inputs.shape) != 4 or self.axis not in (-1, 3):
            return False
        if keras.backend.standardize_dtype(inputs.dtype) not in _FUSED_DTYPES:
            return False
        # Synchronized statistics over several replicas need Keras's
        # all-reduced moments; with one replica they are the local ones.
        return not self.synchronized or tf.distribute.get_strategy().num_replicas_in_sync == 1

    def call(self, inputs, training=None, mask=None):
        """(N, H, W, C) -> (N, H, W, C) in the layer's compute dtype."""
        if not self._fused_applies(inputs, training, mask):
            return super().call(inputs, training=training, mask=mask)
        channels = inputs.shape[-1]
        # Statistics and parameters in float32, as Keras does; float16 inputs
        # go in as they are (the kernel computes in float32 internally).
        gamma = tf.cast(self.gamma, tf.float32) if self.scale else tf.ones([channels], tf.float32)
        beta = tf.cast(self.beta, tf.float32) if self.center else tf.zeros([channels], tf.float32)
        outputs, mean, corrected_variance = tf.compat.v1.nn.fused_batch_norm(
            inputs, gamma, beta, epsilon=self.epsilon, data_format="NHWC", is_training=True
        )
        # The kernel returns variance * n / (n - 1) (n - 1 floored at 1);
        # Keras's moving variance follows the biased batch variance.
        count = tf.cast(tf.size(inputs) // channels, tf.float32)
        variance = corrected_variance * (tf.maximum(count - 1.0, 1.0) / count)
        self.moving_mean.assign(self.moving_mean * self.momentum + mean * (1.0 - self.momentum))
        self.moving_variance.assign(self.moving_variance * self.momentum + variance * (1.0 - self.momentum))
        return tf.cast(outputs, self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config["fused"] = self.fused
        return config
