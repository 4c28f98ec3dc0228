"""Box geometry shared by the loss, targets and inference, and the boxes kept per image.

Conventions: `input_shape` is (height, width) of the network input in pixels;
boxes are `xywh` (centre, size) relative to the input unless a docstring says
otherwise; anchors are (width, height) in input pixels.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_yolo_mgpu.backend import nms as backend_nms

# Which anchors each output scale predicts, coarsest grid first. The tiny
# masks overlap on anchor 3 and skip anchor 0: that is keras-yolo3's choice,
# kept so that weights trained with it decode identically here.
_ANCHOR_MASKS = {
    3: ((6, 7, 8), (3, 4, 5), (0, 1, 2)),
    2: ((3, 4, 5), (1, 2, 3)),
}
# Downsampling factor of each output scale, same order as the masks.
_STRIDES = {3: (32, 16, 8), 2: (32, 16)}
# Boxes kept per training image (keras-yolo3's max_boxes): the pipeline pads
# to this many, and the loss's ignore mask gathers at most this many per anchor.
MAX_BOXES = 20


def num_output_layers(num_anchors: int) -> int:
    """3 output scales for 9 anchors (YOLOv3), 2 for 6 (tiny YOLOv3)."""
    if num_anchors not in (6, 9):
        raise ValueError(f"expected 9 anchors (YOLOv3) or 6 (tiny YOLOv3); got {num_anchors}")
    return num_anchors // 3


def anchor_masks(num_layers: int) -> list[list[int]]:
    """The default (keras-yolo3's) anchor indices per output scale, coarsest first."""
    return [list(mask) for mask in _ANCHOR_MASKS[num_layers]]


def resolve_masks(masks, num_anchors: int) -> list[list[int]]:
    """Anchor masks for a model with `num_anchors` anchors, validated.

    Args:
        masks: anchor indices per output scale, coarsest first (e.g. a
            Darknet cfg's ``[yolo] mask`` lines, or weights metadata), or
            None for keras-yolo3's masks (:func:`anchor_masks`).
        num_anchors: 9 (YOLOv3: 3 scales) or 6 (tiny: 2 scales).

    Returns:
        A list of ``num_layers`` lists of ``num_anchors // num_layers`` ints.

    Raises:
        ValueError: wrong number of scales, of indices per scale, or an
            index outside the anchors.
    """
    num_layers = num_output_layers(num_anchors)
    if masks is None:
        return anchor_masks(num_layers)
    try:
        masks = [[int(i) for i in mask] for mask in masks]
    except (TypeError, ValueError):
        raise ValueError(f"masks must be lists of anchor indices. Received: masks={masks!r}") from None
    per_scale = num_anchors // num_layers
    if len(masks) != num_layers or any(len(mask) != per_scale for mask in masks):
        raise ValueError(
            f"{num_anchors} anchors need {num_layers} masks of {per_scale} anchor indices each, "
            f"coarsest scale first (e.g. {anchor_masks(num_layers)}). Received: masks={masks}"
        )
    if any(not 0 <= i < num_anchors for mask in masks for i in mask):
        raise ValueError(f"mask indices must be in [0, {num_anchors}). Received: masks={masks}")
    return masks


def output_strides(num_layers: int) -> tuple[int, ...]:
    """Input pixels per grid cell for each output scale, coarsest first."""
    return _STRIDES[num_layers]


def yolo_head(feats, anchors, num_classes: int, input_shape, calc_loss: bool = False, scale_x_y: float = 1.0):
    """Decodes one raw output scale into boxes, objectness and class scores.

    Args:
        feats: raw head output, (N, grid_h, grid_w, num_anchors * (5 + num_classes)).
        anchors: (num_anchors, 2) anchors of this scale, (w, h) input pixels.
        num_classes: number of classes.
        input_shape: (height, width) of the network input, a tensor or pair.
        calc_loss: also return what the loss needs.
        scale_x_y: YOLOv4's centre scaling (Darknet's `scale_x_y`, see
            `cell_offset`); 1.0 is YOLOv3's decoding.

    Returns:
        With `calc_loss=False`: `box_xy` (N, gh, gw, A, 2) relative centres,
        `box_wh` (N, gh, gw, A, 2) relative sizes, `box_confidence`
        (N, gh, gw, A, 1) and `box_class_probs` (N, gh, gw, A, C).
        With `calc_loss=True`: `grid` (gh, gw, 1, 2), `feats` reshaped to
        (N, gh, gw, A, 5 + C), `box_xy`, `box_wh`.
    """
    feats = ops.convert_to_tensor(feats)
    dtype = feats.dtype
    anchors = np.asarray(anchors, dtype=np.float32)
    num_anchors = len(anchors)
    anchors_tensor = ops.reshape(ops.convert_to_tensor(anchors, dtype=dtype), (1, 1, 1, num_anchors, 2))

    grid_h, grid_w = ops.shape(feats)[1], ops.shape(feats)[2]
    grid = cell_grid(grid_h, grid_w, dtype)  # (gh, gw, 1, 2) as (x, y)

    feats = ops.reshape(feats, (-1, grid_h, grid_w, num_anchors, num_classes + 5))
    grid_wh = ops.cast(ops.stack([grid_w, grid_h]), dtype)
    input_wh = ops.cast(ops.flip(ops.convert_to_tensor(input_shape), 0), dtype)
    box_xy = (cell_offset(feats[..., :2], scale_x_y) + grid) / grid_wh
    box_wh = ops.exp(feats[..., 2:4]) * anchors_tensor / input_wh
    if calc_loss:
        return grid, feats, box_xy, box_wh
    box_confidence = ops.sigmoid(feats[..., 4:5])
    box_class_probs = ops.sigmoid(feats[..., 5:])
    return box_xy, box_wh, box_confidence, box_class_probs


def cell_grid(grid_h, grid_w, dtype):
    """(gh, gw, 1, 2) cell indices as (x, y): `grid[j, i, 0] == (i, j)`.

    `grid_h`, `grid_w` are Python ints, or scalar tensors where the size is
    only known when the model runs (multi-scale training on TensorFlow).
    """
    grid_y = ops.tile(ops.reshape(ops.arange(grid_h), (-1, 1, 1, 1)), (1, grid_w, 1, 1))
    grid_x = ops.tile(ops.reshape(ops.arange(grid_w), (1, -1, 1, 1)), (grid_h, 1, 1, 1))
    return ops.cast(ops.concatenate([grid_x, grid_y], axis=-1), dtype)


def cell_offset(raw_xy, scale_x_y: float = 1.0):
    """Box centre within its cell: Darknet's `sigmoid(t) * s - (s - 1) / 2`.

    YOLOv4's `s > 1` lets centres reach the cell borders, which a plain
    sigmoid approaches only for infinite `t`. With `s = 1` this is exactly
    YOLOv3's `sigmoid(t)` (no arithmetic is added).
    """
    offset = ops.sigmoid(raw_xy)
    if scale_x_y == 1.0:
        return offset
    return offset * scale_x_y - (scale_x_y - 1.0) / 2.0


def _corners(xywh):
    half = xywh[..., 2:4] / 2.0
    return xywh[..., 0:2] - half, xywh[..., 0:2] + half


def _iou_from_corners(b1_mins, b1_maxes, b1_wh, b2_mins, b2_maxes, b2_wh):
    intersect_wh = ops.maximum(ops.minimum(b1_maxes, b2_maxes) - ops.maximum(b1_mins, b2_mins), 0.0)
    intersect_area = intersect_wh[..., 0] * intersect_wh[..., 1]
    b1_area = b1_wh[..., 0] * b1_wh[..., 1]
    b2_area = b2_wh[..., 0] * b2_wh[..., 1]
    return intersect_area / (b1_area + b2_area - intersect_area)


def box_iou(b1, b2):
    """IoU of every box in `b1` with every box in `b2`.

    Args:
        b1: (..., 4) xywh.
        b2: (j, 4) xywh.

    Returns:
        (..., j) IoU.
    """
    b1 = ops.expand_dims(b1, -2)  # (..., 1, 4)
    b1_mins, b1_maxes = _corners(b1)
    b2 = ops.expand_dims(b2, 0)  # (1, j, 4)
    b2_mins, b2_maxes = _corners(b2)
    return _iou_from_corners(b1_mins, b1_maxes, b1[..., 2:4], b2_mins, b2_maxes, b2[..., 2:4])


def batched_box_iou(pred_boxes, true_boxes):
    """IoU of each sample's predicted boxes with that sample's true boxes.

    Args:
        pred_boxes: (N, gh, gw, A, 4) xywh.
        true_boxes: (N, K, 4) xywh; all-zero rows are padding (IoU 0).

    Returns:
        (N, gh, gw, A, K) IoU.
    """
    b1 = ops.expand_dims(pred_boxes, -2)  # (N, gh, gw, A, 1, 4)
    b2 = true_boxes[:, None, None, None, :, :]  # (N, 1, 1, 1, K, 4)
    b1_mins, b1_maxes = _corners(b1)
    b2_mins, b2_maxes = _corners(b2)
    return _iou_from_corners(b1_mins, b1_maxes, b1[..., 2:4], b2_mins, b2_maxes, b2[..., 2:4])


def box_ciou(b1, b2):
    """Complete IoU (Zheng et al., AAAI 2020) of matching boxes, as YOLOv4's `iou_loss=ciou`.

    `CIoU = IoU - d^2 / c^2 - alpha * v`: `d` is the distance of the centres,
    `c` the diagonal of the smallest box enclosing both, `v = 4 / pi^2 *
    (atan(w2 / h2) - atan(w1 / h1))^2` the aspect-ratio mismatch and
    `alpha = v / (1 - IoU + v)`, held constant in backpropagation as in the
    paper's code.

    Args:
        b1, b2: (..., 4) xywh in pixels (the aspect ratio needs pixels), with
            positive widths and heights.

    Returns:
        (...) CIoU in [-1, 1].
    """
    b1_mins, b1_maxes = _corners(b1)
    b2_mins, b2_maxes = _corners(b2)
    iou = _iou_from_corners(b1_mins, b1_maxes, b1[..., 2:4], b2_mins, b2_maxes, b2[..., 2:4])
    centre_distance = ops.sum(ops.square(b1[..., 0:2] - b2[..., 0:2]), axis=-1)
    enclosing = ops.maximum(b1_maxes, b2_maxes) - ops.minimum(b1_mins, b2_mins)
    diagonal = ops.sum(ops.square(enclosing), axis=-1)
    v = (4.0 / np.pi**2) * ops.square(ops.arctan(b2[..., 2] / b2[..., 3]) - ops.arctan(b1[..., 2] / b1[..., 3]))
    alpha = ops.stop_gradient(v / (1.0 - iou + v + 1e-9))
    return iou - centre_distance / (diagonal + 1e-9) - alpha * v


def yolo_correct_boxes(box_xy, box_wh, input_shape, image_shape):
    """Maps boxes from the letterboxed input back to the original image.

    Args:
        box_xy, box_wh: (..., 2) relative to the network input, (x, y) order.
        input_shape: (height, width) of the network input.
        image_shape: (height, width) of the original image.

    Returns:
        (..., 4) boxes as (y_min, x_min, y_max, x_max) in image pixels, the
        order keras-yolo3 returns.
    """
    dtype = box_xy.dtype
    box_yx = ops.flip(box_xy, -1)
    box_hw = ops.flip(box_wh, -1)
    input_shape = ops.cast(input_shape, dtype)
    image_shape = ops.cast(image_shape, dtype)
    new_shape = ops.round(image_shape * ops.min(input_shape / image_shape))
    offset = (input_shape - new_shape) / 2.0 / input_shape
    scale = input_shape / new_shape
    box_yx = (box_yx - offset) * scale
    box_hw *= scale
    box_mins = box_yx - box_hw / 2.0
    box_maxes = box_yx + box_hw / 2.0
    boxes = ops.concatenate([box_mins[..., 0:1], box_mins[..., 1:2], box_maxes[..., 0:1], box_maxes[..., 1:2]], axis=-1)
    return boxes * ops.concatenate([image_shape, image_shape], axis=-1)


def yolo_boxes_and_scores(feats, anchors, num_classes: int, input_shape, image_shape, scale_x_y: float = 1.0):
    """Boxes (K, 4) in image pixels and per-class scores (K, C) of one scale, one image."""
    box_xy, box_wh, box_confidence, box_class_probs = yolo_head(
        feats, anchors, num_classes, input_shape, scale_x_y=scale_x_y
    )
    boxes = ops.reshape(yolo_correct_boxes(box_xy, box_wh, input_shape, image_shape), (-1, 4))
    box_scores = ops.reshape(box_confidence * box_class_probs, (-1, num_classes))
    return boxes, box_scores


def yolo_eval(
    yolo_outputs,
    anchors,
    num_classes: int,
    image_shape,
    max_boxes: int = 20,
    score_threshold: float = 0.6,
    iou_threshold: float = 0.5,
    masks=None,
    scale_x_y=None,
):
    """Per-class NMS over all scales of ONE image (keras-yolo3's `yolo_eval`).

    Args:
        yolo_outputs: list of raw outputs, each (1, gh, gw, A * (5 + C)).
        anchors: (num_anchors, 2).
        image_shape: (height, width) of the original image.
        masks: anchor indices per scale (default keras-yolo3's, see `resolve_masks`).
        scale_x_y: per scale, coarse first (YOLOv4); None means 1.0 (YOLOv3).

    Returns:
        `boxes` (K, 4) as (y_min, x_min, y_max, x_max) image pixels,
        `scores` (K,), `classes` (K,) int32.

    keras-yolo3's ragged single-image NMS, kept as the reference the detector
    is tested against: TensorFlow's kernels (`backend/tensorflow/nms.py`,
    `ragged_nms`); JAX refuses it. The detector itself (`inference.layers`)
    runs on every backend.
    """
    num_layers = num_output_layers(len(anchors))
    masks = resolve_masks(masks, len(anchors))
    anchors = np.asarray(anchors, dtype=np.float32)
    input_shape = ops.convert_to_tensor(ops.shape(yolo_outputs[0])[1:3], "int32") * 32
    boxes, box_scores = [], []
    for layer in range(num_layers):
        layer_boxes, layer_scores = yolo_boxes_and_scores(
            yolo_outputs[layer],
            anchors[masks[layer]],
            num_classes,
            input_shape,
            image_shape,
            1.0 if scale_x_y is None else float(scale_x_y[layer]),
        )
        boxes.append(layer_boxes)
        box_scores.append(layer_scores)
    return backend_nms.ragged_nms(
        ops.concatenate(boxes, axis=0),
        ops.concatenate(box_scores, axis=0),
        max_boxes=max_boxes,
        score_threshold=score_threshold,
        iou_threshold=iou_threshold,
    )
