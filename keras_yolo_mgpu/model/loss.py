"""The YOLOv3 loss, per sample.

keras-yolo3 summed its loss over the batch and divided by the batch size,
returning a scalar. A scalar loss is what broke Keras 2 `multi_gpu_model`
("Can't concatenate scalars") and, under `tf.distribute`, it skips Keras's
1/replicas scaling so gradients are summed over replicas (docs/multi-gpu.md). Here the
loss is per sample, shape (N, 1): its batch mean equals the original scalar.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_yolo_mgpu.model.architectures import BOX_LOSSES, YOLOV4_CIOU_WEIGHT
from keras_yolo_mgpu.model.boxes import batched_box_iou, box_ciou, num_output_layers, resolve_masks, yolo_head
from keras_yolo_mgpu.serialization import SERIALIZABLE_PACKAGE, constructor_config


def _top_true_boxes(y_true_layer, object_mask, max_true_boxes: int | None):
    """Each sample's true boxes of one scale, in a static-shape tensor every backend compiles.

    Takes the `max_true_boxes` object cells of each sample with `top_k` on the
    object mask; cells picked beyond a sample's own boxes are zeroed, and an
    all-zero row has IoU 0 with anything. None takes every cell of the scale:
    exact for any targets. A bound is exact whenever no sample has more
    boxes than that at this scale, which the data pipeline guarantees with
    `max_true_boxes >= max_boxes` (a box fills at most one cell per anchor).

    Args:
        y_true_layer: (N, gh, gw, A, 5 + C) targets.
        object_mask: (N, gh, gw, A) of 0 / 1.
        max_true_boxes: the bound, or None.

    Returns:
        (N, K, 4) xywh, K = min(max_true_boxes, gh * gw * A).
    """
    shape = ops.shape(y_true_layer)
    static_cells = [y_true_layer.shape[i] for i in (1, 2, 3)]
    if None not in static_cells:
        cells = int(np.prod(static_cells))
        k = cells if max_true_boxes is None else min(max_true_boxes, cells)
    else:
        # TensorFlow with a grid known only when the model runs (multi-scale
        # training): top_k takes a tensor k there. A small image's coarse grid
        # may have fewer cells than the bound.
        cells = shape[1] * shape[2] * shape[3]
        k = cells if max_true_boxes is None else ops.minimum(max_true_boxes, cells)
    flat_mask = ops.reshape(object_mask, (shape[0], -1))  # (N, G) of 0/1
    flat_boxes = ops.reshape(y_true_layer[..., 0:4], (shape[0], -1, 4))  # (N, G, 4)
    picked, indices = ops.top_k(flat_mask, k=k)  # object cells first
    return ops.take_along_axis(flat_boxes, indices[..., None], axis=1) * picked[..., None]


def _ignore_mask(pred_box, y_true_layer, object_mask, ignore_thresh, max_true_boxes=None):
    """(N, gh, gw, A, 1): 1 where the best IoU of a prediction with any true box is below the threshold.

    Vectorised over the batch (the original ran a tf.while_loop per sample,
    over a ragged list of boxes); the padding rows have IoU 0, and a sample
    without boxes gets max IoU -inf (empty reduce) in the original and 0
    here: both below any threshold.
    """
    true_boxes = _top_true_boxes(y_true_layer, object_mask[..., 0], max_true_boxes)
    iou = batched_box_iou(pred_box, true_boxes)  # (N, gh, gw, A, K)
    best_iou = ops.max(iou, axis=-1, keepdims=True)
    return ops.cast(best_iou < ignore_thresh, pred_box.dtype)


def sigmoid_cross_entropy(labels, logits):
    """Binary cross-entropy of sigmoid(`logits`) against `labels`, elementwise, numerically stable.

    TensorFlow's `sigmoid_cross_entropy_with_logits` formula,
    `max(x, 0) - x * z + log(1 + exp(-|x|))`, written once in `keras.ops` so
    that every backend computes the same arithmetic (keras.ops'
    `binary_crossentropy` uses another, equal in exact arithmetic, on JAX).
    """
    return ops.maximum(logits, 0.0) - logits * labels + ops.log1p(ops.exp(-ops.abs(logits)))


def loss_dtype() -> str:
    """The dtype the loss computes in: float32, or float64 when the model is float64.

    Mixed precision (float16, bfloat16 compute) keeps the loss in float32, as
    Keras does; a float64 model (the equivalence proofs) keeps float64, so
    no float32 rounding can stand in for a difference between runs.
    """
    return "float64" if keras.config.floatx() == "float64" else "float32"


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

    The layer runs in float32 under mixed precision (and in float64 for a
    float64 model): see `loss_dtype`.

    Args:
        anchors: (num_anchors, 2), (w, h) in input pixels.
        num_classes: number of classes.
        ignore_thresh: predictions whose best IoU with a true box exceeds this
            are not penalised as background.
        max_true_boxes: how many true boxes per sample and scale the ignore
            mask compares each prediction with: an int, exact when no sample
            has more boxes than that at one scale (training passes the
            pipeline's bound); None compares with every cell of the scale,
            exact for any input but (N, G, G) in memory for G cells.
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
        kwargs.setdefault("dtype", loss_dtype())
        super().__init__(**kwargs)
        self.anchors = np.asarray(anchors, dtype=np.float32).reshape(-1, 2)
        self.num_classes = int(num_classes)
        self.ignore_thresh = float(ignore_thresh)
        self.max_true_boxes = None if max_true_boxes is None else int(max_true_boxes)
        # Without a bound, the grid's cell count sets the shapes: unknown before
        # the model runs at multi-scale sizes on TensorFlow, which XLA cannot
        # compile. Keras's default `jit_compile="auto"` then leaves the step to TF.
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
        # float32 also under mixed precision (float64 for a float64 model, see `loss_dtype`).
        dtype = self.compute_dtype
        yolo_outputs = [ops.cast(t, dtype) for t in inputs[:num_layers]]
        y_true = [ops.cast(t, dtype) for t in inputs[num_layers:]]
        if len(y_true) != num_layers:
            raise ValueError(
                f"yolo_loss expects {num_layers} outputs and {num_layers} targets; got {len(inputs)} tensors"
            )

        output_shape = ops.shape(yolo_outputs[0])
        input_shape = ops.cast(ops.stack([output_shape[1] * 32, output_shape[2] * 32]), dtype)  # (h, w)
        input_wh = ops.flip(input_shape, 0)
        box_terms = ("ciou",) if self.box_loss == "ciou" else ("xy", "wh")
        terms = {**dict.fromkeys(box_terms, 0.0), "confidence": 0.0, "class": 0.0}
        per_sample = lambda t: ops.sum(t, axis=[1, 2, 3, 4])  # noqa: E731  (N, gh, gw, A, k) -> (N,)
        for layer in range(num_layers):
            target = y_true[layer]
            object_mask = target[..., 4:5]
            true_class_probs = target[..., 5:]
            layer_anchors = self.anchors[self.masks[layer]].astype(dtype)
            scale = 1.0 if self.scale_x_y is None else self.scale_x_y[layer]
            grid, raw_pred, pred_xy, pred_wh = yolo_head(
                yolo_outputs[layer], layer_anchors, self.num_classes, input_shape, calc_loss=True, scale_x_y=scale
            )
            pred_box = ops.concatenate([pred_xy, pred_wh], axis=-1)
            layer_shape = ops.shape(yolo_outputs[layer])
            grid_wh = ops.cast(ops.stack([layer_shape[2], layer_shape[1]]), dtype)

            # Targets in the raw output's space: cell offsets and log size ratios.
            raw_true_xy = target[..., :2] * grid_wh - grid
            # Empty cells have wh 0 -> log(0) = -inf; they are masked out (before
            # the log, so that no inf reaches the gradient).
            true_wh = ops.where(object_mask > 0, target[..., 2:4], ops.ones_like(target[..., 2:4]))
            raw_true_wh = ops.where(object_mask > 0, ops.log(true_wh / layer_anchors * input_wh), 0.0)
            # Small boxes weigh more: 2 - relative area.
            box_loss_scale = 2.0 - target[..., 2:3] * target[..., 3:4]

            ignore_mask = _ignore_mask(pred_box, target, object_mask, self.ignore_thresh, self.max_true_boxes)
            if self.box_loss == "ciou":
                # In pixels (CIoU's aspect term needs them); empty cells get a
                # dummy unit box so that no 0/0 reaches the gradient.
                pixels = ops.concatenate([input_wh, input_wh], 0)
                unit_box = ops.convert_to_tensor(np.array([0.5, 0.5, 1.0, 1.0], dtype))
                true_box = ops.where(object_mask > 0, target[..., 0:4], unit_box)
                ciou = box_ciou(pred_box * pixels, true_box * pixels)
                terms["ciou"] += per_sample(object_mask * self.iou_normalizer * (1.0 - ciou[..., None]))
            else:
                if scale != 1.0:
                    # The cross-entropy's label is the sigmoid that puts the centre on the target offset.
                    raw_true_xy = (raw_true_xy + (scale - 1.0) / 2.0) / scale
                xy_loss = object_mask * box_loss_scale * sigmoid_cross_entropy(raw_true_xy, raw_pred[..., 0:2])
                wh_loss = object_mask * box_loss_scale * 0.5 * ops.square(raw_true_wh - raw_pred[..., 2:4])
                terms["xy"] += per_sample(xy_loss)
                terms["wh"] += per_sample(wh_loss)
            conf_bce = sigmoid_cross_entropy(object_mask, raw_pred[..., 4:5])
            confidence_loss = object_mask * conf_bce + (1.0 - object_mask) * conf_bce * ignore_mask
            class_loss = object_mask * sigmoid_cross_entropy(true_class_probs, raw_pred[..., 5:])

            terms["confidence"] += per_sample(confidence_loss)
            terms["class"] += per_sample(class_loss)
        return terms

    def call(self, inputs):
        total = sum(self.loss_terms(list(inputs)).values())
        return ops.expand_dims(total, -1)

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
