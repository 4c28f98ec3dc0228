"""The device's part of the input pipeline on TensorFlow: targets bitwise, HSV as OpenCV, the layer.

The targets are compared with keras-yolo3's numpy (keras_yolo3_targets.py).
The same functions on JAX (under `jax.jit`, 1 and 4 devices) are checked by
tests/jax_input_checks.py, run from tests/test_host_pipeline.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hsv_reference import opencv_hsv
from jax_input_checks import random_boxes
from keras_yolo3_targets import preprocess_true_boxes

from keras_yolo_mgpu.data.device_side import DeviceInputs, build_targets, distort_hsv, to_float
from keras_yolo_mgpu.resources import get_anchors, model_data_path

FULL_ANCHORS = get_anchors(model_data_path("yolo_anchors.txt"))
TINY_ANCHORS = get_anchors(model_data_path("tiny_yolo_anchors.txt"))


@pytest.mark.parametrize("anchors", [FULL_ANCHORS, TINY_ANCHORS], ids=["full", "tiny"])
@pytest.mark.parametrize("shape", [(416, 416), (320, 480), (64, 96)])
def test_targets_equal_preprocess_true_boxes_bitwise(anchors, shape):
    rng = np.random.default_rng(sum(shape) + len(anchors))
    boxes = random_boxes(rng, 8, 40, shape, 5)
    masks = [[6, 7, 8], [0, 1, 2], [3, 4, 5]] if len(anchors) == 9 else [[3, 4, 5], [0, 1, 2]]
    for options in ({}, {"iou_thresh": 0.213}, {"iou_thresh": 0.5}, {"masks": masks}):
        expected = preprocess_true_boxes(boxes, shape, anchors, 5, **options)

        def targets(boxes, options=options):
            return build_targets(boxes, shape, anchors, 5, **options)

        # XLA compiles x / constant to x * (1 / constant): checked once per shape (compiling costs seconds).
        runs = (targets, tf.function(targets, jit_compile=True)) if not options else (targets,)
        for run in runs:
            got = run(boxes)
            assert len(got) == len(expected) == len(anchors) // 3
            for e, g in zip(expected, got, strict=True):
                assert g.dtype == tf.float32 and tuple(g.shape) == e.shape
                np.testing.assert_array_equal(g, e)
    assert sum(e[..., 4].sum() for e in preprocess_true_boxes(boxes, shape, anchors, 5)) > 20  # boxes did land


def test_targets_quirks_last_box_wins_class_bits_tiny_anchors():
    # Centres (105, 106) and (106, 106): cell (13, 13) of the stride-8 grid, anchor 0 for both.
    boxes = np.array([[[100, 100, 111, 113, 0], [101, 101, 112, 112, 1], [0, 0, 0, 0, 0]]], np.float32)
    y_true = [np.asarray(t) for t in build_targets(boxes, (416, 416), FULL_ANCHORS, 3)]
    cell = y_true[2][0, 13, 13, 0]
    np.testing.assert_allclose(cell[:4], [106 / 416, 106 / 416, 11 / 416, 11 / 416], rtol=1e-6)
    np.testing.assert_array_equal(cell[4:], [1, 1, 1, 0])
    assert sum(t[..., 4].sum() for t in y_true) == 1
    small = np.array([[[100, 100, 110, 114, 0]]], np.float32)  # best anchor 0: in no tiny mask
    assert all(not np.asarray(t).any() for t in build_targets(small, (416, 416), TINY_ANCHORS, 1))
    mid = np.array([[[100, 100, 181, 182, 0]]], np.float32)  # best anchor 3: in both tiny masks
    y_true = build_targets(mid, (416, 416), TINY_ANCHORS, 1)
    assert np.asarray(y_true[0])[..., 0, 4].sum() == 1 and np.asarray(y_true[1])[..., 2, 4].sum() == 1


def test_targets_with_dynamic_input_size_on_tensorflow():
    """Multi-scale: (height, width) as tensors, the grids as large as the batch's size."""
    rng = np.random.default_rng(3)
    boxes = random_boxes(rng, 4, 20, (96, 96), 3)

    @tf.function(input_signature=[tf.TensorSpec([None, None, 5]), tf.TensorSpec([], tf.int32)])
    def targets(boxes, size):
        return build_targets(boxes, (size, size), TINY_ANCHORS, 3)

    for size in (96, 64):
        scaled = boxes * np.array([size / 96] * 4 + [1], np.float32)
        for e, g in zip(preprocess_true_boxes(scaled, (size, size), TINY_ANCHORS, 3), targets(scaled, size)):
            np.testing.assert_array_equal(g, e)
    assert targets.experimental_get_tracing_count() == 1


@pytest.mark.parametrize(
    "hue, sat, val", [(0.1, 1.5, 1.5), (-0.1, 1 / 1.5, 1 / 1.5), (-0.03, 1.2, 0.7), (0.0, 1.0, 1.0)]
)
def test_hsv_jitter_matches_opencv_and_keras_yolo3s_matplotlib(hue, sat, val):
    from matplotlib.colors import hsv_to_rgb, rgb_to_hsv

    image = np.random.default_rng(5).integers(0, 256, (1, 32, 48, 3), dtype=np.uint8)
    image[0, 0, :3] = [[0, 0, 0], [255, 255, 255], [128, 128, 128]]  # hue-less pixels
    got = np.asarray(distort_hsv(image, np.tile(np.float32([hue, sat, val]), (1, 4))))[0]
    if (hue, sat, val) == (0.0, 1.0, 1.0):  # neutral: the image itself, exactly
        np.testing.assert_array_equal(got, image[0] / np.float32(255))
        return
    np.testing.assert_allclose(got, opencv_hsv(image[0], hue, sat, val), atol=2e-6, rtol=0)
    x = rgb_to_hsv(image[0] / 255.0)  # keras-yolo3's code, verbatim in effect
    x[..., 0] += hue
    x[..., 0][x[..., 0] > 1] -= 1
    x[..., 0][x[..., 0] < 0] += 1
    x[..., 1] *= sat
    x[..., 2] *= val
    np.testing.assert_allclose(got, hsv_to_rgb(np.clip(x, 0, 1)), atol=3e-6, rtol=0)


def test_hsv_draws_apply_per_quadrant():
    image = np.random.default_rng(1).integers(0, 256, (1, 32, 48, 3), dtype=np.uint8)
    draws = np.float32([[0.1, 1.5, 1.5], [-0.1, 0.7, 0.8], [0.0, 1.0, 1.0], [0.05, 1.2, 1.0]])
    got = np.asarray(distort_hsv(image, draws.reshape(1, 12)))[0]
    for position, draw in enumerate(draws):
        row, column = divmod(position, 2)
        window = np.s_[row * 16 : (row + 1) * 16, column * 24 : (column + 1) * 24]
        expected = opencv_hsv(image[0][window], *draw) if position != 2 else image[0][window] / np.float32(255)
        np.testing.assert_allclose(got[window], expected, atol=2e-6, rtol=0)


def test_to_float_is_numpys_division_by_255():
    levels = np.arange(256, dtype=np.uint8).reshape(16, 16, 1)
    np.testing.assert_array_equal(to_float(levels), levels / np.float32(255))
    np.testing.assert_array_equal(tf.function(to_float, jit_compile=True)(levels), levels / np.float32(255))


def test_device_inputs_layer_in_a_model_round_trips_through_a_keras_file(tmp_path):
    inputs = {
        "image": keras.Input((64, 64, 3), dtype="uint8", name="image"),
        "boxes": keras.Input((20, 5), name="boxes"),
        "hsv": keras.Input((12,), name="hsv"),
    }
    image, y_true = DeviceInputs(FULL_ANCHORS, 3, iou_thresh=0.5, name="device_inputs")(inputs)
    assert image.shape == (None, 64, 64, 3) and [t.shape for t in y_true] == [
        (None, 2, 2, 3, 8),
        (None, 4, 4, 3, 8),
        (None, 8, 8, 3, 8),
    ]
    model = keras.Model(inputs, [image, *y_true])
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)  # safe mode: a registered layer, no lambda
    layer = loaded.get_layer("device_inputs")
    assert isinstance(layer, DeviceInputs) and layer.iou_thresh == 0.5 and layer.num_classes == 3
    rng = np.random.default_rng(0)
    batch = {
        "image": rng.integers(0, 256, (2, 64, 64, 3), dtype=np.uint8),
        "boxes": random_boxes(rng, 2, 20, (64, 64), 3),
        "hsv": np.tile(np.float32([0.05, 1.2, 0.8]), (2, 4)),
    }
    for a, b in zip(model.predict(batch, verbose=0), loaded.predict(batch, verbose=0), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="iou_thresh"):
        DeviceInputs(FULL_ANCHORS, 3, iou_thresh=1.5)


def test_device_inputs_under_mixed_precision_keeps_targets_float32_and_exact():
    rng = np.random.default_rng(2)
    batch = {
        "image": rng.integers(0, 256, (2, 64, 64, 3), dtype=np.uint8),
        "boxes": random_boxes(rng, 2, 20, (64, 64), 3),
        "hsv": np.tile(np.float32([0.05, 1.2, 0.8]), (2, 4)),
    }
    image, y_true = DeviceInputs(TINY_ANCHORS, 3, dtype="mixed_float16")(batch)
    assert image.dtype == tf.float16 and all(t.dtype == tf.float32 for t in y_true)
    for e, g in zip(preprocess_true_boxes(batch["boxes"], (64, 64), TINY_ANCHORS, 3), y_true, strict=True):
        np.testing.assert_array_equal(g, e)


def test_keras_yolo3s_public_name_is_the_same_targets_in_numpy():
    import keras_yolo_mgpu

    rng = np.random.default_rng(4)
    boxes = random_boxes(rng, 4, 20, (64, 96), 3)
    got = keras_yolo_mgpu.preprocess_true_boxes(boxes, (64, 96), TINY_ANCHORS, 3, iou_thresh=0.213)
    expected = preprocess_true_boxes(boxes, (64, 96), TINY_ANCHORS, 3, iou_thresh=0.213)
    for e, g in zip(expected, got, strict=True):
        assert isinstance(g, np.ndarray) and g.dtype == np.float32
        np.testing.assert_array_equal(g, e)
    with pytest.raises(ValueError, match=r"\(N, T, 5\)"):
        keras_yolo_mgpu.preprocess_true_boxes(boxes[0], (64, 96), TINY_ANCHORS, 3)
