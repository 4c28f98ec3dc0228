"""YOLOv3 and tiny YOLOv3 networks (the training model around them: `training.training_model`).

Every layer gets a deterministic, role-prefixed name so that

* freezing selects layers by role, not by index: `darknet_*` is the
  backbone, `yolo_*` the detection heads, `yolo_output_<l>` the three (or
  two) output convolutions;
* two builds of the same network have the same names, so Keras 3
  `.weights.h5` files load into any fresh build.

The layers are created in keras-yolo3's order, so the sequence of weight
shapes (and the topological layer order Keras derives from it) is the
original's and Keras 2 weight files load in order (see `checkpoints.py`).
"""

from __future__ import annotations

import math
from collections import defaultdict

import keras
from keras import layers

from keras_yolo_mgpu.model.architectures import get_architecture
from keras_yolo_mgpu.model.batch_norm import BatchNormalization
from keras_yolo_mgpu.model.boxes import num_output_layers
from keras_yolo_mgpu.model.loss import YoloLoss
from keras_yolo_mgpu.model.pooling import MaxPooling2D

# Darknet's weight decay, applied as an L2 penalty on every kernel.
WEIGHT_DECAY = 5e-4
LEAKY_SLOPE = 0.1
BODY_PREFIX = "darknet_"
HEAD_PREFIX = "yolo_"
OUTPUT_PREFIX = "yolo_output_"


class _Namer:
    """Hands out `<prefix><kind>_<n>` names, counting per kind."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._counts: dict[str, int] = defaultdict(int)

    def __call__(self, kind: str) -> str:
        self._counts[kind] += 1
        return f"{self.prefix}{kind}_{self._counts[kind]}"


def _darknet_conv(x, filters, kernel_size, names, strides=1, use_bias=True, name=None):
    # Darknet pads stride-2 convs on the top-left only (done by the caller
    # with ZeroPadding2D), so those use 'valid'; all others use 'same'.
    return layers.Conv2D(
        filters,
        kernel_size,
        strides=strides,
        padding="valid" if strides == 2 else "same",
        use_bias=use_bias,
        kernel_regularizer=keras.regularizers.L2(WEIGHT_DECAY),
        name=name or names("conv2d"),
    )(x)


def _conv_bn_leaky(x, filters, kernel_size, names, strides=1, sync_bn=False):
    """Conv2D (no bias) + BatchNormalization (fused kernel, see batch_norm.py) + LeakyReLU(0.1)."""
    x = _darknet_conv(x, filters, kernel_size, names, strides=strides, use_bias=False)
    x = BatchNormalization(synchronized=sync_bn, name=names("batch_normalization"))(x)
    return layers.LeakyReLU(negative_slope=LEAKY_SLOPE, name=names("leaky_re_lu"))(x)


def _resblock(x, filters, num_blocks, names, sync_bn):
    # Darknet uses left and top padding instead of 'same' for downsampling.
    x = layers.ZeroPadding2D(((1, 0), (1, 0)), name=names("zero_padding2d"))(x)
    x = _conv_bn_leaky(x, filters, 3, names, strides=2, sync_bn=sync_bn)
    for _ in range(num_blocks):
        y = _conv_bn_leaky(x, filters // 2, 1, names, sync_bn=sync_bn)
        y = _conv_bn_leaky(y, filters, 3, names, sync_bn=sync_bn)
        x = layers.Add(name=names("add"))([x, y])
    return x


def darknet_body(x, sync_bn: bool = False):
    """Darknet-53 without its classifier: 52 convolutions, 23 residual blocks.

    Args:
        x: image tensor (N, H, W, 3), H and W multiples of 32.

    Returns:
        Feature maps at strides 8, 16 and 32: (N, H/8, W/8, 256),
        (N, H/16, W/16, 512), (N, H/32, W/32, 1024).
    """
    names = _Namer(BODY_PREFIX)
    x = _conv_bn_leaky(x, 32, 3, names, sync_bn=sync_bn)
    x = _resblock(x, 64, 1, names, sync_bn)
    x = _resblock(x, 128, 2, names, sync_bn)
    stride8 = _resblock(x, 256, 8, names, sync_bn)
    stride16 = _resblock(stride8, 512, 8, names, sync_bn)
    stride32 = _resblock(stride16, 1024, 4, names, sync_bn)
    return stride8, stride16, stride32


def _last_layers(x, filters, out_filters, names, output_name, sync_bn):
    """Five alternating 1x1/3x3 convs, then a 3x3 conv and the output conv."""
    for kernel_size in (1, 3, 1, 3, 1):
        x = _conv_bn_leaky(x, filters * (2 if kernel_size == 3 else 1), kernel_size, names, sync_bn=sync_bn)
    y = _conv_bn_leaky(x, filters * 2, 3, names, sync_bn=sync_bn)
    y = _darknet_conv(y, out_filters, 1, names, name=output_name)
    return x, y


def _upsample(x, filters, names, sync_bn):
    x = _conv_bn_leaky(x, filters, 1, names, sync_bn=sync_bn)
    return layers.UpSampling2D(2, name=names("up_sampling2d"))(x)


def yolo_body(inputs, num_anchors: int, num_classes: int, *, sync_bn: bool = False) -> keras.Model:
    """YOLOv3: Darknet-53 and three detection heads.

    Args:
        inputs: image tensor (N, H, W, 3), H and W multiples of 32 (or None).
        num_anchors: anchors per scale (3).
        num_classes: number of classes.
        sync_bn: synchronize BatchNormalization statistics across replicas
            under a `tf.distribute` strategy.

    Returns:
        A model with outputs (N, H/32, W/32, A*(5+C)), (N, H/16, W/16, A*(5+C))
        and (N, H/8, W/8, A*(5+C)), coarsest first.
    """
    out_filters = num_anchors * (num_classes + 5)
    stride8, stride16, stride32 = darknet_body(inputs, sync_bn=sync_bn)
    names = _Namer(HEAD_PREFIX)
    x, y1 = _last_layers(stride32, 512, out_filters, names, OUTPUT_PREFIX + "0", sync_bn)
    x = _upsample(x, 256, names, sync_bn)
    x = layers.Concatenate(name=names("concatenate"))([x, stride16])
    x, y2 = _last_layers(x, 256, out_filters, names, OUTPUT_PREFIX + "1", sync_bn)
    x = _upsample(x, 128, names, sync_bn)
    x = layers.Concatenate(name=names("concatenate"))([x, stride8])
    _, y3 = _last_layers(x, 128, out_filters, names, OUTPUT_PREFIX + "2", sync_bn)
    return keras.Model(inputs, [y1, y2, y3], name="yolo_body")


def tiny_yolo_body(inputs, num_anchors: int, num_classes: int, *, sync_bn: bool = False) -> keras.Model:
    """Tiny YOLOv3: a 7-conv backbone and two detection heads.

    Returns:
        A model with outputs (N, H/32, W/32, A*(5+C)) and (N, H/16, W/16, A*(5+C)).
    """
    out_filters = num_anchors * (num_classes + 5)
    body = _Namer(BODY_PREFIX)
    x1 = inputs
    for filters in (16, 32, 64, 128):
        x1 = _conv_bn_leaky(x1, filters, 3, body, sync_bn=sync_bn)
        x1 = MaxPooling2D(2, strides=2, padding="same", name=body("max_pooling2d"))(x1)
    x1 = _conv_bn_leaky(x1, 256, 3, body, sync_bn=sync_bn)  # stride 16 features

    head = _Namer(HEAD_PREFIX)
    x2 = MaxPooling2D(2, strides=2, padding="same", name=head("max_pooling2d"))(x1)
    x2 = _conv_bn_leaky(x2, 512, 3, head, sync_bn=sync_bn)
    # Stride-1 pooling keeps the 13x13 grid (Darknet's size=2 stride=1 maxpool).
    x2 = MaxPooling2D(2, strides=1, padding="same", name=head("max_pooling2d"))(x2)
    x2 = _conv_bn_leaky(x2, 1024, 3, head, sync_bn=sync_bn)
    x2 = _conv_bn_leaky(x2, 256, 1, head, sync_bn=sync_bn)

    y1 = _conv_bn_leaky(x2, 512, 3, head, sync_bn=sync_bn)
    y1 = _darknet_conv(y1, out_filters, 1, head, name=OUTPUT_PREFIX + "0")

    x2 = _upsample(x2, 128, head, sync_bn)
    y2 = layers.Concatenate(name=head("concatenate"))([x2, x1])
    y2 = _conv_bn_leaky(y2, 256, 3, head, sync_bn=sync_bn)
    y2 = _darknet_conv(y2, out_filters, 1, head, name=OUTPUT_PREFIX + "1")
    return keras.Model(inputs, [y1, y2], name="tiny_yolo_body")


def freeze_layers(model: keras.Model, freeze_body: int) -> int:
    """Freezes layers by role, keras-yolo3's `freeze_body` semantics.

    Args:
        model: a `yolo_body` / `tiny_yolo_body` model (or a training model
            that contains its layers).
        freeze_body: 0 trains everything, 1 freezes the Darknet backbone
            (`darknet_*`), 2 freezes all but the output convolutions.

    Returns:
        The number of layers left frozen (layers without weights count too).
    """
    if freeze_body not in (0, 1, 2):
        raise ValueError(f"freeze_body must be 0, 1 or 2. Received: freeze_body={freeze_body}")
    frozen = 0
    for layer in model.layers:
        if isinstance(layer, (layers.InputLayer, YoloLoss)):
            continue
        if freeze_body == 1:
            layer.trainable = not layer.name.startswith(BODY_PREFIX)
        elif freeze_body == 2:
            layer.trainable = layer.name.startswith(OUTPUT_PREFIX)
        else:
            layer.trainable = True
        frozen += not layer.trainable
    return frozen


def check_input_shape(input_shape) -> tuple[int, int]:
    """Validates an (height, width) input shape: positive multiples of 32."""
    try:
        height, width = (int(v) for v in input_shape)
    except (TypeError, ValueError):
        raise ValueError(f"input_shape must be (height, width). Received: input_shape={input_shape!r}") from None
    if height <= 0 or width <= 0 or height % 32 or width % 32:
        raise ValueError(
            f"input_shape must be positive multiples of 32 (the network downsamples by 32). "
            f"Received: input_shape={input_shape!r}"
        )
    return height, width


def build_body(
    anchors, num_classes: int, *, input_shape=(None, None), sync_bn: bool = False, model: str | None = None
) -> keras.Model:
    """The body of `model` (see `architectures.MODEL_NAMES`) on a fresh input.

    Without `model`: `yolo_body` for 9 anchors, `tiny_yolo_body` for 6.
    """
    builder = get_architecture(model, len(anchors)).body_builder()
    num_layers = num_output_layers(len(anchors))
    image = keras.Input(shape=(*input_shape, 3), name="image")
    return builder(image, len(anchors) // num_layers, num_classes, sync_bn=sync_bn)


def set_objectness_prior(body: keras.Model, num_classes: int, probability: float, layer_names=None) -> list[str]:
    """Sets the objectness biases of output convolutions so every cell starts at `probability`.

    A fresh output convolution has bias 0: every anchor of every cell starts
    at objectness sigmoid(0) = 0.5, and the first steps of training from
    scratch are spent pushing thousands of background cells down. Starting
    them at a small prior (RetinaNet's and YOLOv5's 0.01) avoids that.
    Each output's channels are `A` blocks of `(x, y, w, h, objectness,
    classes...)`, so the objectness biases are every `(5 + C)`-th from 4.

    Args:
        body: a network built by `build_body`.
        num_classes: C.
        probability: in (0, 1); the bias becomes log(p / (1 - p)).
        layer_names: output convolutions to change (default: all of them).

    Returns:
        The names of the layers changed.
    """
    if not 0.0 < probability < 1.0:
        raise ValueError(f"objectness prior must be in (0, 1). Received: {probability}")
    bias = math.log(probability / (1.0 - probability))
    changed = []
    for layer in body.layers:
        if not layer.name.startswith(OUTPUT_PREFIX) or (layer_names is not None and layer.name not in layer_names):
            continue
        kernel, biases = layer.get_weights()
        biases = biases.copy()
        biases[4 :: num_classes + 5] = bias
        layer.set_weights([kernel, biases])
        changed.append(layer.name)
    return changed
