"""`multi_gpu_model`: classic in-graph replication of a template model.

It replaces the function Keras removed, for code written against keras-yolo3
and for users who want in-graph replication: a layer slices the batch, runs
the template on each device and joins the per-sample outputs. Because the
loss is per sample (`model/loss.py`), the compiled loss averages over the
whole global batch exactly once, as on one device.

TensorFlow only (`tf.device`, `tf.split` with tensor sizes): on JAX every
device count runs as one SPMD program, and `backend/jax/distribution.py`'s
`replica_model` refuses `--parallel multi_gpu_model` with what to use instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import keras
import tensorflow as tf

from keras_yolo_mgpu.serialization import SERIALIZABLE_PACKAGE

logger = logging.getLogger(__name__)


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


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
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
        """Runs the template on each device's slice of the batch.

        Args:
            inputs: the template's input structure (a tensor, a list, or a
                dict such as the training model's {"image": (batch, h, w, 3)
                uint8, "boxes": (batch, max_boxes, 5), "hsv": (batch, k)});
                every leaf is sliced along its first (batch) axis.

        Returns:
            The template's outputs for the whole batch: per-sample leaves
            (batch, ...) in the original order, scalar leaves averaged.
        """
        flat = keras.tree.flatten(inputs)
        batch = tf.shape(flat[0])[0]
        sizes = split_sizes(batch, len(self.devices))
        # tf.split, not keras.ops.split: the slice sizes are a tensor here
        # (any batch, uneven slices), which ops.split's indices cannot express.
        slices = [tf.split(t, sizes, num=len(self.devices), axis=0) for t in flat]
        replica_outputs = []
        for index, device in enumerate(self.devices):
            with tf.device(device), tf.name_scope(f"replica_{index}"):
                # The template's own structure (dict keys, list order), so a
                # Functional model with named dict inputs accepts it.
                replica_inputs = keras.tree.pack_sequence_as(inputs, [s[index] for s in slices])
                outputs = self.template(replica_inputs, training=training)
                replica_outputs.append(keras.tree.flatten(outputs))
        merged = []
        weights = tf.cast(sizes, tf.float32) / tf.cast(batch, tf.float32)
        for per_replica in zip(*replica_outputs):
            if per_replica[0].shape.rank == 0:
                merged.append(tf.add_n([w * tf.cast(o, tf.float32) for w, o in zip(tf.unstack(weights), per_replica)]))
            else:
                merged.append(tf.concat(per_replica, axis=0))
        return keras.tree.pack_sequence_as(outputs, merged)

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

    Each input of any structure (one tensor, a list, a dict of named
    inputs) is sliced along the batch (uneven slices allowed), the
    template runs on each device, and the outputs are merged: per-sample
    outputs concatenated, scalar outputs averaged weighted by sample count
    (never summed, which would multiply gradients by the device count).

    Args:
        model: the template. The returned model shares its weights, so save
            checkpoints from the template (`TemplateModelCheckpoint`).
        gpus: use `/gpu:0` .. `/gpu:{gpus-1}`.
        devices: explicit device names (e.g. logical CPUs in tests).

    Returns:
        A model with the template's inputs (same structure and names) and outputs.
    """
    if devices is None:
        if gpus is None or gpus < 1:
            raise ValueError(f"pass gpus >= 1 or devices. Received: gpus={gpus}, devices={devices}")
        # Keras 2's names; `distribution.select_devices` is what train.py uses (and imports this module).
        devices = [device.name for device in tf.config.list_logical_devices("GPU")][:gpus]
        if len(devices) < gpus:
            raise ValueError(f"multi_gpu_model(gpus={gpus}) needs {gpus} GPUs; TensorFlow sees {len(devices)}.")
    devices = list(devices)
    # The template's input structure (one tensor, a list, or a dict of named
    # inputs), each input re-created with its name, shape and dtype.
    inputs = keras.tree.map_structure(lambda t: keras.Input(shape=t.shape[1:], dtype=t.dtype, name=t.name), model.input)
    outputs = ReplicaParallel(model, devices, name="replica_parallel")(inputs)
    return keras.Model(inputs, outputs, name=f"{model.name}_parallel")
