"""The device's part of the input pipeline, in `keras.ops`: HSV jitter, scaling, targets.

The host (`data.host`) hands over the uint8 canvas, the boxes padded to
`max_boxes` and the HSV jitter's draws; the train step finishes the batch on
the device, for TensorFlow and JAX alike:

- `distort_hsv`: keras-yolo3's HSV jitter per image quadrant, with OpenCV's
  float HSV arithmetic, and the scaling to [0, 1]; a neutral draw (validation)
  gives `to_float(image)` exactly;
- `build_targets`: keras-yolo3's `preprocess_true_boxes`, bitwise, so the
  dense grids are made where they are used instead of crossing the bus
  (`preprocess_true_boxes`, numpy in and out, is a thin wrapper over it);
- `DeviceInputs`: both, as a Keras layer in front of the body;
- `BoxTargets`: the targets alone, for a model whose inputs are no images.

Everything has static shapes (jit-compilable; comparisons, gathers and
per-image reductions instead of boolean masks and scatters, so a batch split
over devices needs no exchange) and uses float32 only: JAX without x64 has no
float64, so keras-yolo3's one float64 step (the cell index, `floor(x * grid)`)
is computed exactly from float32 partial products (`_floor_of_product`), and
the centres' quotients come from a table of numpy's (`_quotients`), not from
the device's division. tests/test_device_side.py compares all of it with
OpenCV's jitter and keras-yolo3's numpy targets on both backends.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_yolo_mgpu.model.boxes import num_output_layers, output_strides, resolve_masks

__all__ = ["BoxTargets", "DeviceInputs", "build_targets", "distort_hsv", "preprocess_true_boxes", "to_float"]

_FLT_EPSILON = float(np.finfo(np.float32).eps)
# uint8 -> float32 in [0, 1] as `np.float32(v) / np.float32(255)` computes it, by
# table lookup: exact whatever a compiler makes of a division by a constant.
_UNIT_LEVELS = np.arange(256, dtype=np.float32) / np.float32(255)


def to_float(images):
    """uint8 images -> float32 in [0, 1]: `images / 255`, bitwise as numpy and TensorFlow divide.

    Args:
        images: (..., 3) uint8.

    Returns:
        float32 of the same shape.
    """
    return ops.take(ops.convert_to_tensor(_UNIT_LEVELS), ops.cast(images, "int32"))


def _quadrant_params(hsv, height, width):
    """(B, 12) draws -> three (B, H, W) maps: each pixel's quadrant's hue, saturation, value."""
    params = ops.reshape(ops.cast(hsv, "float32"), (-1, 4, 3))
    top = (ops.arange(height, dtype="int32") < height // 2)[None, :, None, None]  # (1, H, 1, 1)
    left = (ops.arange(width, dtype="int32") < width // 2)[None, None, :, None]  # (1, 1, W, 1)

    def corner(position):
        return params[:, position][:, None, None, :]  # (B, 1, 1, 3)

    per_pixel = ops.where(
        top, ops.where(left, corner(0), corner(1)), ops.where(left, corner(2), corner(3))
    )  # (B, H, W, 3)
    return per_pixel[..., 0], per_pixel[..., 1], per_pixel[..., 2]


def distort_hsv(images, hsv):
    """keras-yolo3's HSV jitter and the scaling to [0, 1], per quadrant.

    OpenCV's float HSV arithmetic (tests/hsv_reference.py is the reference):
    H in degrees from the largest channel, S = (max - min) / max, V = max;
    the hue is shifted by `hue` of a turn (wrapped), S and V are scaled and
    clipped at 1, and the sextant formula goes back to RGB. Within 2e-6 of
    OpenCV on all 256^3 colours. A quadrant whose draw is
    `data.host.NEUTRAL_HSV` comes out as `to_float(images)` exactly.

    Args:
        images: (B, H, W, 3) uint8 RGB (H, W even).
        hsv: (B, 12) float32 (hue in turns, saturation and value factors)
            for the top-left, top-right, bottom-left, bottom-right quadrants.

    Returns:
        (B, H, W, 3) float32 RGB in [0, 1].
    """
    shape = ops.shape(images)
    hue, sat, val = _quadrant_params(hsv, shape[1], shape[2])
    x = ops.cast(images, "float32")
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    v = ops.maximum(ops.maximum(r, g), b)
    v_min = ops.minimum(ops.minimum(r, g), b)
    diff = v - v_min
    s = diff / (ops.abs(v) + _FLT_EPSILON)
    scale = 60.0 / (diff + _FLT_EPSILON)
    h = ops.where(v == r, (g - b) * scale, ops.where(v == g, (b - r) * scale + 120.0, (r - g) * scale + 240.0))
    h = ops.where(h < 0.0, h + 360.0, h)
    # The jitter: OpenCV's HSV->RGB wraps hues >= 360 only, so the shift is made positive.
    shift = hue * 360.0
    shift = shift - 360.0 * ops.floor(shift / 360.0)
    h = (h + shift) * (6.0 / 360.0)
    h = ops.where(h >= 6.0, h - 6.0, h)
    s = ops.minimum(s * sat, 1.0)
    v = ops.minimum(v * (val / 255.0), 1.0)
    sector = ops.floor(h)
    f = h - sector
    tab = [v, v * (1.0 - s), v * (1.0 - s * f), v * (1.0 - s * (1.0 - f))]
    # OpenCV's sector table: which of `tab` is (b, g, r) in each sextant.
    sectors = [(1, 3, 0), (1, 0, 2), (3, 0, 1), (0, 2, 1), (0, 1, 3), (2, 1, 0)]
    channels = []
    for channel in (2, 1, 0):  # r, g, b
        out = tab[sectors[5][channel]]
        for number in range(4, -1, -1):
            out = ops.where(sector == number, tab[sectors[number][channel]], out)
        channels.append(out)
    jittered = ops.stack(channels, axis=-1)
    neutral = ops.logical_and(ops.logical_and(hue == 0.0, sat == 1.0), val == 1.0)[..., None]
    return ops.where(neutral, to_float(images), jittered)


def _three_parts(x):
    """`x` as `high + middle + low`, each of at most 13 significant bits for `x` in [0, 2).

    Each part's product with an integer below 2**11 is exact in float32 (an FMA
    contraction changes nothing).
    """
    high = ops.floor(x * 4096.0) / 4096.0  # bits 2^0 .. 2^-12
    rest = x - high
    middle = ops.floor(rest * 16777216.0) / 16777216.0  # 2^-13 .. 2^-24
    return high, middle, rest - middle  # the last: below 2^-24


def _floor_of_product(x, n):
    """`floor(x * n)` of float32 `x` in [0, 2) and integer-valued `n` < 2048, computed exactly.

    keras-yolo3's numpy multiplies a float32 `x` by an int32 grid size in
    float64, where the product is exact; a float32 product can round up onto
    the next integer. The floor of the rounded product is then one too
    large, which the exact sign of `x * n - floor` reveals: the products of
    `x`'s `_three_parts` with `n` are exact, and their sum's sign survives rounding.
    """
    floor = ops.floor(x * n)
    high, middle, low = _three_parts(x)
    excess = (high * n - floor) + middle * n
    excess = excess + low * n
    return floor - ops.cast(excess < 0.0, "float32")


def _quotients(centres, size: int):
    """`centres / size` of integer-valued float32 centres, as numpy's float32 division rounds it, on any device.

    The cell of a box is the floor of its centre's quotient times the grid,
    and a quotient one ulp low moves a centre on a cell border into the cell
    before it. A GPU's division need not round correctly (XLA may emit an
    approximate one), so the quotients of the centres in the image, the
    integers 0..size, are numpy's, looked up; outside it (no cell: the cell
    index is clipped) and for NaN the division stands.

    Args:
        centres: (...) float32, integer-valued (`floor((x_min + x_max) / 2)`).
        size: the input's width or height in pixels.
    """
    table = ops.convert_to_tensor(np.arange(size + 1, dtype=np.float32) / np.float32(size))  # (size + 1,)
    inside = ops.logical_and(centres >= 0.0, centres <= float(size))  # False for NaN
    index = ops.cast(ops.where(inside, centres, 0.0), "int32")
    return ops.where(inside, ops.take(table, index), centres / float(size))


def _exact_quotient(values, size: int):
    """`values / size`, correctly rounded (as numpy's float32 division) whatever the device's division.

    A GPU's float32 division may be off by an ulp or two (under XLA, in over
    a quarter of the centre quotients measured: BENCHMARKS.md, "The JAX
    trainer on one GPU"). One correction step makes it exact: with
    `size = 2**p * k` (k < 2**11), `y = values / 2**p` is exact, the device's
    `q0 = y / k` is within a few ulps, and the residual `y - q0 * k` is
    computed exactly from `q0`'s `_three_parts`. `q0 + residual / k` then
    rounds correctly: the quotient of a float32 by an integer below 2**11 lies
    at least 2**-12 ulp from a rounding boundary unless exact, far more than
    the error of `residual / k`. Exact for quotients in [2**-12, 2) (boxes down to
    size / 4096 pixels); smaller ones keep a few ulps.

    Args:
        values: (...) float32, in [0, 2 * size).
        size: the input's width or height in pixels.
    """
    power = size & -size  # the largest power of two dividing size
    odd = float(size // power)
    y = values / float(power)  # exact: a power of two
    q0 = y / odd
    high, middle, low = _three_parts(q0)
    residual = ((y - high * odd) - middle * odd) - low * odd
    return q0 + residual / odd


def build_targets(boxes, input_shape, anchors, num_classes: int, masks=None, iou_thresh: float | None = None):
    """keras-yolo3's `preprocess_true_boxes` in `keras.ops`, bitwise, with static shapes.

    Args:
        boxes: (B, T, 5) float32 x_min, y_min, x_max, y_max, class_id in
            input pixels; rows of zero width are padding.
        input_shape: (height, width), multiples of 32: Python ints, or (on
            TensorFlow) int32 scalar tensors when the size changes per
            batch (multi-scale).
        anchors: (num_anchors, 2) (w, h) in input pixels; 9 or 6 anchors.
        num_classes: number of classes.
        masks: anchor indices per scale (default keras-yolo3's, see
            `boxes.resolve_masks`).
        iou_thresh: Darknet's `iou_thresh`: a box also goes to every other
            anchor of the masks with IoU above it (None: the best anchor only).

    Returns:
        One float32 tensor per output scale, coarsest first, of shape
        (B, height/stride, width/stride, len(mask), 5 + num_classes).

    keras-yolo3's quirks are kept: centre `(x_min + x_max) // 2`; a later box
    in the same cell and anchor wins xywh and objectness while the class bits
    of all of them stay set; a box whose best anchor is in no mask (anchor 0
    with tiny masks) gets no target, one in two masks gets two.
    """
    anchors = np.asarray(anchors, dtype=np.float32)
    num_anchors = len(anchors)
    num_layers = num_output_layers(num_anchors)
    masks = resolve_masks(masks, num_anchors)
    height, width = input_shape
    boxes = ops.cast(boxes, "float32")
    batch, num_boxes = ops.shape(boxes)[0], ops.shape(boxes)[1]

    input_wh = ops.cast(ops.stack([width, height]), "float32")
    # numpy's float32 `(a + b) // 2` is floor((a + b) / 2): halving is exact.
    boxes_xy = ops.floor((boxes[..., 0:2] + boxes[..., 2:4]) * 0.5)  # (B, T, 2)
    boxes_wh = boxes[..., 2:4] - boxes[..., 0:2]
    # XLA compiles `x / constant` to `x * (1 / constant)`, one ulp off numpy's
    # quotient for a third of the coordinates (measured, JAX on the CPU). A
    # divisor that depends on the data (the size, or 1 where a box is NaN and
    # the quotient NaN anyway) stays a division.
    input_wh = ops.where(ops.isnan(boxes_xy), 1.0, input_wh)  # (B, T, 2)
    if all(isinstance(side, (int, np.integer)) for side in (width, height)):
        # The centres decide the cells (a floor): their quotients come from numpy's table;
        # the sizes' are corrected to numpy's correctly rounded ones.
        rel_xy = ops.stack([_quotients(boxes_xy[..., 0], width), _quotients(boxes_xy[..., 1], height)], axis=-1)
        rel_wh = ops.stack([_exact_quotient(boxes_wh[..., 0], width), _exact_quotient(boxes_wh[..., 1], height)], -1)
    else:  # multi-scale on TensorFlow, whose division is correctly rounded on every device
        rel_xy, rel_wh = boxes_xy / input_wh, boxes_wh / input_wh
    rel_xywh = ops.concatenate([rel_xy, rel_wh], axis=-1)  # (B, T, 4)
    valid = boxes_wh[..., 0] > 0.0  # (B, T)

    # Best anchor by IoU of centred boxes, the first on ties (np.argmax).
    wh = boxes_wh[..., None, :]  # (B, T, 1, 2)
    anchor_maxes = ops.convert_to_tensor(anchors / 2.0)  # (A, 2)
    intersect_wh = ops.maximum(ops.minimum(wh / 2.0, anchor_maxes) - ops.maximum(-wh / 2.0, -anchor_maxes), 0.0)
    intersect_area = intersect_wh[..., 0] * intersect_wh[..., 1]  # (B, T, A)
    box_area = wh[..., 0] * wh[..., 1]  # (B, T, 1)
    anchor_area = ops.convert_to_tensor(anchors[:, 0] * anchors[:, 1])  # (A,)
    iou = intersect_area / (box_area + anchor_area - intersect_area)
    is_best = iou == ops.max(iou, axis=-1, keepdims=True)
    best_anchor = ops.min(ops.where(is_best, ops.arange(num_anchors, dtype="int32"), num_anchors), axis=-1)  # (B, T)

    box_values = ops.concatenate([rel_xywh, ops.ones_like(rel_xywh[..., :1])], axis=-1)  # (B, T, 5)
    class_bits = ops.one_hot(ops.cast(boxes[..., 4], "int32"), num_classes, dtype="float32")  # (B, T, C)
    box_numbers = ops.arange(num_boxes, dtype="int32")
    y_true = []
    for layer, stride in enumerate(output_strides(num_layers)):
        grid_h, grid_w = height // stride, width // stride
        column = _floor_of_product(rel_xywh[..., 0], ops.cast(grid_w, "float32"))
        row = _floor_of_product(rel_xywh[..., 1], ops.cast(grid_h, "float32"))
        # The clips only matter for boxes outside the image (numpy would index out of range).
        column = ops.clip(ops.cast(column, "int32"), 0, grid_w - 1)
        row = ops.clip(ops.cast(row, "int32"), 0, grid_h - 1)
        cell = row * grid_w + column  # (B, T)
        assigned = []
        for anchor in masks[layer]:  # one slot per anchor of the scale
            slot = best_anchor == anchor
            if iou_thresh is not None and iou_thresh < 1.0:
                slot = ops.logical_or(slot, iou[..., anchor] > iou_thresh)
            assigned.append(ops.logical_and(valid, slot))
        assigned = ops.stack(assigned, axis=1)  # (B, S, T)
        slots = len(masks[layer])
        # match[b, g, s, t]: box t of image b goes to slot s of cell g (no scatter: see the module docstring).
        in_cell = cell[:, None, :] == ops.arange(grid_h * grid_w, dtype="int32")[None, :, None]  # (B, G, T)
        match = ops.reshape(
            ops.logical_and(in_cell[:, :, None, :], assigned[:, None, :, :]), (batch, -1, num_boxes)
        )  # (B, G * S, T)
        # The last box of a slot wins xywh and objectness (keras-yolo3 writes them in order) ...
        last = ops.max(ops.where(match, box_numbers, -1), axis=-1)  # (B, G * S)
        picked = ops.take_along_axis(box_values, ops.maximum(last, 0)[..., None], axis=1)  # (B, G * S, 5)
        box_part = ops.where((last >= 0)[..., None], picked, 0.0)
        # ... and the class bits of all of them stay set: counts of 0/1 products (exact in any
        # matmul precision), clipped to 1.
        class_part = ops.minimum(ops.matmul(ops.cast(match, "float32"), class_bits), 1.0)  # (B, G * S, C)
        dense = ops.concatenate([box_part, class_part], axis=-1)
        y_true.append(ops.reshape(dense, (batch, grid_h, grid_w, slots, 5 + num_classes)))
    return y_true


def preprocess_true_boxes(true_boxes, input_shape, anchors, num_classes: int, masks=None, iou_thresh=None):
    """keras-yolo3's name for the targets, numpy in and out: `build_targets` on the current backend.

    Args:
        true_boxes: (N, T, 5) x_min, y_min, x_max, y_max, class_id in input
            pixels; rows with zero width are padding.
        input_shape: (height, width), multiples of 32.
        anchors, num_classes, masks, iou_thresh: `build_targets`'.

    Returns:
        A list with one float32 numpy array per output scale, coarsest
        first, of shape (N, height/stride, width/stride, 3, 5 + num_classes).

    Raises:
        ValueError: `true_boxes` is not (N, T, 5), or a class id is outside
            [0, num_classes) (keras-yolo3 would index out of the one-hot).
    """
    true_boxes = np.asarray(true_boxes, dtype=np.float32)
    if true_boxes.ndim != 3 or true_boxes.shape[-1] != 5:
        raise ValueError(f"true_boxes must be (N, T, 5); got shape {true_boxes.shape}")
    class_ids = true_boxes[..., 4]
    if (class_ids >= num_classes).any() or (class_ids < 0).any():
        raise ValueError(f"class ids must be in [0, {num_classes}); got {np.unique(class_ids).tolist()}")
    input_shape = (int(input_shape[0]), int(input_shape[1]))
    y_true = build_targets(true_boxes, input_shape, anchors, num_classes, masks, iou_thresh)
    return [ops.convert_to_numpy(t) for t in y_true]


@keras.saving.register_keras_serializable(package="keras_yolo_mgpu")
class DeviceInputs(keras.layers.Layer):
    """The host's batch -> the network's input image and keras-yolo3's targets, on the device.

    Put in front of the body of the training model: its inputs are what
    `make_dataset` and `make_py_dataset` yield.

    Call arguments:
        inputs: dict with `"image"` (B, H, W, 3) uint8, `"boxes"` (B, T, 5)
            float32 in input pixels (zero rows: padding) and `"hsv"` (B, 12)
            float32 HSV draws per quadrant (`data.host`; neutral draws, as
            validation batches carry, leave the image as it is).

    Returns:
        `(image, y_true)`: the image, (B, H, W, 3) in [0, 1] in the layer's
        compute dtype, and the list of float32 targets per output scale,
        coarsest first, (B, H/stride, W/stride, 3, 5 + num_classes).

    Args:
        anchors: (num_anchors, 2) (w, h) in input pixels (9 or 6 anchors).
        num_classes: number of classes.
        masks: anchor indices per scale (default keras-yolo3's); the loss's.
        iou_thresh: Darknet's `iou_thresh` for the targets (None: best anchor only).
    """

    def __init__(self, anchors, num_classes: int, masks=None, iou_thresh: float | None = None, **kwargs):
        kwargs.pop("autocast", None)
        # The boxes and draws must stay float32 under mixed precision: targets are bitwise.
        super().__init__(autocast=False, **kwargs)
        self.anchors = np.asarray(anchors, np.float32).reshape(-1, 2)
        self.num_classes = int(num_classes)
        self.masks = resolve_masks(masks, len(self.anchors))
        if iou_thresh is not None and not 0.0 < iou_thresh <= 1.0:
            raise ValueError(f"`iou_thresh` must be in (0, 1] (1: best anchor only). Received: iou_thresh={iou_thresh}")
        self.iou_thresh = iou_thresh

    def call(self, inputs):
        images, boxes, hsv = inputs["image"], inputs["boxes"], inputs["hsv"]
        static = images.shape[1:3]
        if static[0] is not None and static[1] is not None:
            input_shape = (int(static[0]), int(static[1]))
        else:  # multi-scale on TensorFlow: the batch's own size
            input_shape = (ops.shape(images)[1], ops.shape(images)[2])
        image = ops.cast(distort_hsv(images, hsv), self.compute_dtype)
        y_true = build_targets(boxes, input_shape, self.anchors, self.num_classes, self.masks, self.iou_thresh)
        return image, y_true

    def compute_output_spec(self, inputs):
        # Stated rather than traced: JAX traces unknown sizes as symbolic dimensions, which the
        # targets' clips and comparisons cannot take (multi-scale models have (None, None) inputs).
        batch, height, width = inputs["image"].shape[:3]
        image = keras.KerasTensor((batch, height, width, 3), dtype=self.compute_dtype)
        return image, _target_specs(batch, height, width, self.masks, self.num_classes)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "anchors": self.anchors.tolist(),
                "num_classes": self.num_classes,
                "masks": [list(mask) for mask in self.masks],
                "iou_thresh": self.iou_thresh,
            }
        )
        return config


def _target_specs(batch, height, width, masks, num_classes: int) -> list:
    """`build_targets`' outputs as KerasTensors: (batch, height / stride, width / stride, len(mask), 5 + classes)."""
    y_true = []
    for layer, stride in enumerate(output_strides(len(masks))):
        grid = [None if side is None else side // stride for side in (height, width)]
        y_true.append(keras.KerasTensor((batch, *grid, len(masks[layer]), 5 + num_classes), dtype="float32"))
    return y_true


class BoxTargets(keras.layers.Layer):
    """Padded boxes -> keras-yolo3's targets for images of one size (`build_targets`), on the device.

    For a model that takes no images: stage 0 trains the output convolutions on
    the body's features (`training.bottleneck`).

    Call arguments:
        boxes: (B, T, 5) float32 x_min, y_min, x_max, y_max, class in input pixels (zero rows: padding).

    Returns:
        The float32 targets per output scale, coarsest first, (B, H/stride, W/stride, 3, 5 + num_classes).

    Args:
        image_size: (height, width) of the images the boxes are in, multiples of 32.
        anchors, num_classes, masks, iou_thresh: `DeviceInputs`'.
    """

    def __init__(self, image_size, anchors, num_classes: int, masks=None, iou_thresh=None, **kwargs):
        super().__init__(autocast=False, **kwargs)  # the boxes stay float32: the targets are bitwise
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.anchors = np.asarray(anchors, np.float32).reshape(-1, 2)
        self.num_classes = int(num_classes)
        self.masks = resolve_masks(masks, len(self.anchors))
        self.iou_thresh = iou_thresh

    def call(self, boxes):
        return build_targets(boxes, self.image_size, self.anchors, self.num_classes, self.masks, self.iou_thresh)

    def compute_output_spec(self, boxes):
        return _target_specs(boxes.shape[0], *self.image_size, self.masks, self.num_classes)
