"""What runs on N devices: the one place the backend's engine, replica count and BN mode are decided.

Training (`training/trainer.py`), the training benchmark (`bench/train.py`)
and the equivalence tests all build their engine here, so they cannot
drift apart. The backend is Keras's own switch (`KERAS_BACKEND`, or
`~/.keras/keras.json`):

* **TensorFlow**, `parallel="strategy"` (default): `MirroredStrategy` over
  the selected devices (`OneDeviceStrategy` for one), or
  `MultiWorkerMirroredStrategy` (`strategy="multiworker"`, configured by
  `TF_CONFIG`); `parallel="multi_gpu_model"`: the default (no-op) strategy,
  and the in-graph replica model of `replica_model.py` wraps the training
  model. BatchNormalization is synchronised across replicas exactly when
  there is more than one replica under a tf.distribute strategy and
  `sync_bn` is on.
* **JAX**: `keras.distribution.DataParallel` over the selected devices of
  every process (`jax_devices.py`): one SPMD program that XLA compiles at
  every device count, with BatchNormalization over the global batch by
  construction. TensorFlow's other choices have no meaning there and are
  refused with what to use instead (`check_jax_options`).

`Engine.strategy` is what models are built and trained under: a
`tf.distribute.Strategy`, or the Keras `Distribution` on JAX; both have
`scope()`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

logger = logging.getLogger(__name__)

PARALLEL_ENGINES = ("strategy", "multi_gpu_model")


@dataclasses.dataclass(frozen=True)
class Engine:
    """The devices a model trains on and how.

    Attributes:
        strategy: what to build, compile and fit under: a `tf.distribute.Strategy`, or on JAX the
            `keras.distribution.DataParallel` distribution.
        devices: device names (empty for TF multi-worker: each worker's local ones).
        replicas: number of replicas (devices) the global batch is split over.
        parallel: "strategy" or "multi_gpu_model".
        sync_bn: whether `create_model(..., sync_bn=...)` should synchronise BN.
        backend: Keras's backend, "tensorflow" or "jax".
        processes: (this process's index, the number of processes); each
            reads its own slice of every global batch.
        bfloat16: whether the devices compute bfloat16 natively (JAX's mixed
            precision is then bfloat16).
    """

    strategy: object
    devices: tuple[str, ...]
    replicas: int
    parallel: str
    sync_bn: bool
    backend: str = "tensorflow"
    processes: tuple[int, int] = (0, 1)
    bfloat16: bool = False

    @property
    def chief(self) -> bool:
        """Whether this process writes the run's files."""
        return is_chief(self.strategy)

    def wait_for_all_workers(self, name: str = "keras_yolo_mgpu_run_end") -> None:
        """A barrier over the processes (none with one): so no worker exits while the chief saves, or
        the others wait for the chief's records of the dataset (`name`: the barrier's, on JAX)."""
        if self.backend == "jax":
            from keras_yolo_mgpu.parallel import jax_devices

            jax_devices.wait_for_all_processes(name)
            return
        import tensorflow as tf

        # A worker that exits early stops its heartbeats and the chief's
        # coordination service then reports the whole cluster as crashed.
        if isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
            self.strategy.reduce("SUM", self.strategy.run(lambda: tf.constant(1.0)), axis=None)

    def fit_callbacks(self) -> list:
        """Callbacks every `fit` on this engine needs (on JAX with one device: one compile of the step)."""
        if self.backend != "jax":
            return []
        from keras_yolo_mgpu.parallel import jax_devices

        callback = jax_devices.commit_state_callback(self.strategy.device_mesh.devices.flatten().tolist())
        return [callback] if callback is not None else []

    def wrap(self, train_model):
        """The model to `fit`: `train_model`, or its in-graph replica model. Call under `strategy.scope()`."""
        if self.parallel == "multi_gpu_model":
            from keras_yolo_mgpu.parallel.replica_model import multi_gpu_model

            return multi_gpu_model(train_model, devices=list(self.devices))
        return train_model


def build_engine(
    gpus: int | None = None,
    *,
    simulate: bool = False,
    strategy: str = "mirrored",
    parallel: str = "strategy",
    sync_bn: bool = True,
    devices: Sequence[str] | None = None,
) -> Engine:
    """Selects devices and builds the strategy. Must run before any TensorFlow op when devices are simulated.

    Args:
        gpus: number of GPUs (per worker); None means all visible (the CPU if none).
        simulate: split the CPU or single GPU into `gpus` logical devices.
        strategy: "mirrored" (one machine) or "multiworker" (`TF_CONFIG`).
        parallel: "strategy" or "multi_gpu_model".
        sync_bn: synchronise BatchNormalization when there are several replicas
            under a tf.distribute strategy.
        devices: explicit device names instead of `gpus`/`simulate` (tests).

    Raises:
        ValueError: an unknown choice, a combination that cannot work (or
            that has no meaning on the backend), or more GPUs asked for than
            visible.
    """
    import keras

    if keras.backend.backend() == "jax":
        check_jax_options(strategy=strategy, parallel=parallel, sync_bn=sync_bn)
        return _build_jax_engine(gpus, simulate=simulate, devices=devices)
    import tensorflow as tf

    from keras_yolo_mgpu.parallel import devices as device_selection

    if parallel not in PARALLEL_ENGINES:
        raise ValueError(f"parallel must be one of {PARALLEL_ENGINES}. Received: parallel={parallel!r}")
    if parallel == "multi_gpu_model" and strategy == "multiworker":
        raise ValueError("multi_gpu_model replicates inside one process; use it with strategy='mirrored'")
    if strategy == "multiworker":
        if simulate:
            device_selection.simulate_devices(gpus or 2)
        distribution = device_selection.make_strategy([], "multiworker")
        names: tuple[str, ...] = ()
    else:
        names = tuple(devices) if devices is not None else tuple(device_selection.select_devices(gpus, simulate))
        if parallel == "multi_gpu_model":
            distribution = tf.distribute.get_strategy()
        else:
            distribution = device_selection.make_strategy(names, strategy)
    replicas = len(names) if parallel == "multi_gpu_model" else distribution.num_replicas_in_sync
    return Engine(
        strategy=distribution,
        devices=names,
        replicas=replicas,
        parallel=parallel,
        sync_bn=bool(sync_bn and replicas > 1 and parallel == "strategy"),
    )


def check_jax_options(*, strategy: str = "mirrored", parallel: str = "strategy", sync_bn: bool = True) -> None:
    """Raises ValueError for TensorFlow-only choices, saying what to use on JAX instead."""
    if parallel != "strategy":
        raise ValueError(
            f"--parallel {parallel} is TensorFlow's in-graph replication. On JAX every device count runs as one "
            "SPMD program (keras.distribution.DataParallel): drop --parallel, or set KERAS_BACKEND=tensorflow."
        )
    if strategy != "mirrored":
        raise ValueError(
            f"--strategy {strategy} configures TensorFlow's MultiWorkerMirroredStrategy (TF_CONFIG). On JAX start "
            "train.py in every process with KERAS_DISTRIBUTION_JOB_ADDRESSES (the coordinator's host:port first), "
            "KERAS_DISTRIBUTION_NUM_PROCESSES and KERAS_DISTRIBUTION_PROCESS_ID set, and drop --strategy."
        )
    if not sync_bn:
        raise ValueError(
            "--no-sync-bn has no meaning on JAX: N devices run one program, and BatchNormalization always "
            "normalises over the global batch, as on one device. Drop --no-sync-bn, or set KERAS_BACKEND=tensorflow "
            "for per-replica statistics."
        )


def _build_jax_engine(gpus: int | None, *, simulate: bool, devices) -> Engine:
    """The JAX engine: the processes joined, the devices chosen, `DataParallel` over them."""
    from keras_yolo_mgpu.parallel import jax_devices

    jax_devices.start_processes()
    jax_devices.enable_float64_if_asked()
    if devices is None:
        devices = jax_devices.select_devices(gpus, simulate)
    else:
        import jax

        by_name = {str(device): device for device in jax.devices()}
        by_name.update({str(device): device for device in jax.devices("cpu")})
        devices = [by_name.get(str(name), name) for name in devices]
    return Engine(
        strategy=jax_devices.make_distribution(devices),
        devices=tuple(str(device) for device in devices),
        replicas=len(devices),
        parallel="strategy",
        sync_bn=len(devices) > 1,
        backend="jax",
        processes=jax_devices.process_slice(),
        bfloat16=jax_devices.supports_bfloat16(devices),
    )


def is_chief(strategy=None) -> bool:
    """Whether this process writes the run's files (logs, checkpoints, final weights).

    Single-machine strategies (the default one, `MirroredStrategy`) always
    do. Under `MultiWorkerMirroredStrategy` only the chief does: the worker
    `TF_CONFIG` names "chief", or worker 0 when no chief is listed, which is
    TensorFlow's own `StrategyExtended.should_checkpoint`. On JAX, process 0.

    Args:
        strategy: the strategy (or Keras distribution) in use (default: the current one).
    """
    import keras

    if keras.backend.backend() == "jax":
        from keras_yolo_mgpu.parallel import jax_devices

        return jax_devices.is_chief()
    if strategy is None:
        import tensorflow as tf

        strategy = tf.distribute.get_strategy()
    return bool(getattr(strategy.extended, "should_checkpoint", True))


def select_devices(gpus: int | None = None, simulate: bool = False) -> list[str]:
    """The names of the devices a run would train on (see `build_engine`), on Keras's backend.

    Must run before any model is built when devices are simulated.
    """
    import keras

    if keras.backend.backend() == "jax":
        from keras_yolo_mgpu.parallel import jax_devices

        jax_devices.start_processes()
        jax_devices.enable_float64_if_asked()
        return [str(device) for device in jax_devices.select_devices(gpus, simulate)]
    from keras_yolo_mgpu.parallel import devices as device_selection

    return device_selection.select_devices(gpus, simulate)


def visible_accelerators() -> list[str]:
    """The GPUs (TPUs) the backend sees in this process, by name; empty on a CPU-only machine."""
    import keras

    if keras.backend.backend() == "jax":
        import jax

        return [str(device) for device in jax.local_devices() if device.platform != "cpu"]
    import tensorflow as tf

    return [device.name for device in tf.config.list_physical_devices("GPU")]
