"""The Keras internals keras_compat.py relies on: these fail loudly when a Keras upgrade changes them."""

import ast
import inspect
import logging
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from isolation import jax_environment

from keras_yolo_mgpu import keras_compat


def test_the_running_keras_is_one_the_patches_were_verified_on():
    # A new Keras: re-check the two multi-worker bugs (tests/test_train.py runs two workers), then
    # add the version to PATCHED_KERAS, or drop the patch if the bug is fixed.
    assert keras_compat.keras_version() in keras_compat.PATCHED_KERAS, keras.__version__


def test_log_reduction_bug_is_still_there():
    """Keras reduces logs with "mean" (axis 0) under any non-TPU strategy: what the patch replaces by "first"."""
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original = inspect.unwrap(tf_trainer.reduce_per_replica)  # the patch may already be in place
    assert tuple(inspect.signature(original).parameters) == ("values", "strategy", "reduction")
    source = inspect.getsource(tf_trainer)
    assert 'reduction = "first"\n        else:\n            reduction = "mean"' in source
    assert "_collective_all_reduce_multi_worker(strategy)" in source


def test_first_batch_build_hooks_exist():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert tuple(inspect.signature(model._maybe_symbolic_build).parameters) == ("iterator", "data_batch")
    assert "data_batch" in inspect.signature(model._symbolic_build).parameters
    # The bug: the whole (dict) batch goes to strategy.reduce in one call, then to _symbolic_build.
    source = inspect.getsource(type(model)._maybe_symbolic_build)
    assert "self.distribute_strategy.reduce(" in source and "maybe_distributed_data_batch," in source
    assert "self._symbolic_build(data_batch=data_batch)" in source


def test_first_batch_build_patch_replaces_only_this_models_hook():
    first = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    second = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert keras_compat.patch_multiworker_first_batch_build(first)
    assert "_maybe_symbolic_build" in vars(first) and "_maybe_symbolic_build" not in vars(second)


def test_patches_are_skipped_with_a_warning_on_other_keras(monkeypatch, caplog):
    monkeypatch.setattr(keras_compat, "keras_version", lambda: (9, 0))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with caplog.at_level(logging.WARNING):
        assert keras_compat.patch_multiworker_first_batch_build(model) is False
    assert "_maybe_symbolic_build" not in vars(model)
    assert "not applied" in caplog.text and "Keras 3.15" in caplog.text


def test_model_checkpoint_private_hooks_exist_and_are_the_save_path(tmp_path):
    keras_compat.check_model_checkpoint_hooks()
    calls = []

    class Recording(keras.callbacks.ModelCheckpoint):
        def _save_model(self, epoch, batch, logs):
            calls.append((epoch, batch, self._get_file_path(epoch, batch, logs)))

    callback = Recording(str(tmp_path / "ep{epoch:02d}.weights.h5"), save_weights_only=True)
    callback.set_model(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    callback.on_epoch_end(0, {"val_loss": 1.0})
    assert calls == [(0, None, str(tmp_path / "ep01.weights.h5"))]


def test_missing_checkpoint_hook_is_a_clear_error(monkeypatch):
    monkeypatch.delattr(keras.callbacks.ModelCheckpoint, "_should_save_model")
    with pytest.raises(RuntimeError, match="_should_save_model.*written for Keras 3.15"):
        keras_compat.check_model_checkpoint_hooks()


def test_child_layers_of_a_plain_layer():
    class Holder(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.inner = keras.layers.Dense(3)
            self.other = keras.layers.Dense(4)

        def call(self, x):
            return self.other(self.inner(x))

    holder = Holder()
    assert keras_compat.child_layers(holder) == [holder.inner, holder.other]
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert keras_compat.child_layers(model) == model.layers


def test_the_patches_are_for_the_tensorflow_backend():
    assert keras.backend.backend() == "tensorflow"


def test_dtype_policy_setting_reads_unset_without_setting_it():
    previous = keras_compat.global_dtype_policy_setting()
    try:
        keras_compat.restore_global_dtype_policy(None)
        assert keras_compat.global_dtype_policy_setting() is None
        keras.config.set_dtype_policy("mixed_float16")
        assert keras_compat.global_dtype_policy_setting().name == "mixed_float16"
        keras_compat.restore_global_dtype_policy(None)
        assert keras_compat.global_dtype_policy_setting() is None
        # The public reader pins the unset policy to floatx: why the internal one is needed.
        assert keras.config.dtype_policy().name == keras.config.floatx()
    finally:
        keras_compat.restore_global_dtype_policy(previous)


def test_adam_moments_are_the_variables_adam_updates():
    weight = keras.Variable(np.ones(3, np.float32))
    other = keras.Variable(np.ones(2, np.float32))
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.apply_gradients([(np.full(3, 2.0, np.float32), weight), (np.full(2, 5.0, np.float32), other)])
    momentum, velocity = keras_compat.adam_moments(optimizer, weight)
    # After one step from zero: m = (1 - beta_1) g, v = (1 - beta_2) g^2.
    np.testing.assert_allclose(momentum.numpy(), 0.1 * 2.0, rtol=1e-6)
    np.testing.assert_allclose(velocity.numpy(), 0.001 * 4.0, rtol=1e-6)
    np.testing.assert_allclose(keras_compat.adam_moments(optimizer, other)[0].numpy(), 0.1 * 5.0, rtol=1e-6)


def test_moving_averages_pair_each_trainable_variable_with_its_average():
    trained = keras.Variable([1.0, 2.0], name="trained")
    optimizer = keras.optimizers.SGD(learning_rate=0.5, use_ema=True, ema_momentum=0.9)
    optimizer.build([trained])
    optimizer.apply_gradients([(keras.ops.ones((2,)), trained)])
    ((variable, average),) = keras_compat.moving_averages(optimizer)
    assert variable is trained
    # The first step copies the updated weight into the average.
    assert keras.ops.convert_to_numpy(average).tolist() == [0.5, 1.5]


JAX_START = """
import os, random, sys
import numpy as np
import keras
from keras_yolo_mgpu import keras_compat
from keras_yolo_mgpu.training.callbacks import EpochTensorBoard

def draws():
    return [random.random(), float(np.random.rand()), float(keras.random.uniform(()))]

keras_compat.set_random_seed(7)
ours, after_seed = draws(), "tensorflow" in sys.modules
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
board = EpochTensorBoard(sys.argv[1])
board.set_model(model)
board.on_train_begin()
before_epoch_end = "tensorflow" in sys.modules
board.on_epoch_end(0, {"loss": 1.0})
board.on_train_end()
after_curves = "tensorflow" in sys.modules
keras.utils.set_random_seed(7)
written = os.listdir(os.path.join(sys.argv[1], "train"))
print(repr((ours, after_seed, before_epoch_end, len(written), draws(), after_curves)))
"""


def test_a_jax_run_seeds_as_keras_does_and_writes_tensorboard_curves_without_importing_tensorflow(tmp_path):
    # A JAX process where TensorFlow is installed: Keras's own seeding and TensorBoard callback import it (0.5 GB,
    # and GPU memory beside JAX once it runs an op); ours never do.
    done = subprocess.run(
        [sys.executable, "-c", JAX_START, str(tmp_path / "tensorboard")],
        env=dict(os.environ, **jax_environment(1)),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ours, after_seed, before_epoch_end, written, keras_draws, imported = ast.literal_eval(
        done.stdout.strip().splitlines()[-1]
    )
    assert ours == keras_draws and not after_seed and not before_epoch_end
    assert written == 1 and not imported  # the epoch's curves, without TensorFlow


def _curves(folder) -> dict:
    """{(part, tag): [(step, value), ...]} of the TensorBoard event files under `folder` (train/, validation/)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    curves = {}
    for part in sorted(os.listdir(folder)):
        events = EventAccumulator(os.path.join(folder, part))
        events.Reload()
        for tag in events.Tags()["tensors"]:
            curves[part, tag] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]
    return curves


def test_epoch_curves_are_the_ones_keras_tensorboard_callback_writes(tmp_path):
    """The same tags, steps and values as `keras.callbacks.TensorBoard` (epoch updates), read back by TensorBoard."""
    from keras_yolo_mgpu.training.callbacks import EpochTensorBoard

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.25), loss="mse")
    epochs = [{"loss": 1.5, "val_loss": 2.5, "val_mAP": 0.125}, {"loss": 0.75}, {"loss": 0.5, "val_loss": 1.25}]
    for board in (
        keras.callbacks.TensorBoard(str(tmp_path / "keras"), write_graph=False),
        EpochTensorBoard(str(tmp_path / "ours")),
    ):
        board.set_model(model)
        board.on_train_begin()
        for epoch, logs in enumerate(epochs):
            model.optimizer.iterations.assign(3 * epoch + 2)
            if "val_loss" in logs:  # fit's evaluation, then the epoch's end
                board.on_test_begin()
                board.on_test_end({"loss": logs["val_loss"]})
            board.on_epoch_end(epoch, dict(logs))
        board.on_train_end()
    keras_curves = _curves(tmp_path / "keras")
    assert keras_curves[("validation", "epoch_mAP")] == [(0, 0.125)]  # the reference has what is compared
    assert keras_curves[("train", "epoch_learning_rate")] == [(0, 0.25), (1, 0.25), (2, 0.25)]
    assert keras_curves[("validation", "evaluation_loss_vs_iterations")] == [(2, 2.5), (8, 1.25)]
    assert _curves(tmp_path / "ours") == keras_curves
