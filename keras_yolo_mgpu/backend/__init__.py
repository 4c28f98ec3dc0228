"""What each backend does its own way: one switch, and the same modules with the same functions per backend.

Keras's own pattern (keras/src/backend/{jax,tensorflow}/): `backend/jax/` and
`backend/tensorflow/` hold modules of the same names with the same functions,
and this switch picks one set from Keras's backend (`KERAS_BACKEND`, or
`~/.keras/keras.json`) once, at import. Everything outside this package
speaks `keras.ops` and calls these modules; it never asks which backend runs.
To list the differences, open the two folders side by side.

The modules: `distribution`, `gradients`, `batch_norm`, `inference`, `memory`, `nms`,
`optimizer`, `pooling`; the first line of each says how its backend does it.

What one engine does not have is said by its module: the JAX
`distribution.replica_model` refuses `multi_gpu_model` with what to use
instead, the JAX `nms.ragged_nms` refuses keras-yolo3's ragged `yolo_eval`,
the TensorFlow `distribution.check_feed` refuses the JAX feed of processes.

This package sits below the model: it imports Keras, its backend's framework,
numpy and the package's base modules (`keras_compat`, `fileio`, `heap`,
`serialization`), nothing else of the package. The JAX modules never import
TensorFlow, even indirectly: the JAX engine runs where it is not installed.
"""

from __future__ import annotations

import keras

# Keras's backend for this process: "tensorflow" or "jax" (recorded in args.json).
NAME = keras.backend.backend()

if NAME == "jax":
    from keras_yolo_mgpu.backend.jax import (
        batch_norm,
        distribution,
        gradients,
        inference,
        memory,
        nms,
        optimizer,
        pooling,
    )
elif NAME == "tensorflow":
    from keras_yolo_mgpu.backend.tensorflow import (
        batch_norm,
        distribution,
        gradients,
        inference,
        memory,
        nms,
        optimizer,
        pooling,
    )
else:
    raise ValueError(
        f"keras-yolo-mgpu runs on the tensorflow and jax backends; Keras runs on {NAME}. "
        "Set KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax"
    )

__all__ = ["NAME", "batch_norm", "distribution", "gradients", "inference", "memory", "nms", "optimizer", "pooling"]
