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
