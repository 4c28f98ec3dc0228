"""The YOLOv3 loss, per sample.

keras-yolo3 summed its loss over the batch and divided by the batch size,
returning a scalar. A scalar loss is what broke Keras 2 `multi_gpu_model`
("Can't concatenate scalars") and, under `tf.distribute`, it skips Keras's
1/replicas scaling so gradients are summed over replicas (NOTES.md). Here the
loss is per sample, shape (N, 1): its batch mean equals the original scalar.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from keras_yolo_mgpu.model.architectures import BOX_LOSSES, YOLOV4_CIOU_WEIGHT
from keras_yolo_mgpu.model.boxes import batched_box_iou, box_ciou, num_output_layers, resolve_masks, yolo_head
from keras_yolo_mgpu.serialization import SERIALIZABLE_PACKAGE, constructor_config


def _true_boxes_per_sample(y_true_layer, object_mask):
    """Gathers each sample's true boxes of one scale into a padded tensor.

    Args:
        y_true_layer: (N, gh, gw, A, 5 + C) targets.
        object_mask: (N, gh, gw, A) bool, cells holding a box.

    Returns:
        (N, K, 4) xywh, K the most boxes any sample has at this scale; rows
        past a sample's own boxes are zero and have IoU 0 with anything.
    """
    positions = tf.where(object_mask)  # (T, 4): sample, j, i, k
    boxes = tf.gather_nd(y_true_layer[..., 0:4], positions)  # (T, 4)
    ragged = tf.RaggedTensor.from_value_rowids(
        boxes, positions[:, 0], nrows=tf.shape(y_true_layer, out_type=tf.int64)[0]
    )
    return ragged.to_tensor(shape=[None, None, 4])


def _top_true_boxes(y_true_layer, object_mask, max_true_boxes: int):
    """Static-shape variant of `_true_boxes_per_sample` that XLA can compile.

    Takes the `max_true_boxes` object cells of each sample with `top_k` on the
    object mask; cells picked beyond a sample's own boxes are zeroed. Equal to
    the ragged version whenever no sample has more than `max_true_boxes`
    boxes at this scale, which the data pipeline guarantees with
    `max_true_boxes >= max_boxes` (a box fills at most one cell per scale).

    Returns:
        (N, K, 4) xywh, K = min(max_true_boxes, cells per sample).
    """
    batch = tf.shape(y_true_layer)[0]
    cells = int(np.prod(y_true_layer.shape[1:4])) if None not in y_true_layer.shape[1:4] else None
    k = max_true_boxes if cells is None else min(max_true_boxes, cells)
    flat_mask = tf.reshape(object_mask, [batch, -1])  # (N, G) of 0/1
    flat_boxes = tf.reshape(y_true_layer[..., 0:4], [batch, -1, 4])  # (N, G, 4)
    picked, indices = tf.math.top_k(flat_mask, k=k)  # object cells first
    return tf.gather(flat_boxes, indices, batch_dims=1) * picked[..., None]


def _ignore_mask(pred_box, y_true_layer, object_mask, ignore_thresh, max_true_boxes=None):
    """1 where the best IoU of a prediction with any true box is below the threshold.

    Vectorised over the batch (the original ran a tf.while_loop per sample);
    the padding rows have IoU 0, and a sample without boxes gets max IoU
    -inf (empty reduce) in the original and 0 here: both below any threshold.
    """
    if max_true_boxes is None:
        true_boxes = _true_boxes_per_sample(y_true_layer, object_mask[..., 0] > 0)
    else:
        true_boxes = _top_true_boxes(y_true_layer, object_mask[..., 0], max_true_boxes)
    iou = batched_box_iou(pred_box, true_boxes)  # (N, gh, gw, A, K)
    # A sample with no boxes at this scale leaves K == 0: reduce_max gives
    # -inf there, as in the original, which is below any threshold.
    best_iou = tf.reduce_max(iou, axis=-1, keepdims=True)
    return tf.cast(best_iou < ignore_thresh, pred_box.dtype)


def yolo_loss_terms(args, anchors, num_classes: int, ignore_thresh: float = 0.5, **settings) -> dict:
    """The loss terms per sample, summed over scales.

    Args:
        args: `[*yolo_outputs, *y_true]`. Each output is (N, gh, gw, A*(5+C)),
            each target (N, gh, gw, A, 5+C), coarsest scale first.
        anchors, num_classes, ignore_thresh, **settings: see `YoloLoss`.

    Returns:
        A dict of (N,) float32 terms: `xy`, `wh` (box_loss "yolov3") or
        `ciou` (box_loss "ciou"), then `confidence` and `class`.
    """
    return YoloLoss(anchors, num_classes, ignore_thresh, **settings).loss_terms(list(args))


def yolo_loss(args, anchors, num_classes: int, ignore_thresh: float = 0.5, **settings):
    """YOLOv3 loss per sample (keras-yolo3's `yolo_loss`, not averaged).

    Args:
        args: `[*yolo_outputs, *y_true]`, see `yolo_loss_terms`.
        anchors, num_classes, ignore_thresh, **settings: see `YoloLoss`
            (`max_true_boxes` for XLA, `masks`, and YOLOv4's `scale_x_y`,
            `box_loss`, `iou_normalizer`).

    Returns:
        (N, 1) float32. `sum(loss) / N` equals the original's scalar.
    """
    return YoloLoss(anchors, num_classes, ignore_thresh, **settings).call(list(args))


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class YoloLoss(keras.layers.Layer):
    """Layer computing the loss per sample from `[*yolo_outputs, *y_true]`; output (N, 1).

    The layer always runs in float32 (mixed precision keeps the loss exact).

    Args:
        anchors: (num_anchors, 2), (w, h) in input pixels.
        num_classes: number of classes.
        ignore_thresh: predictions whose best IoU with a true box exceeds this
            are not penalised as background.
        max_true_boxes: None gathers every true box (ragged, exact for any
            input); an int uses static shapes XLA can compile, exact when no
            sample has more boxes than that at one scale.
        masks: anchor indices per scale (default keras-yolo3's, see
            `boxes.resolve_masks`); must be the targets' masks.
        scale_x_y: per scale, coarse first (YOLOv4's centre scaling, see
            `boxes.cell_offset`); None is 1.0 everywhere (YOLOv3).
        box_loss: "yolov3" (keras-yolo3's xy cross-entropy and wh squared
            error, scaled by 2 - w*h) or "ciou" (YOLOv4: `iou_normalizer *
            (1 - CIoU)` per true box, `boxes.box_ciou`).
        iou_normalizer: weight of the CIoU term (yolov4.cfg: 0.07).
    """

    def __init__(
        self,
        anchors,
        num_classes: int,
        ignore_thresh: float = 0.5,
        max_true_boxes: int | None = None,
        masks=None,
        scale_x_y=None,
        box_loss: str = "yolov3",
        iou_normalizer: float = YOLOV4_CIOU_WEIGHT,
        **kwargs,
    ):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.anchors = np.asarray(anchors, dtype=np.float32).reshape(-1, 2)
        self.num_classes = int(num_classes)
        self.ignore_thresh = float(ignore_thresh)
        self.max_true_boxes = None if max_true_boxes is None else int(max_true_boxes)
        # The exact ignore mask gathers a data-dependent number of boxes, which
        # XLA cannot compile: without a bound, tell Keras so that its default
        # `jit_compile="auto"` (XLA on a single GPU) leaves the step to TF.
        self.supports_jit = self.max_true_boxes is not None
        num_output_layers(len(self.anchors))  # validates the anchor count
        self.masks = resolve_masks(masks, len(self.anchors))
        self.scale_x_y = None if scale_x_y is None else [float(s) for s in scale_x_y]
        if self.scale_x_y is not None and len(self.scale_x_y) != len(self.masks):
            raise ValueError(f"scale_x_y needs one value per output scale ({len(self.masks)}). Received: {scale_x_y}")
        if box_loss not in BOX_LOSSES:
            raise ValueError(f"box_loss must be one of {BOX_LOSSES}. Received: box_loss={box_loss!r}")
        self.box_loss = box_loss
        self.iou_normalizer = float(iou_normalizer)

    def loss_terms(self, inputs) -> dict:
        """The terms per sample, summed over scales; see `yolo_loss_terms`."""
        num_layers = len(self.masks)
        # The loss is always computed in float32, also under mixed precision.
        yolo_outputs = [tf.cast(t, tf.float32) for t in inputs[:num_layers]]
        y_true = [tf.cast(t, tf.float32) for t in inputs[num_layers:]]
        if len(y_true) != num_layers:
            raise ValueError(
                f"yolo_loss expects {num_layers} outputs and {num_layers} targets; got {len(inputs)} tensors"
            )

        input_shape = tf.cast(tf.shape(yolo_outputs[0])[1:3] * 32, tf.float32)  # (h, w)
        box_terms = ("ciou",) if self.box_loss == "ciou" else ("xy", "wh")
        terms = {**dict.fromkeys(box_terms, 0.0), "confidence": 0.0, "class": 0.0}
        bce = tf.nn.sigmoid_cross_entropy_with_logits
        per_sample = lambda t: tf.reduce_sum(t, axis=[1, 2, 3, 4])  # noqa: E731  (N, gh, gw, A, k) -> (N,)
        for layer in range(num_layers):
            target = y_true[layer]
            object_mask = target[..., 4:5]
            true_class_probs = target[..., 5:]
            layer_anchors = self.anchors[self.masks[layer]]
            scale = 1.0 if self.scale_x_y is None else self.scale_x_y[layer]
            grid, raw_pred, pred_xy, pred_wh = yolo_head(
                yolo_outputs[layer], layer_anchors, self.num_classes, input_shape, calc_loss=True, scale_x_y=scale
            )
            pred_box = tf.concat([pred_xy, pred_wh], axis=-1)
            grid_wh = tf.cast(tf.shape(yolo_outputs[layer])[1:3][::-1], tf.float32)

            # Targets in the raw output's space: cell offsets and log size ratios.
            raw_true_xy = target[..., :2] * grid_wh - grid
            raw_true_wh = tf.math.log(target[..., 2:4] / layer_anchors * input_shape[::-1])
            # Empty cells have wh 0 -> log(0) = -inf; they are masked out anyway.
            raw_true_wh = tf.where(object_mask > 0, raw_true_wh, tf.zeros_like(raw_true_wh))
            # Small boxes weigh more: 2 - relative area.
            box_loss_scale = 2.0 - target[..., 2:3] * target[..., 3:4]

            ignore_mask = _ignore_mask(pred_box, target, object_mask, self.ignore_thresh, self.max_true_boxes)
            if self.box_loss == "ciou":
                # In pixels (CIoU's aspect term needs them); empty cells get a
                # dummy unit box so that no 0/0 reaches the gradient.
                input_wh = input_shape[::-1]
                true_box = tf.where(object_mask > 0, target[..., 0:4], tf.constant([0.5, 0.5, 1.0, 1.0]))
                ciou = box_ciou(
                    pred_box * tf.concat([input_wh, input_wh], 0), true_box * tf.concat([input_wh, input_wh], 0)
                )
                terms["ciou"] += per_sample(object_mask * self.iou_normalizer * (1.0 - ciou[..., None]))
            else:
                if scale != 1.0:
                    # The cross-entropy's label is the sigmoid that puts the centre on the target offset.
                    raw_true_xy = (raw_true_xy + (scale - 1.0) / 2.0) / scale
                xy_loss = object_mask * box_loss_scale * bce(labels=raw_true_xy, logits=raw_pred[..., 0:2])
                wh_loss = object_mask * box_loss_scale * 0.5 * tf.square(raw_true_wh - raw_pred[..., 2:4])
                terms["xy"] += per_sample(xy_loss)
                terms["wh"] += per_sample(wh_loss)
            conf_bce = bce(labels=object_mask, logits=raw_pred[..., 4:5])
            confidence_loss = object_mask * conf_bce + (1.0 - object_mask) * conf_bce * ignore_mask
            class_loss = object_mask * bce(labels=true_class_probs, logits=raw_pred[..., 5:])

            terms["confidence"] += per_sample(confidence_loss)
            terms["class"] += per_sample(class_loss)
        return terms

    def call(self, inputs):
        total = tf.add_n(list(self.loss_terms(list(inputs)).values()))
        return tf.expand_dims(total, -1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0][0], 1)

    def get_config(self):
        return {**super().get_config(), **constructor_config(self)}


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
def totalloss(y_true, y_pred):
    """Compile loss for the training model: its per-sample output, shape (N,).

    `y_true` is ignored (the targets are model inputs). Returning per-sample
    values, not a scalar, lets Keras divide by the global batch size under
    `tf.distribute`, so N replicas train exactly like one device.
    """
    del y_true
    return y_pred[:, 0]
