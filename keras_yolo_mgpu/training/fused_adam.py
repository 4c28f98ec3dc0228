"""Adam whose per-variable update is TensorFlow's fused `ResourceApplyAdam` kernel.

Keras 3's Adam (TensorFlow backend) updates each variable with about ten
separate element-wise ops; keras-yolo3 trained with Keras 2's Adam, which
called TensorFlow's fused kernel: one multi-threaded pass over the weight,
both moments and the gradient, computing Keras 3's formula step for step
(the kernel and the formula: `backend/tensorflow/optimizer.py`). On JAX,
Keras's update runs, which XLA fuses into the step (`backend/jax/optimizer.py`).

With N replicas every replica applies the update to its own copy of the
weights, so the saving counts N times per step (BENCHMARKS.md, "Multi-GPU
training"). AMSGrad, sparse gradients and JAX take Keras's own update.
Everything else (schedules, EMA, gradient all-reduce, saved state) is
Keras's: the moments are the same variables, so a run state saved with
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
