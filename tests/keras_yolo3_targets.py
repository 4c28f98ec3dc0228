"""keras-yolo3's numpy `preprocess_true_boxes`: the oracle the one targets implementation is checked against.

The package builds keras-yolo3's targets once, in `keras.ops`
(`data.device_side.build_targets`, behind `DeviceInputs` and the public
`keras_yolo_mgpu.preprocess_true_boxes`). This is keras-yolo3's own numpy
loop, with Darknet's `masks` and `iou_thresh` added, kept as it was so the
tests can compare the two bit for bit.

`dense_inputs` finishes a host batch (what `make_dataset` and
`make_py_dataset` yield) into keras-yolo3's dense model inputs through that
one implementation, for the tests that read targets from a stream.

Test helper only: nothing in `keras_yolo_mgpu` imports it.
"""

from __future__ import annotations

import numpy as np

from keras_yolo_mgpu.model.boxes import num_output_layers, output_strides, resolve_masks


def preprocess_true_boxes(true_boxes, input_shape, anchors, num_classes: int, masks=None, iou_thresh=None):
    """Assigns each box to its best anchor's grid cell (and, with `iou_thresh`, to other anchors).

    Args:
        true_boxes: (N, T, 5) x_min, y_min, x_max, y_max, class_id in input
            pixels; rows with zero width are padding.
        input_shape: (height, width), multiples of 32.
        anchors: (num_anchors, 2), (w, h) in input pixels.
        num_classes: number of classes.
        masks: anchor indices per scale (default keras-yolo3's, see
            `boxes.resolve_masks`).
        iou_thresh: Darknet's `iou_thresh` (yolov4.cfg: 0.213): the box
            also goes to every other anchor of the masks whose IoU with it
            (both centred) is above this value, in the same cell of that
            anchor's scale. None (or >= 1) is keras-yolo3's best anchor only.

    Returns:
        A list with one float32 array per output scale, coarsest first, of
        shape (N, height/stride, width/stride, 3, 5 + num_classes) holding
        xywh relative to the input, objectness 1 and a one-hot class.

    Quirks kept from keras-yolo3 so targets are identical: the centre is
    `(x_min + x_max) // 2` (floor division); a later box in the same cell
    and anchor overwrites xywh but the class one-hot bits accumulate; with
    the tiny masks a box whose best anchor is 0 gets no target and one whose
    best anchor is 3 gets one at both scales.
    """
    true_boxes = np.array(true_boxes, dtype=np.float32)
    if true_boxes.ndim != 3 or true_boxes.shape[-1] != 5:
        raise ValueError(f"true_boxes must be (N, T, 5); got shape {true_boxes.shape}")
    class_ids = true_boxes[..., 4]
    if (class_ids >= num_classes).any() or (class_ids < 0).any():
        raise ValueError(f"class ids must be in [0, {num_classes}); got {np.unique(class_ids).tolist()}")
    anchors = np.asarray(anchors, dtype=np.float32)
    num_layers = num_output_layers(len(anchors))
    masks = resolve_masks(masks, len(anchors))
    input_shape = np.array(input_shape, dtype=np.int32)  # (h, w)

    boxes_xy = (true_boxes[..., 0:2] + true_boxes[..., 2:4]) // 2
    boxes_wh = true_boxes[..., 2:4] - true_boxes[..., 0:2]
    true_boxes[..., 0:2] = boxes_xy / input_shape[::-1]
    true_boxes[..., 2:4] = boxes_wh / input_shape[::-1]

    batch = true_boxes.shape[0]
    grid_shapes = [input_shape // stride for stride in output_strides(num_layers)]
    y_true = [
        np.zeros((batch, grid[0], grid[1], len(masks[layer]), 5 + num_classes), dtype=np.float32)
        for layer, grid in enumerate(grid_shapes)
    ]

    anchor_maxes = anchors[None] / 2.0  # (1, A, 2), boxes centred on 0
    anchor_area = anchors[:, 0] * anchors[:, 1]
    valid_mask = boxes_wh[..., 0] > 0
    for b in range(batch):
        valid = np.nonzero(valid_mask[b])[0]
        if len(valid) == 0:
            continue
        wh = boxes_wh[b, valid][:, None, :]  # (T', 1, 2)
        intersect_wh = np.maximum(np.minimum(wh / 2.0, anchor_maxes) - np.maximum(-wh / 2.0, -anchor_maxes), 0.0)
        intersect_area = intersect_wh[..., 0] * intersect_wh[..., 1]
        box_area = wh[..., 0] * wh[..., 1]
        iou = intersect_area / (box_area + anchor_area - intersect_area)  # (T', A)
        best_anchor = np.argmax(iou, axis=-1)
        for t, best, box_iou in zip(valid, best_anchor, iou):
            for layer in range(num_layers):
                for n in _assigned_anchors(best, box_iou, masks[layer], iou_thresh):
                    i = np.floor(true_boxes[b, t, 0] * grid_shapes[layer][1]).astype(np.int32)
                    j = np.floor(true_boxes[b, t, 1] * grid_shapes[layer][0]).astype(np.int32)
                    k = masks[layer].index(n)
                    c = true_boxes[b, t, 4].astype(np.int32)
                    y_true[layer][b, j, i, k, 0:4] = true_boxes[b, t, 0:4]
                    y_true[layer][b, j, i, k, 4] = 1
                    y_true[layer][b, j, i, k, 5 + c] = 1
    return y_true


def _assigned_anchors(best: int, box_iou: np.ndarray, mask: list[int], iou_thresh) -> list[int]:
    """The anchors of one scale's `mask` a box is assigned to.

    keras-yolo3: its best anchor, if the mask holds it. Darknet with
    `iou_thresh` < 1 (yolo_layer.c) also assigns every other anchor of the
    mask whose IoU with the box is strictly above `iou_thresh`.
    """
    if iou_thresh is None or iou_thresh >= 1.0:
        return [best] if best in mask else []
    return [n for n in mask if n == best or box_iou[n] > iou_thresh]


def dense_inputs(x, anchors, num_classes: int, masks=None, iou_thresh: float | None = None) -> dict:
    """A host batch finished by `DeviceInputs` into keras-yolo3's dense model inputs, as numpy.

    Args:
        x: `{"image": (B, H, W, 3) uint8, "boxes": (B, T, 5), "hsv": (B, 12)}`.
        anchors, num_classes, masks, iou_thresh: `DeviceInputs`'.

    Returns:
        `{"image": (B, H, W, 3) float32 in [0, 1], "y_true_0": (B, H/32, W/32, 3, 5 + C), ...}`.
    """
    from keras_yolo_mgpu.data.device_side import DeviceInputs

    image, y_true = DeviceInputs(anchors, num_classes, masks=masks, iou_thresh=iou_thresh)(x)
    return {"image": np.asarray(image), **{f"y_true_{layer}": np.asarray(t) for layer, t in enumerate(y_true)}}
