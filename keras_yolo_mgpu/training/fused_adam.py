"""Adam whose per-variable update is TensorFlow's fused `ResourceApplyAdam` kernel.

Keras 3's Adam (TensorFlow backend) updates each variable with about ten
element-wise ops; keras-yolo3's Keras 2 Adam called the fused kernel, one
pass computing Keras 3's formula step for step (`backend/tensorflow/optimizer.py`).
AMSGrad, sparse gradients and JAX (where XLA fuses the update) take Keras's
own update. The moments are the same variables, so a run state saved with
Keras's Adam resumes with this one and back.
"""

from __future__ import annotations

import keras

from keras_yolo_mgpu.backend import optimizer as backend_optimizer
from keras_yolo_mgpu.serialization import SERIALIZABLE_PACKAGE


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` (same arguments) with the fused update kernel."""

    def update_step(self, gradient, variable, learning_rate):
        if not backend_optimizer.fused_adam_step(self, gradient, variable, learning_rate):
            super().update_step(gradient, variable, learning_rate)
