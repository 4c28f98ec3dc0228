"""How `model.pooling.MaxPooling2D` computes on JAX: 2x2 windows at stride 2 as a reshape, with their gradient.

Keras's `max_pool` is a `lax.reduce_window`, whose gradient XLA's CPU
compiler expands into a reduce-window over the input and four int32 index
arrays of the input's size, then a scatter: a large part of tiny YOLOv3's
CPU step scratch memory (BENCHMARKS.md, "Max pooling on JAX: memory and time
of the CPU step"). Tiny YOLOv3's and YOLOv4-tiny's downsampling windows do
not overlap, so the maximum is a reshape and a `max`, and its gradient four
masks, one per window position, which XLA fuses. The gradient goes, as
TensorFlow's `MaxPoolGrad` and Keras's JAX gradient send it, to the first
maximum of each window in row-major order. Every other window (YOLOv4's
stride-1 SPP pools, odd sizes) is Keras's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from keras import ops


def max_pool(inputs, pool_size, strides, padding: str, data_format: str):
    """(B, H, W, C) -> (B, H', W', C): `keras.ops.max_pool`'s result and gradient, by reshape for 2x2 / 2."""
    if (
        tuple(pool_size) == (2, 2)
        and tuple(strides) == (2, 2)
        and data_format == "channels_last"
        and inputs.shape[1] is not None
        and inputs.shape[2] is not None
        and inputs.shape[1] % 2 == 0
        and inputs.shape[2] % 2 == 0
    ):
        # Even sides: "same" pads nothing, so it is "valid" too.
        return _max_pool_2x2(inputs)
    return ops.max_pool(inputs, pool_size, strides, padding, data_format)


@jax.custom_vjp
def _max_pool_2x2(x):
    """(B, H, W, C) -> (B, H / 2, W / 2, C): the maximum of each 2x2 window, H and W even."""
    batch, height, width, channels = x.shape
    return jnp.max(x.reshape(batch, height // 2, 2, width // 2, 2, channels), axis=(2, 4))


def _max_pool_2x2_forward(x):
    y = _max_pool_2x2(x)
    return y, (x, y)


def _max_pool_2x2_backward(residuals, gradient):
    """The output's gradient (B, H / 2, W / 2, C) -> the input's (B, H, W, C), at each window's first maximum."""
    x, y = residuals
    batch, height, width, channels = x.shape
    windows = x.reshape(batch, height // 2, 2, width // 2, 2, channels)
    zero = jnp.zeros((), gradient.dtype)
    taken = jnp.zeros(y.shape, bool)  # a maximum already found earlier in the window
    rows = []
    for row in range(2):
        columns = []
        for column in range(2):
            first = (windows[:, :, row, :, column] == y) & ~taken
            taken = taken | first
            columns.append(jnp.where(first, gradient, zero))
        rows.append(jnp.stack(columns, axis=3))  # (B, H / 2, W / 2, 2, C)
    return (jnp.stack(rows, axis=2).reshape(batch, height, width, channels),)


_max_pool_2x2.defvjp(_max_pool_2x2_forward, _max_pool_2x2_backward)
