"""A detector's model over one or several devices on JAX: one `jax.jit` program over a 1-D mesh.

The weights are replicated and the batch split along the mesh. The batch is
padded to a few sizes (powers of two per device), so a video's varying
batches compile a handful of programs, and a batch that does not divide by
the device count still runs. The program runs outside any Keras
distribution: during training (`keras.distribution.DataParallel`, whose
scope the validation-mAP callback runs in) Keras would otherwise lay out new
variables and shard inputs over the training devices.
"""

from __future__ import annotations

import contextlib

import jax
import keras
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from keras import ops

# Why a detector finds fewer GPUs than asked for.
MISSING_GPUS = "JAX sees {count} GPU(s) ({names}). Check CUDA_VISIBLE_DEVICES and JAX's CUDA install"


@contextlib.contextmanager
def outside_distribution():
    """Keras's distribution (training's `DataParallel`) set aside for the block, then restored.

    Variables built inside (a detector's body) then live on the default
    device instead of being replicated over the training devices. A no-op
    when no distribution is set.
    """
    distribution = keras.distribution.distribution()
    if distribution is None:
        yield
        return
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(distribution)


def default_device():
    """Where a detector on one device runs: JAX's default device."""
    return jax.local_devices()[0]


def local_devices() -> tuple[list, list]:
    """(the GPUs, the CPU devices) as `jax.Device`s, simulated CPU devices included."""
    return [d for d in jax.local_devices() if d.platform != "cpu"], jax.local_devices(backend="cpu")


def compile_for_host(function):
    """`function` compiled once per input shape: run eagerly, its loops would be traced on every call."""
    return jax.jit(function)


def padded_batch_size(size: int, num_devices: int) -> int:
    """The batch a program runs for `size` images: a power of two per device, at least one.

    Few distinct sizes (a compile each) for any sequence of batch sizes, at
    most twice the work of the images themselves on one device.
    """
    per_device = -(-size // num_devices)
    return num_devices * (1 << (per_device - 1).bit_length())


class DetectionRunner:
    """One jitted program over a mesh of `devices`: weights replicated, the (padded) batch split.

    `make_replica` is TensorFlow's: JAX replicates the weights by sharding.
    """

    def __init__(self, model, devices, make_replica=None):
        self._model = model
        self._count = len(devices)
        mesh = Mesh(np.asarray(devices), ("batch",))
        self._replicated = NamedSharding(mesh, PartitionSpec())
        self._split = NamedSharding(mesh, PartitionSpec("batch"))

        def forward(trainable, non_trainable, images, image_shapes):
            inputs = [ops.cast(images, "float32") / 255.0, image_shapes]
            outputs, _ = model.stateless_call(trainable, non_trainable, inputs, training=False)
            return outputs

        self._forward = jax.jit(forward)

    def __call__(self, images: np.ndarray, image_shapes: np.ndarray) -> dict:
        size = len(images)
        padded = padded_batch_size(size, self._count)
        if padded > size:  # copies of the last image: real pixels and sizes, results dropped
            pad = [(0, padded - size)] + [(0, 0)] * (images.ndim - 1)
            images, image_shapes = np.pad(images, pad, mode="edge"), np.pad(image_shapes, pad[:2], mode="edge")
        with outside_distribution():
            # The current weights, read on every call: a detector shares its
            # body (`YOLO.from_body`) with whoever trains it.
            state = (
                [v.value for v in self._model.trainable_variables],
                [v.value for v in self._model.non_trainable_variables],
            )
            state = jax.device_put(state, self._replicated)  # no copy when already there
            images, image_shapes = jax.device_put((images, image_shapes), self._split)
            out = self._forward(*state, images, image_shapes)
        return {key: np.asarray(value)[:size] for key, value in out.items()}


def compile_forward(body, input_shape: tuple[int, int]):
    """The bare network as one jitted program: (N, H, W, 3) float32 [0, 1] -> raw outputs (numpy).

    `input_shape` is TensorFlow's signature; JAX compiles per shape as it meets it.
    """
    state = ([v.value for v in body.trainable_variables], [v.value for v in body.non_trainable_variables])

    def forward(trainable, non_trainable, images):
        return body.stateless_call(trainable, non_trainable, images, training=False)[0]

    compiled = jax.jit(forward)
    return lambda images: [np.asarray(output) for output in compiled(*state, images)]
