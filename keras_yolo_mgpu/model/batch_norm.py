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
import numpy as np

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


def fold_batch_norm(body: keras.Model) -> keras.Model:
    """A copy of `body` for inference, each convolution's BatchNormalization folded into its kernel and bias.

    A Conv2D (no activation) whose only consumer is a BatchNormalization over
    the channel axis computes, in inference, `(conv(x) - mean) * gamma /
    sqrt(var + eps) + beta`: the same as a Conv2D with kernel `kernel * s` and
    bias `bias * s + beta - mean * s`, `s = gamma / sqrt(var + eps)`. Darknet's
    blocks are all of that form. The folded copy runs one convolution with a
    bias where the body runs a convolution then the normalisation's five
    element-wise operations, which TensorFlow's CPU kernels fuse and XLA
    already fuses (so JAX gains nothing). Outputs agree to float32 rounding.

    The copy has its own variables (the folding is computed in float64 from
    `body`'s current weights), the same layer names, and a
    `FoldedBatchNormalization` (the identity) in place of each folded one. It
    is for inference only: training it would train no normalisation. Layers
    of any other form are copied unchanged.

    Args:
        body: a functional Keras model (`model.build_body`).

    Returns:
        The folded model: same inputs, (N, H, W, C) outputs as `body`'s.
    """
    folded = {}  # convolution name -> the BatchNormalization folded into it
    for layer in body.layers:
        if not isinstance(layer, keras.layers.BatchNormalization) or len(layer._inbound_nodes) != 1:
            continue
        conv = layer.input._keras_history.operation
        if (
            type(conv) is keras.layers.Conv2D  # exactly: a subclass may compute something else
            and conv.get_config()["activation"] == "linear"
            and len(conv._outbound_nodes) == 1
            and layer.axis in (-1, len(layer.input.shape) - 1)
        ):
            folded[conv.name] = layer
    normalisations = {bn.name for bn in folded.values()}

    def copy_layer(layer):
        if layer.name in normalisations:
            return FoldedBatchNormalization(name=layer.name)
        config = layer.get_config()
        if layer.name in folded:
            config["use_bias"] = True
        return layer.__class__.from_config(config)

    copy = keras.models.clone_model(body, clone_function=copy_layer)
    for layer in body.layers:
        if layer.name in folded:
            bn = folded[layer.name]
            mean, variance = _float64(bn.moving_mean), _float64(bn.moving_variance)
            gamma = _float64(bn.gamma) if bn.scale else 1.0
            beta = _float64(bn.beta) if bn.center else 0.0
            scale = gamma / np.sqrt(variance + bn.epsilon)
            kernel = _float64(layer.kernel)
            bias = _float64(layer.bias) if layer.use_bias else 0.0
            dtype = layer.kernel.dtype
            copy.get_layer(layer.name).set_weights(
                [(kernel * scale).astype(dtype), ((bias - mean) * scale + beta).astype(dtype)]
            )
        elif layer.weights and layer.name not in normalisations:
            copy.get_layer(layer.name).set_weights(layer.get_weights())
    return copy


def _float64(variable) -> np.ndarray:
    return keras.ops.convert_to_numpy(variable).astype(np.float64)


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class FoldedBatchNormalization(keras.layers.Layer):
    """The identity, where `fold_batch_norm` moved a BatchNormalization into the convolution before it."""

    def call(self, inputs, training=None, mask=None):
        """(N, H, W, C) -> the same tensor."""
        return inputs
