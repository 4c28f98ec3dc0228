"""Decoding and NMS as Keras layers, for inference and export, on every backend.

`YoloDecode` does keras-yolo3's `yolo_head` + `yolo_correct_boxes` for a batch of images of
different sizes; `YoloNMS` its per-class NMS, with a fixed number of detections per image, padded:
fixed shapes batch, serialise and export, where the original's ragged per-image output did not.
Decoding is `keras.ops`; NMS is the one step the backends do differently (`non_max_suppression`).
Both layers compute in float32 whatever the body's dtype policy and are registered serializable,
so a `.keras` inference model loads back without custom objects or `Lambda` layers.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_yolo_mgpu.backend import nms as backend_nms
from keras_yolo_mgpu.model.architectures import get_architecture
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
        grids = [shape[1] * shape[2] if None not in shape[1:3] else None for shape in output_shapes]
        count = None if None in grids else sum(grids) * (len(self.anchors) // self.num_layers)
        batch = output_shapes[0][0]
        return (batch, count, 4), (batch, count, self.num_classes)

    def get_config(self):
        return {**super().get_config(), **constructor_config(self)}


NMS_METHODS = ("combined", "padded")


def non_max_suppression(boxes, scores, **options):
    """Per-class NMS with a fixed number of outputs per image: the one step where the backends differ.

    TensorFlow runs its NMS kernels, which exports carry (`method`, see `YoloNMS`); JAX runs
    `greedy_nms` (`backend/jax/nms.py`), the same selection in `keras.ops`, compiled with the
    network. Not numpy on the host: that would copy every box's per-class scores off the GPU
    (3.6 MB per image for YOLOv3-416, 80 classes), and a Python loop per class and kept box
    would not scale with the candidates as the kernels do.

    Args:
        boxes: (N, K, 4) float32 corners, (x_min, y_min, x_max, y_max) or
            (y_min, x_min, y_max, x_max): IoU is symmetric in x and y.
        scores: (N, K, C) float32 per-class scores.
        options: `max_boxes_per_class`, `max_detections`, `iou_threshold`,
            `score_threshold` and `method` ("combined" by default), as `YoloNMS`.

    Returns:
        `boxes` (N, M, 4) float32, `scores` (N, M) float32 best first,
        `classes` (N, M) int32, `valid_detections` (N,) int32, with M =
        `max_detections` and zeros past `valid_detections`.
    """
    return backend_nms.non_max_suppression(boxes, scores, **options)


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
        shapes = self.compute_output_shape([inputs[0].shape])
        return tuple(keras.KerasTensor(s, dtype=d) for s, d in zip(shapes, ("float32", "float32", "int32", "int32")))

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
