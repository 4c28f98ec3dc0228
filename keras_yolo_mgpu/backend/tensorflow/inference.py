"""A detector's model over one or several devices on TensorFlow: one `tf.function`, a model replica per device.

The runner takes numpy in and gives numpy out, any batch size without retracing.
"""

from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf
from keras import ops

# Why a detector finds fewer GPUs than asked for.
MISSING_GPUS = "TensorFlow sees {count} GPU(s) ({names}). Check CUDA_VISIBLE_DEVICES and the TensorFlow GPU install"


def outside_distribution():
    """A no-op: TensorFlow's strategies are not Keras distributions, so there is none to set aside."""
    return contextlib.nullcontext()


def default_device():
    """Where a detector on one device runs: None, TensorFlow's default placement (no device is listed)."""
    return None


def local_devices() -> tuple[list, list]:
    """(the GPUs, the CPU devices) by name, logical ones included."""
    gpus, cpus = tf.config.list_logical_devices("GPU"), tf.config.list_logical_devices("CPU")
    return [d.name for d in gpus], [d.name for d in cpus]


def compile_for_host(function):
    """`function` as it is: TensorFlow runs its NMS ops eagerly, with no retracing per shape."""
    return function


class DetectionRunner:
    """One `tf.function` per number of devices in use; the batch split in nearly equal slices.

    `make_replica` builds another inference model with a copy of the
    weights, called under each extra device: each GPU then reads its own
    weights on every batch, never another's.
    """

    def __init__(self, model, devices, make_replica=None):
        self._devices = list(devices)
        self._models = [model]
        for device in self._devices[1:]:
            with tf.device(device):
                self._models.append(make_replica())
        self._functions: dict[int, object] = {}

    def _function(self, num_parts: int):
        if num_parts in self._functions:
            return self._functions[num_parts]
        image, image_shape = self._models[0].inputs
        spec = (
            tuple(tf.TensorSpec([None, *image.shape[1:]], tf.uint8) for _ in range(num_parts)),
            tuple(tf.TensorSpec([None, *image_shape.shape[1:]], tf.float32) for _ in range(num_parts)),
        )
        devices, models = self._devices[:num_parts], self._models[:num_parts]

        @tf.function(input_signature=spec)
        def run(images, shapes):
            parts = []
            for device, model, image, shape in zip(devices, models, images, shapes):
                with tf.device(device):
                    parts.append(model([ops.cast(image, "float32") / 255.0, shape], training=False))
            if len(parts) == 1:
                return parts[0]
            return {key: tf.concat([p[key] for p in parts], axis=0) for key in parts[0]}

        self._functions[num_parts] = run
        return run

    def __call__(self, images: np.ndarray, image_shapes: np.ndarray) -> dict:
        parts = min(len(self._devices), len(images))
        out = self._function(parts)(tuple(np.array_split(images, parts)), tuple(np.array_split(image_shapes, parts)))
        return {key: value.numpy() for key, value in out.items()}


def compile_forward(body, input_shape: tuple[int, int]):
    """The bare network as one compiled function: (N, H, W, 3) float32 [0, 1] -> raw outputs (numpy)."""
    height, width = input_shape
    forward = tf.function(
        lambda x: body(x, training=False), input_signature=[tf.TensorSpec([None, height, width, 3], tf.float32)]
    )
    return lambda images: [output.numpy() for output in forward(images)]
