"""Mixed precision and XLA: on by default on GPUs, each checked once at start-up.

Both roughly triple YOLOv3's training speed on a GPU (BENCHMARKS.md); on the
CPU TensorFlow keeps float32 without XLA (float16 is slower there). On JAX
XLA compiles every step everywhere, and mixed precision is `mixed_bfloat16`
where the GPU computes bfloat16 natively (no loss scaling), else
`mixed_float16` with Keras's loss-scaling optimizer.

A default is checked before the first epoch (`run_checks`): mixed precision
against float32 on the first batch (as ultralytics' AMP check does), XLA
against the uncompiled step; a failed check falls back with a warning. A
setting asked for explicitly is used unchecked. args.json records what ran.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import keras
import numpy as np

from keras_yolo_mgpu.backend import distribution
from keras_yolo_mgpu.backend import gradients as backend_gradients
from keras_yolo_mgpu.parallel.engine import select_devices

logger = logging.getLogger(__name__)

# float16 carries ~3 significant digits: a sound model's losses differ by ~1e-3, a broken one's by far more.
MIXED_LOSS_RTOL = 0.05
# XLA may reorder float additions; a miscompiled step is off by far more.
XLA_LOSS_RTOL = 1e-3

# Device names of accelerators: TensorFlow's "/device:GPU:0", JAX's "cuda:0", "rocm:0", "TPU_0".
_ACCELERATOR_NAMES = ("GPU", "CUDA", "ROCM", "TPU")


def training_device_kind(devices: Sequence[str]) -> str:
    """ "GPU" when every device the run trains on is an accelerator, else "CPU".

    Args:
        devices: the engine's device names (e.g. "/gpu:0", "/cpu:0", JAX's
            "cuda:0", "TFRT_CPU_0"); empty for a TensorFlow multi-worker
            cluster, which then looks at the local devices.
    """
    if not devices:
        # A multi-worker cluster: this worker's devices, as a run without --gpus selects them (its GPUs, else the CPU).
        devices = select_devices()
    on_accelerator = [any(kind in name.upper() for kind in _ACCELERATOR_NAMES) for name in devices]
    return "GPU" if all(on_accelerator) else "CPU"


def mixed_policy_name(backend: str, bfloat16: bool = False) -> str:
    """The mixed-precision policy a run uses: bfloat16 on JAX where the GPUs have it, else float16."""
    return "mixed_bfloat16" if backend == "jax" and bfloat16 else "mixed_float16"


@dataclass(frozen=True)
class Plan:
    """What a run asks for before the checks: each setting, whether it is the default (then checked), and why."""

    mixed_precision: bool
    jit: bool
    check_mixed_precision: bool
    check_jit: bool
    reasons: tuple[str, ...]
    # The dtype policy mixed precision means here ("mixed_float16" or "mixed_bfloat16").
    mixed_policy: str = "mixed_float16"


def plan_settings(
    device_kind: str,
    *,
    mixed_precision: bool | None,
    jit: bool | None,
    multi_scale,
    replicas: int = 1,
    backend: str = "tensorflow",
    bfloat16: bool = False,
) -> Plan:
    """Mixed precision and XLA for a run on `device_kind`; None means "the default there".

    The defaults: both on for "GPU", both off for "CPU". XLA stays off for
    multi-scale training (XLA compiles one input size) and for several
    replicas: Keras 3.15 compiles the whole cross-replica step as one XLA
    computation on one device, which cannot reach the other replicas'
    variables (docs/gpu.md, "Defaults and checks"). On JAX XLA is always on
    and unchecked (the only compiled path).
    """
    reasons = []
    on_gpus = device_kind == "GPU"
    default_mixed, default_jit = mixed_precision is None, jit is None
    mixed_policy = mixed_policy_name(backend, bfloat16)
    if default_mixed:
        mixed_precision = on_gpus
        state = f"on ({mixed_policy})" if on_gpus else "off"
        reasons.append(f"mixed precision {state}: the default on {device_kind}")
    if backend == "jax":
        if default_jit:
            jit = True
            reasons.append(f"XLA on: JAX compiles every step, on {device_kind} and at every device count")
        mixed_precision, jit = bool(mixed_precision), bool(jit)
        return Plan(mixed_precision, jit, default_mixed and mixed_precision, False, tuple(reasons), mixed_policy)
    if default_jit:
        jit = on_gpus and not multi_scale and replicas == 1
        why = "the default"
        if on_gpus and multi_scale:
            why = "multi-scale training changes the input size"
        elif on_gpus and replicas > 1:
            why = f"Keras compiles {replicas} replicas' step as one XLA computation, which fails"
        reasons.append(f"XLA {'on' if jit else 'off'}: {why} on {device_kind}")
    elif jit and replicas > 1:
        logger.warning(
            "XLA (--jit) with %d replicas: Keras 3.15 compiles the replicated step as one XLA computation, which "
            "fails on logical devices (variables on another device); --no-jit is the tested path",
            replicas,
        )
    mixed_precision, jit = bool(mixed_precision), bool(jit)
    return Plan(
        mixed_precision, jit, default_mixed and mixed_precision, default_jit and jit, tuple(reasons), mixed_policy
    )


def _loss_and_finite(train_model, inputs, jit_compile: bool = False) -> tuple[float, bool]:
    """The step's mean loss and whether it and every gradient are finite."""
    loss, gradients = backend_gradients.loss_and_gradients(train_model, inputs, jit_compile)
    finite = bool(np.isfinite(loss)) and all(bool(np.all(np.isfinite(g))) for g in gradients)
    return loss, finite


def check_mixed_precision(
    build_train_model: Callable[[], object], inputs, mixed_policy: str = "mixed_float16"
) -> str | None:
    """Compares one forward/backward pass in float32 and in `mixed_policy` (mixed_float16 or mixed_bfloat16).

    Args:
        build_train_model: builds the training model (inputs -> per-sample
            loss (N, 1)) under the global dtype policy, with the run's start
            weights; called once per precision.
        inputs: the model's inputs for one batch (the pipeline's `x`).

    Returns:
        None when mixed precision is sound, else why not (for the warning).
    """
    previous = keras.config.dtype_policy()
    losses = {}
    try:
        for policy in ("float32", mixed_policy):
            keras.config.set_dtype_policy(policy)
            loss, finite = _loss_and_finite(build_train_model(), inputs)
            if not finite:
                return f"the loss or a gradient is not finite under {policy} (loss {loss:g})"
            losses[policy] = loss
    finally:
        keras.config.set_dtype_policy(previous)
    reference, mixed = losses["float32"], losses[mixed_policy]
    difference = abs(mixed - reference) / max(abs(reference), 1e-12)
    if difference > MIXED_LOSS_RTOL:
        return f"the loss is {mixed:g} in mixed precision, {reference:g} in float32 ({difference:.1%} apart)"
    return None


def check_xla(train_model, inputs) -> str | None:
    """Compiles one forward/backward pass of `train_model` with XLA and compares it with the uncompiled one.

    Returns:
        None when the step compiles and agrees, else why not (for the warning).
    """
    try:
        compiled, finite = _loss_and_finite(train_model, inputs, jit_compile=True)
    except Exception as error:  # XLA raises several types (InvalidArgument, Unimplemented, ...)
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"XLA cannot compile the training step: {first_line}"
    plain, _ = _loss_and_finite(train_model, inputs)
    if not finite or abs(compiled - plain) > XLA_LOSS_RTOL * max(abs(plain), 1e-12):
        return f"the XLA-compiled step's loss is {compiled:g}, {plain:g} without XLA"
    return None


class MixedPrecisionError(ValueError):
    """The default mixed precision (bfloat16) failed its check: the GPU or its kernels are broken."""


def first_step_check(policy: str):
    """A callback that raises `MixedPrecisionError` when the first training step's loss is not finite.

    bfloat16's check (`run_checks`): one read in Keras's callback thread
    (`async_safe`), so no later step waits for it; a GPU that cannot compute
    bfloat16 stops the run rather than train on NaNs.
    """

    class FirstStepCheck(keras.callbacks.Callback):
        async_safe = True

        def __init__(self):
            super().__init__()
            self.checked = False

        def on_train_batch_end(self, batch, logs=None):
            if self.checked or not logs or "loss" not in logs:
                return
            self.checked = True
            loss = float(logs["loss"])
            if not math.isfinite(loss):
                raise MixedPrecisionError(
                    f"the first training step's loss is {loss} under {policy}: this GPU's {policy} kernels are "
                    "broken. Train in float32 with --precision float32"
                )
            logger.info("%s: the first training step's loss is finite (%.4g)", policy, loss)

    return FirstStepCheck()


def apply_policy(mixed_precision: bool, mixed_policy: str = "mixed_float16") -> None:
    """Sets Keras's global dtype policy for the models the run builds next."""
    if mixed_precision:
        if not distribution.visible_accelerators():
            # It runs (the tests exercise it on the CPU), it just buys nothing there.
            logger.warning("mixed precision without a GPU: %s on the CPU is slower than float32", mixed_policy)
        keras.mixed_precision.set_global_policy(mixed_policy)
        scaling = ", loss-scaled optimizer" if mixed_policy == "mixed_float16" else " (no loss scaling needed)"
        logger.info("mixed precision: %s compute, float32 variables and loss%s", mixed_policy.split("_")[1], scaling)


def run_checks(plan: Plan, build_train_model: Callable[[], object], first_inputs: Callable[[], object]):
    """The plan's settings after the start-up checks of its defaults: `(mixed_precision, jit)`.

    Args:
        plan: what `plan_settings` chose.
        build_train_model: builds the training model with the run's start
            weights under the global dtype policy (and, for XLA, the static
            shapes XLA needs).
        first_inputs: returns the inputs of the run's first batch; called
            only when a check runs.
    """
    mixed, jit = plan.mixed_precision, plan.jit
    if not (plan.check_mixed_precision or plan.check_jit):
        return mixed, jit

    if plan.check_mixed_precision and plan.mixed_policy == "mixed_bfloat16":
        # Checked at the first step instead (`first_step_check`): bfloat16 has float32's exponent, so the
        # float16 failures the comparison looks for cannot happen, and it would compile the network twice more.
        logger.info(
            "mixed precision: %s, checked at the first training step (its loss must be finite)", plan.mixed_policy
        )
        plan = dataclasses.replace(plan, check_mixed_precision=False)
        if not plan.check_jit:
            return mixed, jit
    inputs = first_inputs()
    if plan.check_mixed_precision:
        started = time.perf_counter()
        problem = check_mixed_precision(build_train_model, inputs, plan.mixed_policy)
        seconds = time.perf_counter() - started
        if problem:
            logger.warning("mixed precision check failed, training in float32: %s", problem)
            mixed = False
        else:
            logger.info(
                "mixed precision check passed in %.1f s (float32 and %s losses agree)", seconds, plan.mixed_policy
            )
    if plan.check_jit:
        previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy(plan.mixed_policy if mixed else previous)
        try:
            problem = check_xla(build_train_model(), inputs)
        finally:
            keras.config.set_dtype_policy(previous)
        if problem:
            logger.warning("XLA check failed, training without XLA: %s", problem)
            jit = False
        else:
            logger.info("XLA check passed (the compiled training step agrees with the uncompiled one)")
    return mixed, jit
