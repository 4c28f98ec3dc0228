"""keras-yolo3's networks and scalar loss rebuilt with Keras 2 (`tf_keras`).

The reference of the loss tests (`test_loss.py`), the builder the legacy
weight-file tests use (`keras2_reference.py`), and the baseline of
`tools/train_step_compare.py --reference keras-yolo3`, which loads it from a
checkout (`keras_yolo_mgpu.bench.baseline`). The networks are
built in keras-yolo3's construction order, so Keras 2 names its layers as
keras-yolo3 users' files do (`conv2d_1`, `batch_normalization_1`, ...).

The loss follows keras-yolo3's formulation, not ours: a `Lambda` layer that
sums every term over the batch and divides by the batch size (a scalar), and
builds the ignore mask one sample at a time in a `tf.while_loop` with a
boolean mask of that sample's true boxes. Only `tf_keras` (the `test` extra)
is needed; import this module lazily.
"""

from __future__ import annotations

from functools import reduce

import numpy as np
import tensorflow as tf

try:
    import tf_keras
    from tf_keras import layers
    from tf_keras.regularizers import l2
except ImportError as error:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "keras-yolo3's reference model needs Keras 2 as `tf_keras`: pip install 'tf-keras==2.21.*' "
        "(installed by the `test` extra)"
    ) from error

from keras_yolo_mgpu.model.boxes import anchor_masks, num_output_layers, output_strides


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


def _head(feats, anchors, num_classes, input_hw):
    """keras-yolo3's `yolo_head(..., calc_loss=True)`: grid, raw (N, gh, gw, A, 5+C), box xy, box wh."""
    num_anchors = len(anchors)
    grid_hw = tf.shape(feats)[1:3]
    cols = tf.tile(tf.reshape(tf.range(grid_hw[1]), [1, -1, 1, 1]), [grid_hw[0], 1, 1, 1])
    rows = tf.tile(tf.reshape(tf.range(grid_hw[0]), [-1, 1, 1, 1]), [1, grid_hw[1], 1, 1])
    grid = tf.cast(tf.concat([cols, rows], axis=-1), feats.dtype)  # (gh, gw, 1, 2), (x, y)
    raw = tf.reshape(feats, [-1, grid_hw[0], grid_hw[1], num_anchors, num_classes + 5])
    grid_wh = tf.cast(grid_hw[::-1], feats.dtype)
    box_xy = (tf.sigmoid(raw[..., :2]) + grid) / grid_wh
    box_wh = tf.exp(raw[..., 2:4]) * tf.constant(anchors.reshape(1, 1, 1, num_anchors, 2), feats.dtype)
    box_wh = box_wh / tf.cast(input_hw[::-1], feats.dtype)
    return grid, raw, box_xy, box_wh


def _iou(pred_box, true_box):
    """IoU of (gh, gw, A, 4) predictions with (K, 4) boxes, both xywh -> (gh, gw, A, K)."""
    pred_box = tf.expand_dims(pred_box, -2)
    pred_min, pred_max = pred_box[..., :2] - pred_box[..., 2:4] / 2, pred_box[..., :2] + pred_box[..., 2:4] / 2
    true_min, true_max = true_box[..., :2] - true_box[..., 2:4] / 2, true_box[..., :2] + true_box[..., 2:4] / 2
    overlap = tf.maximum(tf.minimum(pred_max, true_max) - tf.maximum(pred_min, true_min), 0.0)
    overlap_area = overlap[..., 0] * overlap[..., 1]
    pred_area = pred_box[..., 2] * pred_box[..., 3]
    true_area = true_box[..., 2] * true_box[..., 3]
    return overlap_area / (pred_area + true_area - overlap_area)


def scalar_yolo_loss(args, anchors, num_classes, ignore_thresh=0.5):
    """keras-yolo3's `yolo_loss`: every term summed over the batch, divided by the batch size.

    Args:
        args: `[*yolo_outputs, *y_true]`, coarsest scale first.
        anchors: (num_anchors, 2), (w, h) input pixels.

    Returns:
        A scalar.
    """
    anchors = np.asarray(anchors, np.float32)
    num_layers = num_output_layers(len(anchors))
    outputs, targets = args[:num_layers], args[num_layers:]
    input_hw = tf.shape(outputs[0])[1:3] * 32
    batch = tf.shape(outputs[0])[0]
    batch_float = tf.cast(batch, outputs[0].dtype)
    bce = tf.nn.sigmoid_cross_entropy_with_logits
    total = 0.0
    for layer, mask in enumerate(anchor_masks(num_layers)):
        target = targets[layer]
        object_mask = target[..., 4:5]
        grid, raw, box_xy, box_wh = _head(outputs[layer], anchors[mask], num_classes, input_hw)
        pred_box = tf.concat([box_xy, box_wh], axis=-1)
        grid_wh = tf.cast(tf.shape(outputs[layer])[1:3][::-1], target.dtype)
        true_xy = target[..., :2] * grid_wh - grid
        true_wh = tf.math.log(target[..., 2:4] / anchors[mask] * tf.cast(input_hw[::-1], target.dtype))
        true_wh = tf.where(tf.cast(object_mask, tf.bool), true_wh, tf.zeros_like(true_wh))
        scale = 2.0 - target[..., 2:3] * target[..., 3:4]

        # The original's per-sample loop: each sample's boxes by boolean mask.
        def sample_mask(b, masks, target=target, pred_box=pred_box):
            true_box = tf.boolean_mask(target[b, ..., 0:4], target[b, ..., 4] > 0)
            best = tf.reduce_max(_iou(pred_box[b], true_box), axis=-1)
            return b + 1, masks.write(b, tf.cast(best < ignore_thresh, target.dtype))

        masks = tf.TensorArray(target.dtype, size=1, dynamic_size=True)
        _, masks = tf.while_loop(lambda b, *_: b < batch, sample_mask, [0, masks])
        ignore_mask = tf.expand_dims(masks.stack(), -1)

        xy_loss = object_mask * scale * bce(labels=true_xy, logits=raw[..., 0:2])
        wh_loss = object_mask * scale * 0.5 * tf.square(true_wh - raw[..., 2:4])
        confidence = bce(labels=object_mask, logits=raw[..., 4:5])
        confidence_loss = object_mask * confidence + (1 - object_mask) * confidence * ignore_mask
        class_loss = object_mask * bce(labels=target[..., 5:], logits=raw[..., 5:])
        for term in (xy_loss, wh_loss, confidence_loss, class_loss):
            total += tf.reduce_sum(term) / batch_float
    return total


def build_body(tiny: bool, num_classes: int, seed: int | None = 0, calibration_size: int = 64):
    """A Keras 2 body on a (None, None, 3) input.

    With a `seed`, random non-trivial weights (see `randomize_weights`); with
    None, Keras 2's own initialisation.
    """
    image = tf_keras.Input(shape=(None, None, 3))
    body = (tiny_yolo_body if tiny else yolo_body)(image, 3, num_classes)
    if seed is not None:
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


def create_training_model(body, input_shape, anchors, num_classes: int, ignore_thresh: float = 0.5):
    """keras-yolo3 train.py's `create_model` / `create_tiny_model` around `body`, with the real loss.

    Args:
        body: `yolo_body` / `tiny_yolo_body` model.
        input_shape: (height, width).

    Returns:
        A model from `[image, *y_true]` to the scalar loss; compile it with
        `loss={"yolo_loss": lambda y_true, y_pred: y_pred}` as keras-yolo3 does.
    """
    height, width = input_shape
    num_layers = len(body.outputs)
    y_true = [
        layers.Input(shape=(height // stride, width // stride, 3, num_classes + 5))
        for stride in output_strides(num_layers)
    ]
    loss = layers.Lambda(
        scalar_yolo_loss,
        output_shape=(1,),
        name="yolo_loss",
        arguments={
            "anchors": np.asarray(anchors, np.float32),
            "num_classes": num_classes,
            "ignore_thresh": ignore_thresh,
        },
    )([*body.output, *y_true])
    return tf_keras.Model([body.input, *y_true], loss)
