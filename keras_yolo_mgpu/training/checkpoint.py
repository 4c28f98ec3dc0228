"""Checkpoints that any machine can load.

`TemplateModelCheckpoint` saves the *template* (the single-device `yolo_body`)
during training, whatever wraps it for several devices or for the loss, so a
checkpoint written on a 4-GPU box loads on a CPU-only one (`weights.loading`).
"""

from __future__ import annotations

import logging
import os
import shutil

import keras

from keras_yolo_mgpu.backend import distribution
from keras_yolo_mgpu.fileio import atomic_write
from keras_yolo_mgpu.keras_compat import check_model_checkpoint_hooks
from keras_yolo_mgpu.parallel.engine import is_chief
from keras_yolo_mgpu.weights.metadata import write_metadata

logger = logging.getLogger(__name__)

_WEIGHTS_SUFFIX = ".weights.h5"


def checkpoint_write_path(filepath: str, strategy=None) -> tuple[str, str | None]:
    """Where this worker writes `filepath`, and a temporary folder to delete after.

    Every worker saves (saving is part of the same program on all of them);
    a non-chief one writes into `<dir>/workertemp_<task_id>/`, which the
    caller deletes (Keras 2's `distributed_file_utils` scheme).

    Returns:
        `(write_path, temp_dir)`; `temp_dir` is None on the chief.
    """
    if is_chief(strategy):
        return filepath, None
    temp_dir = os.path.join(os.path.dirname(filepath), f"workertemp_{distribution.worker_index(strategy)}")
    return os.path.join(temp_dir, os.path.basename(filepath)), temp_dir


def save_weights_atomic(model: keras.Model, filepath: str, metadata=None) -> None:
    """`model.save_weights(filepath)` through `fileio.atomic_write`: the old file survives any failure.

    `metadata` (a `weights.metadata.ModelMetadata`, optional) is written into
    the temporary file before the rename, so it appears with the weights.
    """
    filepath = os.fspath(filepath)
    if not filepath.endswith(_WEIGHTS_SUFFIX):
        raise ValueError(f"`filepath` must end in `{_WEIGHTS_SUFFIX}`. Received: filepath={filepath}")

    def write(temporary: str) -> None:
        model.save_weights(temporary, overwrite=True)
        if metadata is not None:
            write_metadata(temporary, metadata)

    atomic_write(filepath, write)


def link_keras_yolo3_name(filepath: str) -> str:
    """Gives `<name>.weights.h5` its keras-yolo3 name `<name>.h5` too, as a hard link; returns that path.

    keras-yolo3's users look for `logs/000/trained_weights_final.h5` (and
    `trained_weights_stage_1.h5`); every loader here reads a file by its
    content, not its ending. A copy where the file system has no hard links;
    made under a temporary name and renamed, so the previous `<name>.h5` stays whole.
    """
    filepath = os.fspath(filepath)
    if not filepath.endswith(_WEIGHTS_SUFFIX):
        raise ValueError(f"`filepath` must end in `{_WEIGHTS_SUFFIX}`. Received: filepath={filepath}")
    keras_yolo3_path = filepath[: -len(_WEIGHTS_SUFFIX)] + ".h5"

    def write(temporary: str) -> None:
        os.remove(temporary)
        try:
            os.link(filepath, temporary)
        except OSError:
            shutil.copyfile(filepath, temporary)

    atomic_write(keras_yolo3_path, write)
    return keras_yolo3_path


class TemplateModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """`ModelCheckpoint` that saves the template's weights, not the trained wrapper's.

    Multi-device training and the loss (`create_model`) wrap the network,
    and a saved wrapper loads only into an identical wrapper (Keras 2's
    "weight file containing 1 layers" problem); the plain body loads on any
    machine, with any number of devices.

    Args:
        filepath: where to save; must end in `.weights.h5`; may contain
            `{epoch:03d}` and logged metrics, e.g. `{val_loss:.3f}`.
        template_model: the single-device model whose weights are saved
            (the `body` returned by `create_model`).
        monitor: metric for `save_best_only`.
        save_best_only: only save when `monitor` improves; the best file is
            never overwritten by a worse one.
        period: save every `period` epochs (Keras 2's argument, gone in
            Keras 3), counted from the first epoch this callback sees, as
            Keras 2 did. Exclusive with an integer `save_freq`.
        **kwargs: `verbose`, `mode`, `save_freq`, `initial_value_threshold`
            of `keras.callbacks.ModelCheckpoint`; `save_weights_only` is always True.
        metadata: optional `weights.metadata.ModelMetadata` stored in every
            file, so a checkpoint alone is enough to detect with.

    Saves are atomic; in multi-worker training only the chief writes to `filepath`.
    """

    def __init__(
        self,
        filepath,
        template_model,
        monitor="val_loss",
        save_best_only=False,
        period=None,
        metadata=None,
        **kwargs,
    ):
        filepath = os.fspath(filepath)
        if not filepath.endswith(_WEIGHTS_SUFFIX):
            raise ValueError(f"`filepath` must end in `{_WEIGHTS_SUFFIX}`. Received: filepath={filepath}")
        if not isinstance(template_model, keras.Model):
            raise ValueError(
                f"`template_model` must be a keras.Model (the single-device body). "
                f"Received: template_model={template_model!r}"
            )
        if not kwargs.pop("save_weights_only", True):
            raise ValueError("TemplateModelCheckpoint always saves weights only. Received: save_weights_only=False")
        if period is not None:
            if isinstance(period, bool) or not isinstance(period, int) or period < 1:
                raise ValueError(f"`period` must be a positive integer (epochs). Received: period={period!r}")
            if kwargs.get("save_freq", "epoch") != "epoch":
                raise ValueError(
                    "`period` counts epochs and cannot be combined with a batch-based `save_freq`. "
                    f"Received: period={period}, save_freq={kwargs['save_freq']!r}"
                )
        check_model_checkpoint_hooks()  # _save_model below overrides a private method
        super().__init__(filepath, monitor=monitor, save_best_only=save_best_only, save_weights_only=True, **kwargs)
        self.template_model = template_model
        self.metadata = metadata
        self.period = period
        self._epochs_since_last_save = 0

    @property
    def async_safe(self) -> bool:
        """Saving once per epoch reads nothing at batch ends: the step loop need not wait for the device."""
        return self.save_freq == "epoch"

    def _save_model(self, epoch, batch, logs):
        # Overrides ModelCheckpoint's save routine; its decision logic is reused as is.
        if batch is None and self.period is not None:
            self._epochs_since_last_save += 1
            if self._epochs_since_last_save < self.period:
                return
            self._epochs_since_last_save = 0
        filepath = self._get_file_path(epoch, batch, logs)
        if os.path.isdir(filepath):
            raise IsADirectoryError(f"TemplateModelCheckpoint needs a file path; {filepath} is an existing directory")
        if not self._should_save_model(epoch, batch, logs, filepath):
            return
        write_path, temp_dir = checkpoint_write_path(filepath, self._strategy())
        try:
            save_weights_atomic(self.template_model, write_path, self.metadata)
        finally:
            if temp_dir is not None:
                shutil.rmtree(temp_dir, ignore_errors=True)
        if self.verbose > 0 and temp_dir is None:
            logger.info("Epoch %d: saved template weights to %s", epoch + 1, filepath)

    def _strategy(self):
        """The strategy the model trains under; None on JAX (`is_chief` asks JAX itself)."""
        return distribution.training_strategy(self.model)
