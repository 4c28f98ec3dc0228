"""BatchNormalization for both backends: TensorFlow's fused kernel there, float64-exact `keras.ops` on JAX.

One layer class, so a network is defined once and its weight files load on
either backend (same variables, same class name as Keras's layer). What
differs per backend is how a training step computes, and the backend's
`batch_norm` module decides it (`keras_yolo_mgpu.backend`):

* **TensorFlow** (`backend/tensorflow/batch_norm.py`): the fused
  `FusedBatchNormV3` kernel where it applies, with statistics all-reduced
  over MirroredStrategy replicas when `synchronized=True`; in float64, plain
  ops with the same written-out gradient, in float64; Keras's own path
  otherwise (inference, masks, renormalisation).
* **JAX** (`backend/jax/batch_norm.py`): Keras's formula in `keras.ops`, but
  in float64 for a float64 model (Keras 3.15 computes float64 inputs in
  float32). `synchronized` needs nothing there: N devices run one SPMD
  program, in which a mean over the batch axis is the global batch's mean.
"""

from __future__ import annotations

import keras

from keras_yolo_mgpu.backend import batch_norm as backend_batch_norm
from keras_yolo_mgpu.serialization import SERIALIZABLE_PACKAGE


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class BatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` with a fused training kernel (TensorFlow) and float64 kept (JAX).

    Args:
        fused: TensorFlow: use the fused kernel in training where it applies
            (default). False always takes Keras's path (for comparisons).
        synchronized: TensorFlow: batch statistics over every replica of a
            MirroredStrategy. Accepted on every backend (on JAX the
            statistics are the global batch's by construction).
        **kwargs: `keras.layers.BatchNormalization` arguments.
    """

    def __init__(self, *, fused: bool = True, synchronized: bool = False, **kwargs):
        super().__init__(synchronized=backend_batch_norm.keras_synchronized(bool(synchronized)), **kwargs)
        self.fused = bool(fused)
        # As asked, for get_config: a file written on one backend builds on the other.
        self._synchronized_as_asked = bool(synchronized)

    def call(self, inputs, training=None, mask=None):
        """(N, H, W, C) -> (N, H, W, C) in the layer's compute dtype."""
        return backend_batch_norm.call(self, inputs, training, mask, super().call)

    def get_config(self):
        config = super().get_config()
        config["fused"] = self.fused
        config["synchronized"] = self._synchronized_as_asked
        return config
