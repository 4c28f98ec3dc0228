"""The input pipeline (tf.data over the host's batches): augmentation, batching, targets, weights, robustness.

The targets themselves are `data.device_side`'s (tests/test_device_side.py);
here they are read from the stream through `DeviceInputs`, as training does.
"""

import io
import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from hsv_reference import opencv_hsv
from keras_yolo3_generator import get_random_data
from keras_yolo3_targets import dense_inputs, preprocess_true_boxes
from PIL import Image

from keras_yolo_mgpu.data.annotations import Annotation, format_annotation_line, parse_annotation_line, read_annotations
from keras_yolo_mgpu.data.augment import (
    augment_boxes,
    augmentation_params,
    box_orders,
    sample_augmentation,
)
from keras_yolo_mgpu.data.device_side import DeviceInputs
from keras_yolo_mgpu.data.host import NEUTRAL_HSV, HostBatches, element_seeds
from keras_yolo_mgpu.data.images import read_image
from keras_yolo_mgpu.data.letterbox import letterbox_array
from keras_yolo_mgpu.data.tf_dataset import make_dataset, steps_per_epoch
from keras_yolo_mgpu.resources import get_anchors, model_data_path

FULL_ANCHORS = get_anchors(model_data_path("yolo_anchors.txt"))
TINY_ANCHORS = get_anchors(model_data_path("tiny_yolo_anchors.txt"))


def _photo(width, height, seed):
    """A smooth, photo-like RGB image (gradients and blobs, mild noise)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width] / max(width, height)
    channels = [
        127 + 100 * np.sin(rng.uniform(2, 9) * xx + rng.uniform(0, 6)) * np.cos(rng.uniform(2, 9) * yy)
        for _ in range(3)
    ]
    pixels = np.stack(channels, axis=-1) + rng.normal(0, 3, (height, width, 3))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _write_dataset(folder, sizes, num_classes=2, seed=0, ext="png"):
    """Images of the given (w, h) with 1-3 boxes each; returns the annotation file path."""
    rng = np.random.default_rng(seed)
    lines = []
    for index, (w, h) in enumerate(sizes):
        name = f"img{index}.{ext}"
        Image.fromarray(_photo(w, h, seed * 100 + index)).save(os.path.join(folder, name))
        boxes = []
        for _ in range(rng.integers(1, 4)):
            x1, y1 = rng.integers(0, w // 2), rng.integers(0, h // 2)
            boxes.append(
                [x1, y1, x1 + rng.integers(4, w // 2), y1 + rng.integers(4, h // 2), rng.integers(0, num_classes)]
            )
        lines.append(format_annotation_line(name, boxes))
    path = os.path.join(folder, "train.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


# --- augmentation -------------------------------------------------------------------


@pytest.mark.parametrize("ext", ["png", "jpg"])
def test_training_images_follow_keras_yolo3_draw_for_draw(tmp_path, ext):
    """The pipeline's random numbers fed to the reference generator give nearly the same images."""
    path = tmp_path / f"photo.{ext}"
    Image.fromarray(_photo(160, 120, 0)).save(path, quality=95)
    annotation = parse_annotation_line(f"{path} 10,20,60,90,0")
    dataset = make_dataset([annotation], (64, 96), TINY_ANCHORS, 1, 10, training=True, seed=3)
    images = np.concatenate([dense_inputs(x, TINY_ANCHORS, 1)["image"] for x, _ in dataset.take(3)])
    mean_errors = []
    for position, image in enumerate(images):
        # The element's draws as TensorFlow's stateless generator makes them (made in numpy by the pipeline).
        seed = tf.constant(element_seeds(3, position))
        uniforms = tf.random.stateless_uniform([11], seed, dtype=tf.float64).numpy()
        feed = list(uniforms)

        def rand(a=0.0, b=1.0):
            return feed.pop(0) * (b - a) + a

        reference, _ = get_random_data(annotation, (64, 96), rand=rand, shuffle=lambda boxes: None)
        assert not feed  # keras-yolo3 drew exactly 11 numbers, in this order
        # Area/bilinear resampling in uint8 instead of PIL's bicubic, float32 HSV:
        # close (measured: mean 0.3/255, worst pixel 5/255), not bitwise.
        error = np.abs(image - reference)
        assert error.max() < 10 / 255 and error.mean() < 1 / 255, position
        mean_errors.append(error.mean())
    assert np.mean(mean_errors) < 0.5 / 255


def test_boxes_follow_keras_yolo3_draw_for_draw():
    annotation = parse_annotation_line("/photo.png 10,20,60,90,0 100,5,150,50,1 0,0,159,119,2 60,60,70,70,3")
    rng = np.random.default_rng(0)
    for trial in range(60):
        uniforms = rng.random(11)
        feed = list(uniforms)

        def rand(a=0.0, b=1.0):
            return feed.pop(0) * (b - a) + a

        params = augmentation_params(uniforms, (64, 96))
        ref_boxes = _reference_boxes(annotation, (160, 120), (64, 96), rand)
        order = box_orders(np.array([[0, trial]]), [4])[0]
        boxes = augment_boxes(annotation.boxes, (160, 120), params, (64, 96), 20, order)
        boxes, ref_boxes = boxes[boxes[:, 2] > 0], ref_boxes[ref_boxes[:, 2] > 0]
        # keras-yolo3 truncates to integers; boxes near the 1 px limit may differ.
        ours = {int(c): b for *b, c in boxes}
        theirs = {int(c): b for *b, c in ref_boxes}
        for c in set(ours) & set(theirs):
            np.testing.assert_allclose(ours[c], theirs[c], atol=1.0)
        assert len(set(ours) ^ set(theirs)) <= 1


def _reference_boxes(annotation, image_size, input_shape, rand):
    """keras-yolo3's box arithmetic for the given draws (no image needed)."""
    import keras_yolo3_generator as reference

    class FakeImage:
        size = image_size

        def convert(self, mode):
            return self

        def resize(self, size, method):
            return Image.new("RGB", size)

    original_open = reference.Image.open
    reference.Image.open = lambda path: FakeImage()
    try:
        return reference.get_random_data(annotation, input_shape, rand=rand, shuffle=lambda boxes: None)[1]
    finally:
        reference.Image.open = original_open


@pytest.mark.parametrize(
    "hue, sat, val", [(0.1, 1.5, 1.5), (-0.1, 1 / 1.5, 1 / 1.5), (-0.03, 1.2, 0.7), (0.0, 1.0, 1.0)]
)
def test_hsv_jitter_matches_matplotlib_float64(hue, sat, val):
    from matplotlib.colors import hsv_to_rgb, rgb_to_hsv

    image = np.random.default_rng(5).integers(0, 256, (32, 48, 3), dtype=np.uint8)
    image[0, :3] = [[0, 0, 0], [255, 255, 255], [128, 128, 128]]  # hue-less pixels
    x = rgb_to_hsv(image / 255.0)  # keras-yolo3's code, verbatim in effect
    x[..., 0] += hue
    x[..., 0][x[..., 0] > 1] -= 1
    x[..., 0][x[..., 0] < 0] += 1
    x[..., 1] *= sat
    x[..., 2] *= val
    x = np.clip(x, 0, 1)
    np.testing.assert_allclose(opencv_hsv(image, hue, sat, val), hsv_to_rgb(x), atol=2e-6)


def test_sampled_parameters_cover_keras_yolo3_ranges():
    p = sample_augmentation(np.stack([np.full(2000, 7), np.arange(2000)], axis=-1), (416, 416))
    assert 0.45 < p["flip"].mean() < 0.55
    assert -0.1 <= p["hue"].min() < -0.09 and 0.09 < p["hue"].max() <= 0.1
    for key in ("sat", "val"):
        assert 1 / 1.5 <= p[key].min() < 0.7 and 1.45 < p[key].max() <= 1.5
        assert 0.45 < (p[key] > 1).mean() < 0.55
    longest = np.maximum(p["nw"], p["nh"])
    assert longest.min() >= int(0.25 * 416) - 1 and longest.max() <= 2 * 416
    for offset, size in (("dx", "nw"), ("dy", "nh")):  # int(U(0, 416 - size)): either side of 0
        slack = 416 - p[size]
        assert ((np.minimum(slack, 0) <= p[offset]) & (p[offset] <= np.maximum(slack, 0))).all()
        assert (p[offset] < 0).any() and (p[offset] > 0).any()


def _encode(pixels, fmt, mode=None, **options):
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode).save(buffer, fmt, **options)
    return buffer.getvalue()


def test_training_reads_every_format(tmp_path, caplog):
    """Pillow decodes every format (JPEGs at reduced scale); none is refused."""
    rgb = _photo(80, 60, 2)
    files = {
        "a.jpg": _encode(rgb, "JPEG"),
        "b.png": _encode(rgb, "PNG"),
        "c.png": _encode(rgb[..., 1].astype(np.uint16) * 257, "PNG"),  # 16-bit grey
        "d.jpg": _encode(np.dstack([rgb, rgb[..., :1]]), "JPEG", "CMYK"),
        "e.gif": _encode(rgb, "GIF"),
        "f.bmp": _encode(rgb, "BMP"),
        "g.png": _encode(np.dstack([rgb, rgb[..., :1]]), "PNG", "RGBA"),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    annotations = [parse_annotation_line(f"{tmp_path / name} 10,10,50,40,0") for name in files]
    dataset = make_dataset(annotations, (64, 64), TINY_ANCHORS, 1, 7, training=True, seed=0)
    with caplog.at_level(logging.WARNING):
        for x, _ in dataset.take(2).as_numpy_iterator():
            assert x["image"].shape == (7, 64, 64, 3) and x["image"].dtype == np.uint8
    assert not [r for r in caplog.records if "cannot read image" in r.getMessage()]


# --- the dataset --------------------------------------------------------------------


def test_steps_per_epoch():
    assert steps_per_epoch(10, 4) == 3 and steps_per_epoch(8, 4) == 2 and steps_per_epoch(1, 32) == 1
    with pytest.raises(ValueError):
        steps_per_epoch(0, 4)


def test_shuffled_passes_cover_every_image_and_equal_tfs_argsort(small_dataset):
    host = HostBatches(small_dataset, (64, 96), 2, 4, training=True, seed=3)
    stream = host.indices_at(np.arange(40)).tolist()
    passes = [stream[i : i + 10] for i in range(0, 40, 10)]
    assert all(sorted(p) == list(range(10)) for p in passes)
    assert len({tuple(p) for p in passes}) == 4  # reshuffled every pass
    again = HostBatches(small_dataset, (64, 96), 2, 4, training=True, seed=3)
    assert again.indices_at(np.arange(40)).tolist() == stream
    # Pass e is tf.argsort of stateless uniforms, as the tf.data stream drew it before
    # (ties, which 100k float32 uniforms have by the hundreds, fall the same way).
    shuffle_seed = tf.random.experimental.stateless_fold_in(tf.constant([3, 0], tf.int64), 1)
    for epoch, size in ((0, 10), (3, 10), (1, 100_000)):
        seed = tf.random.experimental.stateless_fold_in(shuffle_seed, tf.constant(epoch, tf.int64))
        expected = tf.argsort(tf.random.stateless_uniform([size], seed)).numpy()
        host.num_samples, host._permutations = size, {}
        np.testing.assert_array_equal(host._permutation(epoch), expected)


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    sizes = [(96, 64), (64, 96), (80, 80), (120, 60), (64, 64), (100, 70), (70, 100), (64, 48), (90, 90), (72, 96)]
    return read_annotations(_write_dataset(str(folder), sizes))


@pytest.mark.parametrize("anchors", [FULL_ANCHORS, TINY_ANCHORS], ids=["full", "tiny"])
def test_training_batches_structure_and_determinism(small_dataset, anchors):
    def first_batches(seed):
        dataset = make_dataset(small_dataset, (64, 96), anchors, 2, 4, training=True, seed=seed)
        return list(dataset.take(3).as_numpy_iterator())

    batches = first_batches(1)
    x, y = batches[0]
    layers = len(anchors) // 3
    assert sorted(x) == ["boxes", "hsv", "image"]
    assert x["image"].shape == (4, 64, 96, 3) and x["image"].dtype == np.uint8
    assert x["boxes"].shape == (4, 20, 5) and x["hsv"].shape == (4, 12)
    assert x["boxes"].dtype == x["hsv"].dtype == np.float32
    assert y.shape == (4, 1) and not y.any()
    assert all(b[0]["image"].shape[0] == 4 for b in batches)  # every batch full, past the end of a pass
    dense = [dense_inputs(b[0], anchors, 2) for b in batches]
    assert 0 <= dense[0]["image"].min() and dense[0]["image"].max() <= 1
    assert dense[0]["y_true_0"].shape == (4, 2, 3, 3, 7) and dense[0]["y_true_1"].shape == (4, 4, 6, 3, 7)
    if layers == 3:
        assert dense[0]["y_true_2"].shape == (4, 8, 12, 3, 7)
    assert sum(d[f"y_true_{i}"][..., 4].sum() for d in dense for i in range(layers)) > 0
    again = first_batches(1)
    for a, b in zip(batches, again):
        for key in a[0]:
            np.testing.assert_array_equal(a[0][key], b[0][key])
    other = first_batches(2)
    assert not np.array_equal(batches[0][0]["image"], other[0][0]["image"])


def test_host_steps_alone_compose_into_make_dataset(small_dataset):
    """Each step of HostBatches can be run by itself and gives what the whole pipeline gives."""
    host = HostBatches(small_dataset, (64, 96), 2, 4, training=True, seed=1)
    positions = host.positions(0)
    indices = host.indices_at(positions)
    assert positions.tolist() == [0, 1, 2, 3] and host.positions(2).tolist() == [8, 9, 10, 11]
    batch = next(iter(make_dataset(small_dataset, (64, 96), TINY_ANCHORS, 2, 4, training=True, seed=1)))[0]
    images = np.empty((4, 64, 96, 3), np.uint8)
    boxes, draws = host.elements(element_seeds(1, positions), indices, list(images), (64, 96))
    np.testing.assert_array_equal(images, batch["image"])
    np.testing.assert_array_equal(boxes, batch["boxes"])
    np.testing.assert_array_equal(np.tile(draws, 4).astype(np.float32), batch["hsv"])
    # Decoding alone: a PNG decoded at full size is the reader's image.
    pixels, size, extent = host.source.decode(0, (96, 64))
    np.testing.assert_array_equal(pixels, read_image(small_dataset[0].image_path))
    assert size == (96, 64) and extent.tolist() == [96, 64]
    # The letterbox step, and a padding element of the validation stream.
    image = np.empty((64, 96, 3), np.uint8)
    boxes, draw, ok = host.letterboxed(3, image)
    np.testing.assert_array_equal(image, letterbox_array(read_image(small_dataset[3].image_path), (64, 96)))
    assert boxes.shape == (20, 5) and ok and draw == NEUTRAL_HSV
    validation = HostBatches(small_dataset, (64, 96), 2, 4, training=False).batch(2)
    np.testing.assert_allclose(validation.weights, [1.2, 1.2, 0, 0])
    assert not validation.boxes[2:].any() and (validation.images[2:] == 128).all()
    assert (validation.hsv == np.tile(NEUTRAL_HSV, 4)).all()


def test_validation_letterboxes_in_order_pads_and_weights(small_dataset):
    dataset = make_dataset(small_dataset, (64, 96), TINY_ANCHORS, 2, 4, training=False)
    batches = list(dataset.as_numpy_iterator())
    assert len(batches) == 3  # ceil(10 / 4)
    images = np.concatenate([b[0]["image"] for b in batches])
    weights = np.concatenate([b[2] for b in batches])
    np.testing.assert_allclose(weights, [1.2] * 10 + [0, 0])  # 3 * 4 / 10
    assert (images[10:] == 128).all()
    for index, annotation in enumerate(small_dataset):
        # Exactly the detector's letterbox, never augmented.
        np.testing.assert_array_equal(images[index], letterbox_array(read_image(annotation.image_path), (64, 96)))
    assert all((b[0]["hsv"] == np.tile(NEUTRAL_HSV, 4)).all() for b in batches)  # the device changes nothing
    # Targets equal preprocess_true_boxes on the letterboxed boxes (keras-yolo3's box formula).
    boxes = np.zeros((12, 20, 5), np.float32)
    for index, annotation in enumerate(small_dataset):
        iw, ih = Image.open(annotation.image_path).size
        scale = min(96 / iw, 64 / ih)
        nw, nh = int(iw * scale), int(ih * scale)
        dx, dy = (96 - nw) // 2, (64 - nh) // 2
        b = annotation.boxes.copy()
        b[:, [0, 2]] = b[:, [0, 2]] * np.float32(scale) + dx
        b[:, [1, 3]] = b[:, [1, 3]] * np.float32(scale) + dy
        boxes[index, : len(b)] = b
    expected = preprocess_true_boxes(boxes, (64, 96), TINY_ANCHORS, 2)
    dense = [dense_inputs(b[0], TINY_ANCHORS, 2) for b in batches]
    for layer in range(2):
        got = np.concatenate([d[f"y_true_{layer}"] for d in dense])
        np.testing.assert_allclose(got, expected[layer], atol=1e-6)


def test_validation_weights_give_the_mean_over_real_samples_in_keras(small_dataset):
    """sum_over_batch_size per batch, averaged over batches == per-sample mean."""
    dataset = make_dataset(small_dataset, (64, 96), TINY_ANCHORS, 2, 4, training=False)
    inputs = {
        "image": keras.Input((64, 96, 3), dtype="uint8", name="image"),
        "boxes": keras.Input((20, 5), name="boxes"),
        "hsv": keras.Input((12,), name="hsv"),
    }
    # The per-sample "loss" is |mean pixel - 0.5|, known without Keras; near 0
    # for the grey padding, so counting the padding would lower the mean.
    image, _ = DeviceInputs(TINY_ANCHORS, 2)(inputs)
    per_sample = keras.layers.GlobalAveragePooling2D()(image)
    per_sample = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(1 / 3), use_bias=False)(
        per_sample
    )
    model = keras.Model(inputs, per_sample)
    model.compile(loss=lambda y_true, y_pred: keras.ops.abs(y_pred[:, 0] - 0.5))
    loss = model.evaluate(dataset, verbose=0)
    real_images = np.concatenate([b[0]["image"] for b in dataset.as_numpy_iterator()])[:10] / np.float32(255)
    assert loss == pytest.approx(np.abs(real_images.mean(axis=(1, 2, 3)) - 0.5).mean(), abs=1e-5)
    # Without weights the padding would count: the claim is not vacuous.
    unweighted = model.evaluate(dataset.map(lambda x, y, w: (x, y)), verbose=0)
    assert unweighted < loss * 0.9


def test_failed_decode_mid_run_warns_and_keeps_going(tmp_path, caplog):
    path = _write_dataset(str(tmp_path), [(64, 64)] * 5, ext="jpg")
    annotations = read_annotations(path)
    broken, corrupt = annotations[2].image_path, annotations[4].image_path
    dataset_train = make_dataset(annotations, (64, 64), TINY_ANCHORS, 2, 4, training=True, seed=0)
    dataset_val = make_dataset(annotations, (64, 64), TINY_ANCHORS, 2, 4, training=False)
    with open(broken, "r+b") as f:  # truncated after the datasets were made
        f.truncate(100)
    data = bytearray(open(corrupt, "rb").read())  # intact header and end, garbage scan data
    start = data.find(b"\xff\xda") + 40
    data[start:-2] = bytes((b * 31 + 7) % 256 for b in data[start:-2])
    open(corrupt, "wb").write(bytes(data))
    with caplog.at_level(logging.WARNING, logger="keras_yolo_mgpu.data.host"):
        train_batches = list(dataset_train.take(3).as_numpy_iterator())
        val_batches = list(dataset_val.as_numpy_iterator())
    assert len(train_batches) == 3
    for path in (broken, corrupt):
        warnings = [r.getMessage() for r in caplog.records if path in r.getMessage()]
        assert warnings and "cannot read image" in warnings[0]
        assert len(warnings) == 1  # once per file, not once per use
    weights = np.concatenate([b[2] for b in val_batches])
    np.testing.assert_allclose(weights, [1.6, 1.6, 0, 1.6, 0, 0, 0, 0])  # nothing dropped, bad ones weigh 0
    assert (val_batches[0][0]["image"][2] == 128).all()


@pytest.mark.parametrize("cache", ["ram", "disk"])
def test_cache_gives_the_same_validation_images(small_dataset, tmp_path, cache):
    cache = str(tmp_path / "cache") if cache == "disk" else cache
    plain = list(make_dataset(small_dataset, (64, 96), TINY_ANCHORS, 2, 4, training=False).as_numpy_iterator())
    for _ in range(2):  # the second pass reads the cache
        cached = list(
            make_dataset(small_dataset, (64, 96), TINY_ANCHORS, 2, 4, training=False, cache=cache).as_numpy_iterator()
        )
        for a, b in zip(plain, cached):
            np.testing.assert_array_equal(a[0]["image"], b[0]["image"])
            np.testing.assert_array_equal(a[0]["boxes"], b[0]["boxes"])
    if cache != "ram":
        assert len(os.listdir(cache)) == len(small_dataset)
    train = make_dataset(small_dataset, (64, 96), TINY_ANCHORS, 2, 4, training=True, seed=0, cache=cache)
    x, _ = next(iter(train))
    assert x["image"].shape == (4, 64, 96, 3)


@pytest.mark.parametrize("augment", [True, False], ids=["augmented", "letterboxed"])
def test_stream_started_at_a_position_continues_the_stream(small_dataset, augment):
    """A stream started at element p equals the full stream from p: a later stage or a resumed run continues it."""

    def images(batch_size, start, batches):
        dataset = make_dataset(
            small_dataset,
            (64, 96),
            TINY_ANCHORS,
            2,
            batch_size,
            training=True,
            augment=augment,
            seed=5,
            start_position=start,
        )
        return np.concatenate([b[0]["image"] for b in dataset.take(batches).as_numpy_iterator()])

    whole = images(3, 0, 6)  # 18 images: crosses the end of the first pass of 10
    # 7 is mid-pass, and the batch size changes as it does between stages.
    np.testing.assert_array_equal(images(2, 7, 4), whole[7:15])
    np.testing.assert_array_equal(images(4, 12, 1), whole[12:16])  # second pass
    with pytest.raises(ValueError, match="start_position"):
        make_dataset(small_dataset, (64, 96), TINY_ANCHORS, 2, 4, training=False, start_position=4)


def test_ram_cache_notices_a_changed_file(tmp_path):
    path = str(tmp_path / "image.png")
    Image.new("RGB", (64, 64), (255, 0, 0)).save(path)
    annotations = [Annotation(path, np.array([[8, 8, 40, 40, 0]], np.float32), "t.txt", 1)]

    def first_pixel():
        dataset = make_dataset(annotations, (64, 64), TINY_ANCHORS, 2, 1, training=False, cache="ram")
        return next(iter(dataset))[0]["image"][0, 32, 32].numpy()

    np.testing.assert_array_equal(first_pixel(), [255, 0, 0])
    Image.new("RGB", (64, 64), (0, 0, 255)).save(path)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))  # a coarse clock may not tick
    np.testing.assert_array_equal(first_pixel(), [0, 0, 255])


def test_training_without_augmentation_is_letterboxed(small_dataset):
    dataset = make_dataset(small_dataset, (64, 96), TINY_ANCHORS, 2, 10, training=True, augment=False, seed=0)
    images = next(iter(dataset))[0]["image"].numpy()
    expected = [letterbox_array(read_image(a.image_path), (64, 96)) for a in small_dataset]
    for image in images:  # a shuffled pass: each image is one of the letterboxed ones
        assert any(np.array_equal(image, e) for e in expected)


def test_bad_arguments_are_refused(small_dataset):
    bad_class = small_dataset[:1] + [Annotation("/x.jpg", np.array([[1, 2, 3, 4, 5]], np.float32), "t.txt", 9)]
    with pytest.raises(ValueError, match=r"^t.txt:9: class id 5 is out of range for 2 classes"):
        make_dataset(bad_class, (64, 96), TINY_ANCHORS, 2, 4, training=True)
    with pytest.raises(ValueError, match="multiples of 32"):
        make_dataset(small_dataset, (60, 96), TINY_ANCHORS, 2, 4, training=True)
    with pytest.raises(ValueError, match="empty"):
        make_dataset([], (64, 96), TINY_ANCHORS, 2, 4, training=True)


def test_distributed_batches_split_evenly_over_replicas(small_dataset, logical_cpus):
    strategy = tf.distribute.MirroredStrategy(logical_cpus[:4])
    for training in (True, False):
        dataset = make_dataset(small_dataset, (64, 96), TINY_ANCHORS, 2, 8, training=training, seed=0)
        element = next(iter(strategy.experimental_distribute_dataset(dataset)))
        images = strategy.experimental_local_results(element[0]["image"])
        assert [int(t.shape[0]) for t in images] == [2, 2, 2, 2]
        if not training:
            weights = strategy.experimental_local_results(element[2])
            assert [int(t.shape[0]) for t in weights] == [2, 2, 2, 2]
