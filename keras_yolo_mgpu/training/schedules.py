"""Learning-rate schedules: linear warm-up, then constant (plateau) or cosine.

Both are functions of the position in the run in epochs,
`first_epoch + step / steps_per_epoch` with `step` the optimizer's
iterations in the stage: one per global step on every replica and restored
with the optimizer, which makes them exact on N replicas and across `--resume`.

- Warm-up (Darknet's `burn_in`, linear as in ultralytics): from
  `start_fraction * base` at 0 to `base` at `warmup_epochs`, per step.
- Cosine: `base * (final + (1 - final) * (1 + cos(pi * position / epochs)) / 2)`
  after warm-up; each stage scales it by its base rate (`--lr1`, `--lr2`).
- Plateau (keras-yolo3's): the stage's base, lowered by `ReduceLROnPlateau`.
  Keras cannot assign a rate a schedule object computes, so its warm-up is
  a callback (`LinearWarmup`); reductions wait for its end (`PlateauAfterWarmup`).
"""

from __future__ import annotations

import math

import keras

from keras_yolo_mgpu.serialization import SERIALIZABLE_PACKAGE, constructor_config

# The warm-up starts at this fraction of the base rate (0 would waste the first step).
WARMUP_START_FRACTION = 0.01
# Cosine ends at this fraction of the base rate (ultralytics' `lrf`).
COSINE_FINAL_FRACTION = 0.01
SCHEDULES = ("plateau", "cosine")


def rate_factor(
    position,
    *,
    total_epochs: float,
    warmup_epochs: float = 0.0,
    cosine: bool = False,
    start_fraction: float = WARMUP_START_FRACTION,
    final_fraction: float = COSINE_FINAL_FRACTION,
):
    """Multiplier of the base rate at `position` epochs into the run.

    Args:
        position: epochs since the start of training, a float or a float
            tensor (any shape).
        total_epochs: the run's epochs (the end of the cosine).
        warmup_epochs: length of the linear warm-up (0: none).
        cosine: cosine decay (True) or constant (False) after warm-up.
        start_fraction: factor at position 0 when warming up.
        final_fraction: cosine's factor at `total_epochs`.

    Returns:
        The factor, same shape and type as `position` (keras ops).
    """
    ops = keras.ops
    position = ops.convert_to_tensor(position, dtype="float32")
    factor = ops.ones_like(position)
    if cosine:
        progress = ops.clip(position / float(total_epochs), 0.0, 1.0)
        factor = final_fraction + (1.0 - final_fraction) * 0.5 * (1.0 + ops.cos(math.pi * progress))
    if warmup_epochs > 0:
        ramp = start_fraction + (1.0 - start_fraction) * position / float(warmup_epochs)
        factor = ops.where(position < warmup_epochs, factor * ramp, factor)
    return factor


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class StageSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The rate of one training stage as a function of its step.

    Args:
        base_rate: the stage's rate (`--lr1` or `--lr2`).
        first_epoch: the run's epoch at which this stage starts.
        steps_per_epoch: steps per epoch in this stage.
        total_epochs: the run's epochs.
        warmup_epochs: warm-up length, counted from the start of the run.
        cosine: cosine decay after warm-up, else constant.
    """

    def __init__(
        self,
        base_rate: float,
        first_epoch: int,
        steps_per_epoch: int,
        total_epochs: int,
        warmup_epochs: float = 0.0,
        cosine: bool = True,
    ):
        if steps_per_epoch < 1 or total_epochs < 1 or warmup_epochs < 0:
            raise ValueError(
                f"need steps_per_epoch >= 1, total_epochs >= 1, warmup_epochs >= 0. Received: "
                f"{steps_per_epoch}, {total_epochs}, {warmup_epochs}"
            )
        self.base_rate = float(base_rate)
        self.first_epoch = int(first_epoch)
        self.steps_per_epoch = int(steps_per_epoch)
        self.total_epochs = int(total_epochs)
        self.warmup_epochs = float(warmup_epochs)
        self.cosine = bool(cosine)

    def __call__(self, step):
        position = self.first_epoch + keras.ops.cast(step, "float32") / self.steps_per_epoch
        factor = rate_factor(
            position, total_epochs=self.total_epochs, warmup_epochs=self.warmup_epochs, cosine=self.cosine
        )
        return self.base_rate * factor

    def get_config(self):
        return constructor_config(self)


class LinearWarmup(keras.callbacks.Callback):
    """Plateau recipe's warm-up: assigns the rate before each warm-up step.

    Reads the step from the optimizer (restored on `--resume`). After the
    last warm-up step the rate is set to `base_rate` once; later changes
    (ReduceLROnPlateau) are left alone.

    Args:
        base_rate: the stage's rate.
        first_epoch, steps_per_epoch, warmup_epochs: as for `StageSchedule`.
    """

    def __init__(self, base_rate: float, first_epoch: int, steps_per_epoch: int, warmup_epochs: float):
        super().__init__()
        self.base_rate = float(base_rate)
        self.first_epoch = int(first_epoch)
        self.steps_per_epoch = int(steps_per_epoch)
        self.warmup_epochs = float(warmup_epochs)
        self._finished = False

    def on_train_begin(self, logs=None):
        self._finished = self.first_epoch >= self.warmup_epochs

    def on_epoch_begin(self, epoch, logs=None):
        # One read of the step count per epoch: a read per step would make every step wait for the one before.
        if not self._finished:
            self._epoch_start_step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def on_train_batch_begin(self, batch, logs=None):
        if self._finished:
            return
        step = self._epoch_start_step + batch
        position = self.first_epoch + step / self.steps_per_epoch
        if position < self.warmup_epochs:
            factor = float(rate_factor(position, total_epochs=1, warmup_epochs=self.warmup_epochs))
            self.model.optimizer.learning_rate = self.base_rate * factor
            return
        previous = self.first_epoch + (step - 1) / self.steps_per_epoch
        if step > 0 and previous < self.warmup_epochs:
            self.model.optimizer.learning_rate = self.base_rate  # the step that ends the warm-up
        self._finished = True


class PlateauAfterWarmup(keras.callbacks.ReduceLROnPlateau):
    """`ReduceLROnPlateau` that neither counts nor reduces during warm-up.

    During warm-up the rate is `LinearWarmup`'s, and the loss falls because
    the rate rises; a reduction then would be overwritten and its patience
    spent on the wrong signal.
    """

    def __init__(self, warmup_epochs: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.warmup_epochs = float(warmup_epochs)

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 <= self.warmup_epochs:
            return
        super().on_epoch_end(epoch, logs)
