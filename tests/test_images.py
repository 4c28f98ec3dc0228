"""The one image reader: every kind of file to RGB uint8, and TF's decoders agreeing with it."""

from __future__ import annotations

import io
import logging
import struct
import warnings
import zlib

import cv2
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageOps

from keras_yolo_mgpu.data.images import decode_image, image_size, read_image, to_rgb_array
from keras_yolo_mgpu.data.scan import scan_image

RNG = np.random.default_rng(0)
W16 = RNG.integers(0, 65536, (5, 7, 4)).astype(np.uint16)  # (H, W, 4) 16-bit samples
W8 = RNG.integers(0, 256, (5, 7, 4)).astype(np.uint8)
PALETTE = [90, 91, 92, 10, 200, 30, 0, 0, 255, 255, 255, 0]  # 4 RGB entries


def _png(samples: np.ndarray, color_type: int, bit_depth: int, palette=None, transparency=None) -> bytes:
    """A PNG written from the specification (no filter), so every colour type and depth can be made."""
    height = samples.shape[0]
    if bit_depth == 16:
        rows = samples.astype(">u2").reshape(height, -1).view(np.uint8)
    elif bit_depth == 8:
        rows = samples.astype(np.uint8).reshape(height, -1)
    else:  # 1-bit
        rows = np.packbits(samples.reshape(height, -1).astype(np.uint8), axis=1)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", samples.shape[1], height, bit_depth, color_type, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
    if palette is not None:
        data += chunk(b"PLTE", bytes(palette))
    if transparency is not None:
        data += chunk(b"tRNS", bytes(transparency))
    return data + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def _grey(values: np.ndarray) -> np.ndarray:
    return np.repeat(values[..., None], 3, axis=2).astype(np.uint8)


# name: (file bytes, expected RGB). 16-bit samples keep their high byte (not
# clipped: Pillow's own convert("RGB") would turn every grey value > 255 white).
PNG_KINDS = {
    "grey-8": (_png(W8[..., 0], 0, 8), _grey(W8[..., 0])),
    "grey-16": (_png(W16[..., 0], 0, 16), _grey(W16[..., 0] >> 8)),
    "grey-1": (_png(W8[..., 0] > 127, 0, 1), _grey(np.where(W8[..., 0] > 127, 255, 0))),
    "grey-alpha-8": (_png(W8[..., :2], 4, 8), _grey(W8[..., 0])),
    "grey-alpha-16": (_png(W16[..., :2], 4, 16), _grey(W16[..., 0] >> 8)),
    "rgb-16": (_png(W16[..., :3], 2, 16), (W16[..., :3] >> 8).astype(np.uint8)),
    "rgba-8": (_png(W8, 6, 8), W8[..., :3]),
    "rgba-16": (_png(W16, 6, 16), (W16[..., :3] >> 8).astype(np.uint8)),
    "palette": (_png(W8[..., 0] % 4, 3, 8, PALETTE), np.reshape(PALETTE, (4, 3))[W8[..., 0] % 4].astype(np.uint8)),
    "palette-transparent": (
        _png(W8[..., 0] % 4, 3, 8, PALETTE, transparency=[0, 128]),
        np.reshape(PALETTE, (4, 3))[W8[..., 0] % 4].astype(np.uint8),
    ),
}


@pytest.mark.parametrize("kind", list(PNG_KINDS))
def test_png_of_every_kind_is_read_as_rgb_and_tf_agrees(tmp_path, kind):
    data, expected = PNG_KINDS[kind]
    path = tmp_path / f"{kind}.png"
    path.write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no Pillow warning (palette + transparency)
        pixels = read_image(str(path))
    assert pixels.dtype == np.uint8 and pixels.shape == (5, 7, 3)
    np.testing.assert_array_equal(pixels, expected)
    assert image_size(str(path)) == (7, 5)
    # TF's decoder (the training pipeline's before 2026-11-26) gives the same pixels.
    np.testing.assert_array_equal(tf.io.decode_png(data, channels=3, dtype=tf.uint8).numpy(), pixels)
    np.testing.assert_array_equal(decode_image(str(path), reduce_to=(1, 1))[0], pixels)  # only JPEGs shrink


def _photo(height=30, width=40):
    yy, xx = np.mgrid[0:height, 0:width]
    return np.stack([xx * 6, yy * 8, (xx + yy) * 3], axis=-1).astype(np.uint8)


def _encode(pixels, fmt, mode=None, **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode).save(buffer, fmt, **options)
    return buffer.getvalue()


def _exif_rotated_jpeg() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    return _encode(_photo(), "JPEG", exif=exif.tobytes())


JPEG_KINDS = {
    "baseline": lambda: _encode(_photo(), "JPEG", quality=90),
    "progressive": lambda: _encode(_photo(), "JPEG", progressive=True),
    "grey": lambda: _encode(_photo()[..., 0], "JPEG"),
    "exif-rotated": _exif_rotated_jpeg,
}


@pytest.mark.parametrize("kind", list(JPEG_KINDS))
def test_jpeg_decoding_at_every_scale_equals_tfs(tmp_path, kind):
    """Full and reduced-scale decoding give TF's `decode_jpeg` pixels (what training decoded before), turned
    upright where the file says so (TF's decoder ignores EXIF: its pixels are turned 90 degrees clockwise here)."""
    data = JPEG_KINDS[kind]()
    path = tmp_path / "photo.jpg"
    path.write_bytes(data)
    turned = kind == "exif-rotated"
    pixels = read_image(str(path))
    assert pixels.shape == ((40, 30, 3) if turned else (30, 40, 3))  # as displayed: the EXIF orientation applied
    # Target sizes (of the stored grid) -> the largest DCT reduction that keeps the image at least that large.
    for reduce_to, scale in (((40, 30), 1), ((20, 16), 1), ((20, 15), 2), ((10, 7), 4), ((5, 3), 8), ((1, 1), 8)):
        reduced, got_scale, size = decode_image(str(path), reduce_to[::-1] if turned else reduce_to)
        assert (got_scale, size) == (scale, (30, 40) if turned else (40, 30))
        expected = tf.io.decode_jpeg(data, channels=3, ratio=scale, dct_method="INTEGER_ACCURATE").numpy()
        np.testing.assert_array_equal(reduced, np.rot90(expected, k=-1) if turned else expected)
        assert reduced.shape[:2] == (-(-30 // scale), -(-40 // scale))[:: -1 if turned else 1]
    if kind == "baseline":  # close to the source (lossy)
        assert np.abs(pixels.astype(int) - _photo()).mean() < 3


def test_cmyk_and_formats_tf_does_not_decode(tmp_path):
    # CMYK (TIFF, lossless): the subtractive conversion R = (255 - C) * (255 - K) / 255, rounded.
    cmyk = np.zeros((4, 6, 4), np.uint8)
    cmyk[...] = [50, 0, 100, 20]
    expected = np.rint((255 - cmyk[..., :3].astype(float)) * (255 - cmyk[..., 3:]) / 255)  # (189, 235, 143)
    (tmp_path / "cmyk.tif").write_bytes(_encode(cmyk, "TIFF", "CMYK"))
    np.testing.assert_array_equal(read_image(str(tmp_path / "cmyk.tif")), expected)
    jpeg = _encode(cmyk, "JPEG", "CMYK", quality=100)  # TF cannot decode CMYK JPEGs: the reader does
    (tmp_path / "cmyk.jpg").write_bytes(jpeg)
    assert np.abs(read_image(str(tmp_path / "cmyk.jpg")) - expected).max() <= 3
    # 16-bit TIFF and PGM (OpenCV writes them): high byte, like the PNGs.
    rgb16 = W16[..., :3]
    cv2.imwrite(str(tmp_path / "rgb16.tif"), rgb16[..., ::-1])  # OpenCV writes BGR
    np.testing.assert_array_equal(read_image(str(tmp_path / "rgb16.tif")), rgb16 >> 8)
    for ext in ("tif", "pgm"):
        cv2.imwrite(str(tmp_path / f"grey16.{ext}"), W16[..., 0])
        np.testing.assert_array_equal(read_image(str(tmp_path / f"grey16.{ext}")), _grey(W16[..., 0] >> 8))
    # GIF and BMP.
    for fmt in ("GIF", "BMP"):
        (tmp_path / f"image.{fmt}").write_bytes(_encode(W8[..., 0], fmt))
        np.testing.assert_array_equal(read_image(str(tmp_path / f"image.{fmt}")), _grey(W8[..., 0]))


def test_truncated_jpeg_is_decoded_as_far_as_it_goes_like_opencv(tmp_path):
    data = _encode(_photo(128, 160), "JPEG")
    (tmp_path / "truncated.jpg").write_bytes(data[: len(data) // 2])
    recovered = read_image(str(tmp_path / "truncated.jpg"))
    (tmp_path / "full.jpg").write_bytes(data)
    full = read_image(str(tmp_path / "full.jpg"))
    by_opencv = cv2.cvtColor(cv2.imread(str(tmp_path / "truncated.jpg")), cv2.COLOR_BGR2RGB)
    assert recovered.shape == full.shape
    np.testing.assert_array_equal(recovered[:4], full[:4])  # the first rows are the photo's
    assert np.abs(recovered.astype(int) - by_opencv).max() <= 1  # OpenCV recovers the same pixels


def test_unreadable_files_raise(tmp_path):
    data = _encode(_photo(), "JPEG")
    (tmp_path / "truncated.jpg").write_bytes(data[:100])  # cut inside the header
    (tmp_path / "garbage.png").write_bytes(b"not an image")
    for name in ("truncated.jpg", "garbage.png", "missing.png"):
        with pytest.raises(OSError):
            read_image(str(tmp_path / name))


def test_reduced_decoding_of_truncated_and_corrupt_jpegs(tmp_path, caplog):
    """Truncated: recovered as far as it goes, at reduced scale too; corrupt scan data: raises, as TF's decoder did."""
    data = _encode(_photo(128, 160), "JPEG")
    (tmp_path / "truncated.jpg").write_bytes(data[: len(data) // 2])
    with caplog.at_level(logging.WARNING):
        reduced, scale, size = decode_image(str(tmp_path / "truncated.jpg"), reduce_to=(40, 32))
    assert (reduced.shape, scale, size) == ((32, 40, 3), 4, (160, 128))
    assert "truncated" in caplog.text
    # Garbage scan data that libjpeg cannot decode (the training pipeline's
    # TF decoder raised on it and fell back to this reader, which raised too).
    corrupt = bytearray(_encode(RNG.integers(0, 256, (128, 160, 3), dtype=np.uint8), "JPEG"))
    start = corrupt.find(b"\xff\xda") + 40
    corrupt[start:-2] = bytes((b * 31 + 7) % 256 for b in corrupt[start:-2])
    (tmp_path / "corrupt.jpg").write_bytes(bytes(corrupt))
    for reduce_to in (None, (40, 32)):
        with pytest.raises(OSError):
            decode_image(str(tmp_path / "corrupt.jpg"), reduce_to)
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_jpeg(bytes(corrupt), channels=3)


def test_to_rgb_array_normalises_in_memory_images():
    assert to_rgb_array(np.zeros((5, 6), np.uint8)).shape == (5, 6, 3)
    rgba = np.dstack([W8[..., :3], np.zeros((5, 7), np.uint8)])
    np.testing.assert_array_equal(to_rgb_array(rgba), W8[..., :3])
    assert to_rgb_array(np.full((2, 2, 3), 1.0, np.float32)).max() == 255  # [0, 1] floats
    np.testing.assert_array_equal(to_rgb_array(W16[..., :3]), W16[..., :3] >> 8)  # 16-bit arrays: high byte
    assert to_rgb_array(Image.new("L", (6, 5))).shape == (5, 6, 3)
    np.testing.assert_array_equal(to_rgb_array(Image.fromarray(W16[..., 0])), _grey(W16[..., 0] >> 8))
    with pytest.raises(ValueError, match="expected an"):
        to_rgb_array(np.zeros((5,), np.uint8))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_displayed_image_is_pils_exif_transpose(tmp_path, orientation):
    """The reader turns the stored pixels as PIL's `ImageOps.exif_transpose` does, for every orientation; the
    header gives the same size; the scan finds the same orientation from its own JPEG header parser."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / "photo.jpg"
    path.write_bytes(_encode(_photo(), "JPEG", exif=exif.tobytes()))
    with Image.open(path) as image:
        expected = np.asarray(ImageOps.exif_transpose(image).convert("RGB"))
    displayed = read_image(str(path))
    np.testing.assert_array_equal(displayed, expected)
    assert displayed.shape[:2] == ((30, 40) if orientation < 5 else (40, 30))
    assert image_size(str(path)) == displayed.shape[1::-1]
    assert scan_image(str(path))[2:4] == displayed.shape[1::-1] and scan_image(str(path))[6] == orientation
