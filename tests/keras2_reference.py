"""keras-yolo3's networks rebuilt with Keras 2 (`tf_keras`), to write real Keras 2 files.

The checkpoint tests need weight files exactly as keras-yolo3 users have them:
`model_body.save_weights(...)`, its train.py checkpoints (the training model
with the `yolo_loss` Lambda), `model.save(...)` as convert.py writes it, and
files saved from a Keras 2 `multi_gpu_model` (the template nested as one
layer). This module rebuilds keras-yolo3's `yolo_body` / `tiny_yolo_body` in
its own construction order with Keras 2's auto-generated layer names
(`conv2d_1`, `batch_normalization_1`, ...), and the wrappers around them.

Test helper only: nothing in `keras_yolo_mgpu` imports it.
"""

from __future__ import annotations

from functools import reduce

import numpy as np
import tensorflow as tf
import tf_keras
from tf_keras import layers
from tf_keras.regularizers import l2


def compose(*funcs):
    """keras-yolo3's `compose`: left-to-right function composition."""
    return reduce(lambda f, g: lambda *a, **kw: g(f(*a, **kw)), funcs)


def DarknetConv2D(*args, **kwargs):  # noqa: N802  (keras-yolo3's name)
    darknet_conv_kwargs = {"kernel_regularizer": l2(5e-4)}
    # Darknet pads stride-2 convs top-left (ZeroPadding2D) and uses 'valid'.
    darknet_conv_kwargs["padding"] = "valid" if kwargs.get("strides") == (2, 2) else "same"
    darknet_conv_kwargs.update(kwargs)
    return layers.Conv2D(*args, **darknet_conv_kwargs)


def DarknetConv2D_BN_Leaky(*args, **kwargs):  # noqa: N802
    no_bias_kwargs = {"use_bias": False}
    no_bias_kwargs.update(kwargs)
    return compose(DarknetConv2D(*args, **no_bias_kwargs), layers.BatchNormalization(), layers.LeakyReLU(alpha=0.1))


def resblock_body(x, num_filters, num_blocks):
    x = layers.ZeroPadding2D(((1, 0), (1, 0)))(x)
    x = DarknetConv2D_BN_Leaky(num_filters, (3, 3), strides=(2, 2))(x)
    for _ in range(num_blocks):
        y = compose(DarknetConv2D_BN_Leaky(num_filters // 2, (1, 1)), DarknetConv2D_BN_Leaky(num_filters, (3, 3)))(x)
        x = layers.Add()([x, y])
    return x


def darknet_body(x):
    x = DarknetConv2D_BN_Leaky(32, (3, 3))(x)
    x = resblock_body(x, 64, 1)
    x = resblock_body(x, 128, 2)
    x = resblock_body(x, 256, 8)
    x = resblock_body(x, 512, 8)
    x = resblock_body(x, 1024, 4)
    return x


def make_last_layers(x, num_filters, out_filters):
    x = compose(
        DarknetConv2D_BN_Leaky(num_filters, (1, 1)),
        DarknetConv2D_BN_Leaky(num_filters * 2, (3, 3)),
        DarknetConv2D_BN_Leaky(num_filters, (1, 1)),
        DarknetConv2D_BN_Leaky(num_filters * 2, (3, 3)),
        DarknetConv2D_BN_Leaky(num_filters, (1, 1)),
    )(x)
    y = compose(DarknetConv2D_BN_Leaky(num_filters * 2, (3, 3)), DarknetConv2D(out_filters, (1, 1)))(x)
    return x, y


def yolo_body(inputs, num_anchors, num_classes):
    """keras-yolo3's YOLOv3, including its `darknet.layers[152]` / `[92]` taps."""
    darknet = tf_keras.Model(inputs, darknet_body(inputs))
    # The stride-16 and stride-8 features are picked by layer index, as in
    # keras-yolo3; check they are the Add layers ending those stages.
    for index in (152, 92):
        assert isinstance(darknet.layers[index], layers.Add), (index, darknet.layers[index])
    x, y1 = make_last_layers(darknet.output, 512, num_anchors * (num_classes + 5))

    x = compose(DarknetConv2D_BN_Leaky(256, (1, 1)), layers.UpSampling2D(2))(x)
    x = layers.Concatenate()([x, darknet.layers[152].output])
    x, y2 = make_last_layers(x, 256, num_anchors * (num_classes + 5))

    x = compose(DarknetConv2D_BN_Leaky(128, (1, 1)), layers.UpSampling2D(2))(x)
    x = layers.Concatenate()([x, darknet.layers[92].output])
    x, y3 = make_last_layers(x, 128, num_anchors * (num_classes + 5))
    return tf_keras.Model(inputs, [y1, y2, y3])


def tiny_yolo_body(inputs, num_anchors, num_classes):
    """keras-yolo3's tiny YOLOv3."""
    pool = lambda strides=(2, 2): layers.MaxPooling2D(pool_size=(2, 2), strides=strides, padding="same")  # noqa: E731
    x1 = compose(
        DarknetConv2D_BN_Leaky(16, (3, 3)),
        pool(),
        DarknetConv2D_BN_Leaky(32, (3, 3)),
        pool(),
        DarknetConv2D_BN_Leaky(64, (3, 3)),
        pool(),
        DarknetConv2D_BN_Leaky(128, (3, 3)),
        pool(),
        DarknetConv2D_BN_Leaky(256, (3, 3)),
    )(inputs)
    x2 = compose(
        pool(),
        DarknetConv2D_BN_Leaky(512, (3, 3)),
        pool((1, 1)),
        DarknetConv2D_BN_Leaky(1024, (3, 3)),
        DarknetConv2D_BN_Leaky(256, (1, 1)),
    )(x1)
    y1 = compose(DarknetConv2D_BN_Leaky(512, (3, 3)), DarknetConv2D(num_anchors * (num_classes + 5), (1, 1)))(x2)

    x2 = compose(DarknetConv2D_BN_Leaky(128, (1, 1)), layers.UpSampling2D(2))(x2)
    y2 = compose(
        layers.Concatenate(),
        DarknetConv2D_BN_Leaky(256, (3, 3)),
        DarknetConv2D(num_anchors * (num_classes + 5), (1, 1)),
    )([x2, x1])
    return tf_keras.Model(inputs, [y1, y2])


def build_body(tiny: bool, num_classes: int, seed: int = 0, calibration_size: int = 64):
    """A Keras 2 body on a (None, None, 3) input with random, non-trivial weights.

    See `randomize_weights`: every layer's weights visibly change the outputs.
    """
    image = tf_keras.Input(shape=(None, None, 3))
    body = (tiny_yolo_body if tiny else yolo_body)(image, 3, num_classes)
    randomize_weights(body, seed, calibration_size)
    return body


def randomize_weights(model, seed: int = 0, calibration_size: int = 64):
    """Random kernels, biases and BN parameters, with BN statistics that normalise.

    Fresh BN statistics are the identity, so a loader that mixed up BN arrays
    would go unnoticed; random ones make activations vanish or explode
    (1e5 after Darknet-53's 23 residual additions) and drown early layers'
    contributions. So the moving statistics are set from one forward pass in
    training mode on random images, where each BN sees exactly the inputs it
    sees in inference mode once its statistics equal those batch statistics:
    activations stay O(1) in every layer (outputs have a std of about 0.5).
    """
    rng = np.random.default_rng(seed)
    norms, assignments = [], []
    for layer in model.layers:
        if isinstance(layer, layers.BatchNormalization):
            gamma, beta = layer.gamma, layer.beta
            assignments += [(gamma, rng.uniform(0.5, 1.5, gamma.shape)), (beta, rng.normal(0.0, 0.2, beta.shape))]
            norms.append(layer)
        elif isinstance(layer, layers.Conv2D):
            fan_in = np.prod(layer.kernel.shape[:3])
            # float32 draws: YOLOv3 has 62 M parameters.
            kernel = rng.standard_normal(layer.kernel.shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
            assignments.append((layer.kernel, kernel))
            if layer.use_bias:
                assignments.append((layer.bias, rng.normal(0.0, 0.1, layer.bias.shape)))
    tf_keras.backend.batch_set_value(assignments)  # one call: per-layer set_weights is slow

    images = rng.uniform(0.0, 1.0, (4, calibration_size, calibration_size, 3)).astype("float32")
    probe = tf_keras.Model(model.inputs, [layer.input for layer in norms])
    assignments = []
    for layer, value in zip(norms, probe(images, training=True)):
        value = value.numpy()
        var = value.var(axis=(0, 1, 2))
        # Inflate the variance by half the layer's mean: a channel that barely
        # varied on these images would otherwise get a huge gain that turns
        # float rounding differences between Keras 2 and Keras 3 (1e-7) into
        # 1e-4 at the outputs.
        var = var + 0.5 * var.mean() + 1e-3
        assignments += [(layer.moving_mean, value.mean(axis=(0, 1, 2))), (layer.moving_variance, var)]
    tf_keras.backend.batch_set_value(assignments)


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
