"""The fused BatchNormalization computes what Keras 3's own BatchNormalization computes."""

from functools import partial

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_yolo_mgpu.backend.tensorflow import batch_norm as batch_norm_tf
from keras_yolo_mgpu.model.batch_norm import BatchNormalization, fold_batch_norm
from keras_yolo_mgpu.model.yolo3 import build_body
from keras_yolo_mgpu.resources import get_anchors, resolve_resource


def _build_with_parameters(layer, shape):
    """Builds `layer` for inputs of `shape` with distinct, non-trivial gamma, beta and moving statistics."""
    layer.build(shape)
    channels = shape[-1]
    layer.gamma.assign(np.linspace(0.5, 1.5, channels))
    layer.beta.assign(np.linspace(-0.3, 0.3, channels))
    layer.moving_mean.assign(np.linspace(-1.0, 1.0, channels))
    layer.moving_variance.assign(np.linspace(0.5, 2.0, channels))


def _step(layer, x, upstream):
    """Output, gradients (x, gamma, beta) and moving statistics after one training call."""
    _build_with_parameters(layer, x.shape)
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
    assert batch_norm_tf.fused_applies(fused_layer, x, True, None)
    fused = _step(fused_layer, x, upstream)
    reference = _step(keras.layers.BatchNormalization(), x, upstream)
    for name, got, want in zip(["y", "dx", "dgamma", "dbeta", "moving_mean", "moving_variance"], fused, reference):
        scale = max(float(np.abs(want).max()), 1e-6)
        assert float(np.abs(got - want).max()) <= 2e-6 * scale, name


def test_float64_training_step_equals_keras_to_rounding_and_inference_is_keras_exactly():
    """float64 takes the written-gradient path (no fused kernel for it): Keras's step to float64 rounding."""
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(0.0, 1.0, (2, 6, 6, 4)))  # float64
    upstream = tf.constant(rng.normal(0.0, 1.0, (2, 6, 6, 4)))
    layer = BatchNormalization(dtype="float64")
    assert not batch_norm_tf.fused_applies(layer, x, True, None)
    assert batch_norm_tf.written_gradient_applies(layer, x, True, None)
    got = _step(layer, x, upstream)
    want = _step(keras.layers.BatchNormalization(dtype="float64"), x, upstream)
    names = ["y", "dx", "dgamma", "dbeta", "moving_mean", "moving_variance"]
    for name, a, b in zip(names, got, want, strict=True):
        assert a.dtype == np.float64, name
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14, err_msg=name)
    # Inference is Keras's own path, bit for bit.
    assert not batch_norm_tf.written_gradient_applies(layer, x, False, None)
    inference = BatchNormalization(dtype="float64")
    _build_with_parameters(inference, x.shape)
    reference = keras.layers.BatchNormalization(dtype="float64")
    _build_with_parameters(reference, x.shape)
    np.testing.assert_array_equal(inference(x, training=False).numpy(), reference(x, training=False).numpy())
    assert not batch_norm_tf.fused_applies(BatchNormalization(), tf.zeros((2, 4, 4, 3)), False, None)
    assert not batch_norm_tf.fused_applies(BatchNormalization(fused=False), tf.zeros((2, 4, 4, 3)), True, None)


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


def _replicated_step(layer_class, x, upstream, devices):
    """_step's results on a MirroredStrategy over `devices`, the batch split evenly between the replicas.

    Per-replica outputs and input gradients are concatenated back into the
    batch's order; gamma/beta gradients are summed over the replicas (what
    the optimizer's all-reduce does). Also returns whether every replica
    took the all-reduced-statistics path.
    """
    from keras_yolo_mgpu.backend.tensorflow.distribution import make_strategy

    strategy = make_strategy(devices)
    replicas = len(devices)
    with strategy.scope():
        layer = layer_class(synchronized=True)
        _build_with_parameters(layer, x.shape)
    x_shards, upstream_shards = np.split(x.numpy(), replicas), np.split(upstream.numpy(), replicas)
    inputs = strategy.experimental_distribute_values_from_function(
        lambda context: (x_shards[context.replica_id_in_sync_group], upstream_shards[context.replica_id_in_sync_group])
    )
    global_path = []

    @tf.function
    def step(shards):
        def replica(shard):
            x_shard, upstream_shard = shard
            if isinstance(layer, BatchNormalization):
                global_path.append(batch_norm_tf._statistics_are_global(layer))
            with tf.GradientTape() as tape:
                tape.watch(x_shard)
                y = layer(x_shard, training=True)
                loss = tf.reduce_sum(y * upstream_shard)
            return (y, *tape.gradient(loss, [x_shard, layer.gamma, layer.beta]))

        return strategy.run(replica, args=(shards,))

    y, dx, dgamma, dbeta = (strategy.experimental_local_results(t) for t in step(inputs))
    results = [np.concatenate([t.numpy() for t in y]), np.concatenate([t.numpy() for t in dx])]
    results += [np.sum([t.numpy() for t in dgamma], 0), np.sum([t.numpy() for t in dbeta], 0)]
    results += [layer.moving_mean.numpy(), layer.moving_variance.numpy()]
    return results, global_path


@pytest.mark.parametrize("replicas", [2, 4])
def test_synchronized_fused_step_equals_one_device_on_the_global_batch(logical_cpus, replicas):
    """Fused with all-reduced statistics on N replicas = Keras's layer on one device, on the whole batch."""
    rng = np.random.default_rng(2)
    shape = (8, 7, 5, 6)
    x = tf.constant(rng.normal(1.0, 2.0, shape).astype(np.float32))
    upstream = tf.constant(rng.normal(0.0, 1.0, shape).astype(np.float32))
    fused, global_path = _replicated_step(BatchNormalization, x, upstream, logical_cpus[:replicas])
    assert global_path == [True] * replicas
    keras_synchronized, _ = _replicated_step(keras.layers.BatchNormalization, x, upstream, logical_cpus[:replicas])
    one_device = _step(keras.layers.BatchNormalization(), x, upstream)
    names = ["y", "dx", "dgamma", "dbeta", "moving_mean", "moving_variance"]
    for name, got, synchronized, want in zip(names, fused, keras_synchronized, one_device):
        scale = max(float(np.abs(want).max()), 1e-6)
        assert float(np.abs(got - want).max()) <= 2e-6 * scale, name
        assert float(np.abs(synchronized - want).max()) <= 2e-6 * scale, name  # the reference is itself right
    # Local statistics would give a visibly different step (the check can fail).
    local = _step(keras.layers.BatchNormalization(), x[: shape[0] // replicas], upstream[: shape[0] // replicas])
    assert float(np.abs(local[1] - one_device[1][: shape[0] // replicas]).max()) > 1e-3


@pytest.mark.parametrize("replicas", [2, 4])
def test_synchronized_float64_step_equals_one_device_on_the_global_batch(logical_cpus, replicas):
    """float64 on N replicas (statistics and gradient sums all-reduced) = the same layer on one device."""
    rng = np.random.default_rng(3)
    shape = (8, 5, 4, 3)
    x = tf.constant(rng.normal(1.0, 2.0, shape))
    upstream = tf.constant(rng.normal(0.0, 1.0, shape))
    layer = partial(BatchNormalization, dtype="float64", synchronized=True)
    replicated, global_path = _replicated_step(layer, x, upstream, logical_cpus[:replicas])
    assert global_path == [True] * replicas
    one_device = _step(BatchNormalization(dtype="float64"), x, upstream)
    names = ["y", "dx", "dgamma", "dbeta", "moving_mean", "moving_variance"]
    for name, got, want in zip(names, replicated, one_device, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14, err_msg=name)
    # Local statistics would give a visibly different step (the check can fail).
    local = _step(BatchNormalization(dtype="float64"), x[: shape[0] // replicas], upstream[: shape[0] // replicas])
    assert float(np.abs(local[1] - one_device[1][: shape[0] // replicas]).max()) > 1e-3


def test_synchronized_fused_step_on_an_empty_global_batch_is_finite(logical_cpus):
    """Replicas that all got empty batches: zero statistics as Keras's divide_no_nan gives, no NaN."""
    empty = tf.zeros((0, 3, 3, 2))
    results, global_path = _replicated_step(BatchNormalization, empty, empty, logical_cpus[:2])
    assert global_path == [True, True]
    for result in results:
        assert np.isfinite(result).all()


def _with_statistics(model, seed=0):
    """`model` with every BatchNormalization given distinct, non-trivial gamma, beta and moving statistics."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            channels = layer.moving_mean.shape[0]
            for variable, (low, high) in zip(
                (layer.gamma, layer.beta, layer.moving_mean, layer.moving_variance),
                ((0.5, 1.5), (-0.3, 0.3), (-1.0, 1.0), (0.5, 2.0)),
            ):
                if variable is not None:
                    variable.assign(rng.uniform(low, high, channels))
    return model


def _batch_norms(model):
    return [layer.name for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]


def test_fold_batch_norm_folds_each_convolution_it_alone_feeds_and_computes_the_same():
    """Inference outputs as Keras's BatchNormalization computes them; only the foldable ones go."""
    x = keras.Input((12, 12, 3))
    a = keras.layers.Conv2D(4, 3, padding="same", use_bias=False, name="no_bias")(x)
    a = BatchNormalization(name="bn_no_bias")(a)
    a = keras.layers.LeakyReLU(0.1)(a)
    b = keras.layers.Conv2D(4, 1, name="with_bias")(a)
    b = BatchNormalization(center=False, scale=False, name="bn_plain")(b)
    shared = keras.layers.Conv2D(4, 1, name="shared")(b)  # feeds a normalisation and an addition: kept
    c = BatchNormalization(name="bn_shared")(shared)
    c = keras.layers.Add()([c, shared])
    d = keras.layers.Conv2D(4, 1, activation="relu", name="activated")(c)  # normalises a ReLU's output: kept
    d = BatchNormalization(name="bn_activated")(d)
    model = _with_statistics(keras.Model(x, [d, a]))
    before = [w.copy() for w in model.get_weights()]
    folded = fold_batch_norm(model)
    assert _batch_norms(folded) == ["bn_shared", "bn_activated"]
    assert folded.get_layer("no_bias").use_bias and folded.get_layer("with_bias").use_bias
    images = np.random.default_rng(3).normal(size=(2, 12, 12, 3)).astype(np.float32)
    for got, want in zip(folded(images, training=False), model(images, training=False), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    for got, want in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(got, want)  # the body is untouched
    folded.get_layer("no_bias").kernel.assign(np.zeros((3, 3, 3, 4)))
    assert np.abs(model.get_layer("no_bias").kernel.numpy()).max() > 0  # and shares no variable with the copy


@pytest.mark.parametrize("kind", ["yolov3-tiny", "yolov4"])
def test_fold_batch_norm_folds_every_normalisation_of_the_networks(kind):
    anchors = get_anchors(resolve_resource(None, "anchors", model=kind))
    body = _with_statistics(build_body(anchors, 3, model=kind), seed=1)
    folded = fold_batch_norm(body)
    assert _batch_norms(body) and not _batch_norms(folded)
    images = np.random.default_rng(4).random((1, 64, 64, 3), dtype=np.float32)
    for got, want in zip(folded(images, training=False), body(images, training=False), strict=True):
        want = np.asarray(want)
        assert np.abs(np.asarray(got) - want).max() <= 1e-5 * np.abs(want).max()
