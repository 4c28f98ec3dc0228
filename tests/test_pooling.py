"""`model.pooling.MaxPooling2D`: Keras's pooling, and on JAX 2x2 windows at stride 2 by a reshape.

The reference is the rule of TensorFlow's `MaxPoolGrad`, which keras-yolo3
trains with: each output's gradient goes to the first maximum of its window,
in row-major order. The inputs are rounded to halves, so many windows hold
ties. The TensorFlow side runs here; the JAX side in one child process
(`isolation.run_isolated`), which also compiles the gradient both ways: with
Keras's `max_pool` (XLA's CPU compiler makes four int32 index arrays of the
input's size) and with the layer's, whose scratch memory must be far smaller.
"""

from __future__ import annotations

import numpy as np
from isolation import run_isolated

CASES = {
    # name: (input shape, pool size, strides): the downsampling pool, the stride-1 pool of tiny YOLOv3's head,
    # and odd sides (both through Keras's own op on JAX).
    "2x2 stride 2": ((2, 8, 12, 3), 2, 2),
    "2x2 stride 1": ((2, 7, 7, 3), 2, 1),
    "2x2 stride 2, odd": ((2, 7, 9, 3), 2, 2),
}


def _case(name):
    shape, size, strides = CASES[name]
    rng = np.random.default_rng(len(name))
    x = np.round(rng.normal(size=shape) * 1.5) / 2  # halves: ties in many windows
    return x, size, strides


def _first_maximum_rule(x, size, strides, output_gradient):
    """keras-yolo3's (TensorFlow's) max pooling, "same" padding, and its gradient, by loops."""
    batch, height, width, channels = x.shape
    out_h, out_w = -(-height // strides), -(-width // strides)
    pad_h = max((out_h - 1) * strides + size - height, 0) // 2
    pad_w = max((out_w - 1) * strides + size - width, 0) // 2
    y, dx = np.zeros((batch, out_h, out_w, channels)), np.zeros_like(x)
    for b in range(batch):
        for i in range(out_h):
            for j in range(out_w):
                for c in range(channels):
                    rows = range(max(i * strides - pad_h, 0), min(i * strides - pad_h + size, height))
                    cols = range(max(j * strides - pad_w, 0), min(j * strides - pad_w + size, width))
                    window = [(r, s) for r in rows for s in cols]  # row-major
                    best = max(window, key=lambda rs: (x[b, rs[0], rs[1], c], -window.index(rs)))
                    y[b, i, j, c] = x[b, best[0], best[1], c]
                    dx[b, best[0], best[1], c] += output_gradient[b, i, j, c]
    return y, dx


def _pooled_and_gradients(names):
    """In the suite's process or the JAX child: each case's output and input gradient, float64."""
    import keras

    from keras_yolo_mgpu.model.pooling import MaxPooling2D

    results = {}
    for name in names:
        x, size, strides = _case(name)
        layer = MaxPooling2D(size, strides=strides, padding="same", dtype="float64")
        weights = np.arange(1.0, 1.0 + np.prod(layer.compute_output_shape(x.shape))).reshape(
            layer.compute_output_shape(x.shape)
        )

        def loss(inputs, layer=layer, weights=weights):
            return keras.ops.sum(layer(inputs) * weights)

        value = keras.ops.convert_to_numpy(layer(keras.ops.convert_to_tensor(x)))
        results[name] = (value, _input_gradient(loss, x), weights)
    return results


def _input_gradient(loss, x):
    """d loss / d x on the process's backend, as numpy."""
    import keras

    if keras.backend.backend() == "jax":
        import jax

        return np.asarray(jax.grad(loss)(jax.numpy.asarray(x)))
    import tensorflow as tf

    inputs = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        value = loss(inputs)
    return tape.gradient(value, inputs).numpy()


def _scratch_bytes():
    """JAX: the compiled gradient's scratch memory with Keras's `max_pool` and with the layer's (2x2 / 2)."""
    import jax
    import keras

    from keras_yolo_mgpu.model.pooling import MaxPooling2D

    x = jax.numpy.ones((2, 64, 64, 16), "float32")
    layer = MaxPooling2D(2, strides=2, padding="same")

    def scratch(pool):
        compiled = jax.jit(jax.grad(lambda v: jax.numpy.sum(pool(v) ** 2))).lower(x).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    return scratch(lambda v: keras.ops.max_pool(v, 2, 2, "same")), scratch(layer)


def _jax_side():
    return _pooled_and_gradients(list(CASES)), _scratch_bytes()


def test_max_pooling_sends_each_gradient_to_the_first_maximum_on_both_backends():
    on_jax, (keras_bytes, layer_bytes) = run_isolated(_jax_side, floatx="float64", backend="jax")
    on_tensorflow = _pooled_and_gradients(list(CASES))
    for name in CASES:
        x, size, strides = _case(name)
        for backend, (value, gradient, weights) in (("tensorflow", on_tensorflow[name]), ("jax", on_jax[name])):
            expected_value, expected_gradient = _first_maximum_rule(x, size, strides, weights)
            assert np.array_equal(value, expected_value), (backend, name)
            assert np.array_equal(gradient, expected_gradient), (backend, name)
    # Keras's gradient on JAX holds four int32 arrays of the input's size (512 KB each here): measured 2.9 MB
    # of scratch against the layer's 1.3 MB (2026-11-27).
    assert layer_bytes * 2 < keras_bytes, (layer_bytes, keras_bytes)
