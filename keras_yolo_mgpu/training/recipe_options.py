"""The training recipe's options (--ema, --eval-every, ...): checked, and assembled per stage for `trainer.train`.

The callbacks, in the order they must run at the end of an epoch:

    SwapInAverages              --ema: averaged weights in (ema.py)
    MeanAPEvaluation            --eval-every: val_mAP, val_mAP50 (evaluation_callback.py)
    LinearWarmup                --warmup-epochs with plateau (schedules.py)
    Throughput, CSV, plot, TensorBoard, checkpoints, best/last, LR/early stop
    SwapOutAverages             trained weights back
    RunStateCheckpoint          saves the *trained* weights and the optimizer for --resume

`TrainConfig`'s defaults are keras-yolo3's recipe (training/named_recipes.py names others).
"""

from __future__ import annotations

import logging
import os

import keras

from keras_yolo_mgpu.data.multiscale import check_size_range, first_sizes_message
from keras_yolo_mgpu.model.architectures import BOX_LOSSES
from keras_yolo_mgpu.training import ema as ema_module
from keras_yolo_mgpu.training.checkpoint import TemplateModelCheckpoint
from keras_yolo_mgpu.training.evaluation_callback import MAP50_KEY, MAP_KEY, MeanAPEvaluation, OnEvaluatedEpochs
from keras_yolo_mgpu.training.fused_adam import FusedAdam
from keras_yolo_mgpu.training.run_folder import BEST_WEIGHTS, LAST_WEIGHTS
from keras_yolo_mgpu.training.schedules import SCHEDULES, LinearWarmup, PlateauAfterWarmup, StageSchedule

logger = logging.getLogger(__name__)

# mAP@[.5:.95] or mAP@0.5 (Darknet's `-map` keeps its best weights by the latter).
MAP_MONITORS = (MAP_KEY, MAP50_KEY)
MONITORS = ("val_loss", *MAP_MONITORS)


def validate_recipe(config) -> None:
    """Raises ValueError naming the bad recipe setting of a `TrainConfig`."""
    if config.eval_every < 0:
        raise ValueError(f"eval_every must be >= 0 (0: no validation mAP). Received: eval_every={config.eval_every}")
    if config.monitor not in MONITORS:
        raise ValueError(f"monitor must be one of {MONITORS}. Received: monitor={config.monitor!r}")
    if config.monitor in MAP_MONITORS and config.eval_every < 1:
        raise ValueError(f"monitor={config.monitor!r} needs eval_every >= 1 (--eval-every N)")
    if config.lr_schedule not in SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {SCHEDULES}. Received: lr_schedule={config.lr_schedule!r}")
    if not 0 <= config.warmup_epochs <= config.epochs:
        raise ValueError(f"warmup_epochs must be in [0, epochs]. Received: warmup_epochs={config.warmup_epochs}")
    ema_module.make_ema_kwargs(config.ema)  # validates the decay
    if not 0.0 <= config.mosaic <= 1.0:
        raise ValueError(f"mosaic must be a probability in [0, 1]. Received: mosaic={config.mosaic}")
    if not 0.0 <= config.objectness_prior < 1.0:
        raise ValueError(
            f"objectness_prior must be in [0, 1) (0: keras-yolo3's zero bias). Received: {config.objectness_prior}"
        )
    if config.box_loss is not None and config.box_loss not in BOX_LOSSES:
        raise ValueError(f"box_loss must be one of {BOX_LOSSES}. Received: box_loss={config.box_loss!r}")
    if config.ciou_weight is not None and not config.ciou_weight > 0:
        raise ValueError(f"ciou_weight must be > 0. Received: ciou_weight={config.ciou_weight}")
    if config.iou_thresh is not None and not 0.0 < config.iou_thresh <= 1.0:
        raise ValueError(f"iou_thresh must be in (0, 1] (1: the best anchor only). Received: {config.iou_thresh}")
    if config.multi_scale is not None:
        check_size_range(config.multi_scale)
        if config.jit:
            raise ValueError("multi_scale changes the input size every 10 steps; XLA (--jit) needs one size")


def monitor_and_mode(config, has_validation: bool) -> tuple[str, str]:
    """What checkpoints, ReduceLROnPlateau and EarlyStopping follow, and its direction."""
    if not has_validation:
        if config.eval_every:
            raise ValueError(
                f"no validation images (--val-split {config.val_split:g}, no --val-annotations), but the "
                f"{config.recipe} recipe scores validation mAP every {config.eval_every} epoch(s) (--eval-every) "
                f"and keeps best.weights.h5 by {config.monitor}: keep images for validation (--val-split 0.1, "
                "--val-annotations FILE), or train without: --eval-every 0 --monitor val_loss"
            )
        return "loss", "min"
    return config.monitor, ("max" if config.monitor in MAP_MONITORS else "min")


def make_optimizer(config, base_rate: float, first_epoch: int, steps_per_epoch: int):
    """The stage's optimizer: Adam (the fused kernel, `fused_adam.py`) or SGD, with the schedule and the EMA."""
    rate = base_rate
    if config.lr_schedule == "cosine":
        rate = StageSchedule(base_rate, first_epoch, steps_per_epoch, config.epochs, config.warmup_epochs, cosine=True)
    kwargs = ema_module.make_ema_kwargs(config.ema)
    if config.optimizer == "sgd":
        return keras.optimizers.SGD(learning_rate=rate, momentum=0.9, **kwargs)
    return FusedAdam(learning_rate=rate, **kwargs)


class RecipeCallbacks:
    """Builds each stage's recipe callbacks; one instance per run.

    Args:
        run: the `trainer._TrainingRun` whose data, models and metadata are built.
    """

    def __init__(self, run):
        config = self.config = run.config
        self.monitor, self.mode = monitor_and_mode(config, bool(run.val_annotations))
        if config.multi_scale:
            logger.info("%s", first_sizes_message(config.seed, config.multi_scale))
        self.evaluation = None
        if config.eval_every:
            self.evaluation = MeanAPEvaluation(
                run.body,
                run.val_annotations,
                run.class_names,
                run.anchors,
                config.input_shape,
                every=config.eval_every,
                last_epoch=config.epochs,
                masks=run.masks,
                kind=run.kind,
            )
        self._template_model = run.body
        self._metadata = run.metadata
        # Their counters (the best value so far) are part of the run state that --resume restores.
        self.checkpoints = [
            self.best_checkpoint(os.path.join(run.run_dir, BEST_WEIGHTS)),
            TemplateModelCheckpoint(
                os.path.join(run.run_dir, LAST_WEIGHTS), run.body, save_best_only=False, metadata=run.metadata
            ),
        ]
        self._swap_in, self._swap_out = ema_module.average_swap_callbacks() if config.ema else (None, None)

    @property
    def required_columns(self) -> tuple[str, ...]:
        """Log keys that history.csv must have though some epochs lack them."""
        return (MAP_KEY, MAP50_KEY, "val_mAP_seconds", "epoch_seconds") if self.evaluation else ()

    def monitored(self, callback):
        """`callback` as it must run when it follows the monitored value."""
        if self.monitor in MAP_MONITORS and self.config.eval_every > 1:
            return OnEvaluatedEpochs(callback, MAP_KEY)
        return callback

    def best_checkpoint(self, filepath: str):
        """A checkpoint of the template's weights whenever the monitored value improves."""
        checkpoint = TemplateModelCheckpoint(
            filepath,
            self._template_model,
            monitor=self.monitor,
            mode=self.mode,
            save_best_only=True,
            metadata=self._metadata,
        )
        return self.monitored(checkpoint)

    def first(self, stage_rate: float, first_epoch: int, steps_per_epoch: int) -> list:
        """Callbacks before every other one (the EMA swap-in first)."""
        callbacks = [c for c in (self._swap_in, self.evaluation) if c is not None]
        if self.config.lr_schedule == "plateau" and self.config.warmup_epochs > first_epoch:
            callbacks.append(LinearWarmup(stage_rate, first_epoch, steps_per_epoch, self.config.warmup_epochs))
        return callbacks

    def last(self) -> list:
        """The EMA swap-out: after every callback that evaluates or saves, before the run-state saver."""
        return [self._swap_out] if self._swap_out else []

    def plateau_callbacks(self, reduce_lr_patience: int, early_stopping_patience: int) -> list:
        """Stage 2's ReduceLROnPlateau (plateau schedule only) and EarlyStopping."""
        callbacks = []
        if self.config.lr_schedule == "plateau":
            callbacks.append(
                PlateauAfterWarmup(
                    self.config.warmup_epochs,
                    monitor=self.monitor,
                    mode=self.mode,
                    factor=0.1,
                    patience=reduce_lr_patience,
                    verbose=1,
                )
            )
        return [*(self.monitored(c) for c in callbacks), *self.early_stopping(early_stopping_patience)]

    def early_stopping(self, patience: int | None) -> list:
        """`[EarlyStopping]` on the monitored value after `patience` evaluations without improvement; [] for 0/None."""
        if not patience:
            return []
        stopping = keras.callbacks.EarlyStopping(
            monitor=self.monitor, mode=self.mode, min_delta=0, patience=patience, verbose=1
        )
        return [self.monitored(stopping)]
