"""Exponential moving average of the weights (`--ema DECAY`).

The average is the Keras optimizer's own (`use_ema=True`,
`ema_momentum=DECAY`): after every step each trainable variable's average
becomes `DECAY * average + (1 - DECAY) * weight` (the first step copies the
weight). The averages are optimizer variables, so they are mirrored like the
weights (identical on every replica, updated once per global step) and saved
and restored with the optimizer in the run state (`training.run_state`:
`--resume` keeps the average). At the end of each `fit` Keras writes the averages into the weights
(`finalize_variable_values`), so a stage ends, and the final weights are
saved, with the averaged weights.

Under `mixed_float16` Keras's `compile` wraps the optimizer in a
`LossScaleOptimizer`, whose own `use_ema` is False: the averages are its
`inner_optimizer`'s (`averaging_optimizer` looks through the wrapper), and
its `finalize_variable_values` is the inner one's.

During training the averaged weights are what is validated and saved:
`SwapInAverages` (placed first) writes the averages into the model at the end
of each epoch and around the validation pass, and `SwapOutAverages` (after
every callback that evaluates or saves, before the run-state saver, which
must save the trained weights) puts the trained weights back, bit for bit,
before the next step.
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

    Asking the model's optimizer for `use_ema` is not enough: under
    `mixed_float16` it is the wrapper, which keeps no averages itself, and
    the EMA code then took a float16 run for one without averages.
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
            # A copy, not the average's own buffer: on JAX the next compiled
            # step (validation's too) donates the model's variables, which
            # would delete the optimizer's average with them.
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

    Keras ends `fit` by writing the averages into the weights
    (`finalize_variable_values`); on JAX the weights then hold the very
    buffers the optimizer keeps its averages in, and the next `fit` on the
    same optimizer, whose compiled step donates the weights' buffers, would
    delete the averages with them ("Attempt to donate the same buffer
    twice", then "'NoneType' object is not callable" from the emptied
    variables). Does nothing where `model`'s optimizer keeps no averages.
    """
    if averaging_optimizer(model.optimizer) is None:
        return
    for variable in model.trainable_variables:
        variable.assign(keras.ops.copy(variable))
