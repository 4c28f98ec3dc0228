"""YOLOv4 and YOLOv4-tiny networks (AlexeyAB/darknet's yolov4.cfg and yolov4-tiny.cfg).

The conventions of `model/yolo3.py`, so everything built for YOLOv3 works on them unchanged:
outputs coarse to fine (stride 32 first, although the v4 cfg lists its fine scale first), so
YOLOv3's anchor masks, targets and loss apply; role-named layers (`darknet_*` the CSP backbone,
`yolo_*` the neck and heads, `yolo_output_<l>` the output convolutions); Darknet's top-left
padding for stride 2, the cfg's L2 weight decay (5e-4) and Keras's BatchNormalization epsilon
(the converter folds Darknet's batch norm into it, `weights/darknet.py`).

The layers are created in the cfg's order; `build_with_darknet_order` returns that order, which
is how `weights/convert.py` maps a Darknet `.weights` file onto these bodies.
"""

from __future__ import annotations

import keras
from keras import layers

from keras_yolo_mgpu.model.batch_norm import BatchNormalization
from keras_yolo_mgpu.model.pooling import MaxPooling2D
from keras_yolo_mgpu.model.yolo3 import BODY_PREFIX, HEAD_PREFIX, LEAKY_SLOPE, OUTPUT_PREFIX, _darknet_conv, _Namer
from keras_yolo_mgpu.serialization import SERIALIZABLE_PACKAGE, constructor_config

#: `scale_x_y` of each output scale, coarse to fine, as the cfgs set them.
YOLO4_SCALE_X_Y = (1.05, 1.1, 1.2)
YOLO4_TINY_SCALE_X_Y = (1.05, 1.05)


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class Mish(keras.layers.Layer):
    """Mish activation, `x * tanh(softplus(x))` (Darknet's `activation=mish`)."""

    def call(self, inputs):
        return inputs * keras.ops.tanh(keras.ops.softplus(inputs))

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class ChannelGroup(keras.layers.Layer):
    """Darknet's grouped route: group `group_id` of `groups` equal channel slices.

    `[route] layers=-1 groups=2 group_id=1` keeps the second half of the
    channels (YOLOv4-tiny's CSP blocks).
    """

    def __init__(self, groups: int, group_id: int, **kwargs):
        super().__init__(**kwargs)
        if groups < 1 or not 0 <= group_id < groups:
            raise ValueError(f"need 0 <= group_id < groups. Received: groups={groups}, group_id={group_id}")
        self.groups = int(groups)
        self.group_id = int(group_id)

    def _bounds(self, channels: int) -> tuple[int, int]:
        if channels % self.groups:
            raise ValueError(f"{channels} channels do not split into {self.groups} groups")
        size = channels // self.groups
        return self.group_id * size, (self.group_id + 1) * size

    def call(self, inputs):
        start, stop = self._bounds(inputs.shape[-1])
        return inputs[..., start:stop]

    def compute_output_shape(self, input_shape):
        start, stop = self._bounds(input_shape[-1])
        return (*input_shape[:-1], stop - start)

    def get_config(self):
        return {**super().get_config(), **constructor_config(self)}


class _Blocks:
    """Creates the conv blocks of one role (name prefix), recording them in creation (cfg) order.

    `order` gets `(conv layer name, batch-norm layer name or None)` per conv.
    """

    def __init__(self, prefix: str, sync_bn: bool, order: list):
        self.names = _Namer(prefix)
        self.sync_bn = sync_bn
        self.order = order

    def conv(self, x, filters: int, kernel_size: int, strides: int = 1, activation: str = "mish"):
        """Conv2D (no bias) + BatchNormalization + Mish or LeakyReLU(0.1)."""
        if strides == 2:
            # Darknet pads both sides; for inputs divisible by 2 only the top-left row is read.
            x = layers.ZeroPadding2D(((1, 0), (1, 0)), name=self.names("zero_padding2d"))(x)
        conv_name = self.names("conv2d")
        x = _darknet_conv(x, filters, kernel_size, self.names, strides=strides, use_bias=False, name=conv_name)
        bn_name = self.names("batch_normalization")
        x = BatchNormalization(synchronized=self.sync_bn, name=bn_name)(x)
        self.order.append((conv_name, bn_name))
        if activation == "mish":
            return Mish(name=self.names("mish"))(x)
        return layers.LeakyReLU(negative_slope=LEAKY_SLOPE, name=self.names("leaky_re_lu"))(x)

    def leaky(self, x, filters: int, kernel_size: int, strides: int = 1):
        return self.conv(x, filters, kernel_size, strides, activation="leaky")

    def output(self, x, filters: int, layer: int):
        """The linear, biased output convolution `yolo_output_<layer>`."""
        name = OUTPUT_PREFIX + str(layer)
        self.order.append((name, None))
        return _darknet_conv(x, filters, 1, self.names, name=name)

    def concat(self, tensors):
        return layers.Concatenate(name=self.names("concatenate"))(tensors)


def _csp_stage(blocks: _Blocks, x, filters: int, num_blocks: int, first: bool = False):
    """One CSPDarknet53 stage: downsample, split into two paths, residual blocks on one, merge.

    The first stage keeps full width in both paths and a 32-channel bottleneck
    (yolov4.cfg layers 1-10); the others halve the width (e.g. layers 11-23).
    """
    x = blocks.conv(x, filters, 3, strides=2)
    half = filters if first else filters // 2
    shortcut_path = blocks.conv(x, half, 1)
    x = blocks.conv(x, half, 1)
    for _ in range(num_blocks):
        y = blocks.conv(x, filters // 2 if first else half, 1)
        y = blocks.conv(y, half, 3)
        x = layers.Add(name=blocks.names("add"))([x, y])
    x = blocks.conv(x, half, 1)
    x = blocks.concat([x, shortcut_path])
    return blocks.conv(x, filters, 1)


def csp_darknet53_body(x, order: list, sync_bn: bool = False):
    """CSPDarknet53 without its classifier (yolov4.cfg layers 0-104).

    Returns:
        Feature maps at strides 8, 16 and 32: (N, H/8, W/8, 256),
        (N, H/16, W/16, 512), (N, H/32, W/32, 1024).
    """
    blocks = _Blocks(BODY_PREFIX, sync_bn, order)
    x = blocks.conv(x, 32, 3)
    x = _csp_stage(blocks, x, 64, 1, first=True)
    x = _csp_stage(blocks, x, 128, 2)
    stride8 = _csp_stage(blocks, x, 256, 8)
    stride16 = _csp_stage(blocks, stride8, 512, 8)
    stride32 = _csp_stage(blocks, stride16, 1024, 4)
    return stride8, stride16, stride32


def _five_convs(blocks: _Blocks, x, filters: int):
    for kernel_size in (1, 3, 1, 3, 1):
        x = blocks.leaky(x, filters * (2 if kernel_size == 3 else 1), kernel_size)
    return x


def _yolo4(inputs, num_anchors: int, num_classes: int, sync_bn: bool, order: list) -> keras.Model:
    out_filters = num_anchors * (num_classes + 5)
    stride8, stride16, stride32 = csp_darknet53_body(inputs, order, sync_bn)
    blocks = _Blocks(HEAD_PREFIX, sync_bn, order)
    # SPP: max pooling 5, 9, 13 at stride 1, concatenated largest first (layers 105-116).
    x = blocks.leaky(stride32, 512, 1)
    x = blocks.leaky(x, 1024, 3)
    x = blocks.leaky(x, 512, 1)
    pools = [MaxPooling2D(k, strides=1, padding="same", name=blocks.names("max_pooling2d"))(x) for k in (5, 9, 13)]
    x = blocks.concat([pools[2], pools[1], pools[0], x])
    x = blocks.leaky(x, 512, 1)
    x = blocks.leaky(x, 1024, 3)
    p5 = blocks.leaky(x, 512, 1)
    # PANet top-down path (layers 117-136).
    x = blocks.leaky(p5, 256, 1)
    x = layers.UpSampling2D(2, name=blocks.names("up_sampling2d"))(x)
    x = blocks.concat([blocks.leaky(stride16, 256, 1), x])
    p4 = _five_convs(blocks, x, 256)
    x = blocks.leaky(p4, 128, 1)
    x = layers.UpSampling2D(2, name=blocks.names("up_sampling2d"))(x)
    x = blocks.concat([blocks.leaky(stride8, 128, 1), x])
    p3 = _five_convs(blocks, x, 128)
    # Heads and the bottom-up path (layers 137-160), fine scale first as in the cfg.
    y_fine = blocks.output(blocks.leaky(p3, 256, 3), out_filters, 2)
    x = blocks.concat([blocks.leaky(p3, 256, 3, strides=2), p4])
    x = _five_convs(blocks, x, 256)
    y_mid = blocks.output(blocks.leaky(x, 512, 3), out_filters, 1)
    x = blocks.concat([blocks.leaky(x, 512, 3, strides=2), p5])
    x = _five_convs(blocks, x, 512)
    y_coarse = blocks.output(blocks.leaky(x, 1024, 3), out_filters, 0)
    return keras.Model(inputs, [y_coarse, y_mid, y_fine], name="yolo4_body")


def _tiny_csp_block(blocks: _Blocks, x, filters: int):
    """YOLOv4-tiny's CSP block (e.g. yolov4-tiny.cfg layers 2-8).

    Returns:
        (merged output of 2 * filters channels, the 1x1 conv's output).
    """
    x = blocks.leaky(x, filters, 3)
    y = ChannelGroup(2, 1, name=blocks.names("channel_group"))(x)
    y1 = blocks.leaky(y, filters // 2, 3)
    y2 = blocks.leaky(y1, filters // 2, 3)
    route = blocks.leaky(blocks.concat([y2, y1]), filters, 1)
    return blocks.concat([x, route]), route


def _yolo4_tiny(inputs, num_anchors: int, num_classes: int, sync_bn: bool, order: list) -> keras.Model:
    out_filters = num_anchors * (num_classes + 5)
    body = _Blocks(BODY_PREFIX, sync_bn, order)
    x = body.leaky(inputs, 32, 3, strides=2)
    x = body.leaky(x, 64, 3, strides=2)
    for filters in (64, 128, 256):
        x, route = _tiny_csp_block(body, x, filters)
        x = MaxPooling2D(2, strides=2, padding="same", name=body.names("max_pooling2d"))(x)
    stride16 = route  # yolov4-tiny.cfg layer 23
    x = body.leaky(x, 512, 3)

    head = _Blocks(HEAD_PREFIX, sync_bn, order)
    x = head.leaky(x, 256, 1)
    y_coarse = head.output(head.leaky(x, 512, 3), out_filters, 0)
    x = head.leaky(x, 128, 1)
    x = layers.UpSampling2D(2, name=head.names("up_sampling2d"))(x)
    x = head.concat([x, stride16])
    y_fine = head.output(head.leaky(x, 256, 3), out_filters, 1)
    return keras.Model(inputs, [y_coarse, y_fine], name="yolo4_tiny_body")


def yolo4_body(inputs, num_anchors: int, num_classes: int, *, sync_bn: bool = False) -> keras.Model:
    """YOLOv4: CSPDarknet53, SPP, PANet and three detection heads (yolov4.cfg).

    Args:
        inputs: image tensor (N, H, W, 3), H and W multiples of 32 (or None).
        num_anchors: anchors per scale (3).
        num_classes: number of classes.
        sync_bn: synchronize BatchNormalization statistics across replicas.

    Returns:
        A model with outputs (N, H/32, W/32, A*(5+C)), (N, H/16, W/16, A*(5+C))
        and (N, H/8, W/8, A*(5+C)), coarsest first.
    """
    return _yolo4(inputs, num_anchors, num_classes, sync_bn, [])


def yolo4_tiny_body(inputs, num_anchors: int, num_classes: int, *, sync_bn: bool = False) -> keras.Model:
    """YOLOv4-tiny: the tiny CSP backbone and two detection heads (yolov4-tiny.cfg).

    Returns:
        A model with outputs (N, H/32, W/32, A*(5+C)) and (N, H/16, W/16, A*(5+C)).
    """
    return _yolo4_tiny(inputs, num_anchors, num_classes, sync_bn, [])


def build_with_darknet_order(tiny: bool, num_anchors: int, num_classes: int):
    """A fresh `yolo4_body` / `yolo4_tiny_body` and its convolutions in cfg order.

    Returns:
        `(body, order)`: `order[k]` is `(conv layer name, batch-norm layer
        name or None)` of the k-th `[convolutional]` section of the cfg.
    """
    order: list = []
    builder = _yolo4_tiny if tiny else _yolo4
    body = builder(keras.Input(shape=(None, None, 3), name="image"), num_anchors, num_classes, False, order)
    return body, order
