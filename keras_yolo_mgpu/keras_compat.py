"""Every use of Keras internals, in one place, guarded by the Keras version it was written for.

Each function here does what public Keras cannot, says which private attribute it reads, and
was checked against Keras 3.15.1; `tests/test_keras_compat.py` fails loudly when a Keras upgrade
changes them. The two multi-worker patches apply only on the Keras versions they were verified on
(`PATCHED_KERAS`), only when multi-worker training asks for them, never process-wide; on another
version a warning says they were not applied.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys

import h5py
import keras
from keras.src.backend.common import global_state
from keras.src.legacy.saving import legacy_h5_format
from keras.src.utils import module_utils

from keras_yolo_mgpu.optional import tensorflow as tf

logger = logging.getLogger(__name__)

# Keras versions (major, minor) on which the multi-worker bugs were measured
# and the patches verified (tests/test_train.py runs two workers).
PATCHED_KERAS = ((3, 15),)

# ModelCheckpoint's private methods TemplateModelCheckpoint relies on, with
# the parameters it calls them with.
MODEL_CHECKPOINT_HOOKS = {
    "_save_model": ("epoch", "batch", "logs"),
    "_get_file_path": ("epoch", "batch", "logs"),
    "_should_save_model": ("epoch", "batch", "logs", "filepath"),
}


def keras_version() -> tuple[int, int]:
    """(major, minor) of the running Keras."""
    major, minor = keras.__version__.split(".")[:2]
    return int(major), int(minor)


def _patch_applies(name: str) -> bool:
    if keras_version() in PATCHED_KERAS:
        return True
    logger.warning(
        "%s: not applied; it works around a bug of Keras %s and this is Keras %s. If multi-worker training "
        "fails, install keras==3.15.* or check whether the bug is fixed (keras_yolo_mgpu/keras_compat.py).",
        name,
        " / ".join(f"{a}.{b}" for a, b in PATCHED_KERAS),
        keras.__version__,
    )
    return False


def patch_multiworker_first_batch_build(model: keras.Model) -> bool:
    """Works around Keras 3.15 failing on dict inputs under MultiWorkerMirroredStrategy.

    Before its first step, Keras's TF trainer reduces one distributed batch
    to learn the input shapes, calling `strategy.reduce` on the whole nested
    structure. MirroredStrategy accepts a dict there; the collective
    strategy raises "Attempt to convert a value ({'image': PerReplica...})".
    Keras only needs the shapes and dtypes: each leaf's first local replica
    value gives them without any collective op (a MEAN all-reduce would also
    refuse the pipeline's uint8 images).

    Replaces `model._maybe_symbolic_build` (this model only) with a version
    that calls `model._symbolic_build(data_batch=...)`.

    Returns:
        Whether the patch was applied (only on `PATCHED_KERAS`).
    """
    if not _patch_applies("patch_multiworker_first_batch_build"):
        return False
    strategy = model.distribute_strategy

    def first_batch_build(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = tf.nest.map_structure(
                    lambda value: (
                        strategy.experimental_local_results(value)[0]
                        if isinstance(value, tf.distribute.DistributedValues)
                        else value
                    ),
                    next(batches),
                )
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = first_batch_build
    return True


_LOGS_PATCHED = False


def patch_multiworker_log_reduction() -> bool:
    """Works around Keras 3 reducing scalar logs with axis=0 under MultiWorkerMirroredStrategy.

    Keras's TF trainer reduces each step's logs with
    `strategy.reduce("MEAN", value, axis=0)` under the collective strategy,
    which fails on scalars ("Invalid reduction dimension 0 for input with 0
    dimensions", tensorflow/tensorflow#72388). Metric results are already
    identical on every replica (their variables are all-reduced on update),
    so the first replica's value is exact: Keras does the same on TPUs.

    Wraps `keras.src.backend.tensorflow.trainer.reduce_per_replica`; the
    wrapper changes nothing for other strategies. Idempotent.

    Returns:
        Whether the patch is in place (only on `PATCHED_KERAS`).
    """
    global _LOGS_PATCHED
    if _LOGS_PATCHED:
        return True
    if not _patch_applies("patch_multiworker_log_reduction"):
        return False
    # Keras's TensorFlow trainer imports TensorFlow: imported here, on that engine only.
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original = tf_trainer.reduce_per_replica

    @functools.wraps(original)  # keeps `__wrapped__`: the tests read the original
    def reduce_per_replica(values, strategy, reduction):
        if reduction == "auto" and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            reduction = "first"
        return original(values, strategy, reduction)

    tf_trainer.reduce_per_replica = reduce_per_replica
    _LOGS_PATCHED = True
    return True


def check_model_checkpoint_hooks() -> None:
    """Raises RuntimeError when `ModelCheckpoint` lacks the private methods `TemplateModelCheckpoint` overrides."""
    for name, parameters in MODEL_CHECKPOINT_HOOKS.items():
        method = getattr(keras.callbacks.ModelCheckpoint, name, None)
        found = tuple(inspect.signature(method).parameters)[1:] if callable(method) else None
        if found != parameters:
            raise RuntimeError(
                f"keras.callbacks.ModelCheckpoint.{name}{parameters} is gone or changed in Keras {keras.__version__} "
                f"(found: {found}); TemplateModelCheckpoint was written for Keras 3.15. "
                "Install keras==3.15.* or update keras_yolo_mgpu/keras_compat.py."
            )


def child_layers(layer) -> list:
    """The layers directly inside `layer` (sub-layers of a custom layer, a wrapper's inner model).

    `keras.Model.layers` is public, but a plain `Layer` that holds other
    layers only exposes them through the private `_flatten_layers`.
    """
    if isinstance(layer, keras.Model):
        return list(layer.layers)
    return list(layer._flatten_layers(include_self=False, recursive=False))


def global_dtype_policy_setting():
    """Keras's global dtype policy as set: a policy, or None where none was set (it then follows floatx).

    `keras.config.dtype_policy()` would set the floatx policy where none is set;
    this reads without setting (`keras.src.backend.common.global_state`'s
    "dtype_policy" attribute, Keras 3.15.1).
    """
    return global_state.get_global_attribute("dtype_policy", None)


def restore_global_dtype_policy(setting) -> None:
    """Puts back what `global_dtype_policy_setting` returned, None (unset) included (Keras 3.15.1)."""
    global_state.set_global_attribute("dtype_policy", setting)


def adam_moments(optimizer: keras.optimizers.Adam, variable) -> tuple:
    """The first and second moment variables `optimizer` keeps for `variable`, for the fused Adam (Keras 3.15.1).

    `keras.optimizers.Adam` holds them in `_momentums` and `_velocities`,
    indexed by `_get_variable_index(variable)`; the public `variables` list
    does not say which moment belongs to which weight.
    """
    index = optimizer._get_variable_index(variable)
    return optimizer._momentums[index], optimizer._velocities[index]


def moving_averages(optimizer) -> list[tuple]:
    """[(trainable variable, its moving average)] of a built optimizer with `use_ema=True` (`training.ema`).

    Keras keeps the averages in `optimizer._model_variables_moving_average`,
    index for index with `optimizer._trainable_variables` (None where a
    variable has none), and has no public accessor. Checked against Keras 3.15.1.
    """
    averages = optimizer._model_variables_moving_average
    return [(v, a) for v, a in zip(optimizer._trainable_variables, averages) if a is not None]


def set_random_seed(seed: int) -> None:
    """`keras.utils.set_random_seed(seed)`, seeding TensorFlow only once something has imported it.

    Keras seeds Python, NumPy and its global `SeedGenerator`, and, wherever
    TensorFlow is installed, TensorFlow, which it imports to do so. On the
    JAX engine nothing draws from TensorFlow's seed, and that import costs
    every start hundreds of MB of memory and seconds (docs/measurements.md,
    "Figures moved from the code's comments"). On TensorFlow it is imported,
    and seeded as Keras seeds it. A Keras without the lazy module: its own
    function.
    """
    tensorflow = getattr(module_utils, "tensorflow", None)
    if "tensorflow" in sys.modules or not hasattr(tensorflow, "_available"):
        keras.utils.set_random_seed(seed)
        return
    known = tensorflow._available
    tensorflow._available = False  # what `tensorflow.available` answers
    try:
        keras.utils.set_random_seed(seed)
    finally:
        tensorflow._available = known


def latest_jax_state(model) -> dict | None:
    """The JAX trainer's state arrays of the latest dispatched step, or None before the first one.

    Keras 3.15's JAX `fit` and `evaluate` set `model._jax_state` (a dict of
    lists of arrays: trainable, non-trainable, optimizer and metrics
    variables) after dispatching each step, for callbacks that sync it, and
    clear it when they end. The next step's dispatch donates these arrays.
    `backend/jax/distribution.DispatchLimit` waits on them to bound the steps in flight.
    Without the attribute no step is bounded, and the Ctrl-C test of
    `tests/test_feed_processes.py` fails.
    """
    return getattr(model, "_jax_state", None)


def save_keras2_weights(model: keras.Model, path: str) -> None:
    """Writes `model`'s weights to `path` in Keras 2's HDF5 layout, as keras-yolo3's `save_weights` did.

    The file has the `layer_names` root attribute and one group per layer
    (Keras 2's `save_weights` to an `.h5` path), which Keras 2, keras-yolo3
    and `weights.loading.load_weights` read. Keras 3's public `save_weights`
    only writes its own `.weights.h5` layout; the Keras 2 writer is
    `keras.src.legacy.saving.legacy_h5_format.save_weights_to_hdf5_group`
    (Keras 3.15.1).
    """
    with h5py.File(path, "w") as handle:
        legacy_h5_format.save_weights_to_hdf5_group(handle, model)


def save_keras2_model(model: keras.Model, path: str) -> None:
    """Writes `model` (config and weights, no optimizer) to `path` as Keras 2's whole-model HDF5.

    What `model.save("x.h5")` writes in Keras 3 too (a `model_weights` group
    and a `model_config` attribute), without its warning that the format is
    legacy: the user asked for keras-yolo3's file. Loads with
    `keras.saving.load_model` and `weights.loading.load_weights`
    (`keras.src.legacy.saving.legacy_h5_format.save_model_to_hdf5`, Keras 3.15.1).
    """
    legacy_h5_format.save_model_to_hdf5(model, path, include_optimizer=False)
