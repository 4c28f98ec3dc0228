"""keras-yolo3's networks rebuilt with Keras 2 (`tf_keras`), to write real Keras 2 files.

The checkpoint tests need weight files exactly as keras-yolo3 users have them:
`model_body.save_weights(...)`, its train.py checkpoints (the training model
with the `yolo_loss` Lambda), `model.save(...)` as convert.py writes it, and
files saved from a Keras 2 `multi_gpu_model` (the template nested as one
layer). The networks (keras-yolo3's `yolo_body` / `tiny_yolo_body` in its own
construction order, with Keras 2's auto-generated layer names `conv2d_1`,
`batch_normalization_1`, ...) come from `keras_yolo3_model`; this module adds
the wrappers around them.

Test helper only: nothing in `keras_yolo_mgpu` imports it.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras

# The networks, re-exported here under the names the tests use.
from keras_yolo3_model import (  # noqa: F401
    DarknetConv2D,
    DarknetConv2D_BN_Leaky,
    build_body,
    compose,
    darknet_body,
    make_last_layers,
    randomize_weights,
    resblock_body,
    tiny_yolo_body,
    yolo_body,
)
from tf_keras import layers


def build_training_model(body, input_shape, num_classes: int, freeze_body: int = 2):
    """keras-yolo3 train.py's `create_model` around an existing body.

    The loss Lambda has no weights; its maths is irrelevant here (a stand-in
    sum), only the layer structure matters: `input_1`, the body's layers, the
    `y_true` inputs and `yolo_loss`. Layers are frozen by keras-yolo3's index
    rule so the file records them as its stage-1 checkpoints do.
    """
    h, w = input_shape
    num_layers = len(body.outputs)
    strides = {0: 32, 1: 16, 2: 8}
    y_true = [layers.Input(shape=(h // strides[i], w // strides[i], 3, num_classes + 5)) for i in range(num_layers)]
    if freeze_body in (1, 2):
        if num_layers == 3:
            num = (185, len(body.layers) - 3)[freeze_body - 1]
        else:  # keras-yolo3's create_tiny_model
            num = (20, len(body.layers) - 2)[freeze_body - 1]
        for i in range(num):
            body.layers[i].trainable = False

    def stand_in_loss(args):
        return tf.add_n([tf.reduce_sum(tf.square(t), axis=[1, 2, 3])[:, None] for t in args[:num_layers]])

    loss = layers.Lambda(stand_in_loss, output_shape=(1,), name="yolo_loss")([*body.output, *y_true])
    return tf_keras.Model([body.input, *y_true], loss)


def build_multi_gpu_wrapper(template, gpus: int = 2):
    """What Keras 2 `multi_gpu_model(template, gpus)` built, minus the devices.

    The template's inputs are sliced with Lambdas, the template is called on
    each slice as ONE nested layer, and the per-replica outputs are
    concatenated under the template's output names. Saving this model's
    weights gives the file "containing 1 layers" users could not load.
    """

    def get_slice(data, i, parts):
        size = tf.shape(data)[0] // parts
        start = i * size
        stop = tf.shape(data)[0] if i == parts - 1 else start + size
        return data[start:stop]

    all_outputs = [[] for _ in template.outputs]
    for i in range(gpus):
        slices = [layers.Lambda(get_slice, arguments={"i": i, "parts": gpus})(x) for x in template.inputs]
        outputs = template(slices if len(slices) > 1 else slices[0])
        outputs = outputs if isinstance(outputs, list) else [outputs]
        for bucket, output in zip(all_outputs, outputs):
            bucket.append(output)
    merged = [
        layers.concatenate(outputs, axis=0, name=name) for name, outputs in zip(template.output_names, all_outputs)
    ]
    return tf_keras.Model(template.inputs, merged)
