"""Per-class non-max suppression on TensorFlow: its NMS kernels, which SavedModel, TFLite and ONNX export carry.

The JAX side: `backend/jax/nms.py`, the same functions (`greedy_nms` there
selects exactly what these kernels select).
"""

from __future__ import annotations

import tensorflow as tf


def non_max_suppression(
    boxes, scores, *, method="combined", max_boxes_per_class, max_detections, iou_threshold, score_threshold
):
    """`inference.layers.non_max_suppression` with TensorFlow's ops: the combined op, or single-image ops per class.

    Args:
        method: "combined" (`combined_non_max_suppression`, one op for the
            batch) or "padded" (single-image NMS ops per class and image,
            TFLite builtins).
    """
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


def ragged_nms(boxes, box_scores, *, max_boxes: int, score_threshold: float, iou_threshold: float):
    """keras-yolo3's per-class NMS of ONE image, with ragged outputs (`model.boxes.yolo_eval`).

    Args:
        boxes: (K, 4) boxes of every scale; box_scores: (K, C) per-class scores.
        max_boxes: at most this many boxes per class.

    Returns:
        `boxes` (P, 4), `scores` (P,), `classes` (P,) int32: class by class,
        each class's boxes best first.
    """
    num_classes = box_scores.shape[-1]
    mask = box_scores >= score_threshold
    boxes_, scores_, classes_ = [], [], []
    for c in range(num_classes):
        class_boxes = tf.boolean_mask(boxes, mask[:, c])
        class_scores = tf.boolean_mask(box_scores[:, c], mask[:, c])
        keep = tf.image.non_max_suppression(class_boxes, class_scores, max_boxes, iou_threshold=iou_threshold)
        boxes_.append(tf.gather(class_boxes, keep))
        scores_.append(tf.gather(class_scores, keep))
        classes_.append(tf.fill(tf.shape(keep), c))
    return tf.concat(boxes_, axis=0), tf.concat(scores_, axis=0), tf.concat(classes_, axis=0)
