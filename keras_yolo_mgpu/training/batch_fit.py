"""`--batch-size auto`: the largest global batch up to the default whose training step fits each device's memory.

The step's bytes on one device with its share of the batch come from
`backend.memory.training_step_bytes`. The search measures 1 and 2 images per
device, extrapolates the line to the budget, then steps from there until a
size fits and the next does not: the answer is always measured.

The default global batch is the ceiling (`auto_ceiling`): the recipes' learning
rates are set for it, and the largest batch a device holds is no better a
recipe. A batch that grew with the memory would train in fewer steps (a batch
of the whole dataset takes one step an epoch) and, grown with the device
count, would train another model on 4 GPUs than on one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

# The share of a device's memory `--batch-size auto` fills when no budget is given: the rest is left to the
# runtime, fragmentation and the feed's batches placed ahead.
DEFAULT_MARGIN = 0.9


class BatchDoesNotFit(ValueError):
    """Not even one image per device fits the budget."""


@dataclasses.dataclass(frozen=True)
class BatchFit:
    """The chosen per-device batch and the measurements that chose it.

    Attributes:
        per_device: images per device; the global batch is this times the replicas.
        step_bytes: what its step needs on one device.
        next_step_bytes: what one image more per device needs (None: out of
            memory, or not measured: `per_device` is the largest allowed).
        budget: the bytes per device it had to fit.
        largest_allowed: True when the ceiling (`auto_ceiling`), not memory, set the size.
        measured: every size measured, with its bytes (None: out of memory).
    """

    per_device: int
    step_bytes: int
    next_step_bytes: int | None
    budget: int
    largest_allowed: bool
    measured: dict


def auto_ceiling(num_train: int, replicas: int, default_batch: int) -> int:
    """The largest per-device batch `--batch-size auto` may take: the default global batch, split, at least 1.

    Never more than the training images: a larger batch would repeat them in one step.
    """
    return max(1, min(num_train, default_batch) // replicas)


def largest_fitting_batch(step_bytes: Callable[[int], int | None], budget: int, most: int) -> BatchFit:
    """The largest per-device batch `p` in [1, `most`] whose step fits `budget`, with `p + 1` measured not to.

    Args:
        step_bytes: bytes of one step at `p` images per device; None when
            the trial ran out of memory. Assumed to grow with `p`.
        budget: bytes per device.
        most: the largest batch allowed (`auto_ceiling`).

    Raises:
        BatchDoesNotFit: one image per device does not fit.
    """
    measured: dict[int, int | None] = {}

    def need(size: int) -> int | None:
        if size not in measured:
            measured[size] = step_bytes(size)
        return measured[size]

    def fits(size: int) -> bool:
        return need(size) is not None and need(size) <= budget

    if not fits(1):
        needed = "ran out of memory" if need(1) is None else f"needs {_gib(need(1))}"
        raise BatchDoesNotFit(
            f"--batch-size auto: one image per device {needed}, more than the budget of {_gib(budget)} per "
            "device; train at a smaller --input-size, with --mixed-precision, or on more memory (--memory-budget)"
        )
    most = max(1, most)
    guess = 1
    if most > 1 and fits(2):
        slope = max(need(2) - need(1), 1)
        guess = min(most, 2 + (budget - need(2)) // slope)
    low, high = _bisect(fits, guess, most)
    return BatchFit(
        per_device=low,
        step_bytes=need(low),
        next_step_bytes=measured.get(low + 1),
        budget=budget,
        largest_allowed=high is None,
        measured=dict(sorted(measured.items())),
    )


def _bisect(fits: Callable[[int], bool], guess: int, most: int) -> tuple[int, int | None]:
    """`(low, high)`: the largest size in [1, `most`] that `fits` (1 must), and the next one, which does not.

    `high` is None when `most` fits. From `guess`, doubling steps bracket the
    answer (`low` fits, `high` does not), and bisection closes the bracket.
    """
    if fits(guess):
        low, high, stride = guess, None, 1
        while low < most:
            size = min(most, low + stride)
            if not fits(size):
                high = size
                break
            low, stride = size, stride * 2
    else:
        high, stride = guess, 1
        while True:
            size = max(1, high - stride)
            if fits(size):
                low = size
                break
            high, stride = size, stride * 2
    while high is not None and high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low, high


def describe(fit: BatchFit, replicas: int, budget_given: bool, num_train: int) -> str:
    """The log's sentence on what `--batch-size auto` chose and why."""
    budget = (
        f"the --memory-budget of {_gib(fit.budget)} per device"
        if budget_given
        else f"{DEFAULT_MARGIN:.0%} of the device's memory, {_gib(fit.budget)}"
    )
    chosen = f"--batch-size auto: global batch {fit.per_device * replicas} ({fit.per_device} per device)"
    why = f"its training step needs {_gib(fit.step_bytes)} of {budget}"
    if fit.largest_allowed and fit.per_device * replicas >= num_train:
        return f"{chosen}: every training image in one step; {why}"
    if fit.largest_allowed:
        return (
            f"{chosen}: the default batch over the devices, the largest auto takes (the learning rates are set for "
            f"it); {why}. A larger --batch-size uses more of the memory, in fewer steps per epoch"
        )
    more = "runs out of memory" if fit.next_step_bytes is None else f"would need {_gib(fit.next_step_bytes)}"
    return f"{chosen}: {why}; {fit.per_device + 1} per device {more}"


def _gib(size: int | None) -> str:
    return "an unstated amount" if size is None else f"{size / 2**30:.2f} GiB"
