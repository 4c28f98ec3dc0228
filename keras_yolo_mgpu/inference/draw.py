"""Drawing detections on images with Pillow's current API.

keras-yolo3 measured labels with `ImageDraw.textsize`, which Pillow 10
removed; this module uses `textbbox` and Pillow's bundled scalable font, so
it needs no font file (keras-yolo3 shipped `font/FiraMono-Medium.otf`).
"""

from __future__ import annotations

import colorsys
import functools
import random
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont


@functools.lru_cache(maxsize=16)
def class_colors(num_classes: int) -> tuple[tuple[int, int, int], ...]:
    """One RGB colour per class: evenly spaced hues, shuffled with keras-yolo3's seed.

    The same class keeps the same colour in every run and every frame.
    """
    hsv = [(x / num_classes, 1.0, 1.0) for x in range(num_classes)]
    colors = [tuple(int(c * 255) for c in colorsys.hsv_to_rgb(*h)) for h in hsv]
    random.Random(10101).shuffle(colors)  # own generator: leaves the global RNG alone
    return tuple(colors)


@functools.lru_cache(maxsize=16)
def _font(size: int):
    try:
        return ImageFont.load_default(size=size)  # scalable (FreeType) since Pillow 10.1
    except (TypeError, OSError):  # older Pillow or no FreeType: fixed bitmap font
        return ImageFont.load_default()


@functools.lru_cache(maxsize=4096)
def _label_mask(text: str, font_size: int) -> Image.Image:
    """The rendered label as an "L" mask, cached: in a video the same labels recur
    every frame, and rendering text is most of the drawing time."""
    font = _font(font_size)
    left, top, right, bottom = ImageDraw.Draw(Image.new("L", (1, 1))).textbbox((0, 0), text, font=font)
    mask = Image.new("L", (max(1, right - left), max(1, bottom - top)), 0)
    ImageDraw.Draw(mask).text((-left, -top), text, fill=255, font=font)
    return mask


def _text_color(rgb: Sequence[int]) -> tuple[int, int, int]:
    """Black on light backgrounds, white on dark ones."""
    luminance = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]
    return (0, 0, 0) if luminance > 140 else (255, 255, 255)


def draw_detections(
    image: Image.Image | np.ndarray,
    boxes,
    scores,
    classes,
    class_names: Sequence[str],
    *,
    colors: Sequence[tuple[int, int, int]] | None = None,
    bgr: bool = False,
) -> Image.Image:
    """Draws boxes with `"<class> <score>"` labels, keras-yolo3's layout.

    Args:
        image: PIL image or (H, W, 3) uint8 RGB array; not modified.
        boxes: (K, 4) x_min, y_min, x_max, y_max in image pixels.
        scores: (K,) scores.
        classes: (K,) class indices into `class_names`.
        class_names: names of the classes.
        colors: RGB colour per class (default: `class_colors`).
        bgr: `image` is an OpenCV BGR array: the colours are swapped to
            match, so a frame drawn here and written by OpenCV shows the
            same colours as an RGB image drawn without the flag.

    Returns:
        A new RGB PIL image with the boxes drawn.
    """
    if isinstance(image, np.ndarray):
        canvas = Image.fromarray(np.ascontiguousarray(image[..., :3]), "RGB")
    else:
        canvas = image.convert("RGB").copy()
    width, height = canvas.size
    colors = colors or class_colors(len(class_names))
    font_size = max(10, int(np.floor(3e-2 * height + 0.5)))
    thickness = max(1, (width + height) // 300)  # keras-yolo3's line width
    draw = ImageDraw.Draw(canvas)
    for box, score, cls in zip(
        np.asarray(boxes).reshape(-1, 4), np.asarray(scores).reshape(-1), np.asarray(classes).reshape(-1)
    ):
        cls = int(cls)
        name = class_names[cls] if 0 <= cls < len(class_names) else str(cls)
        rgb = tuple(colors[cls % len(colors)])
        color = rgb[::-1] if bgr else rgb
        left, top, right, bottom = (int(np.floor(v + 0.5)) for v in box)
        left, top = max(0, left), max(0, top)
        right, bottom = min(width - 1, right), min(height - 1, bottom)
        if right < left or bottom < top:
            continue
        draw.rectangle([left, top, right, bottom], outline=color, width=thickness)

        mask = _label_mask(f"{name} {float(score):.2f}", font_size)  # measured with textbbox
        label_w, label_h = mask.size
        # Above the box when there is room, else just inside its top edge.
        y = top - label_h - 2 if top - label_h - 2 >= 0 else top + 1
        x = min(left, max(0, width - label_w - 2))
        draw.rectangle([x, y, x + label_w + 2, y + label_h + 2], fill=color)
        text_color = _text_color(rgb)
        draw.bitmap((x + 1, y + 1), mask, fill=text_color[::-1] if bgr else text_color)
    return canvas
