"""YOLOv3 and tiny YOLOv3 networks, and the training model around them.

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

from keras_yolo_mgpu.model.batch_norm import BatchNormalization
from keras_yolo_mgpu.model.boxes import MAX_BOXES, num_output_layers, output_strides
from keras_yolo_mgpu.model.loss import YoloLoss

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
        x1 = layers.MaxPooling2D(2, strides=2, padding="same", name=body("max_pooling2d"))(x1)
    x1 = _conv_bn_leaky(x1, 256, 3, body, sync_bn=sync_bn)  # stride 16 features

    head = _Namer(HEAD_PREFIX)
    x2 = layers.MaxPooling2D(2, strides=2, padding="same", name=head("max_pooling2d"))(x1)
    x2 = _conv_bn_leaky(x2, 512, 3, head, sync_bn=sync_bn)
    # Stride-1 pooling keeps the 13x13 grid (Darknet's size=2 stride=1 maxpool).
    x2 = layers.MaxPooling2D(2, strides=1, padding="same", name=head("max_pooling2d"))(x2)
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
    from keras_yolo_mgpu.model.architectures import get_architecture

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


def create_model(
    input_shape,
    anchors,
    num_classes: int,
    freeze_body: int = 2,
    weights_path: str | None = None,
    *,
    sync_bn: bool = False,
    ignore_thresh: float | None = None,
    weights_partial: bool = False,
    max_true_boxes: int | None = None,
    masks=None,
    model: str | None = None,
    box_loss: str | None = None,
    ciou_weight: float | None = None,
    device_inputs: bool = False,
    iou_thresh: float | None = None,
):
    """Builds the network and the training model that outputs its loss.

    Args:
        input_shape: (height, width) of training images, multiples of 32, or
            (None, None) for a model that trains at any size (multi-scale).
        anchors: (9, 2) for YOLOv3 / YOLOv4, (6, 2) for the tiny ones.
        num_classes: number of classes.
        freeze_body: 0, 1 or 2, see `freeze_layers`.
        weights_path: optional weights to start from (any file
            `weights.loading.load_weights` takes). Output convs of another
            class count are left at their init (transfer to a new
            dataset); any other mismatch raises ValueError naming the
            layers, unless `weights_partial`.
        weights_partial: load whatever layers match and leave every other
            one at its init (each is logged as a warning).
        sync_bn: synchronized BatchNormalization across replicas.
        ignore_thresh: IoU above which a prediction is not penalised as
            background (default: the model's, 0.5 for YOLOv3, 0.7 for YOLOv4).
        max_true_boxes: true boxes per sample and scale the ignore mask
            compares predictions with (see `YoloLoss`); default: every
            cell a box can fill when each image has at most `MAX_BOXES`
            boxes (`MAX_BOXES` times the anchors per scale), exact for the
            training pipeline's targets.
        masks: anchor indices per scale for the loss (default keras-yolo3's,
            see `boxes.resolve_masks`).
        model: one of `architectures.MODEL_NAMES`; None picks YOLOv3 or tiny
            YOLOv3 by anchor count.
        box_loss: "yolov3" or "ciou" (default: the model's, CIoU for YOLOv4).
        ciou_weight: weight of the CIoU term (default: the model's,
            `Architecture.ciou_weight`); only with the CIoU box loss.
        device_inputs: the training model takes the host's batch as the input
            pipeline hands it over (`data.device_side.DeviceInputs`): a uint8
            image, padded boxes and HSV draws; the HSV jitter, the scaling
            to float and keras-yolo3's targets then run inside the compiled
            step. False: the float image and the dense targets (keras-yolo3's
            inputs).
        iou_thresh: with `device_inputs`, Darknet's `iou_thresh` for the
            targets (None: each box's best anchor only).

    Returns:
        `(body, train_model)`. `body` maps images (N, H, W, 3) to the raw
        outputs. `train_model` takes inputs named `image`, `y_true_0`,
        `y_true_1` (and `y_true_2`), or with `device_inputs` a dict of
        `image` (N, H, W, 3) uint8, `boxes` (N, MAX_BOXES, 5) and `hsv`
        (N, 12), and outputs the per-sample loss (N, 1); compile it with
        `loss=totalloss`. Both share their layers.
    """
    from keras_yolo_mgpu.model.architectures import get_architecture

    # (None, None): any size, for multi-scale training (one model, every size).
    dynamic = tuple(input_shape) == (None, None)
    height, width = (None, None) if dynamic else check_input_shape(input_shape)
    architecture = get_architecture(model, len(anchors))
    body = build_body(anchors, num_classes, sync_bn=sync_bn, model=architecture.name)
    if weights_path:
        from keras_yolo_mgpu.weights.loading import load_weights

        load_weights(body, weights_path, skip_mismatch=weights_partial, allow_new_classes=True)
    freeze_layers(body, freeze_body)

    num_layers = num_output_layers(len(anchors))
    anchors_per_scale = len(anchors) // num_layers
    if device_inputs:
        return body, _training_model_on_device_inputs(
            body,
            (height, width),
            anchors,
            num_classes,
            masks,
            iou_thresh,
            architecture,
            ignore_thresh,
            max_true_boxes,
            box_loss,
            ciou_weight,
        )
    y_true = [
        keras.Input(
            shape=(
                None if dynamic else height // stride,
                None if dynamic else width // stride,
                anchors_per_scale,
                num_classes + 5,
            ),
            name=f"y_true_{layer}",
        )
        for layer, stride in enumerate(output_strides(num_layers))
    ]
    loss = _loss_layer(anchors, num_classes, masks, architecture, ignore_thresh, max_true_boxes, box_loss, ciou_weight)(
        [*body.outputs, *y_true]
    )
    train_model = keras.Model([*body.inputs, *y_true], loss, name="yolo_train")
    return body, train_model


def _loss_layer(anchors, num_classes, masks, architecture, ignore_thresh, max_true_boxes, box_loss, ciou_weight):
    """The training model's `YoloLoss` layer, with the architecture's defaults."""
    anchors_per_scale = len(anchors) // num_output_layers(len(anchors))
    box_loss = box_loss or architecture.box_loss
    if box_loss == "ciou":
        ciou = {"iou_normalizer": architecture.ciou_weight if ciou_weight is None else ciou_weight}
    elif ciou_weight is not None:
        raise ValueError(f"ciou_weight applies to the CIoU box loss only; this model's box loss is {box_loss!r}")
    else:
        ciou = {}  # keeps the YOLOv3 loss layer's configuration exactly as before
    return YoloLoss(
        anchors,
        num_classes,
        ignore_thresh=architecture.ignore_thresh if ignore_thresh is None else ignore_thresh,
        max_true_boxes=MAX_BOXES * anchors_per_scale if max_true_boxes is None else max_true_boxes,
        masks=masks,
        # None keeps the YOLOv3 loss layer's configuration exactly as before.
        scale_x_y=architecture.decode_scale_x_y,
        box_loss=box_loss,
        name="yolo_loss",
        **ciou,
    )


def _training_model_on_device_inputs(
    body,
    input_shape,
    anchors,
    num_classes,
    masks,
    iou_thresh,
    architecture,
    ignore_thresh,
    max_true_boxes,
    box_loss,
    ciou_weight,
) -> keras.Model:
    """host batch {image uint8, boxes, hsv} -> DeviceInputs -> body -> loss (N, 1), one model, one compiled step."""
    from keras_yolo_mgpu.data.device_side import DeviceInputs
    from keras_yolo_mgpu.data.host import HSV_PARAMS

    height, width = input_shape
    inputs = {
        "image": keras.Input(shape=(height, width, 3), dtype="uint8", name="image"),
        # float32 whatever the model's dtype: the targets are bitwise those of keras-yolo3's numpy.
        "boxes": keras.Input(shape=(MAX_BOXES, 5), dtype="float32", name="boxes"),
        "hsv": keras.Input(shape=(HSV_PARAMS,), dtype="float32", name="hsv"),
    }
    image, y_true = DeviceInputs(anchors, num_classes, masks=masks, iou_thresh=iou_thresh, name="device_inputs")(inputs)
    outputs = body(image)
    loss = _loss_layer(anchors, num_classes, masks, architecture, ignore_thresh, max_true_boxes, box_loss, ciou_weight)(
        [*outputs, *y_true]
    )
    return keras.Model(inputs, loss, name="yolo_train")
