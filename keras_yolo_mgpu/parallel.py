"""Several devices: strategy selection, simulated devices, `multi_gpu_model`.

The default engine is `tf.distribute.MirroredStrategy`: one replica per GPU,
gradients all-reduced (NCCL on GPUs), BatchNormalization synchronised. The
`multi_gpu_model` here replaces the function Keras removed, for code written
against keras-yolo3 and for users who want the classic in-graph replication.

Both compute what one device computes at the same global batch, because the
loss is per sample (see `loss.py`): the compiled loss averages over the whole
global batch exactly once.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence

import keras
import tensorflow as tf

logger = logging.getLogger(__name__)

STRATEGIES = ("mirrored", "multiworker")
# Memory per simulated GPU when one physical GPU is split (MiB).
DEFAULT_SIMULATED_GPU_MEMORY_MB = 4096


def simulate_devices(count: int, memory_limit_mb: int = DEFAULT_SIMULATED_GPU_MEMORY_MB) -> list[str]:
    """Splits the single GPU (or, without one, the CPU) into `count` logical devices.

    Lets a multi-GPU run be rehearsed on any machine. Must run before
    TensorFlow initialises its devices (before any op or model is created).

    Returns:
        The logical device names, e.g. `['/device:CPU:0', '/device:CPU:1']`.

    Raises:
        RuntimeError: TensorFlow's devices are already initialised with
            another layout.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1. Received: count={count}")
    gpus = tf.config.list_physical_devices("GPU")
    physical = gpus[0] if gpus else tf.config.list_physical_devices("CPU")[0]
    kind = "GPU" if gpus else "CPU"
    if kind == "GPU":
        layout = [tf.config.LogicalDeviceConfiguration(memory_limit=memory_limit_mb)] * count
    else:
        layout = [tf.config.LogicalDeviceConfiguration()] * count
    try:
        tf.config.set_logical_device_configuration(physical, layout)
    except RuntimeError:
        existing = tf.config.list_logical_devices(kind)
        if len(existing) >= count:
            logger.info("devices already initialised; using %d of %d logical %s devices", count, len(existing), kind)
        else:
            raise RuntimeError(
                f"cannot split the {kind} into {count} logical devices: TensorFlow already "
                f"initialised {len(existing)}. Simulate devices before building any model."
            ) from None
    return [d.name for d in tf.config.list_logical_devices(kind)[:count]]


def select_devices(gpus: int | None = None, simulate: bool = False) -> list[str]:
    """The devices to train on.

    Args:
        gpus: number of GPUs; None means every visible GPU (the CPU if none).
        simulate: split the CPU or single GPU into `gpus` logical devices.

    Raises:
        ValueError: more GPUs asked for than visible (without `simulate`).
    """
    if simulate:
        return simulate_devices(gpus or 2)
    visible = [d.name for d in tf.config.list_logical_devices("GPU")]
    if gpus is None:
        return visible or [tf.config.list_logical_devices("CPU")[0].name]
    if gpus > len(visible):
        raise ValueError(
            f"--gpus {gpus} asked for {gpus} GPUs but TensorFlow sees {len(visible)} "
            f"({', '.join(visible) or 'none'}). Check CUDA_VISIBLE_DEVICES and the TensorFlow GPU install, "
            "or add --simulate-devices to rehearse on logical devices."
        )
    return visible[:gpus]


def make_strategy(devices: Sequence[str], kind: str = "mirrored") -> tf.distribute.Strategy:
    """A strategy over `devices`.

    Args:
        devices: device names from `select_devices`.
        kind: "mirrored" (one machine) or "multiworker" (several machines,
            configured by the TF_CONFIG environment variable; each worker
            uses its local devices).
    """
    if kind not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}. Received: strategy={kind!r}")
    if kind == "multiworker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError(
                "--strategy multiworker needs the TF_CONFIG environment variable, e.g. "
                '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}'
            )
        try:
            json.loads(os.environ["TF_CONFIG"])
        except json.JSONDecodeError as error:
            raise ValueError(f"TF_CONFIG is not valid JSON: {error}") from None
        return tf.distribute.MultiWorkerMirroredStrategy()
    if len(devices) == 1:
        return tf.distribute.OneDeviceStrategy(devices[0])
    cross_device_ops = None
    if not all("GPU" in d.upper() for d in devices):
        # NCCL only runs on GPUs; logical CPU devices reduce on one device.
        cross_device_ops = tf.distribute.ReductionToOneDevice()
    return tf.distribute.MirroredStrategy(devices=list(devices), cross_device_ops=cross_device_ops)


def split_sizes(batch_size, num_devices: int):
    """Slice sizes that differ by at most one: 16 over 3 -> [6, 5, 5].

    Args:
        batch_size: scalar int tensor or int.

    Returns:
        int32 tensor (num_devices,).
    """
    batch_size = tf.cast(batch_size, tf.int32)
    base = batch_size // num_devices
    extra = batch_size - base * num_devices
    return base + tf.cast(tf.range(num_devices) < extra, tf.int32)


@keras.saving.register_keras_serializable(package="keras_yolo_mgpu")
class ReplicaParallel(keras.layers.Layer):
    """Runs `template` on slices of the batch, one slice per device.

    Per-sample outputs (rank >= 1) are joined along the batch in the
    original order; scalar outputs are averaged weighted by each replica's
    sample count, which is what the template would return on the whole
    batch for a mean. The template's weights are shared, not copied.
    BatchNormalization in training mode sees per-replica statistics.
    """

    def __init__(self, template: keras.Model, devices: Sequence[str], **kwargs):
        super().__init__(**kwargs)
        if len(devices) < 1:
            raise ValueError("ReplicaParallel needs at least one device")
        self.template = template
        self.devices = list(devices)

    def build(self, input_shape):
        # The template is already built; nothing of our own to create.
        self.built = True

    def call(self, inputs, training=None):
        flat = tf.nest.flatten(inputs)
        batch = tf.shape(flat[0])[0]
        sizes = split_sizes(batch, len(self.devices))
        slices = [tf.split(t, sizes, num=len(self.devices), axis=0) for t in flat]
        replica_outputs = []
        for index, device in enumerate(self.devices):
            with tf.device(device), tf.name_scope(f"replica_{index}"):
                replica_inputs = tf.nest.pack_sequence_as(inputs, [s[index] for s in slices])
                replica_outputs.append(tf.nest.flatten(self.template(replica_inputs, training=training)))
        merged = []
        weights = tf.cast(sizes, tf.float32) / tf.cast(batch, tf.float32)
        for per_replica in zip(*replica_outputs):
            if per_replica[0].shape.rank == 0:
                merged.append(tf.add_n([w * tf.cast(o, tf.float32) for w, o in zip(tf.unstack(weights), per_replica)]))
            else:
                merged.append(tf.concat(per_replica, axis=0))
        return merged[0] if len(merged) == 1 else merged

    def compute_output_spec(self, inputs, training=None):
        return self.template.compute_output_spec(inputs)

    def get_config(self):
        config = super().get_config()
        config.update(template=keras.saving.serialize_keras_object(self.template), devices=self.devices)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["template"] = keras.saving.deserialize_keras_object(config["template"])
        return cls(**config)


def multi_gpu_model(model: keras.Model, gpus: int | None = None, devices: Sequence[str] | None = None) -> keras.Model:
    """Replicates `model` over devices; the drop-in for Keras 2's removed function.

    Each input is sliced along the batch (uneven slices allowed), the
    template runs on each device, and the outputs are merged: per-sample
    outputs concatenated, scalar outputs averaged weighted by sample count
    (never summed, which would multiply gradients by the device count).

    Args:
        model: the template. The returned model shares its weights, so save
            checkpoints from the template (`TemplateModelCheckpoint`).
        gpus: use `/gpu:0` .. `/gpu:{gpus-1}`.
        devices: explicit device names (e.g. logical CPUs in tests).

    Returns:
        A model with the template's inputs (same names) and outputs.
    """
    if devices is None:
        if gpus is None or gpus < 1:
            raise ValueError(f"pass gpus >= 1 or devices. Received: gpus={gpus}, devices={devices}")
        devices = select_devices(gpus)
    devices = list(devices)
    inputs = [keras.Input(shape=t.shape[1:], dtype=t.dtype, name=t.name) for t in model.inputs]
    outputs = ReplicaParallel(model, devices, name="replica_parallel")(inputs if len(inputs) > 1 else inputs[0])
    return keras.Model(inputs, outputs, name=f"{model.name}_parallel")


def patch_multiworker_first_batch_build(model: keras.Model) -> None:
    """Works around Keras 3.15 failing on dict inputs under MultiWorkerMirroredStrategy.

    Before its first step, Keras's TF trainer reduces one distributed batch
    to learn the input shapes, calling `strategy.reduce` on the whole nested
    structure. MirroredStrategy accepts a dict there; the collective
    strategy raises "Attempt to convert a value ({'image': PerReplica...})".
    Reducing leaf by leaf gives Keras the same shapes. Every worker makes the
    same calls, so the collective ops stay matched.
    """
    strategy = model.distribute_strategy

    def first_batch_build(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = tf.nest.map_structure(
                    lambda value: strategy.reduce("MEAN", value, axis=None)
                    if isinstance(value, tf.distribute.DistributedValues)
                    else value,
                    next(batches),
                )
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = first_batch_build


_LOGS_PATCHED = False


def patch_multiworker_log_reduction() -> None:
    """Works around Keras 3 reducing scalar logs with axis=0 under MultiWorkerMirroredStrategy.

    Keras's TF trainer reduces each step's logs with
    `strategy.reduce("MEAN", value, axis=0)` under the collective strategy,
    which fails on scalars ("Invalid reduction dimension 0 for input with 0
    dimensions", tensorflow/tensorflow#72388). Metric results are already
    identical on every replica (their variables are all-reduced on update),
    so the first replica's value is exact: Keras does the same on TPUs.
    """
    global _LOGS_PATCHED
    if _LOGS_PATCHED:
        return
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original = tf_trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction == "auto" and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            reduction = "first"
        return original(values, strategy, reduction)

    tf_trainer.reduce_per_replica = reduce_per_replica
    _LOGS_PATCHED = True
