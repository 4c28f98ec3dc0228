"""The one letterbox: keras-yolo3's geometry, and the same pixels on every path."""

from __future__ import annotations

import numpy as np
import pytest
from inference_helpers import CLASS_NAMES, INPUT_SHAPE, TINY_ANCHORS, make_body
from keras_yolo3_generator import get_random_data
from keras_yolo3_targets import dense_inputs
from PIL import Image

import keras_yolo_mgpu
from keras_yolo_mgpu.data.annotations import parse_annotation_line
from keras_yolo_mgpu.data.images import read_image
from keras_yolo_mgpu.data.letterbox import letterbox_array, letterbox_boxes, letterbox_geometry, letterbox_image
from keras_yolo_mgpu.data.tf_dataset import make_dataset
from keras_yolo_mgpu.evaluation.mean_ap import detect_annotations
from keras_yolo_mgpu.inference.detector import YOLO

HEIGHT, WIDTH = INPUT_SHAPE  # (96, 128)
# (width, height): enlarged (bicubic), shrunk by 0.5-1 (bilinear), shrunk more
# (area), the input's own size (no resampling), odd margins on both axes.
SIZES = [(50, 40), (150, 100), (400, 500), (WIDTH, HEIGHT), (97, 131)]


def _photo(width: int, height: int, seed: int) -> np.ndarray:
    """Smooth colours plus mild noise: resamplers differ on it, as on photos."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width] / max(width, height)
    pixels = np.stack([127 + 100 * np.sin((3 + c) * xx + c) * np.cos((2 + c) * yy) for c in range(3)], axis=-1)
    return np.clip(pixels + rng.normal(0, 4, pixels.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """One PNG and one JPEG per size, each with a box, as annotations."""
    folder = tmp_path_factory.mktemp("letterbox")
    annotations = []
    for index, (w, h) in enumerate(SIZES):
        for ext in ("png", "jpg"):
            path = folder / f"image{index}.{ext}"
            Image.fromarray(_photo(w, h, index)).save(path, quality=90)
            annotations.append(parse_annotation_line(f"{path} 3,5,{w - 7},{h // 2},{index % 2}"))
    return annotations


@pytest.mark.parametrize("size", SIZES)
def test_geometry_and_boxes_are_keras_yolo3s(files, size):
    """Against keras-yolo3's `get_random_data(random=False)` (Pillow BICUBIC, integer boxes)."""
    annotation = next(a for a in files if Image.open(a.image_path).size == size and a.image_path.endswith("png"))
    theirs, their_boxes = get_random_data(annotation, INPUT_SHAPE, random=False, shuffle=lambda boxes: None)
    theirs = np.rint(theirs * 255).astype(int)
    ours = letterbox_array(read_image(annotation.image_path), INPUT_SHAPE).astype(int)
    g = letterbox_geometry(size, (WIDTH, HEIGHT))
    inside = np.zeros(INPUT_SHAPE, bool)
    inside[g.top : g.top + g.height, g.left : g.left + g.width] = True
    # The same grey margins, pixel for pixel ...
    assert (ours[~inside] == 128).all() and (theirs[~inside] == 128).all()
    assert (ours[inside] != 128).any()  # the picture fills its place
    # ... and the same picture up to the resampler (OpenCV instead of Pillow BICUBIC).
    error = np.abs(ours[inside] - theirs[inside])
    assert error.mean() < 2.0, error.mean()
    # Boxes: keras-yolo3 truncates them to integers, ours stay floats.
    boxes = letterbox_boxes(annotation.boxes, size, INPUT_SHAPE)
    np.testing.assert_array_equal(np.trunc(boxes), their_boxes[: len(boxes)])


def test_geometry_is_keras_yolo3s_formula():
    assert letterbox_geometry((640, 480), (416, 416)) == (0.65, 416, 312, 0, 52, 416, 416)
    assert letterbox_geometry((427, 640), (416, 416))[1:5] == (277, 416, 69, 0)  # int(277.55), (416 - 277) // 2
    assert letterbox_geometry((5000, 2), (416, 416))[1:3] == (416, 1)  # never 0 pixels high


def test_same_image_gives_the_same_pixels_on_every_path(files):
    """Validation (cached or not), training without augmentation, the detector, evaluation, PIL adapter."""
    expected = {a.image_path: letterbox_array(read_image(a.image_path), INPUT_SHAPE) for a in files}
    num = len(files)

    def as_uint8(x):
        """The batch as the training model's input layer finishes it, back in uint8."""
        images = dense_inputs(x, TINY_ANCHORS, 2)["image"]
        pixels = np.rint(images * 255.0)
        assert np.abs(pixels - images * 255.0).max() < 1e-3  # letterboxed: the device only divides by 255
        return pixels.astype(np.uint8)

    paths = {}
    for cache in (None, "ram"):
        dataset = make_dataset(files, INPUT_SHAPE, TINY_ANCHORS, 2, num, training=False, cache=cache)
        paths[f"validation cache={cache}"] = as_uint8(next(iter(dataset))[0])
    dataset = make_dataset(files, INPUT_SHAPE, TINY_ANCHORS, 2, num, training=True, augment=False, seed=0)
    shuffled = as_uint8(next(iter(dataset))[0])
    order = [
        next(i for i, a in enumerate(files) if np.array_equal(image, expected[a.image_path])) for image in shuffled
    ]
    assert sorted(order) == list(range(num))  # every image found exactly once
    paths["training augment=False"] = shuffled[np.argsort(order)]

    yolo = YOLO.from_body(make_body(), TINY_ANCHORS, CLASS_NAMES, model_image_size=INPUT_SHAPE, batch_size=4)
    paths["detector (array)"] = [yolo.preprocess(read_image(a.image_path))[0] for a in files]
    paths["detector (PIL image)"] = [yolo.preprocess(Image.open(a.image_path))[0] for a in files]
    seen = []
    detect = yolo.detect_letterboxed
    yolo.detect_letterboxed = lambda images, shapes: seen.extend(images) or detect(images, shapes)
    detect_annotations(yolo, files, progress=False)
    paths["evaluation"] = seen
    paths["letterbox_image (PIL)"] = [
        np.asarray(keras_yolo_mgpu.letterbox_image(Image.open(a.image_path), (WIDTH, HEIGHT))) for a in files
    ]
    assert keras_yolo_mgpu.letterbox_image is letterbox_image  # keras-yolo3's public name

    for name, images in paths.items():
        assert len(images) == num, name
        for annotation, image in zip(files, images):
            np.testing.assert_array_equal(image, expected[annotation.image_path], err_msg=name)
