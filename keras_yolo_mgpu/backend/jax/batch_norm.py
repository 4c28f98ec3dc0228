"""How `model.batch_norm.BatchNormalization` computes on JAX: Keras's formula in `keras.ops`, float64 kept.

`synchronized` needs nothing here: N devices run one SPMD program, in which
a mean over the batch axis is the global batch's mean.
"""

from __future__ import annotations

import keras
from keras import ops


def keras_synchronized(synchronized: bool) -> bool:
    """`synchronized` for `keras.layers.BatchNormalization`: False, which Keras accepts on TensorFlow only.

    The statistics are global anyway: JAX compiles N devices as one SPMD
    program, in which a mean over the batch axis is the global batch's.
    """
    return False


def call(layer, inputs, training, mask, keras_call):
    """(N, H, W, C) -> (N, H, W, C): `layer`'s call; `keras_call` (Keras's own) for masks and renormalisation."""
    if mask is not None or layer.renorm:
        return keras_call(inputs, training=training, mask=mask)
    return portable_call(layer, inputs, training)


def portable_call(layer, inputs, training):
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
    gamma = ops.cast(layer.gamma, dtype) if layer.scale else None
    beta = ops.cast(layer.beta, dtype) if layer.center else None
    if training and layer.trainable:
        reduction_axes = [axis for axis in range(len(inputs.shape)) if axis != layer.axis % len(inputs.shape)]
        mean, variance = ops.moments(x, axes=reduction_axes)
        momentum = layer.momentum
        layer.moving_mean.assign(ops.cast(layer.moving_mean, dtype) * momentum + mean * (1.0 - momentum))
        layer.moving_variance.assign(ops.cast(layer.moving_variance, dtype) * momentum + variance * (1.0 - momentum))
    else:
        mean, variance = ops.cast(layer.moving_mean, dtype), ops.cast(layer.moving_variance, dtype)
    outputs = ops.batch_normalization(
        x, mean, variance, axis=layer.axis, offset=beta, scale=gamma, epsilon=layer.epsilon
    )
    return ops.cast(outputs, layer.compute_dtype)
