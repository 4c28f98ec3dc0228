"""How an inference model runs on one or several devices: TensorFlow's way and JAX's, side by side.

The detector (`detector.YOLO`) and the host NMS of exported models
(`export_formats.host_nms`) call these; nothing else in `inference/` knows which
backend runs. Both ways take numpy in and give numpy out:

* **TensorFlow**: one `tf.function` over slices of the batch, one model
  replica (with its own copy of the weights) per device under `tf.device`,
  any batch size without retracing.
* **JAX**: one `jax.jit` program over a 1-D mesh of the devices, the weights
  replicated and the batch split along it. The batch is padded to a few
  sizes (powers of two per device), so a video's varying batches compile a
  handful of programs, and a batch that does not divide by the device count
  still runs. The program runs outside any Keras distribution: during
  training (`keras.distribution.DataParallel`, whose scope the validation-mAP
  callback runs in) Keras would otherwise lay out new variables and shard
  inputs over the training devices.
"""

from __future__ import annotations

import contextlib
import logging

import keras
import numpy as np
from keras import ops

logger = logging.getLogger(__name__)


def is_tensorflow() -> bool:
    return keras.backend.backend() == "tensorflow"


@contextlib.contextmanager
def outside_distribution():
    """Keras's distribution (training's `DataParallel`) set aside for the block, then restored.

    Variables built inside (a detector's body) then live on the default
    device instead of being replicated over the training devices. A no-op
    when no distribution is set (always on TensorFlow, whose strategies are
    not Keras distributions).
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


# ----------------------------------------------------------------------
# Devices


def inference_devices(gpu_num: int) -> list:
    """The devices a detector spreads its batches over: `gpu_num` GPUs, else as many CPU devices.

    TensorFlow: device names, `[None]` (default placement) for one. JAX:
    `jax.Device`s, the default device for one.

    Raises:
        ValueError: fewer devices than `gpu_num`.
    """
    if gpu_num < 1:
        raise ValueError(f"gpu_num must be >= 1. Received: gpu_num={gpu_num}")
    if is_tensorflow():
        import tensorflow as tf

        if gpu_num == 1:
            return [None]
        gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
        cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
        backend, hint = "TensorFlow", "Check CUDA_VISIBLE_DEVICES and the TensorFlow GPU install"
    else:
        import jax

        if gpu_num == 1:
            return [jax.local_devices()[0]]
        gpus = [d for d in jax.local_devices() if d.platform != "cpu"]
        cpus = jax.local_devices(backend="cpu")
        backend, hint = "JAX", "Check CUDA_VISIBLE_DEVICES and JAX's CUDA install"
    if len(gpus) >= gpu_num:
        return gpus[:gpu_num]
    if not gpus and len(cpus) >= gpu_num:
        # Logical (TF) or simulated (JAX) CPU devices: a rehearsal.
        logger.info("no GPU: spreading frames over %d CPU devices", gpu_num)
        return cpus[:gpu_num]
    names = ", ".join(str(d) for d in gpus) or "none"
    raise ValueError(f"gpu_num={gpu_num} but {backend} sees {len(gpus)} GPU(s) ({names}). {hint}, or use gpu_num=1.")


# ----------------------------------------------------------------------
# Running the detection model


def make_detection_runner(model: keras.Model, devices: list, make_replica=None):
    """A function `(images, image_shapes) -> {output name: numpy array}` running `model` over `devices`.

    Args:
        model: `layers.build_inference_model`'s model (inputs: image in [0, 1], image_shape).
        devices: from `inference_devices`.
        make_replica: TensorFlow only, for several devices: builds another
            such model with a copy of the weights (called under each extra
            device). JAX replicates the weights by sharding instead.

    The function takes `images` (N, H, W, 3) uint8 letterboxed RGB (divided
    by 255 on the device, as keras-yolo3 divides float32 pixels; uint8 moves
    a quarter of the bytes) and `image_shapes` (N, 2) float32.
    """
    if is_tensorflow():
        return _TensorFlowRunner(model, devices, make_replica)
    return _JaxRunner(model, devices)


def _to_model_inputs(images, image_shapes):
    return [ops.cast(images, "float32") / 255.0, image_shapes]


class _TensorFlowRunner:
    """One `tf.function` per number of devices in use; the batch split in nearly equal slices."""

    def __init__(self, model, devices, make_replica):
        import tensorflow as tf

        self._devices = list(devices)
        # One replica per extra device, each with its own copy of the
        # weights, so no GPU reads another's weights on every batch.
        self._models = [model]
        for device in self._devices[1:]:
            with tf.device(device):
                self._models.append(make_replica())
        self._functions: dict[int, object] = {}

    def _function(self, num_parts: int):
        import tensorflow as tf

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
                    parts.append(model(_to_model_inputs(image, shape), training=False))
            if len(parts) == 1:
                return parts[0]
            return {key: tf.concat([p[key] for p in parts], axis=0) for key in parts[0]}

        self._functions[num_parts] = run
        return run

    def __call__(self, images: np.ndarray, image_shapes: np.ndarray) -> dict:
        parts = min(len(self._devices), len(images))
        out = self._function(parts)(tuple(np.array_split(images, parts)), tuple(np.array_split(image_shapes, parts)))
        return {key: value.numpy() for key, value in out.items()}


def padded_batch_size(size: int, num_devices: int) -> int:
    """The batch a JAX program runs for `size` images: a power of two per device, at least one.

    Few distinct sizes (a compile each) for any sequence of batch sizes, at
    most twice the work of the images themselves on one device.
    """
    per_device = -(-size // num_devices)
    return num_devices * (1 << (per_device - 1).bit_length())


class _JaxRunner:
    """One jitted program over a mesh of `devices`: weights replicated, the (padded) batch split."""

    def __init__(self, model, devices):
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        self._model = model
        self._count = len(devices)
        mesh = Mesh(np.asarray(devices), ("batch",))
        self._replicated = NamedSharding(mesh, PartitionSpec())
        self._split = NamedSharding(mesh, PartitionSpec("batch"))

        def forward(trainable, non_trainable, images, image_shapes):
            outputs, _ = model.stateless_call(
                trainable, non_trainable, _to_model_inputs(images, image_shapes), training=False
            )
            return outputs

        self._forward = jax.jit(forward)

    def __call__(self, images: np.ndarray, image_shapes: np.ndarray) -> dict:
        import jax

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


# ----------------------------------------------------------------------
# NMS alone, on the host's decoded boxes (exported models)


def make_nms_runner(**options):
    """A function `(boxes (N, K, 4), scores (N, K, C)) -> (boxes, scores, classes, valid)` as numpy.

    `options`: `layers.non_max_suppression`'s keyword arguments. TensorFlow
    runs its NMS op eagerly; JAX compiles `greedy_nms` once per input shape
    (run eagerly, its loops would be traced and compiled on every call).
    """
    from keras_yolo_mgpu.inference.layers import non_max_suppression

    def nms(boxes, scores):
        return non_max_suppression(boxes, scores, **options)

    if not is_tensorflow():
        import jax

        nms = jax.jit(nms)

    def run(boxes: np.ndarray, scores: np.ndarray) -> tuple:
        with outside_distribution():
            results = nms(np.asarray(boxes, np.float32), np.asarray(scores, np.float32))
        return tuple(np.asarray(value) for value in results)

    return run
