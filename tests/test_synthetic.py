"""The synthetic dataset: exact boxes, reproducibility, file layout, video."""

import numpy as np
import pytest
from PIL import Image

from keras_yolo_mgpu.data.synthetic import (
    DEFAULT_CLASSES,
    SUPPORTED_CLASSES,
    make_synthetic_dataset,
    make_synthetic_video,
    render_sample,
)


def _read_lines(path):
    rows = []
    for line in open(path, encoding="utf-8").read().splitlines():
        parts = line.split()
        boxes = np.array([[int(v) for v in token.split(",")] for token in parts[1:]], dtype=np.int64).reshape(-1, 5)
        rows.append((parts[0], boxes))
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_boxes_are_the_exact_pixel_extent_of_each_shape(seed):
    rng = np.random.default_rng(seed)
    sample = render_sample(rng, (96, 128), SUPPORTED_CLASSES, max_objects=5, empty_fraction=0.0, noise=0.0)
    assert sample.image.shape == (96, 128, 3) and sample.image.dtype == np.uint8
    assert len(sample.boxes) >= 1
    for (x_min, y_min, x_max, y_max, class_id), mask in zip(sample.boxes, sample.masks):
        ys, xs = np.nonzero(mask)
        # Pixel-edge coordinates: x_max is one past the last column.
        assert (x_min, y_min, x_max, y_max) == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
        # The shape touches all four sides of its box.
        assert mask[y_min:y_max, x_min].any() and mask[y_min:y_max, x_max - 1].any()
        assert mask[y_min, x_min:x_max].any() and mask[y_max - 1, x_min:x_max].any()
        assert 0 <= class_id < len(SUPPORTED_CLASSES)
        # Drawn last and without noise: every pixel of the shape has its one colour.
        colours = np.unique(sample.image[mask], axis=0)
        assert len(colours) == 1


def test_objects_never_overlap():
    rng = np.random.default_rng(7)
    for _ in range(20):
        sample = render_sample(rng, 96, max_objects=6, empty_fraction=0.0)
        if len(sample.masks) > 1:
            assert sample.masks.sum(axis=0).max() == 1


def test_background_is_cluttered_and_images_vary():
    rng = np.random.default_rng(0)
    a = render_sample(rng, 64, empty_fraction=1.0)
    b = render_sample(rng, 64, empty_fraction=1.0)
    assert len(a.boxes) == 0 and a.masks.shape == (0, 64, 64)
    assert a.image.std() > 10  # not a flat colour
    assert np.abs(a.image.astype(int) - b.image.astype(int)).mean() > 10


def test_dataset_files_and_reproducibility(tmp_path):
    paths = make_synthetic_dataset(tmp_path / "a", num_train=12, num_val=5, image_size=64, seed=3, empty_fraction=0.3)
    train, val, classes = paths  # unpacks as a tuple
    assert open(classes).read().split() == list(DEFAULT_CLASSES)
    train_rows, val_rows = _read_lines(train), _read_lines(val)
    assert len(train_rows) == 12 and len(val_rows) == 5
    for path, boxes in train_rows + val_rows:
        image = Image.open(path)
        assert image.size == (64, 64) and image.mode == "RGB"
        assert ((boxes[:, 0] >= 0) & (boxes[:, 1] >= 0) & (boxes[:, 2] <= 64) & (boxes[:, 3] <= 64)).all()
        assert ((boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])).all()
    assert any(len(boxes) == 0 for _, boxes in train_rows)  # some background images
    # Same seed, same data; train and val differ.
    again = make_synthetic_dataset(tmp_path / "b", num_train=12, num_val=5, image_size=64, seed=3, empty_fraction=0.3)
    for (p1, b1), (p2, b2) in zip(train_rows, _read_lines(again.train)):
        assert np.array_equal(b1, b2)
        assert np.array_equal(np.asarray(Image.open(p1)), np.asarray(Image.open(p2)))
    assert not np.array_equal(np.asarray(Image.open(train_rows[0][0])), np.asarray(Image.open(val_rows[0][0])))


def test_unknown_class_is_refused(tmp_path):
    with pytest.raises(ValueError, match="classes must be"):
        make_synthetic_dataset(tmp_path, 1, 1, 64, classes=("circle", "hexagon"))


@pytest.mark.parametrize("name", ["clip.mp4", "clip.avi"])
def test_video_is_readable(tmp_path, name):
    cv2 = pytest.importorskip("cv2")
    path = make_synthetic_video(tmp_path / name, num_frames=8, frame_size=(72, 96), fps=5)
    capture = cv2.VideoCapture(path)
    frames = []
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        frames.append(frame)
    capture.release()
    assert len(frames) == 8
    assert frames[0].shape == (72, 96, 3)
    # The shapes move.
    assert np.abs(frames[0].astype(int) - frames[-1].astype(int)).mean() > 1


def test_mixed_image_sizes(tmp_path):
    sizes = [(64, 64), (48, 64), (64, 48)]
    paths = make_synthetic_dataset(tmp_path, num_train=30, num_val=2, image_size=sizes, seed=0)
    seen = set()
    for path, boxes in _read_lines(paths.train):
        width, height = Image.open(path).size
        seen.add((height, width))
        assert ((boxes[:, 2] <= width) & (boxes[:, 3] <= height)).all()
    assert seen == set(sizes)


def test_bad_image_size_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least 16x16"):
        make_synthetic_dataset(tmp_path, 1, 1, image_size=[(8, 64)])
