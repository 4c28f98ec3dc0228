"""keras-yolo3's original input pipeline, rewritten as the test reference and the benchmark baseline.

A single Python thread does everything, the way keras-yolo3's
`data_generator` + `get_random_data` do: PIL decode, BICUBIC resize of the
whole image, paste on a grey canvas, flip, a per-image matplotlib
`rgb_to_hsv`/`hsv_to_rgb` round trip in float64, integer box arithmetic, and
`preprocess_true_boxes` per batch (keras-yolo3's numbers; here the package's
one implementation, `data.device_side`, rather than keras-yolo3's numpy loop).
It is also the reference that the pipeline's augmentation is tested against:
`rand` can be replaced to feed both the same random numbers.
`bench pipeline --generator reference` loads it from a checkout
(`keras_yolo_mgpu.bench.baseline`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
from matplotlib.colors import hsv_to_rgb, rgb_to_hsv
from PIL import Image

from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.data.device_side import preprocess_true_boxes


def rand(a: float = 0.0, b: float = 1.0) -> float:
    return np.random.rand() * (b - a) + a


# Over 60 lines: keras-yolo3's generator transcribed step for step, so it reads against the
# original line by line.
def get_random_data(
    annotation: Annotation,
    input_shape: tuple[int, int],
    random: bool = True,
    max_boxes: int = 20,
    jitter: float = 0.3,
    hue: float = 0.1,
    sat: float = 1.5,
    val: float = 1.5,
    rand: Callable[..., float] = rand,
    shuffle: Callable[[np.ndarray], None] = np.random.shuffle,
) -> tuple[np.ndarray, np.ndarray]:
    """One image as keras-yolo3 prepares it.

    Returns:
        (h, w, 3) float64 image in [0, 1] and (max_boxes, 5) boxes (integer
        values, as keras-yolo3 truncates them) in input pixels.
    """
    image = Image.open(annotation.image_path)
    iw, ih = image.size
    h, w = input_shape
    box = annotation.boxes.astype(np.int64)  # keras-yolo3 parses with int()

    if not random:
        scale = min(w / iw, h / ih)
        nw, nh = int(iw * scale), int(ih * scale)
        dx, dy = (w - nw) // 2, (h - nh) // 2
        image = image.convert("RGB").resize((nw, nh), Image.BICUBIC)
        new_image = Image.new("RGB", (w, h), (128, 128, 128))
        new_image.paste(image, (dx, dy))
        image_data = np.array(new_image) / 255.0
        box_data = np.zeros((max_boxes, 5))
        if len(box) > 0:
            shuffle(box)
            box = box[:max_boxes]
            box[:, [0, 2]] = box[:, [0, 2]] * scale + dx
            box[:, [1, 3]] = box[:, [1, 3]] * scale + dy
            box_data[: len(box)] = box
        return image_data, box_data

    # Resize with aspect jitter and scale.
    new_ar = w / h * rand(1 - jitter, 1 + jitter) / rand(1 - jitter, 1 + jitter)
    scale = rand(0.25, 2)
    if new_ar < 1:
        nh = int(scale * h)
        nw = int(nh * new_ar)
    else:
        nw = int(scale * w)
        nh = int(nw / new_ar)
    image = image.convert("RGB").resize((nw, nh), Image.BICUBIC)

    # Place on a grey canvas (possibly cut off).
    dx = int(rand(0, w - nw))
    dy = int(rand(0, h - nh))
    new_image = Image.new("RGB", (w, h), (128, 128, 128))
    new_image.paste(image, (dx, dy))
    image = new_image

    flip = rand() < 0.5
    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)

    # HSV distortion, per image, in float64.
    hue = rand(-hue, hue)
    sat = rand(1, sat) if rand() < 0.5 else 1 / rand(1, sat)
    val = rand(1, val) if rand() < 0.5 else 1 / rand(1, val)
    x = rgb_to_hsv(np.array(image) / 255.0)
    x[..., 0] += hue
    x[..., 0][x[..., 0] > 1] -= 1
    x[..., 0][x[..., 0] < 0] += 1
    x[..., 1] *= sat
    x[..., 2] *= val
    x[x > 1] = 1
    x[x < 0] = 0
    image_data = hsv_to_rgb(x)

    # Boxes: integer arithmetic (assignment into an int array truncates).
    box_data = np.zeros((max_boxes, 5))
    if len(box) > 0:
        shuffle(box)
        box[:, [0, 2]] = box[:, [0, 2]] * nw / iw + dx
        box[:, [1, 3]] = box[:, [1, 3]] * nh / ih + dy
        if flip:
            box[:, [0, 2]] = w - box[:, [2, 0]]
        box[:, 0:2][box[:, 0:2] < 0] = 0
        box[:, 2][box[:, 2] > w] = w
        box[:, 3][box[:, 3] > h] = h
        box_w = box[:, 2] - box[:, 0]
        box_h = box[:, 3] - box[:, 1]
        box = box[np.logical_and(box_w > 1, box_h > 1)]
        box = box[:max_boxes]
        box_data[: len(box)] = box
    return image_data, box_data


def data_generator(
    annotations: list[Annotation], batch_size: int, input_shape: tuple[int, int], anchors, num_classes: int
) -> Iterator[tuple[list[np.ndarray], np.ndarray]]:
    """keras-yolo3's endless training generator: ([images, *y_true], zeros)."""
    annotations = list(annotations)
    n, i = len(annotations), 0
    while True:
        image_data, box_data = [], []
        for _ in range(batch_size):
            if i == 0:
                np.random.shuffle(annotations)
            image, box = get_random_data(annotations[i], input_shape, random=True)
            image_data.append(image)
            box_data.append(box)
            i = (i + 1) % n
        image_data = np.array(image_data)
        y_true = preprocess_true_boxes(np.array(box_data), input_shape, anchors, num_classes)
        yield [image_data, *y_true], np.zeros(batch_size)
