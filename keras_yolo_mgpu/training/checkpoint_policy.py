"""Which epoch checkpoints a run keeps besides `best.weights.h5` and `last.weights.h5`.

`TrainConfig.save_period`:

- None: keras-yolo3's `ep*.weights.h5` at every epoch whose monitored value improves;
- 0: none (`--resume` has its own run-state files);
- N >= 1: the weights of every Nth epoch (epoch N, 2N, ..., the same on a resumed run).
"""

from __future__ import annotations

import os

from keras_yolo_mgpu.training.checkpoint import TemplateModelCheckpoint

# keras-yolo3's per-improvement files, named by the monitored value.
IMPROVEMENT_PATTERN = "ep{epoch:03d}-loss{loss:.3f}-val_loss{val_loss:.3f}.weights.h5"
MAP_IMPROVEMENT_PATTERN = "ep{epoch:03d}-loss{loss:.3f}-val_mAP{val_mAP:.3f}.weights.h5"
# Also the per-improvement name of a run without validation images.
PERIODIC_PATTERN = "ep{epoch:03d}-loss{loss:.3f}.weights.h5"


class EveryNthEpochCheckpoint(TemplateModelCheckpoint):
    """The template's weights at the end of every epoch whose number (1-based) divides by `period`.

    By the epoch number, not the epochs this callback saw: both stages and a resumed run keep the same files.
    """

    def __init__(self, filepath, template_model, period: int, metadata=None):
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(f"save_period must be a positive integer (epochs). Received: {period!r}")
        super().__init__(filepath, template_model, save_best_only=False, metadata=metadata)
        self.every = period

    def _save_model(self, epoch, batch, logs):
        if batch is None and (epoch + 1) % self.every:
            return
        super()._save_model(epoch, batch, logs)


def validate_save_period(save_period) -> None:
    """Raises ValueError unless `save_period` is None or an integer >= 0."""
    if save_period is None:
        return
    if isinstance(save_period, bool) or not isinstance(save_period, int) or save_period < 0:
        raise ValueError(
            f"save_period must be >= 0 (0: best and last only) or None (keras-yolo3's file per improvement). "
            f"Received: save_period={save_period!r}"
        )


def epoch_checkpoints(run) -> list:
    """The epoch checkpoint callbacks (a list of 0 or 1) of `run`, a `trainer._TrainingRun`."""
    if run.config.save_period is None:
        pattern = IMPROVEMENT_PATTERN if run.val_annotations else PERIODIC_PATTERN
        if run.recipe.monitor in ("val_mAP", "val_mAP50"):
            pattern = MAP_IMPROVEMENT_PATTERN
        return [run.recipe.best_checkpoint(os.path.join(run.run_dir, pattern))]
    if run.config.save_period == 0:
        return []
    path = os.path.join(run.run_dir, PERIODIC_PATTERN)
    return [EveryNthEpochCheckpoint(path, run.body, run.config.save_period, run.metadata)]
