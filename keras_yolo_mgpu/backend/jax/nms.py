"""Per-class non-max suppression on JAX: `greedy_nms`, TensorFlow's NMS selection written in `keras.ops`.

It compiles with the network into one XLA program. `greedy_nms` is plain
`keras.ops` and runs on either backend: the tests compare it with
TensorFlow's kernels box for box.
"""

from __future__ import annotations

from keras import ops

# Candidates of every class that `greedy_nms` examines at a time, best first.
NMS_BLOCK = 64


def non_max_suppression(boxes, scores, *, method: str = "combined", **options):
    """`inference.layers.non_max_suppression` on JAX: `greedy_nms` with `options`.

    `method` chooses TensorFlow's kernels; both select what `greedy_nms` selects.
    """
    return greedy_nms(boxes, scores, **options)


def ragged_nms(boxes, box_scores, *, max_boxes: int, score_threshold: float, iou_threshold: float):
    """keras-yolo3's ragged NMS of one image (`model.boxes.yolo_eval`) is TensorFlow's: NotImplementedError."""
    raise NotImplementedError(
        "yolo_eval is keras-yolo3's ragged NMS on TensorFlow's kernels, kept as the reference the detector is "
        "tested against. On JAX use inference.layers.YoloNMS (or YOLO.detect), which selects the same boxes, "
        "or set KERAS_BACKEND=tensorflow."
    )


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

    Args and returns as `inference.layers.non_max_suppression`; `block_size`
    only changes the speed, never the selection.
    """
    boxes = ops.cast(boxes, "float32")
    scores = ops.cast(scores, "float32")
    batch, num_boxes, num_classes = ops.shape(scores)
    per_class = int(max_boxes_per_class)
    block = max(1, min(int(block_size), num_boxes))
    num_blocks = -(-num_boxes // block)

    # Each block is the next `block` candidates of every class, best first, taken by a top_k of the scores
    # not yet visited (visited ones set to -1, below any threshold): XLA's CPU top_k of a few hundred is a
    # partial sort, a fraction of the full sort of all K boxes, and usually one block is all that is read.
    # top_k puts equal scores in index order, the kernels' order; -1 keeps the order of the rest.
    remaining = ops.transpose(scores, (0, 2, 1))  # (N, C, K)
    visited_rows = ops.reshape(
        ops.stack(
            ops.meshgrid(ops.arange(batch, dtype="int32"), ops.arange(num_classes, dtype="int32"), indexing="ij"),
            axis=-1,
        ),
        (batch, num_classes, 1, 2),
    )  # (N, C, 1, 2): the (image, class) of each row, to mark a block's boxes visited
    flat_boxes = ops.reshape(boxes, (-1, 4))
    first_box = ops.reshape(ops.arange(batch, dtype="int32") * num_boxes, (-1, 1, 1))  # (N, 1, 1) in flat_boxes
    slots = ops.arange(per_class, dtype="int32")  # (P,)
    positions = ops.arange(block, dtype="int32")  # (B,)

    def can_keep_more(remaining, count):
        """(N, C): the class keeps fewer than P boxes and its best candidate left scores above the threshold."""
        return (count < per_class) & (ops.max(remaining, axis=-1) > score_threshold)

    def take_block(b, more, remaining, count, kept_index, kept_score, kept_boxes):
        """Resolves block `b` of every class's candidates: the best `block` of those not yet visited."""
        block_scores, block_index = ops.top_k(remaining, k=block, sorted=True)  # (N, C, B)
        block_index = ops.cast(block_index, "int32")
        block_boxes = ops.take(flat_boxes, block_index + first_box, axis=0)  # (N, C, B, 4)
        rows = ops.broadcast_to(visited_rows, (batch, num_classes, block, 2))
        visited = ops.reshape(ops.concatenate([rows, block_index[..., None]], axis=-1), (-1, 3))
        remaining = ops.scatter_update(remaining, visited, ops.full((batch * num_classes * block,), -1.0))

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
        more = (b < num_blocks) & ops.any(can_keep_more(remaining, count))
        return b, more, remaining, count, kept_index, kept_score, kept_boxes

    count = ops.zeros((batch, num_classes), "int32")
    kept_index = ops.zeros((batch, num_classes, per_class), "int32")
    kept_score = ops.zeros((batch, num_classes, per_class), "float32")
    kept_boxes = ops.zeros((batch, num_classes, per_class, 4), "float32")
    state = (ops.convert_to_tensor(0, "int32"), ops.any(can_keep_more(remaining, count)))  # (block, more to do)
    state += (remaining, count, kept_index, kept_score, kept_boxes)
    _, _, _, count, kept_index, kept_score, _ = ops.while_loop(lambda b, more, *_: more, take_block, state)

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
