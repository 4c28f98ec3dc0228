"""The YOLO detector, the decode/NMS layers and box drawing."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from inference_helpers import (
    CLASS_NAMES,
    INPUT_SHAPE,
    TINY_ANCHORS,
    TINY_ANCHORS_PATH,
    make_body,
    random_images,
    write_classes,
)
from PIL import Image, ImageOps

from keras_yolo_mgpu.data.images import read_image
from keras_yolo_mgpu.data.letterbox import letterbox_array
from keras_yolo_mgpu.inference.detector import YOLO, Detections
from keras_yolo_mgpu.inference.draw import class_colors, draw_detections
from keras_yolo_mgpu.inference.layers import YoloDecode, YoloNMS, build_inference_model
from keras_yolo_mgpu.model.boxes import yolo_eval

SCORE, IOU = 0.5, 0.45


@pytest.fixture(scope="module")
def body():
    return make_body()


@pytest.fixture(scope="module")
def files(tmp_path_factory, body):
    folder = tmp_path_factory.mktemp("detector")
    weights = str(folder / "tiny.weights.h5")
    body.save_weights(weights)
    return {"weights": weights, "classes": write_classes(folder / "classes.txt")}


@pytest.fixture(scope="module")
def yolo(body):
    return YOLO.from_body(
        body, TINY_ANCHORS, CLASS_NAMES, score=SCORE, iou=IOU, model_image_size=INPUT_SHAPE, batch_size=3
    )


def reference_detections(body, image_float, image_shape, max_boxes=20):
    """keras-yolo3's yolo_eval on one image: rows (x1, y1, x2, y2, score, class), sorted."""
    raw = body(image_float[None], training=False)
    boxes, scores, classes = yolo_eval(
        raw, TINY_ANCHORS, 2, image_shape, max_boxes=max_boxes, score_threshold=SCORE, iou_threshold=IOU
    )
    rows = np.concatenate([boxes.numpy()[:, [1, 0, 3, 2]], scores.numpy()[:, None], classes.numpy()[:, None]], axis=1)
    return rows[np.lexsort(rows.T[::-1])]


def as_rows(boxes, scores, classes):
    rows = np.concatenate(
        [np.asarray(boxes), np.asarray(scores)[:, None], np.asarray(classes, np.float32)[:, None]], axis=1
    )
    return rows[np.lexsort(rows.T[::-1])]


def assert_same_detections(found, expected) -> int:
    """Equal classes, boxes within 1e-3 px and scores within 1e-5, image by image; returns the boxes counted."""
    count = 0
    for a, b in zip(found, expected, strict=True):
        np.testing.assert_array_equal(a.classes, b.classes)
        np.testing.assert_allclose(a.boxes, b.boxes, rtol=0, atol=1e-3)
        np.testing.assert_allclose(a.scores, b.scores, rtol=0, atol=1e-5)
        count += a.num_boxes
    return count


# ---- the layers ------------------------------------------------------------------


@pytest.mark.parametrize("method", ["combined", "padded"])
def test_layers_match_yolo_eval(body, method):
    """Batched decoding + NMS select exactly what keras-yolo3's yolo_eval selects, image by image."""
    images = np.random.default_rng(1).random((3, *INPUT_SHAPE, 3), dtype=np.float32)
    shapes = np.array([[96, 128], [200, 300], [480, 100]], np.float32)
    model = build_inference_model(
        body,
        TINY_ANCHORS,
        2,
        input_shape=INPUT_SHAPE,
        score_threshold=SCORE,
        iou_threshold=IOU,
        max_boxes_per_class=20,
        max_detections=40,
        nms_method=method,
    )
    out = model([images, shapes])
    for i in range(3):
        expected = reference_detections(body, images[i], shapes[i])
        n = int(out["valid_detections"][i])
        assert n == len(expected) > 3
        got = as_rows(out["boxes"][i, :n], out["scores"][i, :n], out["classes"][i, :n])
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
        assert np.all(np.diff(np.asarray(out["scores"][i, :n])) <= 0)  # best first
        assert not np.any(np.asarray(out["boxes"][i, n:]))  # zero padding


def test_nms_keeps_the_best_max_detections(body):
    images = np.random.default_rng(2).random((2, *INPUT_SHAPE, 3), dtype=np.float32)
    shapes = np.array([[96, 128], [300, 200]], np.float32)
    full = build_inference_model(
        body, TINY_ANCHORS, 2, input_shape=INPUT_SHAPE, score_threshold=SCORE, max_detections=40
    )
    capped = build_inference_model(
        body, TINY_ANCHORS, 2, input_shape=INPUT_SHAPE, score_threshold=SCORE, max_detections=5, nms_method="padded"
    )
    a, b = full([images, shapes]), capped([images, shapes])
    assert b["boxes"].shape == (2, 5, 4)
    np.testing.assert_array_equal(b["valid_detections"], [5, 5])
    np.testing.assert_allclose(b["scores"], a["scores"][:, :5], atol=1e-6)
    np.testing.assert_allclose(b["boxes"], a["boxes"][:, :5], atol=1e-4)


def test_layers_serialize_and_saved_inference_model_reloads(body, tmp_path):
    decode = YoloDecode(TINY_ANCHORS, 2)
    nms = YoloNMS(max_detections=7, max_boxes_per_class=3, score_threshold=0.2, iou_threshold=0.6, method="padded")
    for layer in (decode, nms):
        clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
        assert type(clone) is type(layer) and clone.get_config() == layer.get_config()
    with pytest.raises(ValueError, match="method"):
        YoloNMS(method="soft")
    # Masks decide which anchors decode each scale: with the cfg's 0,1,2 the
    # fine scale's boxes scale by anchors 0..2 instead of 1..3.
    cfg_decode = YoloDecode(TINY_ANCHORS, 2, masks=[[3, 4, 5], [0, 1, 2]])
    assert keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(cfg_decode)).masks == [
        [3, 4, 5],
        [0, 1, 2],
    ]
    raw = [np.zeros((1, 2, 2, 21), np.float32), np.zeros((1, 4, 4, 21), np.float32)]
    shape = np.array([[64, 64]], np.float32)
    default_boxes, cfg_boxes = (np.asarray(d([*raw, shape])[0])[0] for d in (decode, cfg_decode))
    coarse = 2 * 2 * 3
    np.testing.assert_array_equal(cfg_boxes[:coarse], default_boxes[:coarse])
    width = lambda b: (b[:, 2] - b[:, 0]).reshape(-1, 3)  # noqa: E731  (cells, anchors)
    np.testing.assert_allclose(width(cfg_boxes[coarse:])[0], np.asarray(TINY_ANCHORS)[[0, 1, 2], 0], rtol=1e-5)
    np.testing.assert_allclose(width(default_boxes[coarse:])[0], np.asarray(TINY_ANCHORS)[[1, 2, 3], 0], rtol=1e-5)

    model = build_inference_model(body, TINY_ANCHORS, 2, input_shape=INPUT_SHAPE, score_threshold=SCORE)
    path = str(tmp_path / "inference.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)  # no custom_objects: the layers are registered
    images = np.random.default_rng(3).random((2, *INPUT_SHAPE, 3), dtype=np.float32)
    shapes = np.array([[96, 128], [250, 90]], np.float32)
    expected, got = model([images, shapes]), loaded([images, shapes])
    for key in expected:
        np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(expected[key]))


# ---- the detector ------------------------------------------------------------------


def test_yolo_loads_weights_file_and_detects_like_yolo_eval(files, body):
    yolo = YOLO(
        files["weights"], TINY_ANCHORS_PATH, files["classes"], score=SCORE, iou=IOU, model_image_size=INPUT_SHAPE
    )
    assert yolo.class_names == CLASS_NAMES
    images = random_images(4, seed=4)
    batch = yolo.detect_batch(images)
    total = 0
    for image, found in zip(images, batch):
        assert isinstance(found, Detections)
        assert found.boxes.dtype == np.float32 and found.classes.dtype == np.int32
        height, width = image.shape[:2]
        assert (
            np.all(found.boxes >= 0)
            and np.all(found.boxes[:, [0, 2]] <= width)
            and np.all(found.boxes[:, [1, 3]] <= height)
        )
        single = yolo.detect(image)
        np.testing.assert_allclose(single.boxes, found.boxes, atol=1e-3)
        np.testing.assert_array_equal(single.classes, found.classes)
        # keras-yolo3's path on the same letterboxed input, clipped the same way.
        letterboxed = letterbox_array(image, INPUT_SHAPE).astype(np.float32) / 255.0
        expected = reference_detections(body, letterboxed, np.array([height, width], np.float32))
        expected[:, [0, 2]] = np.clip(expected[:, [0, 2]], 0, width)
        expected[:, [1, 3]] = np.clip(expected[:, [1, 3]], 0, height)
        np.testing.assert_allclose(as_rows(*found), expected[np.lexsort(expected.T[::-1])], atol=1e-3)
        total += found.num_boxes
    assert total > 10


def test_gpu_num_spreads_batches_with_identical_detections(body, yolo, logical_cpus):
    assert len(logical_cpus) >= 4
    spread = YOLO.from_body(
        body, TINY_ANCHORS, CLASS_NAMES, score=SCORE, iou=IOU, model_image_size=INPUT_SHAPE, gpu_num=4, batch_size=7
    )
    assert len(set(spread.devices)) == 4
    images = random_images(7, seed=5)
    for a, b in zip(yolo.detect_batch(images), spread.detect_batch(images)):
        # Same boxes; the last float bits may differ because each device
        # convolves a smaller batch (7 images vs slices of 2, 2, 2, 1).
        np.testing.assert_array_equal(a.classes, b.classes)
        np.testing.assert_allclose(a.boxes, b.boxes, rtol=0, atol=1e-3)
        np.testing.assert_allclose(a.scores, b.scores, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="gpu_num=9"):
        YOLO.from_body(body, TINY_ANCHORS, CLASS_NAMES, gpu_num=9)


def test_a_weights_file_detector_folds_its_network_and_spreads_it_over_devices(files, yolo, logical_cpus):
    """`YOLO(path)` runs the folded network, on every device `gpu_num` asks for, with the unfolded one's detections."""
    spread = YOLO(
        files["weights"],
        TINY_ANCHORS_PATH,
        files["classes"],
        score=SCORE,
        iou=IOU,
        model_image_size=INPUT_SHAPE,
        gpu_num=4,
        batch_size=7,
    )
    assert not any(isinstance(layer, keras.layers.BatchNormalization) for layer in spread.body.layers)
    assert len(set(spread.devices)) == 4
    images = random_images(7, seed=6)
    assert assert_same_detections(spread.detect_batch(images), yolo.detect_batch(images)) > 0


def test_yolo_errors_are_clear(files, tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="model weights not found"):
        YOLO(str(tmp_path / "missing.h5"), TINY_ANCHORS_PATH, files["classes"])
    monkeypatch.chdir(tmp_path)  # keras-yolo3's default model_data/yolo.h5 is not there: the error says how to make it
    with pytest.raises(FileNotFoundError, match=r"yolov3\.weights model_data/yolo\.h5 .* model_path=\"yolov3\""):
        YOLO(anchors_path=TINY_ANCHORS_PATH, classes_path=files["classes"])
    three = write_classes(tmp_path / "three.txt", ["a", "b", "c"])
    with pytest.raises(ValueError, match="--classes"):
        YOLO(files["weights"], TINY_ANCHORS_PATH, three, model_image_size=INPUT_SHAPE)
    with pytest.raises(ValueError, match="multiples of 32"):
        YOLO(files["weights"], TINY_ANCHORS_PATH, files["classes"], model_image_size=(100, 100))


def test_four_replica_training_checkpoint_gives_identical_detections(tmp_path, logical_cpus):
    """Train one step on 4 replicas, save the template, detect on one device.

    The replicas are `parallel.multi_gpu_model`'s, on 4 logical CPUs, run
    eagerly: a MirroredStrategy `fit` costs over a minute of tracing here,
    and the file written from the template is the same kind either way.
    """
    from keras_yolo_mgpu.backend.tensorflow.replica_model import multi_gpu_model
    from keras_yolo_mgpu.data.device_side import preprocess_true_boxes
    from keras_yolo_mgpu.model.loss import totalloss
    from keras_yolo_mgpu.training.checkpoint import save_weights_atomic
    from keras_yolo_mgpu.training.training_model import create_model

    keras.utils.set_random_seed(7)
    body, train_model = create_model((64, 64), TINY_ANCHORS, 2, freeze_body=0)
    before = [w.copy() for w in body.get_weights()]
    parallel_model = multi_gpu_model(train_model, devices=logical_cpus[:4])
    parallel_model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=totalloss, run_eagerly=True)
    rng = np.random.default_rng(0)
    images = rng.random((8, 64, 64, 3), dtype=np.float32)
    true_boxes = np.zeros((8, 2, 5), np.float32)
    true_boxes[:, 0] = [8, 8, 40, 48, 1]
    y_true = preprocess_true_boxes(true_boxes, (64, 64), TINY_ANCHORS, 2)
    inputs = {"image": images, **{f"y_true_{i}": y for i, y in enumerate(y_true)}}
    parallel_model.fit(inputs, np.zeros((8, 1), np.float32), batch_size=8, epochs=1, verbose=0)
    assert any(not np.array_equal(a, b) for a, b in zip(before, body.get_weights()))  # it trained

    path = str(tmp_path / "replicas.weights.h5")
    save_weights_atomic(body, path)
    classes = write_classes(tmp_path / "classes.txt")
    loaded = YOLO(path, TINY_ANCHORS_PATH, classes, score=0.05, model_image_size=(64, 64))
    in_memory = YOLO.from_body(body, TINY_ANCHORS, CLASS_NAMES, score=0.05, model_image_size=(64, 64))
    test_images = random_images(3, seed=8)
    # The file's detector folds the batch normalisations into the convolutions: float32 rounding apart.
    assert assert_same_detections(loaded.detect_batch(test_images), in_memory.detect_batch(test_images)) > 0


# ---- pre- and post-processing ------------------------------------------------------


# The letterbox and the image reader: tests/test_letterbox.py, tests/test_images.py.


def test_draw_detections_uses_class_colours():
    image = np.zeros((120, 160, 3), np.uint8)
    drawn = draw_detections(image, np.array([[20, 40, 100, 110]], np.float32), [0.87], [1], CLASS_NAMES)
    assert isinstance(drawn, Image.Image) and drawn.size == (160, 120)
    pixels = np.asarray(drawn)
    colour = class_colors(2)[1]
    assert tuple(pixels[75, 20]) == colour  # left edge of the box
    assert tuple(pixels[110, 60]) == colour  # bottom edge
    assert pixels[20:40, 20:100].any()  # the label sits above the box
    assert not image.any()  # input untouched
    # On an OpenCV BGR frame the colour is swapped, so the written video shows the same colour.
    bgr = np.asarray(
        draw_detections(image, np.array([[20, 40, 100, 110]], np.float32), [0.87], [1], CLASS_NAMES, bgr=True)
    )
    assert tuple(bgr[75, 20]) == colour[::-1]


def test_detect_image_returns_annotated_copy(yolo):
    image = Image.fromarray(random_images(1, seed=4)[0])
    found = yolo.detect(image)
    assert found.num_boxes > 0
    annotated = yolo.detect_image(image)
    assert annotated.size == image.size and annotated.mode == "RGB"
    assert not np.array_equal(np.asarray(annotated), np.asarray(image))
    yolo.close_session()  # keras-yolo3 compatibility


def test_a_pil_image_is_detected_as_stored_and_exif_transpose_turns_it_as_the_commands_read_it(yolo, tmp_path):
    """docs/inference.md: in memory the detector takes the pixels it is given; EXIF orientation is the file readers'."""
    exif = Image.Exif()
    exif[0x0112] = 3  # stored upside down: shown turned 180 degrees
    path = tmp_path / "upside_down.jpg"
    Image.fromarray(random_images(1, seed=4)[0]).save(path, quality=95, exif=exif.tobytes())

    as_stored = as_rows(*yolo.detect(Image.open(path)))
    np.testing.assert_array_equal(as_stored, as_rows(*yolo.detect(np.asarray(Image.open(path)))))
    upright = as_rows(*yolo.detect(read_image(str(path))))  # what yolo_video.py, evaluate.py and training read
    assert len(upright) > 0
    assert as_stored.shape != upright.shape or not np.allclose(as_stored, upright)
    np.testing.assert_array_equal(as_rows(*yolo.detect(ImageOps.exif_transpose(Image.open(path)))), upright)
