"""The Adam update on JAX: Keras's own, which XLA fuses into the compiled step.

TensorFlow's fused `ResourceApplyAdam` kernel has no JAX counterpart, and needs
none: the whole training step is one XLA program, in which Keras's element-wise
update ops are fused already.
"""

from __future__ import annotations


def fused_adam_step(optimizer, gradient, variable, learning_rate) -> bool:
    """False: Keras's Adam update runs (`training.fused_adam.FusedAdam`)."""
    return False
