"""What runs on N devices: the one place the backend's engine, replica count and BN mode are decided.

Training, the training benchmark and the equivalence tests all build their
engine here, so they cannot drift apart. The backend is Keras's own switch
(`KERAS_BACKEND`); what each does is in its `backend/<name>/distribution.py`:

* **TensorFlow**, `parallel="strategy"` (default): `MirroredStrategy`
  (`OneDeviceStrategy` for one device), or `MultiWorkerMirroredStrategy`
  (`strategy="multiworker"`, `TF_CONFIG`); `parallel="multi_gpu_model"`: the
  in-graph replica model of `backend/tensorflow/replica_model.py`.
  BatchNormalization is synchronised when there is more than one replica
  under a tf.distribute strategy and `sync_bn` is on.
* **JAX**: `keras.distribution.DataParallel` over the selected devices of
  every process, with BatchNormalization over the global batch by
  construction; TensorFlow's other choices are refused (`check_options`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from keras_yolo_mgpu.backend import NAME as BACKEND_NAME
from keras_yolo_mgpu.backend import distribution as backend_distribution

logger = logging.getLogger(__name__)


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
        backend_distribution.wait_for_all_workers(self.strategy, name)

    def fit_callbacks(self) -> list:
        """Callbacks every `fit` on this engine needs (on JAX with one device: one compile of the step)."""
        return backend_distribution.fit_callbacks(self.strategy)

    def wrap(self, train_model):
        """The model to `fit`: `train_model`, or its in-graph replica model. Call under `strategy.scope()`."""
        if self.parallel == "multi_gpu_model":
            return backend_distribution.replica_model(train_model, self.devices)
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
    fields = backend_distribution.build_engine_fields(
        gpus, simulate=simulate, strategy=strategy, parallel=parallel, sync_bn=sync_bn, devices=devices
    )
    return Engine(**fields, backend=BACKEND_NAME)


def is_chief(strategy=None) -> bool:
    """Whether this process writes the run's files (logs, checkpoints, final weights).

    On one machine, always; under `MultiWorkerMirroredStrategy`, the chief
    only (`backend/tensorflow/distribution.py`); on JAX, process 0.

    Args:
        strategy: the strategy (or Keras distribution) in use (default: the current one).
    """
    return backend_distribution.is_chief(strategy)


def select_devices(gpus: int | None = None, simulate: bool = False) -> list[str]:
    """The names of the devices a run would train on (see `build_engine`), on Keras's backend.

    Must run before any model is built when devices are simulated.
    """
    return backend_distribution.device_names(gpus, simulate)
