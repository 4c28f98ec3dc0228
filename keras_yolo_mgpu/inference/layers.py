"""Decoding and NMS as Keras layers, for inference and export.

`YoloDecode` turns the raw head outputs into boxes in original-image pixels
and per-class scores, with keras-yolo3's `yolo_head` + `yolo_correct_boxes`
arithmetic, but for a whole batch of images of different sizes at once.
`YoloNMS` keeps the best boxes per class (keras-yolo3's per-class NMS) and
returns a fixed number of detections per image, padded, with a count of the
valid ones: fixed shapes batch, serialise and export (SavedModel, TFLite,
ONNX), where the original's ragged per-image output did not.

Both layers compute in float32 whatever the body's dtype policy, have
`get_config` and are registered serializable, so an inference model saved
as `.keras` loads back without custom objects or `Lambda` layers.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from keras_yolo_mgpu.model.boxes import cell_offset, num_output_layers, resolve_masks
from keras_yolo_mgpu.serialization import SERIALIZABLE_PACKAGE, constructor_config


def _static_or_dynamic(tensor, axis: int):
    """A dimension as a Python int when static (folds into constants on export)."""
    value = tensor.shape[axis]
    return value if value is not None else tf.shape(tensor)[axis]


def correct_boxes_batched(box_xy, box_wh, input_wh, image_shape):
    """`boxes.yolo_correct_boxes` for a batch of images of different sizes.

    The same arithmetic, element for element, written in (x, y) order
    without reversed slices (TFLite has no builtin for a negative stride).

    Args:
        box_xy, box_wh: (N, gh, gw, A, 2) relative to the network input, (x, y).
        input_wh: (2,) float32 network input (width, height).
        image_shape: (N, 2) original image (height, width) per sample.

    Returns:
        (N, gh, gw, A, 4) boxes as (x_min, y_min, x_max, y_max) in image pixels.
    """
    image_wh = tf.gather(tf.cast(image_shape, tf.float32), [1, 0], axis=-1)
    image_wh = image_wh[:, None, None, None, :]  # (N, 1, 1, 1, 2)
    new_wh = tf.round(image_wh * tf.reduce_min(input_wh / image_wh, axis=-1, keepdims=True))
    offset = (input_wh - new_wh) / 2.0 / input_wh
    scale = input_wh / new_wh
    box_xy = (box_xy - offset) * scale
    box_wh = box_wh * scale
    box_mins = (box_xy - box_wh / 2.0) * image_wh
    box_maxes = (box_xy + box_wh / 2.0) * image_wh
    return tf.concat([box_mins, box_maxes], axis=-1)


def decode_scale(feats, anchors, num_classes: int, input_wh, scale_x_y: float = 1.0):
    """`boxes.yolo_head` for inference: relative centres, sizes and scores.

    Args:
        feats: (N, gh, gw, A * (5 + C)) raw output of one scale.
        anchors: (A, 2) numpy anchors of this scale, (w, h) input pixels.
        input_wh: (2,) float32 network input (width, height).
        scale_x_y: YOLOv4's centre scaling (`boxes.cell_offset`); 1.0 for YOLOv3.

    Returns:
        `box_xy`, `box_wh` (N, gh, gw, A, 2) relative to the input, and
        `scores` (N, gh, gw, A, C) objectness times class probability.
    """
    num_anchors = len(anchors)
    grid_h, grid_w = _static_or_dynamic(feats, 1), _static_or_dynamic(feats, 2)
    feats = tf.reshape(feats, [-1, grid_h, grid_w, num_anchors, num_classes + 5])
    grid_x = tf.tile(tf.reshape(tf.range(grid_w), [1, -1, 1, 1]), [grid_h, 1, 1, 1])
    grid_y = tf.tile(tf.reshape(tf.range(grid_h), [-1, 1, 1, 1]), [1, grid_w, 1, 1])
    grid = tf.cast(tf.concat([grid_x, grid_y], axis=-1), tf.float32)  # (gh, gw, 1, 2) as (x, y)
    grid_wh = tf.cast(tf.stack([grid_w, grid_h]), tf.float32)
    anchors = tf.constant(np.reshape(anchors, [1, 1, 1, num_anchors, 2]), tf.float32)
    box_xy = (cell_offset(feats[..., 0:2], scale_x_y) + grid) / grid_wh
    box_wh = tf.exp(feats[..., 2:4]) * anchors / input_wh
    scores = tf.sigmoid(feats[..., 4:5]) * tf.sigmoid(feats[..., 5:])
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
        outputs = [tf.cast(o, tf.float32) for o in outputs]
        input_wh = tf.cast(
            tf.stack([_static_or_dynamic(outputs[0], 2) * 32, _static_or_dynamic(outputs[0], 1) * 32]), tf.float32
        )
        batch = _static_or_dynamic(outputs[0], 0)
        all_boxes, all_scores = [], []
        for layer, mask in enumerate(self.masks):
            scale = 1.0 if self.scale_x_y is None else self.scale_x_y[layer]
            box_xy, box_wh, scores = decode_scale(outputs[layer], self.anchors[mask], self.num_classes, input_wh, scale)
            boxes = correct_boxes_batched(box_xy, box_wh, input_wh, image_shape)
            all_boxes.append(tf.reshape(boxes, [batch, -1, 4]))
            all_scores.append(tf.reshape(scores, [batch, -1, self.num_classes]))
        return tf.concat(all_boxes, axis=1), tf.concat(all_scores, axis=1)

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


def _nms_one_image(boxes, scores, *, max_boxes_per_class, max_detections, iou_threshold, score_threshold):
    """Per-class NMS of one image with single-image NMS ops (TFLite builtins).

    Args:
        boxes: (K, 4); scores: (K, C).

    Returns:
        boxes (M, 4), scores (M,), classes (M,) int32, valid count () int32.
    """
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
        method: "combined" runs TensorFlow's batched
            `combined_non_max_suppression` (fast, one op for the batch);
            "padded" runs one single-image NMS op per class and image (the
            ops TFLite has as builtins; a static batch is unrolled, a dynamic
            one mapped). Both select the same boxes.

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
        boxes = tf.cast(boxes, tf.float32)
        scores = tf.cast(scores, tf.float32)
        if self.method == "padded":
            return self._padded(boxes, scores)
        # IoU is symmetric in x and y, so xyxy boxes work where TF documents
        # yxyx. clip_boxes would clip to [0, 1]; these are pixels.
        nmsed_boxes, nmsed_scores, nmsed_classes, valid = tf.image.combined_non_max_suppression(
            boxes[:, :, None, :],
            scores,
            max_output_size_per_class=self.max_boxes_per_class,
            max_total_size=self.max_detections,
            iou_threshold=self.iou_threshold,
            score_threshold=self.score_threshold,
            pad_per_class=False,
            clip_boxes=False,
        )
        return nmsed_boxes, nmsed_scores, tf.cast(nmsed_classes, tf.int32), tf.cast(valid, tf.int32)

    def _padded(self, boxes, scores):
        options = dict(
            max_boxes_per_class=self.max_boxes_per_class,
            max_detections=self.max_detections,
            iou_threshold=self.iou_threshold,
            score_threshold=self.score_threshold,
        )
        if boxes.shape[0] is not None:  # static batch (export): unroll
            results = [_nms_one_image(boxes[i], scores[i], **options) for i in range(boxes.shape[0])]
            return tuple(tf.stack(parts, axis=0) for parts in zip(*results))
        return tf.map_fn(
            lambda sample: _nms_one_image(sample[0], sample[1], **options),
            (boxes, scores),
            fn_output_signature=(
                tf.TensorSpec([self.max_detections, 4], tf.float32),
                tf.TensorSpec([self.max_detections], tf.float32),
                tf.TensorSpec([self.max_detections], tf.int32),
                tf.TensorSpec([], tf.int32),
            ),
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
