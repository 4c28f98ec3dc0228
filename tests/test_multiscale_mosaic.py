"""Multi-scale batches and mosaic elements: sizes, boxes, determinism, one trace for all sizes."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras_yolo3_targets import dense_inputs

from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.host import NEUTRAL_HSV, HostBatches, element_seeds
from keras_yolo_mgpu.data.images import read_image
from keras_yolo_mgpu.data.letterbox import letterbox_array
from keras_yolo_mgpu.data.mosaic import draw_mosaics
from keras_yolo_mgpu.data.multiscale import BLOCK_STEPS, rescale_batch, size_of_batch, sizes_of_batches
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
from keras_yolo_mgpu.data.tf_dataset import make_dataset
from keras_yolo_mgpu.resources import default_anchors_path, get_anchors

ANCHORS = get_anchors(default_anchors_path(True))


@pytest.fixture(scope="module")
def annotations(tmp_path_factory):
    paths = make_synthetic_dataset(tmp_path_factory.mktemp("data"), num_train=8, num_val=2, image_size=64, seed=0)
    return read_annotations(paths.train)


def test_sizes_change_every_ten_steps_within_the_range_from_the_seed_alone():
    sizes = sizes_of_batches(5, 20 * BLOCK_STEPS, (64, 192))
    blocks = [sizes[i : i + BLOCK_STEPS] for i in range(0, len(sizes), BLOCK_STEPS)]
    assert all(len(set(block)) == 1 for block in blocks)
    assert set(sizes) <= {64, 96, 128, 160, 192} and len(set(sizes)) >= 4
    assert sizes == sizes_of_batches(5, 20 * BLOCK_STEPS, (64, 192))
    assert sizes != sizes_of_batches(6, 20 * BLOCK_STEPS, (64, 192))
    # The draws TensorFlow's stateless generator made (the tf.data pipeline's before 2026-11-26).
    base = tf.random.experimental.stateless_fold_in(tf.constant([5, 0], tf.int64), 3)
    for batch_number in (0, 10, 95, 10**6):
        block = tf.random.experimental.stateless_fold_in(base, tf.constant(batch_number // BLOCK_STEPS, tf.int64))
        expected = tf.random.stateless_uniform([], block, minval=2, maxval=7, dtype=tf.int32) * 32
        assert size_of_batch(5, batch_number, (64, 192)) == int(expected)


def test_rescaled_batch_scales_boxes_and_drops_those_under_a_pixel():
    images = np.zeros([1, 64, 64, 3], np.uint8)
    images[:, :, ::2] = 200  # stripes of 200 and 0 average to 100
    boxes = np.array([[[8, 8, 40, 24, 1], [0, 0, 1.5, 10, 0], [0, 0, 0, 0, 0]]], np.float32)
    small, scaled = rescale_batch(images, boxes, 32)
    assert small.shape == (1, 32, 32, 3) and small.dtype == np.uint8 and (small == 100).all()
    np.testing.assert_array_equal(scaled[0], [[4, 4, 20, 12, 1], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]])


def test_multi_scale_dataset_makes_each_batch_and_its_targets_at_its_steps_size(annotations):
    dataset = make_dataset(annotations, (64, 64), ANCHORS, 4, 4, training=True, seed=1, multi_scale=(32, 96))
    expected = sizes_of_batches(1, 2 * BLOCK_STEPS + 1, (32, 96))
    for size, (x, _) in zip(expected, dataset.take(len(expected))):
        x = dense_inputs(x, ANCHORS, 4)
        assert x["image"].shape[1:3] == (size, size)
        assert x["y_true_0"].shape[1:3] == (size // 32, size // 32)
        assert x["y_true_1"].shape[1:3] == (size // 16, size // 16)
        assert x["image"].max() <= 1.0


def test_mosaic_tiles_hold_their_images_boxes(annotations):
    host = HostBatches(annotations, (64, 64), 4, 4, training=True, seed=0, augment=False, mosaic=1.0)
    (draws,) = draw_mosaics(element_seeds(0, [3]), [2], 1.0, host.num_samples)
    assert draws.indices[0] == 2 and draws.tile_seeds.shape == (4, 2)
    image, hsv = np.empty((64, 64, 3), np.uint8), np.empty((4, 3))
    boxes = host.mosaic_of_four(draws, image, hsv)
    assert (hsv == NEUTRAL_HSV).all()  # letterboxed tiles: nothing to jitter
    real = boxes[boxes[:, 2] > boxes[:, 0]]
    # The top-left tile is image 2 letterboxed into 32 x 32: its boxes, halved (64 px images).
    top_left = annotations[2].boxes.astype(np.float32)
    expected = np.concatenate([top_left[:, :4] / 2, top_left[:, 4:]], axis=1)
    in_top_left = real[(real[:, 2] <= 32) & (real[:, 3] <= 32)]
    for row in expected:
        assert np.any(np.all(np.abs(in_top_left - row) < 1e-4, axis=1)), (row, in_top_left)
    # Every box lies inside one tile.
    for x1, y1, x2, y2, _ in real:
        assert (x2 <= 32 or x1 >= 32) and (y2 <= 32 or y1 >= 32)
    # Its pixels are the project's one letterbox (the pipeline's and validation's) on a 32 x 32 canvas.
    expected_pixels = letterbox_array(read_image(annotations[2].image_path), (32, 32))
    np.testing.assert_array_equal(image[:32, :32], expected_pixels)
    again, again_hsv = np.empty_like(image), np.empty_like(hsv)
    np.testing.assert_array_equal(host.mosaic_of_four(draws, again, again_hsv), boxes)
    np.testing.assert_array_equal(image, again)
    # Augmented tiles each keep their own HSV draw, for the device to apply per quadrant.
    augmented = HostBatches(annotations, (64, 64), 4, 4, training=True, seed=0, mosaic=1.0)
    augmented.mosaic_of_four(draws, image, hsv)
    assert len({tuple(row) for row in hsv}) == 4


def test_mosaic_probability_zero_is_the_plain_stream_and_one_changes_every_element(annotations):
    def first_images(mosaic):
        dataset = make_dataset(annotations, (64, 64), ANCHORS, 4, 4, training=True, seed=2, mosaic=mosaic)
        return [x["image"].numpy() for x, _ in dataset.take(1)]

    plain, none, every = first_images(0.0), first_images(1e-9), first_images(1.0)
    for a, b, c in zip(plain, none, every):
        np.testing.assert_array_equal(a, b)
        assert all(not np.array_equal(a[i], c[i]) for i in range(len(a)))


@pytest.mark.slow
def test_keras_traces_the_train_step_at_most_once_per_size_on_two_replicas(annotations, logical_cpus):
    """The train function is traced for the dataset's (None, None) spec, not once per size."""
    from keras_yolo_mgpu.backend.tensorflow.distribution import make_strategy
    from keras_yolo_mgpu.model.loss import totalloss
    from keras_yolo_mgpu.training.training_model import create_model

    traces = []

    def counting_loss(y_true, y_pred):
        traces.append(y_pred.shape)  # Python runs only while tracing, once per replica
        return totalloss(y_true, y_pred)

    strategy = make_strategy(logical_cpus[:2])
    with strategy.scope():
        _, model = create_model((None, None), ANCHORS, 4, freeze_body=2, sync_bn=True, device_inputs=True)
        model.compile(optimizer=keras.optimizers.SGD(1e-4), loss=counting_loss)
    dataset = make_dataset(annotations, (64, 64), ANCHORS, 4, 2, training=True, seed=1, multi_scale=(32, 96))
    steps = 3 * BLOCK_STEPS
    sizes = set(sizes_of_batches(1, steps, (32, 96)))
    assert len(sizes) >= 2
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
    assert 1 <= len(traces) / 2 <= len(sizes)
