"""How `model.pooling.MaxPooling2D` computes on TensorFlow: Keras's `max_pool`, TensorFlow's kernels.

The JAX side: `backend/jax/pooling.py`, the same function (2x2 windows at
stride 2 there by a reshape, whose gradient needs no index arrays).
"""

from __future__ import annotations

from keras import ops


def max_pool(inputs, pool_size, strides, padding: str, data_format: str):
    """(B, H, W, C) -> (B, H', W', C): `keras.ops.max_pool` (`MaxPool` and its `MaxPoolGrad`)."""
    return ops.max_pool(inputs, pool_size, strides, padding, data_format)
