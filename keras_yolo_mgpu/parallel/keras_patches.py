"""Workarounds for Keras private internals, in one place.

Each patch names the Keras behaviour it works around. They are applied only
where needed (MultiWorkerMirroredStrategy) and never process-wide by default.
"""

from __future__ import annotations

import logging

import keras
import tensorflow as tf

logger = logging.getLogger(__name__)


def patch_multiworker_first_batch_build(model: keras.Model) -> None:
    """Works around Keras 3.15 failing on dict inputs under MultiWorkerMirroredStrategy.

    Before its first step, Keras's TF trainer reduces one distributed batch
    to learn the input shapes, calling `strategy.reduce` on the whole nested
    structure. MirroredStrategy accepts a dict there; the collective
    strategy raises "Attempt to convert a value ({'image': PerReplica...})".
    Reducing leaf by leaf gives Keras the same shapes. Every worker makes the
    same calls, so the collective ops stay matched.
    """
    strategy = model.distribute_strategy

    def first_batch_build(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = tf.nest.map_structure(
                    lambda value: (
                        strategy.reduce("MEAN", value, axis=None)
                        if isinstance(value, tf.distribute.DistributedValues)
                        else value
                    ),
                    next(batches),
                )
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = first_batch_build


_LOGS_PATCHED = False


def patch_multiworker_log_reduction() -> None:
    """Works around Keras 3 reducing scalar logs with axis=0 under MultiWorkerMirroredStrategy.

    Keras's TF trainer reduces each step's logs with
    `strategy.reduce("MEAN", value, axis=0)` under the collective strategy,
    which fails on scalars ("Invalid reduction dimension 0 for input with 0
    dimensions", tensorflow/tensorflow#72388). Metric results are already
    identical on every replica (their variables are all-reduced on update),
    so the first replica's value is exact: Keras does the same on TPUs.
    """
    global _LOGS_PATCHED
    if _LOGS_PATCHED:
        return
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original = tf_trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction == "auto" and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            reduction = "first"
        return original(values, strategy, reduction)

    tf_trainer.reduce_per_replica = reduce_per_replica
    _LOGS_PATCHED = True
