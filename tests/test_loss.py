"""yolo_loss against an independent numpy implementation of keras-yolo3's formula."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_yolo_mgpu import YoloLoss, get_anchors, model_data_path, preprocess_true_boxes, totalloss, yolo_loss
from keras_yolo_mgpu.model.loss import yolo_loss_terms

TINY_ANCHORS = get_anchors(model_data_path("tiny_yolo_anchors.txt"))
FULL_ANCHORS = get_anchors(model_data_path("yolo_anchors.txt"))
MASKS = {3: [[6, 7, 8], [3, 4, 5], [0, 1, 2]], 2: [[3, 4, 5], [1, 2, 3]]}


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _bce_logits(labels, logits):
    return np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))


def _iou_xywh(a, b):
    """a (..., 4), b (K, 4) -> (..., K)."""
    a = a[..., None, :]
    a_min, a_max = a[..., :2] - a[..., 2:] / 2, a[..., :2] + a[..., 2:] / 2
    b_min, b_max = b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2
    wh = np.maximum(np.minimum(a_max, b_max) - np.maximum(a_min, b_min), 0)
    inter = wh[..., 0] * wh[..., 1]
    return inter / (a[..., 2] * a[..., 3] + b[:, 2] * b[:, 3] - inter)


def numpy_loss(outputs, y_true, anchors, num_classes, ignore_thresh=0.5, masks=None):
    """keras-yolo3's loss, per sample, written with loops in float64."""
    num_layers = len(outputs)
    batch = outputs[0].shape[0]
    input_hw = np.array(outputs[0].shape[1:3]) * 32
    per_sample = np.zeros(batch)
    for layer in range(num_layers):
        gh, gw = outputs[layer].shape[1:3]
        layer_anchors = anchors[(masks or MASKS[num_layers])[layer]]
        raw = outputs[layer].reshape(batch, gh, gw, 3, 5 + num_classes).astype(np.float64)
        target = y_true[layer].astype(np.float64)
        grid = np.stack(np.meshgrid(np.arange(gw), np.arange(gh)), -1)[:, :, None, :]  # (gh, gw, 1, 2) x,y
        pred_xy = (_sigmoid(raw[..., :2]) + grid) / [gw, gh]
        pred_wh = np.exp(raw[..., 2:4]) * layer_anchors / input_hw[::-1]
        for b in range(batch):
            obj = target[b, ..., 4:5]
            true_xy = target[b, ..., :2] * [gw, gh] - grid
            with np.errstate(divide="ignore"):
                true_wh = np.log(target[b, ..., 2:4] / layer_anchors * input_hw[::-1])
            true_wh = np.where(obj > 0, true_wh, 0.0)
            scale = 2 - target[b, ..., 2:3] * target[b, ..., 3:4]
            boxes = target[b][target[b, ..., 4] > 0][:, :4]
            pred_box = np.concatenate([pred_xy[b], pred_wh[b]], -1)
            best = _iou_xywh(pred_box, boxes).max(-1, keepdims=True) if len(boxes) else np.full(obj.shape, -np.inf)
            ignore = (best < ignore_thresh).astype(np.float64)
            xy = obj * scale * _bce_logits(true_xy, raw[b, ..., :2])
            wh = obj * scale * 0.5 * (true_wh - raw[b, ..., 2:4]) ** 2
            conf = _bce_logits(obj, raw[b, ..., 4:5])
            conf = obj * conf + (1 - obj) * conf * ignore
            cls = obj * _bce_logits(target[b, ..., 5:], raw[b, ..., 5:])
            per_sample[b] += xy.sum() + wh.sum() + conf.sum() + cls.sum()
    return per_sample


def _random_case(anchors, input_hw, num_classes, batch, seed, boxes_per_image=6, masks=None, iou_thresh=None):
    rng = np.random.default_rng(seed)
    num_layers = len(anchors) // 3
    h, w = input_hw
    boxes = np.zeros((batch, boxes_per_image, 5), np.float32)
    for b in range(batch):
        count = rng.integers(0, boxes_per_image + 1) if b else boxes_per_image  # sample 0 full, others vary (incl. 0)
        for t in range(count):
            bw, bh = rng.uniform(6, w * 0.9), rng.uniform(6, h * 0.9)
            x1, y1 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            boxes[b, t] = [x1, y1, x1 + bw, y1 + bh, rng.integers(num_classes)]
    y_true = preprocess_true_boxes(boxes, input_hw, anchors, num_classes, masks=masks, iou_thresh=iou_thresh)
    outputs = [
        rng.normal(0, 1.5, (batch, h // s, w // s, 3 * (5 + num_classes))).astype(np.float32)
        for s in (32, 16, 8)[:num_layers]
    ]
    return outputs, y_true


@pytest.mark.parametrize(
    "anchors, input_hw, seed",
    [(TINY_ANCHORS, (128, 96), 0), (FULL_ANCHORS, (96, 128), 1), (FULL_ANCHORS, (64, 64), 2)],
)
def test_loss_matches_numpy_per_sample_and_batch_mean(anchors, input_hw, seed):
    outputs, y_true = _random_case(anchors, input_hw, 3, batch=4, seed=seed)
    expected = numpy_loss(outputs, y_true, anchors, 3)
    got = yolo_loss([*outputs, *y_true], anchors, 3).numpy()
    assert got.shape == (4, 1)
    np.testing.assert_allclose(got[:, 0], expected, rtol=1e-5)
    # The original returns sum / batch: the mean of the per-sample losses.
    assert got.sum() / 4 == pytest.approx(expected.mean(), rel=1e-5)


def test_ignore_mask_changes_the_loss():
    outputs, y_true = _random_case(TINY_ANCHORS, (64, 64), 2, batch=2, seed=3)
    strict = yolo_loss([*outputs, *y_true], TINY_ANCHORS, 2, ignore_thresh=0.0).numpy()
    loose = yolo_loss([*outputs, *y_true], TINY_ANCHORS, 2, ignore_thresh=1.01).numpy()
    # ignore_thresh 0: every prediction overlapping a box is ignored -> less loss.
    assert (strict <= loose + 1e-6).all() and (strict < loose - 1e-3).any()
    np.testing.assert_allclose(loose[:, 0], numpy_loss(outputs, y_true, TINY_ANCHORS, 2, 1.01), rtol=1e-5)


def _logit(p):
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return np.log(p / (1 - p))


def test_perfect_prediction_has_near_zero_wh_and_class_loss_and_minimal_xy_loss():
    anchors, num_classes, h, w = TINY_ANCHORS, 2, 64, 64
    boxes = np.array([[[8, 4, 44, 50, 1], [30, 30, 62, 60, 0]]], np.float32)
    y_true = preprocess_true_boxes(boxes, (h, w), anchors, num_classes)
    outputs = []
    for layer, target in enumerate(y_true):
        gh, gw = target.shape[1:3]
        grid = np.stack(np.meshgrid(np.arange(gw), np.arange(gh)), -1)[:, :, None, :]
        raw = np.zeros(target.shape, np.float32)
        obj = target[..., 4:5] > 0
        xy_offset = target[..., :2] * [gw, gh] - grid
        with np.errstate(divide="ignore"):
            wh = np.log(target[..., 2:4] / anchors[MASKS[2][layer]] * [w, h])
        raw[..., :2] = np.where(obj, _logit(xy_offset), 0)
        raw[..., 2:4] = np.where(obj, wh, 0)
        raw[..., 4] = np.where(obj[..., 0], 20.0, -20.0)
        raw[..., 5:] = np.where(target[..., 5:] > 0, 20.0, -20.0)
        outputs.append(raw.reshape(1, gh, gw, -1))
    assert sum(t[..., 4].sum() for t in y_true) >= 2
    terms = {k: float(v.numpy()[0]) for k, v in yolo_loss_terms([*outputs, *y_true], anchors, num_classes).items()}
    assert terms["wh"] < 1e-6
    assert terms["class"] < 1e-6
    assert terms["confidence"] < 1e-5
    # Binary cross-entropy against soft targets bottoms out at their entropy.
    entropy = 0.0
    for target in y_true:
        gh, gw = target.shape[1:3]
        grid = np.stack(np.meshgrid(np.arange(gw), np.arange(gh)), -1)[:, :, None, :]
        t = (target[..., :2] * [gw, gh] - grid)[target[..., 4] > 0]
        scale = (2 - target[..., 2] * target[..., 3])[target[..., 4] > 0][:, None]
        entropy += float((scale * -(t * np.log(t) + (1 - t) * np.log(1 - t))).sum())
    assert terms["xy"] == pytest.approx(entropy, rel=1e-4)


def test_totalloss_returns_per_sample_values():
    y_pred = tf.constant([[1.0], [2.0], [4.0]])
    got = totalloss(tf.zeros((3, 1)), y_pred)
    assert got.shape == (3,)
    np.testing.assert_array_equal(got.numpy(), [1.0, 2.0, 4.0])


def test_loss_with_cfg_masks_matches_numpy():
    masks = [[3, 4, 5], [0, 1, 2]]
    outputs, y_true = _random_case(TINY_ANCHORS, (96, 96), 2, batch=3, seed=4, masks=masks)
    expected = numpy_loss(outputs, y_true, TINY_ANCHORS, 2, masks=masks)
    layer = YoloLoss(TINY_ANCHORS, 2, masks=masks)
    clone = keras.layers.deserialize(keras.layers.serialize(layer))
    assert clone.masks == masks
    np.testing.assert_allclose(clone([*outputs, *y_true]).numpy()[:, 0], expected, rtol=1e-5)
    # The default masks give a different loss on the same tensors.
    assert not np.allclose(yolo_loss([*outputs, *y_true], TINY_ANCHORS, 2).numpy()[:, 0], expected, rtol=1e-3)


def test_yolo_loss_layer_config_round_trip():
    layer = YoloLoss(TINY_ANCHORS, 2, ignore_thresh=0.6, name="yolo_loss")
    clone = keras.layers.deserialize(keras.layers.serialize(layer))
    assert isinstance(clone, YoloLoss)
    np.testing.assert_array_equal(clone.anchors, TINY_ANCHORS)
    assert (clone.num_classes, clone.ignore_thresh, clone.max_true_boxes, clone.name) == (2, 0.6, None, "yolo_loss")
    outputs, y_true = _random_case(TINY_ANCHORS, (64, 64), 2, batch=2, seed=5)
    np.testing.assert_allclose(layer([*outputs, *y_true]).numpy(), clone([*outputs, *y_true]).numpy(), rtol=1e-6)
    assert keras.losses.get(keras.losses.serialize(totalloss)) is totalloss


@pytest.mark.parametrize("anchors, input_hw", [(TINY_ANCHORS, (64, 96)), (FULL_ANCHORS, (96, 64))])
def test_static_ignore_mask_equals_ragged_and_compiles_with_xla(anchors, input_hw):
    outputs, y_true = _random_case(anchors, input_hw, 2, batch=3, seed=7, boxes_per_image=6)
    ragged = yolo_loss([*outputs, *y_true], anchors, 2).numpy()
    static = yolo_loss([*outputs, *y_true], anchors, 2, max_true_boxes=6).numpy()
    np.testing.assert_allclose(static, ragged, rtol=1e-6)
    compiled = tf.function(lambda *args: yolo_loss(list(args), anchors, 2, max_true_boxes=6), jit_compile=True)
    np.testing.assert_allclose(compiled(*outputs, *y_true).numpy(), ragged, rtol=1e-5)
    # Too small a K misses boxes and changes the loss: the bound matters.
    fewer = yolo_loss([*outputs, *y_true], anchors, 2, max_true_boxes=1).numpy()
    assert not np.allclose(fewer, ragged, rtol=1e-6)


def test_xla_bound_on_true_boxes_holds_with_darknet_multi_anchor_targets():
    """train.py's max_true_boxes under --jit covers every cell --iou-thresh fills (a box fills up to 3 per scale)."""
    from keras_yolo_mgpu.model.boxes import MAX_BOXES, resolve_masks
    from keras_yolo_mgpu.training.model_settings import _target_cells_bound

    case = dict(batch=2, seed=3, boxes_per_image=MAX_BOXES, iou_thresh=0.213)
    outputs, y_true = _random_case(TINY_ANCHORS, (256, 256), 2, **case)
    cells = max(int(y[b, ..., 4].sum()) for y in y_true for b in range(2))
    assert cells > MAX_BOXES  # the best-anchor bound would drop true boxes here
    bound = _target_cells_bound(0.213, resolve_masks(None, 6))
    assert bound >= cells and _target_cells_bound(None, resolve_masks(None, 6)) == MAX_BOXES
    ragged = yolo_loss([*outputs, *y_true], TINY_ANCHORS, 2).numpy()
    static = yolo_loss([*outputs, *y_true], TINY_ANCHORS, 2, max_true_boxes=bound).numpy()
    np.testing.assert_allclose(static, ragged, rtol=1e-6)


def test_keras_yolo3_reference_loss_is_the_original_scalar():
    """The benchmark's keras-yolo3 baseline computes keras-yolo3's loss: the batch mean of the formula."""
    pytest.importorskip("tf_keras")
    from keras_yolo3_model import scalar_yolo_loss

    for anchors, input_hw, seed in [(TINY_ANCHORS, (64, 96), 8), (FULL_ANCHORS, (64, 64), 9)]:
        outputs, y_true = _random_case(anchors, input_hw, 3, batch=3, seed=seed)
        got = float(scalar_yolo_loss([*outputs, *y_true], anchors, 3))
        assert got == pytest.approx(numpy_loss(outputs, y_true, anchors, 3).mean(), rel=1e-5)


def test_unbounded_ignore_mask_opts_out_of_automatic_xla():
    # Keras's jit_compile="auto" turns XLA on for a single GPU; the exact
    # (ragged) ignore mask cannot compile, so the layer must say so.
    assert YoloLoss(TINY_ANCHORS, 2).supports_jit is False
    assert YoloLoss(TINY_ANCHORS, 2, max_true_boxes=20).supports_jit is True
