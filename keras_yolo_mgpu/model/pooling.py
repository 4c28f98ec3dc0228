"""MaxPooling2D for both backends: Keras's layer, computed by the backend's `pooling` module.

One layer class with Keras's arguments and name, so a network is defined
once and behaves alike on either backend; what differs is how a training
step computes the 2x2 pools' gradient (`backend/jax/pooling.py`: without
the index arrays, as large as the input, that XLA's CPU compiler makes).
"""

from __future__ import annotations

import keras

from keras_yolo_mgpu.backend import pooling as backend_pooling
from keras_yolo_mgpu.serialization import SERIALIZABLE_PACKAGE


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class MaxPooling2D(keras.layers.MaxPooling2D):
    """`keras.layers.MaxPooling2D`, the same result and gradient, with the backend's `max_pool`."""

    def call(self, inputs):
        """(B, H, W, C) -> (B, H', W', C) in the layer's compute dtype."""
        return backend_pooling.max_pool(inputs, self.pool_size, self.strides, self.padding, self.data_format)
