"""Exponential moving average of the weights (`--ema DECAY`).

The average is the Keras optimizer's own (`use_ema=True`,
`ema_momentum=DECAY`): optimizer variables, so mirrored like the weights and
restored by `--resume` with the optimizer. At the end of each `fit` Keras
writes the averages into the weights (`finalize_variable_values`), so each
stage ends, and is saved, with them.

During training the averages are what is validated and saved:
`SwapInAverages` (placed first) puts them in at the end of each epoch and
around validation; `SwapOutAverages` (after every callback that evaluates or
saves, before the run-state saver) puts the trained weights back, bit for bit.
"""

from __future__ import annotations

import keras

from keras_yolo_mgpu.keras_compat import moving_averages


def make_ema_kwargs(decay: float | None) -> dict:
    """Optimizer keyword arguments for an EMA of `decay` (None or 0: none)."""
    if not decay:
        return {}
    if not 0.0 < decay < 1.0:
        raise ValueError(f"EMA decay must be in (0, 1). Received: ema={decay}")
    return {"use_ema": True, "ema_momentum": float(decay)}


def averaging_optimizer(optimizer) -> keras.optimizers.Optimizer | None:
    """The optimizer that keeps the moving averages: `optimizer` or the one a `LossScaleOptimizer` wraps; else None.

    Under `mixed_float16` the model's optimizer is the wrapper, whose own `use_ema` is False.
    """
    while isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer if getattr(optimizer, "use_ema", False) else None


class _AverageSwap:
    """Shared state of the two swap callbacks: the trained values set aside."""

    def __init__(self):
        self.saved = None

    def swap_in(self, optimizer):
        if self.saved is not None:
            return
        # [(trainable variable, its average)] of an optimizer that keeps an EMA.
        averaging = averaging_optimizer(optimizer)
        pairs = moving_averages(averaging) if averaging is not None and averaging.built else []
        self.saved = [(variable, keras.ops.convert_to_numpy(variable)) for variable, _ in pairs]
        for variable, average in pairs:
            # A copy: on JAX the next compiled step donates the model's variables, deleting a shared average.
            variable.assign(keras.ops.copy(average))

    def swap_out(self):
        if self.saved is None:
            return
        for variable, value in self.saved:
            variable.assign(value)
        self.saved = None


class SwapInAverages(keras.callbacks.Callback):
    """Puts the averaged weights into the model for validation and end-of-epoch callbacks."""

    def __init__(self, swap: _AverageSwap):
        super().__init__()
        self.swap = swap

    def on_test_begin(self, logs=None):
        self.swap.swap_in(self.model.optimizer)

    def on_test_end(self, logs=None):
        self.swap.swap_out()

    def on_epoch_end(self, epoch, logs=None):
        self.swap.swap_in(self.model.optimizer)


class SwapOutAverages(keras.callbacks.Callback):
    """Restores the trained weights after the end-of-epoch callbacks (place it last)."""

    def __init__(self, swap: _AverageSwap):
        super().__init__()
        self.swap = swap

    def on_epoch_end(self, epoch, logs=None):
        self.swap.swap_out()

    def on_train_end(self, logs=None):
        self.swap.swap_out()


def average_swap_callbacks() -> tuple[SwapInAverages, SwapOutAverages]:
    """(first, last): the first before every other callback, the last before the run-state saver."""
    swap = _AverageSwap()
    return SwapInAverages(swap), SwapOutAverages(swap)


def untie_averages(model) -> None:
    """Gives `model`'s trainable variables buffers of their own again after a `fit` with an EMA.

    On JAX `finalize_variable_values` leaves the weights holding the
    optimizer's average buffers, and the next `fit`'s compiled step, which
    donates the weights' buffers, would delete the averages ("Attempt to
    donate the same buffer twice"). Does nothing without averages.
    """
    if averaging_optimizer(model.optimizer) is None:
        return
    for variable in model.trainable_variables:
        variable.assign(keras.ops.copy(variable))
