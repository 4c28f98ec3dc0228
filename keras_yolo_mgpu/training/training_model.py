"""The training model: a network with keras-yolo3's loss on top (keras-yolo3 train.py's `create_model`).

The model takes keras-yolo3's inputs (the image and the dense targets) or the
input pipeline's host batch, finished in the compiled step (`data.device_side`).
"""

from __future__ import annotations

import keras

from keras_yolo_mgpu.data.device_side import DeviceInputs
from keras_yolo_mgpu.data.host import HSV_PARAMS
from keras_yolo_mgpu.model.architectures import get_architecture
from keras_yolo_mgpu.model.boxes import MAX_BOXES, num_output_layers, output_strides
from keras_yolo_mgpu.model.loss import YoloLoss
from keras_yolo_mgpu.model.yolo3 import build_body, check_input_shape, freeze_layers
from keras_yolo_mgpu.weights.loading import load_weights


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
        input_shape: (height, width) of training images, multiples of 32, or (None, None): any size (multi-scale).
        anchors: (9, 2) for YOLOv3 / YOLOv4, (6, 2) for the tiny ones.
        num_classes: number of classes.
        freeze_body: 0, 1 or 2, see `model.yolo3.freeze_layers`.
        weights_path: optional weights to start from (any file `weights.loading.load_weights` takes). Output
            convs of another class count keep their init (transfer to a new dataset); any other mismatch raises
            ValueError naming the layers, unless `weights_partial`: then those layers keep their init (logged).
        sync_bn: synchronized BatchNormalization across replicas.
        ignore_thresh: IoU above which a prediction is not background (default: the model's: 0.5 YOLOv3, 0.7 YOLOv4).
        max_true_boxes: true boxes per sample and scale the ignore mask compares predictions with (`YoloLoss`);
            default: `MAX_BOXES` times the anchors per scale, exact for the training pipeline's targets.
        masks: anchor indices per scale for the loss (default keras-yolo3's, see `model.boxes.resolve_masks`).
        model: one of `model.architectures.MODEL_NAMES`; None picks YOLOv3 or tiny YOLOv3 by anchor count.
        box_loss: "yolov3" or "ciou" (default: the model's, CIoU for YOLOv4).
        ciou_weight: weight of the CIoU term (default: the model's, `Architecture.ciou_weight`); CIoU only.
        device_inputs: the model takes the host's batch (a uint8 image, padded boxes and HSV draws) and runs
            the HSV jitter, the scaling to float and keras-yolo3's targets in the compiled step
            (`data.device_side.DeviceInputs`). False: the float image and dense targets (keras-yolo3's inputs).
        iou_thresh: with `device_inputs`, Darknet's `iou_thresh` for the targets (None: each box's best anchor).

    Returns:
        `(body, train_model)`. `body` maps images (N, H, W, 3) to the raw outputs. `train_model` takes inputs
        named `image`, `y_true_0`, `y_true_1` (and `y_true_2`), or with `device_inputs` a dict of `image`
        (N, H, W, 3) uint8, `boxes` (N, MAX_BOXES, 5) and `hsv` (N, 12), and outputs the per-sample loss
        (N, 1); compile it with `loss=totalloss`. Both share their layers.
    """
    dynamic = tuple(input_shape) == (None, None)
    height, width = (None, None) if dynamic else check_input_shape(input_shape)
    architecture = get_architecture(model, len(anchors))
    body = build_body(anchors, num_classes, sync_bn=sync_bn, model=architecture.name)
    if weights_path:
        load_weights(body, weights_path, skip_mismatch=weights_partial, allow_new_classes=True)
    freeze_layers(body, freeze_body)
    loss_layer = _loss_layer(
        anchors, num_classes, masks, architecture, ignore_thresh, max_true_boxes, box_loss, ciou_weight
    )
    if device_inputs:
        return body, _on_device_inputs(body, loss_layer, (height, width), anchors, num_classes, masks, iou_thresh)
    return body, _on_dense_targets(body, loss_layer, (height, width), anchors, num_classes)


def _on_dense_targets(body, loss_layer, input_shape, anchors, num_classes) -> keras.Model:
    """keras-yolo3's training model: [image, y_true_0, y_true_1 (, y_true_2)] -> body -> loss (N, 1).

    `y_true_<layer>`: (N, height / stride, width / stride, anchors per scale, num_classes + 5), each side None
    when `input_shape` is (None, None).
    """
    height, width = input_shape
    num_layers = num_output_layers(len(anchors))
    anchors_per_scale = len(anchors) // num_layers
    y_true = [
        keras.Input(
            shape=(
                None if height is None else height // stride,
                None if width is None else width // stride,
                anchors_per_scale,
                num_classes + 5,
            ),
            name=f"y_true_{layer}",
        )
        for layer, stride in enumerate(output_strides(num_layers))
    ]
    return keras.Model([*body.inputs, *y_true], loss_layer([*body.outputs, *y_true]), name="yolo_train")


def _loss_layer(anchors, num_classes, masks, architecture, ignore_thresh, max_true_boxes, box_loss, ciou_weight):
    """The training model's `YoloLoss` layer, with the architecture's defaults."""
    anchors_per_scale = len(anchors) // num_output_layers(len(anchors))
    box_loss = box_loss or architecture.box_loss
    if box_loss == "ciou":
        ciou = {"iou_normalizer": architecture.ciou_weight if ciou_weight is None else ciou_weight}
    elif ciou_weight is not None:
        raise ValueError(f"ciou_weight applies to the CIoU box loss only; this model's box loss is {box_loss!r}")
    else:
        ciou = {}  # the YOLOv3 loss layer's configuration has no CIoU keys
    return YoloLoss(
        anchors,
        num_classes,
        ignore_thresh=architecture.ignore_thresh if ignore_thresh is None else ignore_thresh,
        max_true_boxes=MAX_BOXES * anchors_per_scale if max_true_boxes is None else max_true_boxes,
        masks=masks,
        scale_x_y=architecture.decode_scale_x_y,  # None for YOLOv3 (1.0): its layer configuration has none
        box_loss=box_loss,
        name="yolo_loss",
        **ciou,
    )


def _on_device_inputs(body, loss_layer, input_shape, anchors, num_classes, masks, iou_thresh) -> keras.Model:
    """host batch {image uint8, boxes, hsv} -> DeviceInputs -> body -> loss (N, 1), one model, one compiled step."""
    height, width = input_shape
    inputs = {
        "image": keras.Input(shape=(height, width, 3), dtype="uint8", name="image"),
        # float32 whatever the model's dtype: the targets are bitwise those of keras-yolo3's numpy.
        "boxes": keras.Input(shape=(MAX_BOXES, 5), dtype="float32", name="boxes"),
        "hsv": keras.Input(shape=(HSV_PARAMS,), dtype="float32", name="hsv"),
    }
    image, y_true = DeviceInputs(anchors, num_classes, masks=masks, iou_thresh=iou_thresh, name="device_inputs")(inputs)
    return keras.Model(inputs, loss_layer([*body(image), *y_true]), name="yolo_train")
