"""Decoding and NMS as Keras layers, for inference and export, on every backend.

`YoloDecode` turns the raw head outputs into boxes in original-image pixels
and per-class scores, with keras-yolo3's `yolo_head` + `yolo_correct_boxes`
arithmetic, but for a whole batch of images of different sizes at once.
`YoloNMS` keeps the best boxes per class (keras-yolo3's per-class NMS) and
returns a fixed number of detections per image, padded, with a count of the
valid ones: fixed shapes batch, serialise and export (SavedModel, TFLite,
ONNX), where the original's ragged per-image output did not.

Decoding is written once, in `keras.ops`. NMS is the one thing the backends
do differently, in one function, `non_max_suppression`: TensorFlow runs its
own NMS kernels (what SavedModel, TFLite and ONNX export), JAX runs
`greedy_nms`, the same selection written in `keras.ops`.

Both layers compute in float32 whatever the body's dtype policy, have
`get_config` and are registered serializable, so an inference model saved
as `.keras` loads back without custom objects or `Lambda` layers.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_yolo_mgpu.model.boxes import cell_grid, cell_offset, num_output_layers, resolve_masks
from keras_yolo_mgpu.serialization import SERIALIZABLE_PACKAGE, constructor_config


def correct_boxes_batched(box_xy, box_wh, input_wh, image_shape):
    """`boxes.yolo_correct_boxes` for a batch of images of different sizes.

    The same arithmetic, element for element, written in (x, y) order
    without reversed slices or `flip` (TFLite has no builtin for a negative
    stride; slices and a concatenation lower to builtins on every backend).

    Args:
        box_xy, box_wh: (N, gh, gw, A, 2) relative to the network input, (x, y).
        input_wh: (2,) float32 network input (width, height).
        image_shape: (N, 2) original image (height, width) per sample.

    Returns:
        (N, gh, gw, A, 4) boxes as (x_min, y_min, x_max, y_max) in image pixels.
    """
    image_shape = ops.cast(image_shape, "float32")
    image_wh = ops.concatenate([image_shape[:, 1:2], image_shape[:, 0:1]], axis=-1)
    image_wh = image_wh[:, None, None, None, :]  # (N, 1, 1, 1, 2)
    new_wh = ops.round(image_wh * ops.min(input_wh / image_wh, axis=-1, keepdims=True))
    offset = (input_wh - new_wh) / 2.0 / input_wh
    scale = input_wh / new_wh
    box_xy = (box_xy - offset) * scale
    box_wh = box_wh * scale
    box_mins = (box_xy - box_wh / 2.0) * image_wh
    box_maxes = (box_xy + box_wh / 2.0) * image_wh
    return ops.concatenate([box_mins, box_maxes], axis=-1)


def decode_scale(feats, anchors, num_classes: int, input_wh, scale_x_y: float = 1.0):
    """`boxes.yolo_head` for inference: relative centres, sizes and scores.

    The input size comes in as a (width, height) tensor rather than
    `yolo_head`'s (height, width), so no `flip` reaches the exported graph.

    Args:
        feats: (N, gh, gw, A * (5 + C)) raw output of one scale, float32.
        anchors: (A, 2) numpy anchors of this scale, (w, h) input pixels.
        input_wh: (2,) float32 network input (width, height).
        scale_x_y: YOLOv4's centre scaling (`boxes.cell_offset`); 1.0 for YOLOv3.

    Returns:
        `box_xy`, `box_wh` (N, gh, gw, A, 2) relative to the input, and
        `scores` (N, gh, gw, A, C) objectness times class probability.
    """
    num_anchors = len(anchors)
    grid_h, grid_w = ops.shape(feats)[1], ops.shape(feats)[2]  # ints, tensors where unknown (TF)
    feats = ops.reshape(feats, (-1, grid_h, grid_w, num_anchors, num_classes + 5))
    grid = cell_grid(grid_h, grid_w, "float32")  # (gh, gw, 1, 2) as (x, y)
    grid_wh = ops.cast(ops.stack([grid_w, grid_h]), "float32")
    anchors = ops.convert_to_tensor(np.reshape(anchors, (1, 1, 1, num_anchors, 2)), "float32")
    box_xy = (cell_offset(feats[..., 0:2], scale_x_y) + grid) / grid_wh
    box_wh = ops.exp(feats[..., 2:4]) * anchors / input_wh
    scores = ops.sigmoid(feats[..., 4:5]) * ops.sigmoid(feats[..., 5:])
    return box_xy, box_wh, scores


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class YoloDecode(keras.layers.Layer):
    """Raw YOLO outputs -> boxes in image pixels and per-class scores.

    Call with `[*yolo_outputs, image_shape]`:

    - `yolo_outputs`: 3 (YOLOv3) or 2 (tiny) tensors, coarsest first, each
      (N, gh, gw, A * (5 + C)); the network input is (32 gh, 32 gw).
    - `image_shape`: (N, 2) float, (height, width) of each original image
      that was letterboxed into the input.

    Returns:
        `boxes` (N, K, 4) float32 as (x_min, y_min, x_max, y_max) in original
        image pixels, not clipped; `scores` (N, K, C) float32, objectness
        times class probability. K = sum over scales of gh * gw * A, in
        keras-yolo3's order (scale, row, column, anchor).

    Args:
        anchors: (num_anchors, 2) (w, h) in input pixels; 9 or 6 anchors.
        num_classes: number of classes.
        masks: anchor indices per scale (default keras-yolo3's, see
            `boxes.resolve_masks`).
        scale_x_y: per scale, coarse first (YOLOv4, `architectures`); None
            is 1.0 everywhere (YOLOv3).
    """

    def __init__(self, anchors, num_classes: int, masks=None, scale_x_y=None, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.anchors = np.asarray(anchors, dtype=np.float32).reshape(-1, 2)
        self.num_layers = num_output_layers(len(self.anchors))
        self.masks = resolve_masks(masks, len(self.anchors))
        self.num_classes = int(num_classes)
        if self.num_classes < 1:
            raise ValueError(f"num_classes must be >= 1. Received: num_classes={num_classes}")
        self.scale_x_y = None if scale_x_y is None else [float(v) for v in scale_x_y]
        if self.scale_x_y is not None and len(self.scale_x_y) != self.num_layers:
            raise ValueError(f"scale_x_y needs one value per output scale ({self.num_layers}). Received: {scale_x_y}")

    def call(self, inputs):
        *outputs, image_shape = inputs
        if len(outputs) != self.num_layers:
            raise ValueError(
                f"YoloDecode expects {self.num_layers} outputs for {len(self.anchors)} anchors "
                f"plus image_shape; received {len(outputs)} outputs"
            )
        outputs = [ops.cast(o, "float32") for o in outputs]
        grid_h, grid_w = ops.shape(outputs[0])[1], ops.shape(outputs[0])[2]
        input_wh = ops.cast(ops.stack([grid_w * 32, grid_h * 32]), "float32")
        num_anchors = len(self.anchors) // self.num_layers
        all_boxes, all_scores = [], []
        for layer, mask in enumerate(self.masks):
            scale = 1.0 if self.scale_x_y is None else self.scale_x_y[layer]
            box_xy, box_wh, scores = decode_scale(outputs[layer], self.anchors[mask], self.num_classes, input_wh, scale)
            boxes = correct_boxes_batched(box_xy, box_wh, input_wh, image_shape)
            # Boxes of this scale, (N, gh * gw * A, ...): a constant shape
            # whenever the grid is static (always, in an export).
            shape = ops.shape(outputs[layer])
            count = shape[1] * shape[2] * num_anchors
            all_boxes.append(ops.reshape(boxes, (-1, count, 4)))
            all_scores.append(ops.reshape(scores, (-1, count, self.num_classes)))
        return ops.concatenate(all_boxes, axis=1), ops.concatenate(all_scores, axis=1)

    def compute_output_shape(self, input_shape):
        *output_shapes, _ = input_shape
        num_anchors = len(self.anchors) // self.num_layers
        count = 0
        for shape in output_shapes:
            if shape[1] is None or shape[2] is None:
                count = None
                break
            count += shape[1] * shape[2] * num_anchors
        batch = output_shapes[0][0]
        return (batch, count, 4), (batch, count, self.num_classes)

    def get_config(self):
        return {**super().get_config(), **constructor_config(self)}


NMS_METHODS = ("combined", "padded")
# Candidates of every class that `greedy_nms` examines at a time, best first.
NMS_BLOCK = 256


def non_max_suppression(
    boxes,
    scores,
    *,
    max_boxes_per_class: int,
    max_detections: int,
    iou_threshold: float,
    score_threshold: float,
    method: str = "combined",
):
    """Per-class NMS with a fixed number of outputs per image: the one place where the backends differ.

    TensorFlow runs its own NMS kernels: they are what a SavedModel, a TFLite
    file and an ONNX export carry (`method`, see `YoloNMS`). JAX runs
    `greedy_nms`: the same selection in `keras.ops`, compiled with the
    network into one XLA program. It was chosen over NMS in numpy on the host
    because it is as exact (TensorFlow's selection rule and IoU arithmetic,
    see `greedy_nms`), it needs no copy of every box's per-class scores to
    the host (3.6 MB per image for YOLOv3-416 with 80 classes) on the GPU
    machines where JAX runs, and on a CPU its cost follows the candidates as
    the TensorFlow kernel's does, where a Python loop per class and kept box
    would not.

    Args:
        boxes: (N, K, 4) float32 corners, (x_min, y_min, x_max, y_max) or
            (y_min, x_min, y_max, x_max): IoU is symmetric in x and y.
        scores: (N, K, C) float32 per-class scores.

    Returns:
        `boxes` (N, M, 4) float32, `scores` (N, M) float32 best first,
        `classes` (N, M) int32, `valid_detections` (N,) int32, with M =
        `max_detections` and zeros past `valid_detections`.
    """
    options = dict(
        max_boxes_per_class=max_boxes_per_class,
        max_detections=max_detections,
        iou_threshold=iou_threshold,
        score_threshold=score_threshold,
    )
    if keras.backend.backend() == "tensorflow":
        return _tensorflow_nms(boxes, scores, method=method, **options)
    return greedy_nms(boxes, scores, **options)


# ----------------------------------------------------------------------
# TensorFlow: its NMS kernels


def _tensorflow_nms(boxes, scores, *, method, max_boxes_per_class, max_detections, iou_threshold, score_threshold):
    """`non_max_suppression` with TensorFlow's ops: the combined op, or single-image ops per class ("padded")."""
    import tensorflow as tf

    options = dict(
        max_boxes_per_class=max_boxes_per_class,
        max_detections=max_detections,
        iou_threshold=iou_threshold,
        score_threshold=score_threshold,
    )
    if method == "padded":
        if boxes.shape[0] is not None:  # static batch (export): unroll
            results = [_nms_one_image(boxes[i], scores[i], **options) for i in range(boxes.shape[0])]
            return tuple(tf.stack(parts, axis=0) for parts in zip(*results))
        return tf.map_fn(
            lambda sample: _nms_one_image(sample[0], sample[1], **options),
            (boxes, scores),
            fn_output_signature=(
                tf.TensorSpec([max_detections, 4], tf.float32),
                tf.TensorSpec([max_detections], tf.float32),
                tf.TensorSpec([max_detections], tf.int32),
                tf.TensorSpec([], tf.int32),
            ),
        )
    # IoU is symmetric in x and y, so xyxy boxes work where TF documents
    # yxyx. clip_boxes would clip to [0, 1]; these are pixels.
    nmsed_boxes, nmsed_scores, nmsed_classes, valid = tf.image.combined_non_max_suppression(
        boxes[:, :, None, :],
        scores,
        max_output_size_per_class=max_boxes_per_class,
        max_total_size=max_detections,
        iou_threshold=iou_threshold,
        score_threshold=score_threshold,
        pad_per_class=False,
        clip_boxes=False,
    )
    return nmsed_boxes, nmsed_scores, tf.cast(nmsed_classes, tf.int32), tf.cast(valid, tf.int32)


def _nms_one_image(boxes, scores, *, max_boxes_per_class, max_detections, iou_threshold, score_threshold):
    """Per-class NMS of one image with single-image NMS ops (TFLite builtins).

    Args:
        boxes: (K, 4); scores: (K, C).

    Returns:
        boxes (M, 4), scores (M,), classes (M,) int32, valid count () int32.
    """
    import tensorflow as tf

    num_classes = scores.shape[-1]
    per_class = max_boxes_per_class
    indices, kept_scores = [], []
    for c in range(num_classes):
        selected, selected_scores, valid = tf.raw_ops.NonMaxSuppressionV5(
            boxes=boxes,
            scores=scores[:, c],
            max_output_size=per_class,
            iou_threshold=iou_threshold,
            score_threshold=score_threshold,
            soft_nms_sigma=0.0,
            pad_to_max_output_size=True,
        )
        # Padding rows get score -1 so they sort after every real box.
        kept_scores.append(tf.where(tf.range(per_class) < valid, selected_scores, -1.0))
        indices.append(selected)
    indices = tf.concat(indices, axis=0)  # (C * P,), class-major
    kept_scores = tf.concat(kept_scores, axis=0)
    k = min(max_detections, num_classes * per_class)
    top_scores, order = tf.math.top_k(kept_scores, k=k)
    is_valid = top_scores >= 0.0
    valid_count = tf.reduce_sum(tf.cast(is_valid, tf.int32))
    out_boxes = tf.gather(boxes, tf.gather(indices, order)) * tf.cast(is_valid, tf.float32)[:, None]
    out_scores = tf.maximum(top_scores, 0.0)
    out_classes = tf.where(is_valid, order // per_class, 0)
    if k < max_detections:
        pad = max_detections - k
        out_boxes = tf.pad(out_boxes, [[0, pad], [0, 0]])
        out_scores = tf.pad(out_scores, [[0, pad]])
        out_classes = tf.pad(out_classes, [[0, pad]])
    return out_boxes, out_scores, tf.cast(out_classes, tf.int32), valid_count


# ----------------------------------------------------------------------
# JAX (any backend): the same selection in keras.ops


def greedy_nms(
    boxes,
    scores,
    *,
    max_boxes_per_class: int,
    max_detections: int,
    iou_threshold: float,
    score_threshold: float,
    block_size: int = NMS_BLOCK,
):
    """`non_max_suppression` in `keras.ops`, selecting exactly what TensorFlow's NMS kernels select.

    The kernels' rule, per image and class: visit the boxes scoring above
    `score_threshold` best first (equal scores: lower box index first) and
    keep a box unless a box kept before it overlaps it by IoU >
    `iou_threshold`, until `max_boxes_per_class` are kept. Here every class
    of every image walks its sorted candidates together, `block_size` at a
    time: a block's candidates are first checked against the boxes kept from
    earlier blocks, then resolved among themselves by keeping the best one
    left and dropping what it overlaps, until none is left. The next block
    is read only while some class can keep more boxes and still has a
    candidate above the score, so the work follows the candidates, as the
    kernels' does: a plain padded greedy NMS (keep the best, suppress among
    all K boxes, `max_boxes_per_class` times) costs K * P IoUs per class,
    85 million per image for YOLOv3-416 (K = 10,647) with 80 classes at
    evaluation's 100 boxes per class. IoU is computed op for op as the
    kernels compute it in float32 (`_kernel_iou`), so the same inputs give
    the same boxes, bit for bit. The kept boxes of all classes are then
    sorted by score (equal scores: lower class first, as the "padded"
    method) and the best `max_detections` returned.

    Args and returns as `non_max_suppression`; `block_size` only changes the
    speed, never the selection.
    """
    boxes = ops.cast(boxes, "float32")
    scores = ops.cast(scores, "float32")
    batch, num_boxes, num_classes = ops.shape(scores)
    per_class = int(max_boxes_per_class)
    block = max(1, min(int(block_size), num_boxes))
    num_blocks = -(-num_boxes // block)

    # Each class's boxes, best first: (N, C, K) scores and box indices. top_k
    # puts equal scores in index order, the kernels' order.
    sorted_scores, order = ops.top_k(ops.transpose(scores, (0, 2, 1)), k=num_boxes, sorted=True)
    order = ops.cast(order, "int32")
    if num_blocks * block > num_boxes:  # whole blocks; a score of -1 is never a candidate
        padding = [[0, 0], [0, 0], [0, num_blocks * block - num_boxes]]
        sorted_scores = ops.pad(sorted_scores, padding, constant_values=-1.0)
        order = ops.pad(order, padding)
    flat_boxes = ops.reshape(boxes, (-1, 4))
    first_box = ops.reshape(ops.arange(batch, dtype="int32") * num_boxes, (-1, 1, 1))  # (N, 1, 1) in flat_boxes
    slots = ops.arange(per_class, dtype="int32")  # (P,)
    positions = ops.arange(block, dtype="int32")  # (B,)

    def can_keep_more(start, count):
        """(N, C): the class keeps fewer than P boxes and its candidate at `start` scores above the threshold."""
        # Start indices of one dtype: with 64-bit types on (a float64 model), JAX would take 0 as int64.
        zero = start * 0
        best_left = ops.slice(sorted_scores, (zero, zero, start), (batch, num_classes, 1))[..., 0]
        return (count < per_class) & (best_left > score_threshold)

    def take_block(b, more, count, kept_index, kept_score, kept_boxes):
        """Resolves block `b` of every class's candidates."""
        start = b * block
        zero = start * 0
        block_scores = ops.slice(sorted_scores, (zero, zero, start), (batch, num_classes, block))  # (N, C, B)
        block_index = ops.slice(order, (zero, zero, start), (batch, num_classes, block))
        block_boxes = ops.take(flat_boxes, block_index + first_box, axis=0)  # (N, C, B, 4)

        def pick(alive, count, kept_index, kept_score, kept_boxes):
            """Keeps each class's best candidate left in the block (if any) and drops what it overlaps."""
            found = ops.any(alive, axis=-1)  # (N, C)
            position = ops.min(ops.where(alive, positions, block - 1), axis=-1)  # (N, C); any valid one if none
            index = ops.take_along_axis(block_index, position[..., None], axis=-1)[..., 0]
            score = ops.take_along_axis(block_scores, position[..., None], axis=-1)[..., 0]
            box = ops.take(flat_boxes, index + first_box[..., 0], axis=0)  # (N, C, 4)
            slot = (slots == count[..., None]) & found[..., None]  # (N, C, P): the next free slot
            kept_index = ops.where(slot, index[..., None], kept_index)
            kept_score = ops.where(slot, score[..., None], kept_score)
            kept_boxes = ops.where(slot[..., None], box[:, :, None, :], kept_boxes)
            count = count + ops.cast(found, "int32")
            overlaps = _kernel_iou(box[:, :, None, :], block_boxes) > iou_threshold  # (N, C, B)
            alive = alive & ~overlaps & (positions != position[..., None]) & (count < per_class)[..., None]
            return alive, count, kept_index, kept_score, kept_boxes

        # Candidates that no box kept from earlier blocks overlaps.
        kept = slots < count[..., None]  # (N, C, P)
        covered = _kernel_iou(block_boxes[:, :, :, None, :], kept_boxes[:, :, None, :, :]) > iou_threshold
        alive = (block_scores > score_threshold) & ~ops.any(covered & kept[:, :, None, :], axis=-1)
        alive = alive & (count < per_class)[..., None]
        _, count, kept_index, kept_score, kept_boxes = ops.while_loop(
            lambda alive, *_: ops.any(alive), pick, (alive, count, kept_index, kept_score, kept_boxes)
        )
        b = b + 1
        more = (b < num_blocks) & ops.any(can_keep_more(ops.minimum(b, num_blocks - 1) * block, count))
        return b, more, count, kept_index, kept_score, kept_boxes

    count = ops.zeros((batch, num_classes), "int32")
    kept_index = ops.zeros((batch, num_classes, per_class), "int32")
    kept_score = ops.zeros((batch, num_classes, per_class), "float32")
    kept_boxes = ops.zeros((batch, num_classes, per_class, 4), "float32")
    state = (ops.convert_to_tensor(0, "int32"), ops.any(can_keep_more(0, count)))  # (block, more to do)
    state += (count, kept_index, kept_score, kept_boxes)
    _, _, count, kept_index, kept_score, _ = ops.while_loop(lambda b, more, *_: more, take_block, state)

    # Every class's kept boxes, class-major, best first overall.
    kept_score = ops.where(slots < count[..., None], kept_score, -1.0)  # empty slots sort last
    k = min(int(max_detections), num_classes * per_class)
    top_scores, top = ops.top_k(ops.reshape(kept_score, (-1, num_classes * per_class)), k=k, sorted=True)
    valid = top_scores >= 0.0  # kept scores are above a threshold >= 0
    index = ops.take_along_axis(ops.reshape(kept_index, (-1, num_classes * per_class)), top, axis=-1)
    out_boxes = ops.where(valid[..., None], ops.take(flat_boxes, index + first_box[:, :, 0], axis=0), 0.0)
    out_scores = ops.where(valid, top_scores, 0.0)
    out_classes = ops.cast(ops.where(valid, top // per_class, 0), "int32")
    valid_count = ops.sum(ops.cast(valid, "int32"), axis=-1)
    if k < max_detections:
        pad = int(max_detections) - k
        out_boxes = ops.pad(out_boxes, [[0, 0], [0, pad], [0, 0]])
        out_scores = ops.pad(out_scores, [[0, 0], [0, pad]])
        out_classes = ops.pad(out_classes, [[0, 0], [0, pad]])
    return out_boxes, out_scores, out_classes, valid_count


def _kernel_iou(a, b):
    """IoU of boxes `a` and `b` (..., 4), broadcast, as TensorFlow's NMS kernels compute it in float32.

    Same operations in the same order (corners sorted per axis, area 0 or
    less gives IoU 0), so a suppression decision at the threshold is the
    kernels' own.
    """
    a_low, a_high = ops.minimum(a[..., 0:2], a[..., 2:4]), ops.maximum(a[..., 0:2], a[..., 2:4])
    b_low, b_high = ops.minimum(b[..., 0:2], b[..., 2:4]), ops.maximum(b[..., 0:2], b[..., 2:4])
    area_a = (a_high[..., 0] - a_low[..., 0]) * (a_high[..., 1] - a_low[..., 1])
    area_b = (b_high[..., 0] - b_low[..., 0]) * (b_high[..., 1] - b_low[..., 1])
    size = ops.maximum(ops.minimum(a_high, b_high) - ops.maximum(a_low, b_low), 0.0)
    intersection = size[..., 0] * size[..., 1]
    iou = intersection / (area_a + area_b - intersection)
    return ops.where((area_a <= 0.0) | (area_b <= 0.0), 0.0, iou)


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class YoloNMS(keras.layers.Layer):
    """Per-class non-max suppression with a fixed number of outputs per image.

    Call with `[boxes, scores]` from `YoloDecode`: boxes (N, K, 4), scores
    (N, K, C). Within each class, boxes scoring above `score_threshold` are
    suppressed by better boxes of that class overlapping them by more than
    `iou_threshold` (keras-yolo3's `yolo_eval`); at most
    `max_boxes_per_class` survive per class; the survivors of all classes
    are sorted by score and the best `max_detections` are kept.

    Args:
        method: which TensorFlow ops run it. "combined" runs TensorFlow's
            batched `combined_non_max_suppression` (fast, one op for the
            batch); "padded" runs one single-image NMS op per class and
            image (the ops TFLite has as builtins; a static batch is
            unrolled, a dynamic one mapped). Both select the same boxes. On
            JAX either runs `greedy_nms`, which selects them too
            (`non_max_suppression`).

    Returns:
        `boxes` (N, M, 4) float32, same corner order as the input boxes;
        `scores` (N, M) float32, best first; `classes` (N, M) int32;
        `valid_detections` (N,) int32. M = `max_detections`; rows past
        `valid_detections` are zero padding.
    """

    def __init__(
        self,
        max_detections: int = 100,
        max_boxes_per_class: int = 20,
        score_threshold: float = 0.3,
        iou_threshold: float = 0.45,
        method: str = "combined",
        **kwargs,
    ):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        if int(max_detections) < 1 or int(max_boxes_per_class) < 1:
            raise ValueError(
                "max_detections and max_boxes_per_class must be >= 1. Received: "
                f"max_detections={max_detections}, max_boxes_per_class={max_boxes_per_class}"
            )
        if not 0.0 <= float(score_threshold) <= 1.0 or not 0.0 <= float(iou_threshold) <= 1.0:
            raise ValueError(
                "score_threshold and iou_threshold must be in [0, 1]. Received: "
                f"score_threshold={score_threshold}, iou_threshold={iou_threshold}"
            )
        if method not in NMS_METHODS:
            raise ValueError(f"method must be one of {NMS_METHODS}. Received: method={method!r}")
        self.max_detections = int(max_detections)
        self.max_boxes_per_class = int(max_boxes_per_class)
        self.score_threshold = float(score_threshold)
        self.iou_threshold = float(iou_threshold)
        self.method = method

    def call(self, inputs):
        boxes, scores = inputs
        return non_max_suppression(
            ops.cast(boxes, "float32"),
            ops.cast(scores, "float32"),
            max_boxes_per_class=self.max_boxes_per_class,
            max_detections=self.max_detections,
            iou_threshold=self.iou_threshold,
            score_threshold=self.score_threshold,
            method=self.method,
        )

    def compute_output_shape(self, input_shape):
        batch = input_shape[0][0]
        m = self.max_detections
        return (batch, m, 4), (batch, m), (batch, m), (batch,)

    def compute_output_spec(self, inputs):
        batch = inputs[0].shape[0]
        m = self.max_detections
        return (
            keras.KerasTensor((batch, m, 4), dtype="float32"),
            keras.KerasTensor((batch, m), dtype="float32"),
            keras.KerasTensor((batch, m), dtype="int32"),
            keras.KerasTensor((batch,), dtype="int32"),
        )

    def get_config(self):
        return {**super().get_config(), **constructor_config(self)}


OUTPUT_NAMES = ("boxes", "scores", "classes", "valid_detections")
# Extra outputs of an exported model: every decoded box and score before NMS,
# so a host can run its own NMS (another score floor) and a check can compare
# every box, not only the few that survive NMS.
DECODED_OUTPUT_NAMES = ("decoded_boxes", "decoded_scores")


def build_inference_model(
    body: keras.Model,
    anchors,
    num_classes: int,
    *,
    input_shape=(416, 416),
    score_threshold: float = 0.3,
    iou_threshold: float = 0.45,
    max_boxes_per_class: int = 20,
    max_detections: int = 100,
    nms_method: str = "combined",
    batch_size: int | None = None,
    masks=None,
    scale_x_y=None,
    name: str = "yolo_inference",
    decoded_outputs: bool = False,
) -> keras.Model:
    """Wraps a YOLO body with decoding and NMS.

    Args:
        body: `model.build_body` network (any input size), raw outputs.
        anchors: (num_anchors, 2) anchors the body was trained with.
        input_shape: (height, width) of the letterboxed input, fixed so the
            model exports with static shapes.
        nms_method: "combined" or "padded", see `YoloNMS`.
        batch_size: None for any batch; a number fixes it (TFLite export).
        masks: anchor indices per scale (default keras-yolo3's).
        scale_x_y: per scale, coarse first (YOLOv4); None for YOLOv3.
        decoded_outputs: also return `decoded_boxes` (N, K, 4) and
            `decoded_scores` (N, K, C), `YoloDecode`'s outputs before NMS.

    Returns:
        A model with inputs `image` (N, H, W, 3) float32 letterboxed RGB in
        [0, 1] and `image_shape` (N, 2) float32 original (height, width),
        and a dict of outputs: `boxes` (N, M, 4) as (x_min, y_min,
        x_max, y_max) original pixels, `scores` (N, M), `classes` (N, M)
        int32, `valid_detections` (N,) int32.
    """
    height, width = (int(v) for v in input_shape)
    image = keras.Input(shape=(height, width, 3), batch_size=batch_size, name="image")
    image_shape = keras.Input(shape=(2,), batch_size=batch_size, name="image_shape")
    raw = body(image)
    raw = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    boxes, scores = YoloDecode(anchors, num_classes, masks=masks, scale_x_y=scale_x_y, name="yolo_decode")(
        [*raw, image_shape]
    )
    outputs = YoloNMS(
        max_detections=max_detections,
        max_boxes_per_class=max_boxes_per_class,
        score_threshold=score_threshold,
        iou_threshold=iou_threshold,
        method=nms_method,
        name="yolo_nms",
    )([boxes, scores])
    named = dict(zip(OUTPUT_NAMES, outputs))
    if decoded_outputs:
        named.update(zip(DECODED_OUTPUT_NAMES, (boxes, scores)))
    return keras.Model([image, image_shape], named, name=name)


def build_detection_model(
    body: keras.Model,
    settings,
    *,
    score: float = 0.3,
    iou: float = 0.45,
    max_boxes: int = 20,
    max_detections: int = 100,
    **options,
) -> keras.Model:
    """`build_inference_model` for a body described by its `weights.metadata.ModelMetadata`.

    `settings` gives the anchors, the class count, the masks, the input size
    and the network (YOLOv4's `scale_x_y`); `score`, `iou`, `max_boxes` and
    `max_detections` are the detection flags as `YOLO` and `export_model`
    name them. `options`: `nms_method`, `batch_size`, `name`.
    """
    from keras_yolo_mgpu.model.architectures import get_architecture

    return build_inference_model(
        body,
        settings.anchors_array,
        len(settings.class_names),
        input_shape=settings.input_shape,
        score_threshold=score,
        iou_threshold=iou,
        max_boxes_per_class=max_boxes,
        max_detections=max_detections,
        masks=settings.masks_list,
        scale_x_y=get_architecture(settings.kind).decode_scale_x_y,
        **options,
    )
