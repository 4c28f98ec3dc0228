"""preprocess_true_boxes on hand-computed boxes."""

import numpy as np
import pytest

from keras_yolo_mgpu import get_anchors, model_data_path, preprocess_true_boxes

FULL_ANCHORS = get_anchors(model_data_path("yolo_anchors.txt"))
TINY_ANCHORS = get_anchors(model_data_path("tiny_yolo_anchors.txt"))


def test_large_box_goes_to_coarse_scale_best_anchor():
    # 416x416 input; box 100..220 x 50..380: w=120, h=330. Best anchor by
    # centred IoU: (116,90)=10440/(39600+10440-10440)... computed below.
    boxes = np.array([[[100, 50, 220, 380, 3]]], np.float32)
    y_true = preprocess_true_boxes(boxes, (416, 416), FULL_ANCHORS, 5)
    w, h = 120.0, 330.0
    ious = [min(w, aw) * min(h, ah) / (w * h + aw * ah - min(w, aw) * min(h, ah)) for aw, ah in FULL_ANCHORS]
    assert int(np.argmax(ious)) == 7  # (156, 198), in the coarsest mask [6, 7, 8] at k=1
    # Centre = (100+220)//2, (50+380)//2 = 160, 215 -> cell floor(160/416*13)=5, floor(215/416*13)=6.
    cell = y_true[0][0, 6, 5, 1]
    np.testing.assert_allclose(cell[0:4], [160 / 416, 215 / 416, 120 / 416, 330 / 416], rtol=1e-6)
    assert cell[4] == 1 and cell[5 + 3] == 1
    assert y_true[0].sum() == pytest.approx(cell.sum())  # nothing else set
    assert y_true[1].sum() == 0 and y_true[2].sum() == 0
    assert [t.shape for t in y_true] == [(1, 13, 13, 3, 10), (1, 26, 26, 3, 10), (1, 52, 52, 3, 10)]
    assert all(t.dtype == np.float32 for t in y_true)


def test_small_box_goes_to_fine_scale_and_centre_uses_floor_division():
    # w=11, h=15 -> best anchor 0 (10,13) -> scale 2 (stride 8), k=0.
    # Centre x = (31+42)//2 = 36 (floor of 36.5), y = (20+35)//2 = 27.
    boxes = np.array([[[31, 20, 42, 35, 1], [0, 0, 0, 0, 0]]], np.float32)
    y_true = preprocess_true_boxes(boxes, (416, 416), FULL_ANCHORS, 2)
    cell = y_true[2][0, int(27 / 416 * 52), int(36 / 416 * 52), 0]
    np.testing.assert_allclose(cell, [36 / 416, 27 / 416, 11 / 416, 15 / 416, 1, 0, 1], rtol=1e-6)
    assert y_true[2].sum() == pytest.approx(cell.sum())


def test_non_square_input_uses_height_width_order():
    # input (h, w) = (320, 416): x is divided by 416, y by 320. A 100x100 box's
    # best anchor is 6 (116,90): IoU 9000/11440 = 0.787, the coarse scale, k=0.
    boxes = np.array([[[200, 100, 300, 200, 0]]], np.float32)
    y_true = preprocess_true_boxes(boxes, (320, 416), FULL_ANCHORS, 1)
    assert [t.shape[1:3] for t in y_true] == [(10, 13), (20, 26), (40, 52)]
    cell = y_true[0][0, int(150 / 320 * 10), int(250 / 416 * 13), 0]
    np.testing.assert_allclose(cell, [250 / 416, 150 / 320, 100 / 416, 100 / 320, 1, 1], rtol=1e-6)
    assert sum(t[..., 4].sum() for t in y_true) == 1


def test_later_box_in_same_cell_overwrites_box_but_class_bits_accumulate():
    # Centres (19, 20) and (20, 21): both in stride-8 cell (2, 2), anchor 0.
    boxes = np.array([[[14, 14, 25, 27, 0], [15, 15, 26, 28, 1]]], np.float32)
    y_true = preprocess_true_boxes(boxes, (416, 416), FULL_ANCHORS, 2)
    cell = y_true[2][0, 2, 2, 0]
    np.testing.assert_allclose(cell[:4], [20 / 416, 21 / 416, 11 / 416, 13 / 416], rtol=1e-6)
    np.testing.assert_array_equal(cell[4:], [1, 1, 1])


def test_tiny_masks_drop_anchor_0_and_duplicate_anchor_3():
    # (10,14) box -> anchor 0: in no tiny mask, so no target at all.
    small = np.array([[[100, 100, 110, 114, 0]]], np.float32)
    assert all(t.sum() == 0 for t in preprocess_true_boxes(small, (416, 416), TINY_ANCHORS, 1))
    # (81,82) box -> anchor 3: in both masks ([3,4,5] k=0 and [1,2,3] k=2).
    mid = np.array([[[100, 100, 181, 182, 0]]], np.float32)
    y_true = preprocess_true_boxes(mid, (416, 416), TINY_ANCHORS, 1)
    assert y_true[0][..., 0, 4].sum() == 1 and y_true[1][..., 2, 4].sum() == 1
    assert len(y_true) == 2 and y_true[1].shape == (1, 26, 26, 3, 6)


def test_class_out_of_range_is_refused():
    with pytest.raises(ValueError, match="class ids"):
        preprocess_true_boxes(np.array([[[0, 0, 10, 10, 2]]], np.float32), (64, 64), TINY_ANCHORS, 2)


def test_cfg_masks_give_anchor_0_a_target_and_anchor_3_only_one():
    # pjreddie's later yolov3-tiny.cfg says mask 0,1,2 for the fine scale.
    cfg_masks = [[3, 4, 5], [0, 1, 2]]
    small = np.array([[[100, 100, 110, 114, 0]]], np.float32)  # best anchor 0
    y_true = preprocess_true_boxes(small, (416, 416), TINY_ANCHORS, 1, masks=cfg_masks)
    assert y_true[0].sum() == 0 and y_true[1][..., 0, 4].sum() == 1
    mid = np.array([[[100, 100, 181, 182, 0]]], np.float32)  # best anchor 3
    y_true = preprocess_true_boxes(mid, (416, 416), TINY_ANCHORS, 1, masks=cfg_masks)
    assert y_true[0][..., 0, 4].sum() == 1 and y_true[1].sum() == 0


def test_bad_masks_are_refused_with_the_expected_layout():
    from keras_yolo_mgpu.model.boxes import resolve_masks

    assert resolve_masks(None, 6) == [[3, 4, 5], [1, 2, 3]]
    assert resolve_masks([(6, 7, 8), (3, 4, 5), (0, 1, 2)], 9) == [[6, 7, 8], [3, 4, 5], [0, 1, 2]]
    with pytest.raises(ValueError, match=r"6 anchors need 2 masks of 3 anchor indices"):
        resolve_masks([[0, 1, 2]], 6)
    with pytest.raises(ValueError, match=r"in \[0, 6\)"):
        resolve_masks([[3, 4, 5], [1, 2, 6]], 6)


# --- Darknet's iou_thresh: other anchors above the threshold learn the box too ---


def _darknet_assignments(true_boxes, input_shape, anchors, masks, iou_thresh):
    """{(layer, sample, j, i, mask_n)} the boxes train, transcribed from Darknet's yolo_layer.c.

    forward_yolo_layer, per truth: best_n over all anchors by the IoU of the
    truth and the anchor box both centred (`box_iou(pred, truth_shift)`,
    strict `>` so the first maximum wins); the truth trains mask_n of best_n
    when the layer's mask holds it, then every other n of the mask with
    `iou > l.iou_thresh` (only when iou_thresh < 1), in the truth's cell
    i = truth.x * l.w, j = truth.y * l.h. Truth x, y are keras-yolo3's
    integer-divided centres relative to the input.
    """
    height, width = input_shape
    grids = [(height // 32, width // 32), (height // 16, width // 16), (height // 8, width // 8)][: len(masks)]
    slots = set()
    for b, boxes in enumerate(true_boxes):
        for x_min, y_min, x_max, y_max, _ in boxes:
            w, h = x_max - x_min, y_max - y_min
            if w <= 0:
                continue
            ious = []
            for anchor_w, anchor_h in anchors:
                overlap = min(w, anchor_w) * min(h, anchor_h)
                ious.append(overlap / (w * h + anchor_w * anchor_h - overlap))
            best_iou, best_n = 0.0, 0
            for n, iou in enumerate(ious):
                if iou > best_iou:
                    best_iou, best_n = iou, n
            x, y = ((x_min + x_max) // 2) / width, ((y_min + y_max) // 2) / height
            for layer, (grid_h, grid_w) in enumerate(grids):
                i, j = int(x * grid_w), int(y * grid_h)
                if best_n in masks[layer]:
                    slots.add((layer, b, j, i, masks[layer].index(best_n)))
                for n in range(len(anchors)):
                    if n in masks[layer] and n != best_n and iou_thresh < 1.0 and ious[n] > iou_thresh:
                        slots.add((layer, b, j, i, masks[layer].index(n)))
    return slots


@pytest.mark.parametrize("iou_thresh", [0.213, 0.5])
@pytest.mark.parametrize("anchors", [FULL_ANCHORS, TINY_ANCHORS], ids=["full", "tiny"])
def test_iou_thresh_trains_the_anchors_darknet_assigns(anchors, iou_thresh):
    rng = np.random.default_rng(7)
    shape = (416, 416)
    corners = rng.uniform(0, 300, (6, 8, 2))
    sizes = rng.uniform(8, 300, (6, 8, 2))
    boxes = np.concatenate([corners, np.minimum(corners + sizes, 415), rng.integers(0, 3, (6, 8, 1))], -1)
    boxes = np.round(boxes).astype(np.float32)
    boxes[1, 5:] = 0  # padding rows
    masks = [[6, 7, 8], [3, 4, 5], [0, 1, 2]] if len(anchors) == 9 else [[3, 4, 5], [1, 2, 3]]
    y_true = preprocess_true_boxes(boxes, shape, anchors, 3, masks=masks, iou_thresh=iou_thresh)
    got = {(layer, *map(int, slot)) for layer, y in enumerate(y_true) for slot in zip(*np.nonzero(y[..., 4]))}
    expected = _darknet_assignments(boxes, shape, anchors, masks, iou_thresh)
    assert got == expected
    best_only = _darknet_assignments(boxes, shape, anchors, masks, 1.0)
    assert len(expected) > len(best_only)  # the threshold added anchors: the check can fail


def test_iou_thresh_one_or_none_is_the_best_anchor_only():
    rng = np.random.default_rng(3)
    corners = rng.uniform(0, 300, (2, 6, 2))
    boxes = np.concatenate([corners, corners + rng.uniform(8, 100, (2, 6, 2)), np.zeros((2, 6, 1))], -1)
    boxes = boxes.astype(np.float32)
    plain = preprocess_true_boxes(boxes, (416, 416), FULL_ANCHORS, 1)
    for iou_thresh in (None, 1.0):
        for a, b in zip(plain, preprocess_true_boxes(boxes, (416, 416), FULL_ANCHORS, 1, iou_thresh=iou_thresh)):
            np.testing.assert_array_equal(a, b)


def test_iou_thresh_gives_a_box_of_unmasked_best_anchor_its_near_anchors():
    # (10,14) box: best anchor 0 (in no tiny mask, no target without the
    # threshold); IoU with anchor 1 (23,27) = 140 / 621 = 0.225 > 0.213.
    small = np.array([[[100, 100, 110, 114, 0]]], np.float32)
    y_true = preprocess_true_boxes(small, (416, 416), TINY_ANCHORS, 1, iou_thresh=0.213)
    assert y_true[0].sum() == 0
    assert y_true[1][..., 4].sum() == 1 and y_true[1][0, 6, 6, 0, 4] == 1  # fine scale, anchor 1 is mask slot 0
    assert all(t.sum() == 0 for t in preprocess_true_boxes(small, (416, 416), TINY_ANCHORS, 1, iou_thresh=0.23))
