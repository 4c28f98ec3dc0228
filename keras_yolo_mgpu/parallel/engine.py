"""What runs on N devices: the one place the strategy, replica count and BN mode are decided.

Training (`training/trainer.py`), the training benchmark (`bench/train.py`)
and the equivalence tests all build their engine here, so the three cannot
drift apart:

* `parallel="strategy"` (default): `MirroredStrategy` over the selected
  devices (`OneDeviceStrategy` for one), or `MultiWorkerMirroredStrategy`
  (`strategy="multiworker"`, configured by `TF_CONFIG`);
* `parallel="multi_gpu_model"`: the default (no-op) strategy, and the
  in-graph replica model of `replica_model.py` wraps the training model.

BatchNormalization is synchronised across replicas exactly when there is
more than one replica under a tf.distribute strategy and `sync_bn` is on
(`BatchNormalization(synchronized=True)` is a tf.distribute feature; under
the in-graph replica model BN sees per-replica statistics).
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
        strategy: the `tf.distribute.Strategy` to build and compile under.
        devices: device names (empty for multi-worker: each worker's local ones).
        replicas: number of replicas the global batch is split over.
        parallel: "strategy" or "multi_gpu_model".
        sync_bn: whether `create_model(..., sync_bn=...)` should synchronise BN.
    """

    strategy: object
    devices: tuple[str, ...]
    replicas: int
    parallel: str
    sync_bn: bool

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
        ValueError: an unknown choice, a combination that cannot work, or
            more GPUs asked for than visible.
    """
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
        import tensorflow as tf

        strategy = tf.distribute.get_strategy()
    return bool(getattr(strategy.extended, "should_checkpoint", True))
