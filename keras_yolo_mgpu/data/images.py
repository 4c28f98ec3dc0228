"""How an image becomes pixels: one reader for every path.

Training, validation, detection, evaluation, the dataset checker and the
benchmarks all read files with `read_image`, and in-memory images (PIL
images, arrays from users or OpenCV) go through `to_rgb_array`; both return
(H, W, 3) uint8 RGB by the same rules:

- grey, grey + alpha, palette, 1-bit, CMYK and RGBA are converted by Pillow
  (alpha is dropped, not composited: keras-yolo3 and TensorFlow's decoders
  drop it too);
- more than 8 bits per sample keep the high byte (`v >> 8` for 16 bits), which
  is what libpng, Pillow (16-bit RGB) and `tf.io.decode_png(dtype=uint8)`
  do, so every decoder gives the same pixels for the same file; 16-bit grey,
  which Pillow's own conversion would clip to white, follows that rule;
- a truncated file (no end marker, a transfer cut short) is decoded as far
  as it goes, the rest grey, as OpenCV, Pillow's `LOAD_TRUNCATED_IMAGES` and
  TensorFlow's `try_recover_truncated` all do: every command then reads the
  same pixels from it, with a warning naming it; a file no decoder reads
  still raises;
- the EXIF orientation is applied: a phone's portrait photo, stored
  sideways, is read upright, as a viewer shows it and as ultralytics
  (OpenCV), detectron2 and the labelling tools that run in a browser read
  it; its size is the displayed one (`image_size`). Boxes drawn on the
  stored pixels (keras-yolo3's annotation files; a COCO or VOC file that
  records the stored size) are turned with the image (`stored_to_displayed`,
  applied by `data.check` and `data.annotations.turned_upright`).

Training decodes with `decode_image`, which decodes a JPEG that will be
shrunk anyway at reduced scale: several times faster, and the pixels of
TensorFlow's `decode_jpeg(ratio=...)` (tests/test_images.py).
"""

from __future__ import annotations

import logging
import threading

import numpy as np
from PIL import Image, ImageFile

logger = logging.getLogger(__name__)
# Pillow's switch for truncated files is process-wide: set it only while one
# recovering decode runs.
_TRUNCATED_LOCK = threading.Lock()
_WARNED_TRUNCATED: set[str] = set()  # warned once per file, not at every epoch

__all__ = [
    "ORIENTATION_NAMES",
    "decode_image",
    "displayed_size",
    "image_size",
    "image_size_and_orientation",
    "read_image",
    "stored_to_displayed",
    "to_rgb_array",
    "turn_upright",
]

# Pillow modes of one channel with more than 8 bits per sample ("I" holds
# 16-bit PGM and TIFF samples; 32-bit values beyond 16 bits clip at 255).
_DEEP_GREY_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
# EXIF's Orientation tag: how a viewer turns the stored pixels for display (1: as stored).
_ORIENTATION_TAG = 0x0112
ORIENTATION_NAMES = {
    1: "as stored",
    2: "mirrored",
    3: "rotated 180 degrees",
    4: "flipped upside down",
    5: "transposed",
    6: "rotated 90 degrees clockwise",
    7: "transversed",
    8: "rotated 90 degrees counter-clockwise",
}


def read_image(path: str) -> np.ndarray:
    """Decodes an image file completely to RGB.

    Args:
        path: any format Pillow reads.

    Returns:
        (H, W, 3) uint8 RGB in the stored pixel grid (see the module docstring).

    Raises:
        OSError, ValueError, ...: whatever Pillow raises for a missing or
        undecodable file.
    """
    return decode_image(path)[0]


def decode_image(path: str, reduce_to: tuple[int, int] | None = None) -> tuple[np.ndarray, int, tuple[int, int]]:
    """`read_image`, decoding a JPEG at reduced scale when it will be shrunk to `reduce_to`.

    Args:
        path: any format Pillow reads.
        reduce_to: (width, height) the displayed image will be resized to, or None. A
            JPEG at least twice as large on both axes is decoded at 1/2, 1/4
            or 1/8 scale, the largest that keeps it at least this large
            (libjpeg's DCT scaling, Pillow's `draft`). Other formats are decoded whole.

    Returns:
        (pixels, scale, size): (ceil(H / scale), ceil(W / scale), 3) uint8
        RGB, the reduction (1, 2, 4 or 8), and the (W, H) of the whole image,
        all as displayed (EXIF orientation applied).

    Raises:
        OSError, ValueError, ...: as `read_image`.
    """
    try:
        return _decode(path, reduce_to)
    except OSError as error:
        if "truncated" not in str(error):
            raise
    with _TRUNCATED_LOCK:
        previous, ImageFile.LOAD_TRUNCATED_IMAGES = ImageFile.LOAD_TRUNCATED_IMAGES, True
        try:
            decoded = _decode(path, reduce_to)
        finally:
            ImageFile.LOAD_TRUNCATED_IMAGES = previous
        first_time = str(path) not in _WARNED_TRUNCATED
        _WARNED_TRUNCATED.add(str(path))
    if first_time:
        logger.warning("%s is truncated: decoded as far as it goes", path)
    return decoded


def _decode(path: str, reduce_to) -> tuple[np.ndarray, int, tuple[int, int]]:
    with Image.open(path) as image:
        orientation = _orientation(image)
        scale, size = 1, displayed_size(image.size, orientation)
        if reduce_to is not None and image.format == "JPEG":
            width = image.size[0]
            target = displayed_size((max(int(reduce_to[0]), 1), max(int(reduce_to[1]), 1)), orientation)
            drafted = image.draft("RGB", target)  # the stored grid's (w, h)
            if drafted is not None:  # (mode, (0, 0, width / scale, height / scale))
                scale = round(width / drafted[1][2])
        image.load()  # the whole file: a truncated image fails here, not later
        return turn_upright(to_rgb_array(image), orientation), scale, size


def turn_upright(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """(H, W, C) stored pixels as a viewer shows them: PIL's `ImageOps.exif_transpose` on an array.

    tests/test_images.py compares the two for every orientation.
    """
    turned = {
        1: lambda p: p,
        2: lambda p: p[:, ::-1],
        3: lambda p: p[::-1, ::-1],
        4: lambda p: p[::-1],
        5: lambda p: p.transpose(1, 0, 2),
        6: lambda p: np.rot90(p, k=-1),
        7: lambda p: p[::-1, ::-1].transpose(1, 0, 2),
        8: lambda p: np.rot90(p, k=1),
    }[orientation](pixels)
    return turned if orientation == 1 else np.ascontiguousarray(turned)


def image_size(path: str) -> tuple[int, int]:
    """(width, height) of an image file as displayed (EXIF orientation applied), from its header."""
    stored, orientation = image_size_and_orientation(path)
    return displayed_size(stored, orientation)


def image_size_and_orientation(path: str) -> tuple[tuple[int, int], int]:
    """(stored (width, height), EXIF orientation 1-8) from the file's header, without decoding it.

    The orientation is 1 for a file without EXIF or with a value outside 1-8.
    """
    with Image.open(path) as image:
        return image.size, _orientation(image)


def _orientation(image: Image.Image) -> int:
    """The EXIF orientation of an open image, 1 where it has none (or one outside 1-8, or a damaged block)."""
    if not image.info.get("exif"):  # read at open for JPEG, WebP and PNG's eXIf before the pixels
        return 1
    try:
        orientation = int(image.getexif().get(_ORIENTATION_TAG, 1))
    except Exception:  # noqa: BLE001 - a damaged EXIF block leaves the pixels as stored
        return 1
    return orientation if orientation in ORIENTATION_NAMES else 1


def displayed_size(stored_size: tuple[int, int], orientation: int) -> tuple[int, int]:
    """(width, height) of the image as a viewer shows it: swapped by the orientations that turn it 90 degrees."""
    width, height = stored_size
    return (height, width) if orientation >= 5 else (width, height)


def stored_to_displayed(boxes: np.ndarray, orientation: int, stored_size: tuple[int, int]) -> np.ndarray:
    """Boxes drawn on the stored pixels of an image, turned with it to the displayed view (`turn_upright`).

    Args:
        boxes: (N, 4 + k) x_min, y_min, x_max, y_max in stored pixels, then any other columns (the class).
        orientation: the image's EXIF orientation, 1-8.
        stored_size: (width, height) of the stored pixels.

    Returns:
        (N, 4 + k) float, the same boxes on the displayed image, corners ordered; other columns unchanged.
    """
    boxes = np.array(boxes, np.float64).reshape(len(boxes), -1)
    width, height = stored_size
    x, y = boxes[:, [0, 2]], boxes[:, [1, 3]]
    # Where a stored point (x, y) is shown, for each orientation.
    shown_x, shown_y = {
        1: (x, y),
        2: (width - x, y),
        3: (width - x, height - y),
        4: (x, height - y),
        5: (y, x),
        6: (height - y, x),
        7: (height - y, width - x),
        8: (y, width - x),
    }[orientation]
    turned = boxes.copy()
    turned[:, 0], turned[:, 2] = shown_x.min(axis=1), shown_x.max(axis=1)
    turned[:, 1], turned[:, 3] = shown_y.min(axis=1), shown_y.max(axis=1)
    return turned


def to_rgb_array(image) -> np.ndarray:
    """A PIL image or an array as (H, W, 3) uint8 RGB.

    Args:
        image: a PIL image of any mode, or an array (H, W), (H, W, 1),
            (H, W, 3) or (H, W, 4) in RGB(A) order: uint8; uint16 (16 bits,
            high byte kept); float in [0, 1] (scaled by 255) or in [0, 255];
            other types are rounded and clipped to [0, 255].

    Returns:
        (H, W, 3) uint8 RGB; the input itself when it already is one.

    Raises:
        ValueError: an array of another shape.
    """
    if isinstance(image, Image.Image):
        return _pil_to_rgb(image)
    array = np.asarray(image)
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4) or array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(f"expected an (H, W, 3) RGB image. Received: array of shape {array.shape}")
    array = array[:, :, :3]
    if array.shape[2] == 1:
        array = np.repeat(array, 3, axis=2)
    if array.dtype == np.uint16:
        array = array >> 8
    elif array.dtype != np.uint8:
        if np.issubdtype(array.dtype, np.floating) and array.size and float(array.max()) <= 1.0:
            array = array * 255.0  # [0, 1] floats
        array = np.clip(np.rint(array), 0, 255)
    return array.astype(np.uint8, copy=False)


def _pil_to_rgb(image: Image.Image) -> np.ndarray:
    if image.mode == "RGB":
        return np.asarray(image)
    if image.mode in _DEEP_GREY_MODES:
        # Pillow's convert("RGB") clips these at 255: keep the high byte instead.
        grey = np.asarray(image).astype(np.int64) >> 8
        return to_rgb_array(np.clip(grey, 0, 255).astype(np.uint8))
    if image.mode == "F":
        return to_rgb_array(np.asarray(image))
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # the same colours; Pillow warns on a direct P -> RGB
    return np.asarray(image.convert("RGB"))
