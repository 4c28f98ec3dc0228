"""The fused BatchNormalization computes what Keras 3's own BatchNormalization computes."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_yolo_mgpu.model.batch_norm import BatchNormalization


def _step(layer, x, upstream):
    """Output, gradients (x, gamma, beta) and moving statistics after one training call."""
    layer.build(x.shape)
    channels = x.shape[-1]
    layer.gamma.assign(np.linspace(0.5, 1.5, channels))
    layer.beta.assign(np.linspace(-0.3, 0.3, channels))
    layer.moving_mean.assign(np.linspace(-1.0, 1.0, channels))
    layer.moving_variance.assign(np.linspace(0.5, 2.0, channels))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
        loss = tf.reduce_sum(tf.cast(y, upstream.dtype) * upstream)
    grads = tape.gradient(loss, [x, layer.gamma, layer.beta])
    return [t.numpy() for t in [y, *grads, layer.moving_mean.value, layer.moving_variance.value]]


@pytest.mark.parametrize("shape", [(4, 13, 11, 8), (1, 2, 1, 3), (2, 5, 5, 6)])
def test_fused_training_step_equals_keras(shape):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(1.0, 2.0, shape).astype(np.float32))
    upstream = tf.constant(rng.normal(0.0, 1.0, shape).astype(np.float32))
    fused_layer = BatchNormalization()
    assert fused_layer._fused_applies(x, True, None)
    fused = _step(fused_layer, x, upstream)
    reference = _step(keras.layers.BatchNormalization(), x, upstream)
    for name, got, want in zip(["y", "dx", "dgamma", "dbeta", "moving_mean", "moving_variance"], fused, reference):
        scale = max(float(np.abs(want).max()), 1e-6)
        assert float(np.abs(got - want).max()) <= 2e-6 * scale, name


def test_float64_and_inference_take_keras_path_exactly():
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(0.0, 1.0, (2, 6, 6, 4)))  # float64
    upstream = tf.constant(rng.normal(0.0, 1.0, (2, 6, 6, 4)))
    fused_layer = BatchNormalization(dtype="float64")
    assert not fused_layer._fused_applies(x, True, None)
    got = _step(fused_layer, x, upstream)
    want = _step(keras.layers.BatchNormalization(dtype="float64"), x, upstream)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert not BatchNormalization()._fused_applies(tf.zeros((2, 4, 4, 3)), False, None)
    assert not BatchNormalization(fused=False)._fused_applies(tf.zeros((2, 4, 4, 3)), True, None)


def _small_model(norm):
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    return keras.Model(inputs, norm(name="batch_normalization")(x))


def test_weight_files_interchange_with_keras_batch_normalization(tmp_path):
    ours = _small_model(BatchNormalization)
    ours.layers[-1].moving_variance.assign([2.0, 3.0, 4.0, 5.0])
    path = str(tmp_path / "fused.weights.h5")
    ours.save_weights(path)
    plain = _small_model(keras.layers.BatchNormalization)
    plain.load_weights(path)
    for a, b in zip(ours.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(a, b)
    clone = keras.layers.deserialize(keras.layers.serialize(BatchNormalization(fused=False, momentum=0.9)))
    assert isinstance(clone, BatchNormalization) and clone.fused is False and clone.momentum == 0.9
