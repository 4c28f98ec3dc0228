"""A synthetic detection dataset and video: shapes with exact boxes on clutter.

The demo and the tests need a detection problem that a tiny YOLOv3 can learn
from scratch in minutes on a CPU, yet is not trivial: filled shapes of
several classes, in random colours and sizes, on backgrounds made of colour
gradients, noise, texture patches and distractor lines and arcs that cross
everywhere. Some images hold no object at all.

Boxes are exact: every object is rendered into its own binary mask first and
its box is the mask's pixel extent, in pixel-edge coordinates
(`x_max = last column + 1`), so `x_max - x_min` is the object's width in
pixels. Objects never overlap each other (rejection sampling) and are drawn
after the clutter, so what is visible of an object is all of it.

Output layout of `make_synthetic_dataset(out_dir, ...)`:

    out_dir/classes.txt              one class name per line
    out_dir/train.txt, val.txt       keras-yolo3 annotation lines
    out_dir/images/train/00000.png   the images (PNG: lossless, exact)
    out_dir/images/val/00000.png
"""

from __future__ import annotations

import colorsys
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from keras_yolo_mgpu.data.annotations import format_annotation_line

logger = logging.getLogger(__name__)

#: Default classes, in class-id order. Each is a filled shape.
DEFAULT_CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "cross")
SUPPORTED_CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "cross", "diamond", "ring")


class DatasetPaths(NamedTuple):
    """Files written by `make_synthetic_dataset`; unpacks as (train, val, classes)."""

    train: str
    val: str
    classes: str


class Sample(NamedTuple):
    """One rendered image.

    Attributes:
        image: uint8 (H, W, 3) RGB.
        boxes: int32 (K, 5) x_min, y_min, x_max, y_max (exclusive), class_id.
        masks: bool (K, H, W), each object's pixels (in the same order).
    """

    image: np.ndarray
    boxes: np.ndarray
    masks: np.ndarray


def _as_hw(image_size) -> tuple[int, int]:
    if isinstance(image_size, (int, np.integer)):
        return int(image_size), int(image_size)
    height, width = (int(v) for v in image_size)
    return height, width


def _image_sizes(image_size) -> list[tuple[int, int]]:
    """`128`, `(96, 128)` or `[(128, 128), (96, 128)]` -> list of (height, width)."""
    several = (
        not isinstance(image_size, (int, np.integer)) and len(image_size) and isinstance(image_size[0], (tuple, list))
    )
    sizes = [_as_hw(size) for size in (image_size if several else [image_size])]
    if any(h < 16 or w < 16 for h, w in sizes):
        raise ValueError(f"image sizes must be at least 16x16. Received: image_size={image_size!r}")
    return sizes


def _check_classes(classes: Sequence[str]) -> tuple[str, ...]:
    classes = tuple(classes)
    unknown = [name for name in classes if name not in SUPPORTED_CLASSES]
    if unknown or not classes:
        raise ValueError(f"classes must be a non-empty subset of {SUPPORTED_CLASSES}. Received: classes={classes!r}")
    if len(set(classes)) != len(classes):
        raise ValueError(f"classes must not repeat. Received: classes={classes!r}")
    return classes


# --- backgrounds ---------------------------------------------------------------


def _random_colour(rng: np.random.Generator, saturation=(0.0, 1.0), value=(0.0, 1.0)) -> np.ndarray:
    hue = rng.uniform()
    r, g, b = colorsys.hsv_to_rgb(hue, rng.uniform(*saturation), rng.uniform(*value))
    return np.array([r, g, b]) * 255.0


def _background(rng: np.random.Generator, height: int, width: int, clutter: float) -> np.ndarray:
    """A cluttered float32 (H, W, 3) background in [0, 255]."""
    # Linear gradient between two random colours in a random direction.
    c0, c1 = _random_colour(rng), _random_colour(rng)
    angle = rng.uniform(0, 2 * np.pi)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    t = np.cos(angle) * xx / width + np.sin(angle) * yy / height
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    image = c0[None, None] * (1 - t[..., None]) + c1[None, None] * t[..., None]

    # Low-frequency blotches: upsampled coarse noise.
    coarse = rng.normal(0, 40 * clutter, size=(max(2, height // 16), max(2, width // 16), 3)).astype(np.float32)
    blotches = np.asarray(
        Image.fromarray(np.uint8(np.clip(coarse + 128, 0, 255))).resize((width, height), Image.BILINEAR)
    )
    image = image + (blotches.astype(np.float32) - 128)

    canvas = Image.fromarray(np.uint8(np.clip(image, 0, 255)))
    # Texture patches: rectangles of fine noise.
    for _ in range(rng.integers(0, int(3 * clutter) + 1)):
        pw, ph = rng.integers(width // 8, width // 2), rng.integers(height // 8, height // 2)
        px, py = rng.integers(0, width - pw), rng.integers(0, height - ph)
        patch = np.asarray(canvas, dtype=np.float32)[py : py + ph, px : px + pw]
        patch = patch + rng.normal(0, 35, size=patch.shape)
        canvas.paste(Image.fromarray(np.uint8(np.clip(patch, 0, 255))), (int(px), int(py)))
    # Distractor lines, polylines and arcs (thin: never confused with filled shapes).
    draw = ImageDraw.Draw(canvas)
    for _ in range(rng.integers(int(2 * clutter), int(8 * clutter) + 1)):
        colour = tuple(int(v) for v in _random_colour(rng))
        kind = rng.integers(0, 3)
        if kind == 0:
            points = [(float(rng.uniform(0, width)), float(rng.uniform(0, height))) for _ in range(2)]
            draw.line(points, fill=colour, width=int(rng.integers(1, 3)))
        elif kind == 1:
            points = [(float(rng.uniform(0, width)), float(rng.uniform(0, height))) for _ in range(rng.integers(3, 6))]
            draw.line(points, fill=colour, width=1)
        else:
            r = float(rng.uniform(0.1, 0.4) * min(width, height))
            cx, cy = float(rng.uniform(0, width)), float(rng.uniform(0, height))
            start = float(rng.uniform(0, 360))
            draw.arc([cx - r, cy - r, cx + r, cy + r], start, start + float(rng.uniform(40, 200)), fill=colour, width=1)
    # Speckles.
    for _ in range(rng.integers(0, int(20 * clutter) + 1)):
        x, y = float(rng.uniform(0, width)), float(rng.uniform(0, height))
        r = float(rng.uniform(0.5, 1.5))
        draw.ellipse([x - r, y - r, x + r, y + r], fill=tuple(int(v) for v in _random_colour(rng)))
    image = np.asarray(canvas, dtype=np.float32)
    if rng.uniform() < 0.5:
        image = np.asarray(canvas.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.0))), dtype=np.float32)
    return image


# --- shapes ---------------------------------------------------------------


def _shape_mask(
    name: str, height: int, width: int, x0: int, y0: int, w: int, h: int, rng: np.random.Generator
) -> np.ndarray:
    """Bool (H, W) mask of a filled shape drawn inside the box (x0, y0, w, h)."""
    canvas = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    x1, y1 = x0 + w - 1, y0 + h - 1  # PIL's inclusive corner
    if name == "circle":
        draw.ellipse([x0, y0, x1, y1], fill=255)
    elif name == "ring":
        draw.ellipse([x0, y0, x1, y1], fill=255)
        tw, th = max(2, round(w * 0.22)), max(2, round(h * 0.22))
        draw.ellipse([x0 + tw, y0 + th, x1 - tw, y1 - th], fill=0)
    elif name == "square":
        draw.rectangle([x0, y0, x1, y1], fill=255)
    elif name == "triangle":
        direction = rng.integers(0, 4)  # apex up, down, left, right
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        points = {
            0: [(x0, y1), (x1, y1), (cx, y0)],
            1: [(x0, y0), (x1, y0), (cx, y1)],
            2: [(x1, y0), (x1, y1), (x0, cy)],
            3: [(x0, y0), (x0, y1), (x1, cy)],
        }[int(direction)]
        draw.polygon(points, fill=255)
    elif name == "cross":
        tw, th = max(2, round(w * 0.3)), max(2, round(h * 0.3))
        left, top = x0 + (w - tw) // 2, y0 + (h - th) // 2
        draw.rectangle([left, y0, left + tw - 1, y1], fill=255)
        draw.rectangle([x0, top, x1, top + th - 1], fill=255)
    elif name == "diamond":
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        draw.polygon([(cx, y0), (x1, cy), (cx, y1), (x0, cy)], fill=255)
    else:
        raise ValueError(f"unknown shape {name!r}")
    return np.asarray(canvas) > 0


def _mask_box(mask: np.ndarray) -> tuple[int, int, int, int]:
    """Pixel-edge extent (x_min, y_min, x_max, y_max) of a non-empty mask."""
    ys, xs = np.nonzero(mask)
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def _contrasting_colour(rng: np.random.Generator, background: np.ndarray) -> np.ndarray:
    """A saturated colour far from the mean background under the object."""
    mean = background.reshape(-1, 3).mean(axis=0)
    best, best_distance = None, -1.0
    for _ in range(16):
        colour = _random_colour(rng, saturation=(0.3, 1.0), value=(0.15, 1.0))
        distance = float(np.linalg.norm(colour - mean))
        if distance > 110:
            return colour
        if distance > best_distance:
            best, best_distance = colour, distance
    return best


def render_sample(
    rng: np.random.Generator,
    image_size=128,
    classes: Sequence[str] = DEFAULT_CLASSES,
    *,
    max_objects: int = 4,
    empty_fraction: float = 0.08,
    size_range: tuple[float, float] = (0.14, 0.40),
    aspect_range: tuple[float, float] = (0.8, 1.25),
    clutter: float = 1.0,
    noise: float = 6.0,
) -> Sample:
    """Draws one image with 0..`max_objects` shapes on a cluttered background.

    Args:
        rng: numpy random generator (all randomness comes from it).
        image_size: `int` or (height, width) in pixels.
        classes: shape names, class id = position.
        max_objects: most objects in an image (at least 1 unless empty).
        empty_fraction: probability of an image without objects.
        size_range: object size (sqrt of box area) as a fraction of the
            image's longer side (so a detector that letterboxes the image
            sees the same object sizes whatever the aspect ratio).
        aspect_range: box width / height.
        clutter: 0 for a plain gradient, 1 for the default clutter.
        noise: standard deviation of the pixel noise added at the end
            (0 keeps the objects' pixels exactly their colour).

    Returns:
        A `Sample` with the image, boxes (K, 5) and masks (K, H, W).
    """
    classes = _check_classes(classes)
    height, width = _as_hw(image_size)
    image = _background(rng, height, width, clutter)
    count = 0 if rng.uniform() < empty_fraction else int(rng.integers(1, max_objects + 1))
    longer = max(height, width)
    placed: list[tuple[int, int, int, int]] = []
    boxes, masks = [], []
    for _ in range(count):
        for _attempt in range(30):
            side = rng.uniform(*size_range) * longer
            aspect = math.exp(rng.uniform(math.log(aspect_range[0]), math.log(aspect_range[1])))
            w = int(np.clip(round(side * math.sqrt(aspect)), 6, width - 2))
            h = int(np.clip(round(side / math.sqrt(aspect)), 6, height - 2))
            x0, y0 = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
            # Keep a 2-pixel gap so objects never touch.
            if all(x0 + w + 2 <= a or a2 + 2 <= x0 or y0 + h + 2 <= b or b2 + 2 <= y0 for a, b, a2, b2 in placed):
                break
        else:
            continue
        class_id = int(rng.integers(0, len(classes)))
        mask = _shape_mask(classes[class_id], height, width, x0, y0, w, h, rng)
        colour = _contrasting_colour(rng, image[y0 : y0 + h, x0 : x0 + w])
        # Subtle shading so objects are not perfectly flat.
        shade = 1.0 + rng.uniform(-0.15, 0.15) * np.linspace(-1, 1, h)[:, None, None]
        region = np.clip(colour[None, None] * shade, 0, 255) if noise > 0 else colour[None, None]
        block = np.broadcast_to(region, (h, w, 3))
        sub = image[y0 : y0 + h, x0 : x0 + w]
        sub[mask[y0 : y0 + h, x0 : x0 + w]] = block[mask[y0 : y0 + h, x0 : x0 + w]]
        placed.append((x0, y0, x0 + w, y0 + h))
        boxes.append((*_mask_box(mask), class_id))
        masks.append(mask)
    if noise > 0:
        image = image + rng.normal(0, noise, size=image.shape)
    image = np.uint8(np.clip(np.round(image), 0, 255))
    boxes_array = np.array(boxes, dtype=np.int32).reshape(-1, 5)
    masks_array = np.array(masks, dtype=bool).reshape(-1, height, width)
    return Sample(image, boxes_array, masks_array)


def _write_split(out_dir: Path, split: str, count: int, rng: np.random.Generator, image_size, classes, options) -> str:
    image_dir = out_dir / "images" / split
    image_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    sizes = _image_sizes(image_size)
    for index in range(count):
        size = sizes[int(rng.integers(0, len(sizes)))] if len(sizes) > 1 else sizes[0]
        sample = render_sample(rng, size, classes, **options)
        path = image_dir / f"{index:05d}.png"
        Image.fromarray(sample.image).save(path)
        lines.append(format_annotation_line(str(path.resolve()), sample.boxes))
    annotation_path = out_dir / f"{split}.txt"
    annotation_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(annotation_path)


def make_synthetic_dataset(
    out_dir: str | os.PathLike,
    num_train: int = 400,
    num_val: int = 100,
    image_size=128,
    seed: int = 0,
    classes: Sequence[str] = DEFAULT_CLASSES,
    **options,
) -> DatasetPaths:
    """Writes a synthetic detection dataset in keras-yolo3's format.

    Args:
        out_dir: folder to write into (created; existing files are replaced).
        num_train, num_val: number of images per split.
        image_size: `int` (square images), (height, width), or a list of
            (height, width) pairs, one drawn at random for each image
            (mixed aspect ratios: a letterboxing detector then sees grey
            bars in training as it will on other footage).
        seed: the dataset is a pure function of the arguments and this seed;
            the train and validation splits use independent streams.
        classes: shape names from `SUPPORTED_CLASSES`; class id = position.
        **options: passed to `render_sample` (`max_objects`,
            `empty_fraction`, `size_range`, `aspect_range`, `clutter`,
            `noise`).

    Returns:
        `DatasetPaths(train, val, classes)`: the two annotation files (with
        absolute image paths) and the class names file.
    """
    classes = _check_classes(classes)
    if num_train < 0 or num_val < 0:
        raise ValueError(f"num_train and num_val must be >= 0. Received: num_train={num_train}, num_val={num_val}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_rng, val_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    classes_path = out / "classes.txt"
    classes_path.write_text("\n".join(classes) + "\n", encoding="utf-8")
    train = _write_split(out, "train", num_train, train_rng, image_size, classes, options)
    val = _write_split(out, "val", num_val, val_rng, image_size, classes, options)
    logger.info("synthetic dataset: %d train + %d val images in %s", num_train, num_val, out)
    return DatasetPaths(train, val, str(classes_path))


# --- video ---------------------------------------------------------------


def make_synthetic_video(
    path: str | os.PathLike,
    num_frames: int = 60,
    frame_size=(240, 320),
    fps: float = 10.0,
    seed: int = 0,
    classes: Sequence[str] = DEFAULT_CLASSES,
    num_objects: int = 3,
    size_range: tuple[float, float] = (0.6, 0.95),
    clutter: float = 1.0,
    texture_scale: float = 1.0,
) -> str:
    """Writes a clip of shapes moving over a cluttered background.

    Each shape travels in its own lane (a vertical band for landscape
    frames, a horizontal one for portrait frames), bouncing off the frame's
    ends and drifting across its lane, so shapes never occlude each other:
    the training images hold no occlusion either. Shapes get evenly spaced
    hues, so they always look different from each other.

    Args:
        path: output file; `.avi` is written with MJPG, anything else with
            `mp4v` (both ship with OpenCV's wheels).
        num_frames: frames in the clip.
        frame_size: (height, width) of the frames.
        fps: frames per second.
        seed: makes the clip reproducible.
        classes: shape names, as for the dataset.
        num_objects: shapes on screen (one per lane).
        size_range: shape size as a fraction of the lane's width.
        clutter: background clutter, as for the dataset.
        texture_scale: the background is drawn this many times smaller and
            enlarged, so that a detector which shrinks frames by this factor
            (e.g. 320-pixel frames into a 128-pixel network) sees clutter at
            the scale of its training images.

    Returns:
        `path` as a string.
    """
    classes = _check_classes(classes)
    height, width = _as_hw(frame_size)
    if num_objects < 1:
        raise ValueError(f"num_objects must be >= 1. Received: num_objects={num_objects}")
    rng = np.random.default_rng(seed)
    small = (max(8, round(height / texture_scale)), max(8, round(width / texture_scale)))
    background = _background(rng, *small, clutter)
    if small != (height, width):
        background = cv2.resize(background, (width, height), interpolation=cv2.INTER_LINEAR)
    # Lanes split the longer side (the shapes can be larger that way); work
    # in (along, across) lane coordinates, moving along the shorter side.
    landscape = width < height  # lanes are horizontal bands
    length, breadth = (width, height) if landscape else (height, width)
    lane = breadth / num_objects
    hue0 = rng.uniform()
    names, sides, colours, seeds, along, across, v_along, v_across = ([] for _ in range(8))
    for k in range(num_objects):
        sides.append(int(np.clip(round(rng.uniform(*size_range) * lane), 6, int(lane) - 1)))
        r, g, b = colorsys.hsv_to_rgb((hue0 + k / num_objects) % 1.0, rng.uniform(0.6, 1.0), rng.uniform(0.6, 1.0))
        names.append(classes[int(rng.integers(0, len(classes)))])
        along.append(rng.uniform(0, length - sides[k]))
        across.append(rng.uniform(k * lane, (k + 1) * lane - sides[k]))
        v_along.append(rng.choice([-1, 1]) * rng.uniform(0.5, 1.0) * length / 30)
        v_across.append(rng.uniform(-1, 1) * lane / 20)
        colours.append(np.array([r, g, b]) * 255.0)
        seeds.append(int(rng.integers(0, 2**31)))
    along, across, v_along, v_across = (np.array(v, np.float64) for v in (along, across, v_along, v_across))
    sides = np.array(sides)
    lo, hi = np.arange(num_objects) * lane, np.arange(1, num_objects + 1) * lane - sides  # each lane's extent across
    path = str(path)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    codec = "MJPG" if path.lower().endswith(".avi") else "mp4v"
    writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*codec), float(fps), (width, height))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write video {path!r} (codec {codec})")
    try:
        for _ in range(num_frames):
            frame = background.copy()
            for k in range(num_objects):
                a, c = int(round(along[k])), int(round(across[k]))
                x0, y0 = (a, c) if landscape else (c, a)
                # Same seed every frame: a triangle keeps its orientation.
                rng_shape = np.random.default_rng(seeds[k])
                frame[_shape_mask(names[k], height, width, x0, y0, sides[k], sides[k], rng_shape)] = colours[k]
            along += v_along
            across += v_across
            v_along[(along < 0) | (along > length - sides)] *= -1  # bounce off the frame's ends
            v_across[(across < lo) | (across > hi)] *= -1  # and off the lane's sides
            along, across = np.clip(along, 0, length - sides), np.clip(across, lo, hi)
            frame = np.uint8(np.clip(frame + rng.normal(0, 4, size=frame.shape), 0, 255))
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))  # OpenCV writes BGR
    finally:
        writer.release()
    return path
