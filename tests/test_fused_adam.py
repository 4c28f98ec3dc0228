"""FusedAdam (TensorFlow's fused kernel) computes what Keras 3's Adam computes, on one device and on replicas."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_yolo_mgpu.training.fused_adam import FusedAdam

SHAPES = [(3, 3, 4, 5), (5,), (7, 2)]


def _gradients(dtype, steps):
    rng = np.random.default_rng(0)
    return [[rng.normal(0.0, scale, shape).astype(dtype) for shape in SHAPES] for scale in np.geomspace(1, 1e-4, steps)]


def _train(optimizer, dtype, steps=6):
    """The variables (and EMA averages) after `steps` updates from the same start."""
    rng = np.random.default_rng(1)
    variables = [keras.Variable(rng.normal(0.0, 1.0, shape).astype(dtype)) for shape in SHAPES]
    for gradients in _gradients(dtype, steps):
        optimizer.apply(gradients, variables)
    averages = optimizer._model_variables_moving_average if optimizer.use_ema else []
    return [keras.ops.convert_to_numpy(v) for v in [*variables, *averages]]


def _schedule():
    return keras.optimizers.schedules.ExponentialDecay(1e-2, decay_steps=2, decay_rate=0.5)


def _adam_formula(start, gradients, lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    """Adam as Keras 2 and TensorFlow's ApplyAdam kernel write it (epsilon-hat form), in numpy float64."""
    weights = [w.copy() for w in start]
    moments = [np.zeros_like(w) for w in start]
    velocities = [np.zeros_like(w) for w in start]
    for t, step_gradients in enumerate(gradients, start=1):
        alpha = lr * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        for w, m, v, g in zip(weights, moments, velocities, step_gradients):
            m += (g - m) * (1 - beta_1)
            v += (g * g - v) * (1 - beta_2)
            w -= m * alpha / (np.sqrt(v) + epsilon)
    return weights


def test_fused_adam_follows_the_adam_formula_in_float64():
    # A rate exact in float32 (Keras keeps the rate in a float32 variable).
    lr, gradients = 2.0**-7, _gradients("float64", 6)
    rng = np.random.default_rng(1)
    start = [rng.normal(0.0, 1.0, shape) for shape in SHAPES]
    variables = [keras.Variable(w) for w in start]
    optimizer = FusedAdam(lr)
    for step_gradients in gradients:
        optimizer.apply(step_gradients, variables)
    for variable, want, initial in zip(variables, _adam_formula(start, gradients, lr), start):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), want, rtol=1e-14, atol=1e-15)
        assert float(np.abs(want - initial).max()) > 1e-2  # the updates moved the weights


@pytest.mark.parametrize("kwargs", [{}, {"use_ema": True, "ema_momentum": 0.9}, {"weight_decay": 0.01}])
def test_fused_adam_equals_keras_adam_in_float32(kwargs):
    fused = _train(FusedAdam(learning_rate=_schedule(), **kwargs), "float32")
    reference = _train(keras.optimizers.Adam(learning_rate=_schedule(), **kwargs), "float32")
    start = _train(keras.optimizers.Adam(learning_rate=0.0), "float32")
    for got, want, initial in zip(fused, reference, start):
        scale = float(np.abs(want).max())
        assert float(np.abs(got - want).max()) <= 1e-6 * scale
        assert float(np.abs(want - initial).max()) > 1e-3 * scale  # the updates moved the weights, by far more


def test_amsgrad_takes_keras_update_exactly():
    got = _train(FusedAdam(1e-2, amsgrad=True), "float64")
    want = _train(keras.optimizers.Adam(1e-2, amsgrad=True), "float64")
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_every_replica_copy_is_updated(logical_cpus):
    """Under MirroredStrategy the kernel updates each device's copy (the handle is the updated device's)."""
    from keras_yolo_mgpu.backend.tensorflow.distribution import make_strategy

    strategy = make_strategy(logical_cpus[:2])
    gradients = _gradients("float32", 3)
    rng = np.random.default_rng(1)
    start = [rng.normal(0.0, 1.0, shape).astype("float32") for shape in SHAPES]
    with strategy.scope():
        variables = [keras.Variable(value) for value in start]
        optimizer = FusedAdam(1e-2)
        optimizer.build(variables)

    @tf.function
    def step(gradients):
        # Each replica contributes half of the gradient; the optimizer's all-reduce sums them.
        strategy.run(lambda: optimizer.apply([g / 2 for g in gradients], variables))

    for step_gradients in gradients:
        step([tf.constant(g) for g in step_gradients])
    one_device = keras.optimizers.Adam(1e-2)
    reference = [keras.Variable(value) for value in start]
    for step_gradients in gradients:
        one_device.apply(step_gradients, reference)
    for variable, want, initial in zip(variables, reference, start):
        copies = strategy.experimental_local_results(variable.value)
        assert len(copies) == 2
        for copy in copies:
            np.testing.assert_allclose(copy.numpy(), want.numpy(), rtol=0, atol=2e-6)
        assert float(np.abs(want.numpy() - initial).max()) > 1e-3


def test_serializes_and_resumes_keras_adam_state():
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(FusedAdam(3e-3, beta_1=0.8)))
    assert isinstance(restored, FusedAdam) and restored.beta_1 == 0.8
    keras_adam, fused = keras.optimizers.Adam(1e-2), FusedAdam(1e-2)
    variables = [keras.Variable(np.ones(shape, "float32")) for shape in SHAPES]
    keras_adam.build(variables)
    fused.build(variables)
    assert [v.path.split("/")[-1] for v in keras_adam.variables] == [v.path.split("/")[-1] for v in fused.variables]
