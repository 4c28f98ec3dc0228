"""Does training on N replicas equal training on one device? Measure it, layer by layer.

The PP-YOLO "align 1 GPU with N GPUs" recipe, as the equivalence tests run it:
build the network on one device and on N replicas, start both from the same
weights, feed both the same global batches, take K optimizer steps and compare
every weight. The per-sample loss and synchronised BatchNormalization make the
N-replica step the one-device step, so

- in float64 the runs agree to rounding (~1e-16 against steps of ~1e-3): any
  real difference (a loss scaled by the replica count, per-replica BN
  statistics, a layer missing from the gradient reduction) is far larger;
- in float32 rounding differs between a batch of 8 and N batches of 8/N, and
  training amplifies it (docs/multi-gpu.md): differences are judged relative
  to how far the weights moved (`FLOAT32_RELATIVE_THRESHOLD`), over the whole
  model, as per-layer ratios are noisy (a flipped max-pool tie); those are
  printed to find where a difference starts.

`cli/align.py` turns the command line into the `build` function and the batches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence

import keras
import numpy as np

from keras_yolo_mgpu.model.loss import totalloss
from keras_yolo_mgpu.parallel.engine import build_engine

logger = logging.getLogger(__name__)

ENGINES = ("strategy", "multi_gpu_model")
#: Default threshold on the largest weight difference in float64.
FLOAT64_THRESHOLD = 1e-9
#: Default float32 threshold, a fraction of the one-device run's largest weight change (`max_step`):
#: synchronised replicas differ by ~3e-3 of it, unsynchronised BN by ~0.15 (BENCHMARKS.md,
#: "1-vs-N alignment in float32").
FLOAT32_RELATIVE_THRESHOLD = 0.02

#: Builds `(body, train_model)`; the argument says whether BatchNormalization
#: must synchronise across replicas. Called inside the strategy's scope.
BuildFn = Callable[[bool], tuple[keras.Model, keras.Model]]
#: Makes a fresh optimizer for one run.
OptimizerFn = Callable[[], keras.optimizers.Optimizer]


@contextlib.contextmanager
def floatx_policy(floatx: str):
    """Builds models in `floatx` ("float32" or "float64") inside the block.

    Sets both the floatx and the global dtype policy: once any code has set a
    policy, Keras no longer derives the layers' dtype from floatx.
    """
    previous_floatx, previous_policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx(floatx)
    keras.config.set_dtype_policy(floatx)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous_policy)
        keras.config.set_floatx(previous_floatx)


def replicate(
    build: BuildFn,
    devices: Sequence[str],
    engine: str = "strategy",
    *,
    sync_bn: bool = True,
    optimizer: OptimizerFn | None = None,
):
    """Builds and compiles the training model on `devices`.

    Args:
        build: see `BuildFn`.
        devices: one device for the reference run, several for replicas.
        engine: "strategy" (MirroredStrategy) or "multi_gpu_model".
        sync_bn: synchronised BatchNormalization when replicated by the
            strategy (`multi_gpu_model` always computes statistics per
            replica).
        optimizer: fresh optimizer factory (default: plain SGD 1e-4, which
            is stateless, so a step depends only on the weights and batch).

    Returns:
        `(body, fit_model)`: the template network and the compiled model to
        call `fit` on; they share their weights.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}. Received: engine={engine!r}")
    if not devices:
        raise ValueError("devices must name at least one device")
    # The engine training uses (parallel/engine.py): the same strategy and BN mode.
    built = build_engine(devices=devices, parallel=engine, sync_bn=sync_bn)
    with built.strategy.scope():
        body, train_model = build(built.sync_bn)
        fit_model = built.wrap(train_model)
        fit_model.compile(
            optimizer=optimizer() if optimizer else keras.optimizers.SGD(learning_rate=1e-4), loss=totalloss
        )
    # `train_steps` fits under it: on JAX that is what shards the batches over the devices.
    fit_model.training_scope = built.strategy.scope
    return body, fit_model


def train_steps(body, fit_model, batches, start_weights, *, restart_from=None):
    """One optimizer step per batch; the body's weights after each step.

    Args:
        body, fit_model: from `replicate`.
        batches: `(x, y)` pairs of arrays, one global batch each.
        start_weights: `body.get_weights()` to start from.
        restart_from: None runs freely; a list of weights (one per step, as
            returned by a reference run) starts every step from its entry,
            so each step is checked on its own.

    Returns:
        `(weights, losses)`: `weights[0]` is the start and `weights[k + 1]`
        the weights after step k; `losses[k]` the loss of step k.
    """
    body.set_weights(start_weights)
    weights, losses = [body.get_weights()], []
    scope = getattr(fit_model, "training_scope", contextlib.nullcontext)
    for step, batch in enumerate(batches):
        if restart_from is not None:
            body.set_weights(restart_from[step])
        x, y = keras.tree.map_structure(keras.ops.convert_to_numpy, batch)
        with scope():
            # The whole global batch as one batch, in order, on either backend.
            history = fit_model.fit(x, y, batch_size=len(y), epochs=1, shuffle=False, verbose=0)
        losses.append(float(history.history["loss"][0]))
        weights.append(body.get_weights())
    return weights, losses


def max_difference(first, second, mask=None) -> float:
    """Largest |a - b| over two lists of arrays (those where `mask` is true)."""
    pairs = zip(first, second) if mask is None else [(a, b) for a, b, keep in zip(first, second, mask) if keep]
    return max((float(np.max(np.abs(np.asarray(a) - np.asarray(b)), initial=0.0)) for a, b in pairs), default=0.0)


def weight_layer_names(model) -> list[str]:
    """The owning layer's name for each of `model.get_weights()`."""
    names = []
    for variable in model.weights:
        path = getattr(variable, "path", variable.name)
        # "<model>/<layer>/kernel" or "<layer>/kernel": the layer is the
        # part before the variable name.
        parts = path.split("/")
        names.append(parts[-2] if len(parts) >= 2 else parts[0])
    return names


@dataclasses.dataclass
class LayerDifference:
    """How far one layer's weights are apart after the runs.

    Attributes:
        layer: layer name.
        max_abs_diff: largest |replicas - one device| over the layer's
            weights (BatchNormalization moving statistics included).
        step: largest change of the layer's weights over the one-device run
            (what the optimizer and the statistics updates moved).
    """

    layer: str
    max_abs_diff: float
    step: float

    @property
    def ratio(self) -> float:
        if self.step > 0:
            return self.max_abs_diff / self.step
        return 0.0 if self.max_abs_diff == 0 else float("inf")


def layer_differences(names, start, reference, other) -> list[LayerDifference]:
    """Per-layer differences, largest first.

    Args:
        names: layer name of each weight array (`weight_layer_names`).
        start: weights before the runs.
        reference, other: weights after the one-device and the replica run.
    """
    rows: dict[str, LayerDifference] = {}
    for name, w0, a, b in zip(names, start, reference, other):
        diff = float(np.max(np.abs(np.asarray(a) - np.asarray(b)), initial=0.0))
        step = float(np.max(np.abs(np.asarray(a) - np.asarray(w0)), initial=0.0))
        row = rows.setdefault(name, LayerDifference(name, 0.0, 0.0))
        row.max_abs_diff = max(row.max_abs_diff, diff)
        row.step = max(row.step, step)
    return sorted(rows.values(), key=lambda r: (-r.max_abs_diff, r.layer))


@dataclasses.dataclass
class AlignmentReport:
    """The outcome of `align`: per-layer rows (largest difference first) and the verdict.

    `passed` is `max_abs_diff <= threshold`: an absolute threshold (float64's
    default, or as given), or in float32 by default `relative_threshold * max_step`.
    """

    layers: list[LayerDifference]
    max_abs_diff: float
    max_step: float
    max_ratio: float
    threshold: float
    relative_threshold: float | None
    passed: bool
    replicas: int
    steps: int
    floatx: str
    engine: str
    sync_bn: bool
    reference_losses: list[float]
    replica_losses: list[float]

    @property
    def worst_layer(self) -> str | None:
        return self.layers[0].layer if self.layers else None

    def summary(self) -> dict:
        """JSON-ready verdict (the CLI's last line)."""
        return {
            "max_abs_diff": self.max_abs_diff,
            "max_step": self.max_step,
            "ratio": self.max_abs_diff / self.max_step if self.max_step else None,
            "max_layer_ratio": self.max_ratio,
            "threshold": self.threshold,
            "relative_threshold": self.relative_threshold,
            "passed": self.passed,
            "worst_layer": self.worst_layer,
            "replicas": self.replicas,
            "steps": self.steps,
            "floatx": self.floatx,
            "engine": self.engine,
            "sync_bn": self.sync_bn,
            "max_loss_diff": max_difference(self.reference_losses, self.replica_losses),
            "reference_losses": self.reference_losses,
            "replica_losses": self.replica_losses,
        }


def judge(
    rows: list[LayerDifference],
    floatx: str,
    threshold: float | None = None,
    relative_threshold: float | None = None,
) -> tuple[bool, float, float | None]:
    """Applies the thresholds (see `AlignmentReport`).

    Returns:
        `(passed, threshold used, relative threshold or None)`.
    """
    max_abs_diff = max((r.max_abs_diff for r in rows), default=0.0)
    if threshold is None and floatx == "float64":
        threshold = FLOAT64_THRESHOLD
    if threshold is None:
        if relative_threshold is None:
            relative_threshold = FLOAT32_RELATIVE_THRESHOLD
        threshold = relative_threshold * max((r.step for r in rows), default=0.0)
    else:
        relative_threshold = None
    return max_abs_diff <= threshold, threshold, relative_threshold


def align(
    build: BuildFn,
    batches,
    devices: Sequence[str],
    *,
    engine: str = "strategy",
    sync_bn: bool = True,
    optimizer: OptimizerFn | None = None,
    threshold: float | None = None,
    relative_threshold: float | None = None,
) -> AlignmentReport:
    """Trains K steps on `devices[0]` alone and on all `devices`; compares the weights.

    Args:
        build: see `BuildFn`; the one-device build's initial weights (loaded
            or random) are the start of both runs.
        batches: K `(x, y)` global batches (arrays in the models' dtype).
        devices: at least 2; `devices[0]` runs the reference.
        engine: "strategy" or "multi_gpu_model", see `replicate`.
        sync_bn: synchronised BatchNormalization in the replica run.
        optimizer: optimizer factory (default plain SGD 1e-4); each run gets
            a fresh one.
        threshold, relative_threshold: the verdict's bounds (see `AlignmentReport`;
            defaults `FLOAT64_THRESHOLD` and `FLOAT32_RELATIVE_THRESHOLD`).

    Returns:
        An `AlignmentReport`.
    """
    if len(devices) < 2:
        raise ValueError(f"align needs at least 2 devices (1 reference + replicas). Received: devices={devices}")
    floatx = keras.config.floatx()
    # One device: nothing to synchronise (the engine turns sync_bn off for one replica).
    body, fit_model = replicate(build, devices[:1], engine="strategy", sync_bn=True, optimizer=optimizer)
    start = body.get_weights()
    names = weight_layer_names(body)
    logger.info("reference: %d step(s) on %s", len(batches), devices[0])
    reference, reference_losses = train_steps(body, fit_model, batches, start)
    del body, fit_model
    logger.info("replicas: %d step(s) on %d devices (%s, sync_bn=%s)", len(batches), len(devices), engine, sync_bn)
    body, fit_model = replicate(build, devices, engine=engine, sync_bn=sync_bn, optimizer=optimizer)
    replicas, replica_losses = train_steps(body, fit_model, batches, start)

    rows = layer_differences(names, start, reference[-1], replicas[-1])
    passed, threshold, relative_threshold = judge(rows, floatx, threshold, relative_threshold)
    return AlignmentReport(
        layers=rows,
        max_abs_diff=max((r.max_abs_diff for r in rows), default=0.0),
        max_step=max((r.step for r in rows), default=0.0),
        max_ratio=max((r.ratio for r in rows), default=0.0),
        threshold=threshold,
        relative_threshold=relative_threshold,
        passed=passed,
        replicas=len(devices),
        steps=len(batches),
        floatx=floatx,
        engine=engine,
        sync_bn=sync_bn,
        reference_losses=reference_losses,
        replica_losses=replica_losses,
    )


@dataclasses.dataclass
class TensorDifference:
    """One tensor of two weight files: largest |a - b| and sum of (a - b)^2."""

    name: str
    shape: tuple[int, ...]
    max_abs_diff: float
    sum_squares: float


def tensor_differences(first: keras.Model, second: keras.Model) -> list[TensorDifference]:
    """Per-tensor differences of two models with the same weight shapes, largest first.

    Raises:
        ValueError: the models' weight lists differ in length or shapes.
    """
    a_weights, b_weights = first.weights, second.weights
    if len(a_weights) != len(b_weights):
        raise ValueError(f"the models have {len(a_weights)} and {len(b_weights)} weight tensors")
    rows = []
    for va, vb in zip(a_weights, b_weights):
        a, b = np.asarray(va.numpy(), np.float64), np.asarray(vb.numpy(), np.float64)
        name = getattr(va, "path", va.name)
        if a.shape != b.shape:
            raise ValueError(f"{name}: shapes differ, {a.shape} and {b.shape}")
        delta = a - b
        rows.append(TensorDifference(name, a.shape, float(np.max(np.abs(delta), initial=0.0)), float(np.sum(delta**2))))
    return sorted(rows, key=lambda r: (-r.max_abs_diff, r.name))
