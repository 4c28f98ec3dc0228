"""Devices on TensorFlow: device selection, simulated devices, strategies, the chief and the barrier.

`parallel="strategy"` (default): `MirroredStrategy` over the selected devices
(`OneDeviceStrategy` for one): one replica per GPU, gradients all-reduced (NCCL
on GPUs), BatchNormalization synchronised; or `MultiWorkerMirroredStrategy`
(`strategy="multiworker"`, configured by `TF_CONFIG`).
`parallel="multi_gpu_model"`: the default (no-op) strategy, and the in-graph
replica model of `replica_model.py` wraps the training model.

Both compute what one device computes at the same global batch, because the
loss is per sample (see `model/loss.py`): the compiled loss averages over the
whole global batch exactly once. The input is `tf.data` (`INPUT_PIPELINE`),
distributed by the strategy.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Sequence

import keras
import tensorflow as tf

from keras_yolo_mgpu.backend.tensorflow.replica_model import multi_gpu_model

logger = logging.getLogger(__name__)

# How the training data reaches this engine (`data/streams.py`): tf.data, distributed by the strategy.
INPUT_PIPELINE = "tf.data"
STRATEGIES = ("mirrored", "multiworker")
PARALLEL_ENGINES = ("strategy", "multi_gpu_model")
# Memory per simulated GPU when one physical GPU is split (MiB).
DEFAULT_SIMULATED_GPU_MEMORY_MB = 4096


def build_engine_fields(
    gpus: int | None, *, simulate: bool, strategy: str, parallel: str, sync_bn: bool, devices
) -> dict:
    """`parallel.engine.Engine`'s fields on TensorFlow: the devices selected, the strategy built.

    BatchNormalization is synchronised exactly when there is more than one
    replica under a tf.distribute strategy and `sync_bn` is on.

    Raises:
        ValueError: an unknown choice, or a combination that cannot work.
    """
    if parallel not in PARALLEL_ENGINES:
        raise ValueError(f"parallel must be one of {PARALLEL_ENGINES}. Received: parallel={parallel!r}")
    if parallel == "multi_gpu_model" and strategy == "multiworker":
        raise ValueError("multi_gpu_model replicates inside one process; use it with strategy='mirrored'")
    if strategy == "multiworker":
        if simulate:
            simulate_devices(gpus or 2)
        distribution = make_strategy([], "multiworker")
        names: tuple[str, ...] = ()
    else:
        names = tuple(devices) if devices is not None else tuple(select_devices(gpus, simulate))
        if parallel == "multi_gpu_model":
            distribution = tf.distribute.get_strategy()
        else:
            distribution = make_strategy(names, strategy)
    replicas = len(names) if parallel == "multi_gpu_model" else distribution.num_replicas_in_sync
    return dict(
        strategy=distribution,
        devices=names,
        replicas=replicas,
        parallel=parallel,
        sync_bn=bool(sync_bn and replicas > 1 and parallel == "strategy"),
        processes=(0, 1),
        bfloat16=False,
    )


def replica_model(train_model: keras.Model, devices: Sequence[str]) -> keras.Model:
    """`multi_gpu_model(train_model, devices)`: the in-graph replica model (`replica_model.py`)."""
    return multi_gpu_model(train_model, devices=list(devices))


def is_chief(strategy=None) -> bool:
    """Whether this process writes the run's files (logs, checkpoints, final weights).

    Single-machine strategies (the default one, `MirroredStrategy`) always
    do. Under `MultiWorkerMirroredStrategy` only the chief does: the worker
    `TF_CONFIG` names "chief", or worker 0 when no chief is listed, which is
    TensorFlow's own `StrategyExtended.should_checkpoint`.

    Args:
        strategy: the strategy in use (default: the current one).
    """
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    return bool(getattr(strategy.extended, "should_checkpoint", True))


def worker_index(strategy=None) -> int:
    """This worker's task id (0 on one machine): where a worker other than the chief writes its copy of a checkpoint."""
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    # MultiWorkerMirroredStrategy's public cluster resolver names the task.
    return getattr(getattr(strategy, "cluster_resolver", None), "task_id", None) or 0


def training_strategy(model: keras.Model):
    """The strategy `model` trains under (what `is_chief` and `worker_index` take)."""
    strategy = getattr(model, "distribute_strategy", None)
    return strategy if strategy is not None else tf.distribute.get_strategy()


def wait_for_all_workers(strategy, name: str) -> None:
    """A barrier over the workers of a `MultiWorkerMirroredStrategy` (none otherwise; `name`: JAX's)."""
    # A worker that exits early stops its heartbeats and the chief's
    # coordination service then reports the whole cluster as crashed.
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)


def device_names(gpus: int | None = None, simulate: bool = False) -> list[str]:
    """The names of the devices a run would train on (`select_devices`)."""
    return select_devices(gpus, simulate)


def visible_accelerators(cpu_devices: int = 0) -> list[str]:
    """The GPUs TensorFlow sees in this process, by name; empty on a CPU-only machine.

    `cpu_devices` is JAX's concern (see its module): listing the physical
    devices leaves TensorFlow's logical split free.
    """
    return [device.name for device in tf.config.list_physical_devices("GPU")]


def fit_callbacks(strategy) -> list:
    """Callbacks every `fit` under `strategy` needs: none on TensorFlow."""
    return []


def use_compilation_cache(folder: str | None) -> None:
    """Nothing: TensorFlow traces and compiles its graphs again in every process (JAX keeps them on disk)."""


def return_memory_after_compiles() -> None:
    """Nothing: TensorFlow traces and compiles inside a step's first call, with nothing to hook in between."""


def check_feed(feed: str) -> None:
    """Raises ValueError for the JAX feed of processes: tf.data makes the batches in its own threads."""
    if feed == "processes":
        raise ValueError(
            "--feed processes is the JAX feed's; on TensorFlow, tf.data makes the batches in its own threads. "
            "Run with KERAS_BACKEND=jax, or leave --feed out"
        )


def batch_placer(strategy):
    """None: the strategy places the batches of a tf.data dataset on the devices itself."""
    return None


def simulate_devices(count: int, memory_limit_mb: int = DEFAULT_SIMULATED_GPU_MEMORY_MB) -> list[str]:
    """Splits the single GPU (or, without one, the CPU) into `count` logical devices.

    Lets a multi-GPU run be rehearsed on any machine. Must run before
    TensorFlow initialises its devices (before any op or model is created).

    Returns:
        The logical device names, e.g. `['/device:CPU:0', '/device:CPU:1']`.

    Raises:
        RuntimeError: TensorFlow's devices are already initialised with
            another layout.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1. Received: count={count}")
    gpus = tf.config.list_physical_devices("GPU")
    physical = gpus[0] if gpus else tf.config.list_physical_devices("CPU")[0]
    kind = "GPU" if gpus else "CPU"
    if kind == "GPU":
        layout = [tf.config.LogicalDeviceConfiguration(memory_limit=memory_limit_mb)] * count
    else:
        layout = [tf.config.LogicalDeviceConfiguration()] * count
    try:
        tf.config.set_logical_device_configuration(physical, layout)
    except RuntimeError:
        existing = tf.config.list_logical_devices(kind)
        if len(existing) >= count:
            logger.info("devices already initialised; using %d of %d logical %s devices", count, len(existing), kind)
        else:
            raise RuntimeError(
                f"cannot split the {kind} into {count} logical devices: TensorFlow already initialised "
                f"{len(existing)} in this process. Simulate devices before building any model: from Python, in a "
                "new process (a run or model built earlier in it fixed the devices)."
            ) from None
    return [d.name for d in tf.config.list_logical_devices(kind)[:count]]


def select_devices(gpus: int | None = None, simulate: bool = False) -> list[str]:
    """The devices to train on.

    Args:
        gpus: number of GPUs; None means every visible GPU (the CPU if none).
        simulate: split the CPU or single GPU into `gpus` logical devices.

    Raises:
        ValueError: more GPUs asked for than visible (without `simulate`).
    """
    if simulate:
        return simulate_devices(gpus or 2)
    visible = [d.name for d in tf.config.list_logical_devices("GPU")]
    if gpus is None:
        return visible or [tf.config.list_logical_devices("CPU")[0].name]
    if gpus > len(visible):
        raise ValueError(
            f"--gpus {gpus} asked for {gpus} GPUs but TensorFlow sees {len(visible)} "
            f"({', '.join(visible) or 'none'}). Check CUDA_VISIBLE_DEVICES and the TensorFlow GPU install, "
            "or add --simulate-devices to rehearse on logical devices."
        )
    return visible[:gpus]


def make_strategy(devices: Sequence[str], kind: str = "mirrored") -> tf.distribute.Strategy:
    """A strategy over `devices`.

    Args:
        devices: device names from `select_devices`.
        kind: "mirrored" (one machine) or "multiworker" (several machines,
            configured by the TF_CONFIG environment variable; each worker
            uses its local devices).
    """
    if kind not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}. Received: strategy={kind!r}")
    if kind == "multiworker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError(
                "--strategy multiworker needs the TF_CONFIG environment variable, e.g. "
                '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}'
            )
        try:
            json.loads(os.environ["TF_CONFIG"])
        except json.JSONDecodeError as error:
            raise ValueError(f"TF_CONFIG is not valid JSON: {error}") from None
        return tf.distribute.MultiWorkerMirroredStrategy()
    if len(devices) == 1:
        return tf.distribute.OneDeviceStrategy(devices[0])
    cross_device_ops = None
    if not all("GPU" in d.upper() for d in devices):
        # NCCL only runs on GPUs; logical CPU devices reduce on one device.
        cross_device_ops = tf.distribute.ReductionToOneDevice()
    return mirrored_strategy(devices, cross_device_ops)


# Spacing of the collective group keys of successive strategies: a strategy
# takes one group key per device set it reduces over.
_COLLECTIVE_KEY_STEP = 10_000
_collective_key_bases = itertools.count(1)


class _MirroredStrategyWithOwnKeys(tf.distribute.MirroredStrategy):
    """MirroredStrategy whose collective ops use keys no earlier strategy of this process used.

    TensorFlow numbers every MirroredStrategy's collective groups from 1 and
    their instances from 100 (`_collective_key_base`, 0 unless a test sets
    it; TF 2.21). The runtime remembers each instance's shape, so a second
    strategy in the same process (a second `train()` in a notebook, a test
    suite) that all-reduces another shape under the same keys aborts with
    "Shape mismatch in the collective instance 100" wherever gradients and
    sync BN's statistics go through collective ops (GPUs). A fresh key base
    per strategy keeps them apart.
    """

    def __init__(self, devices, cross_device_ops=None):
        # Read by MirroredExtended.__init__ (from super().__init__) to number its keys.
        self._collective_key_base = next(_collective_key_bases) * _COLLECTIVE_KEY_STEP
        super().__init__(devices=devices, cross_device_ops=cross_device_ops)


def mirrored_strategy(devices: Sequence[str], cross_device_ops=None) -> tf.distribute.MirroredStrategy:
    """`tf.distribute.MirroredStrategy(devices, cross_device_ops)` with collective keys of its own.

    Args:
        devices: two or more device names.
        cross_device_ops: None: TensorFlow's default (collective ops, NCCL on
            physical GPUs).
    """
    return _MirroredStrategyWithOwnKeys(list(devices), cross_device_ops)
