"""The header scan and its records (data/scan.py) on a small COCO-size-style dataset with planted bad files.

The dataset comes from scripts/make_coco_size_dataset.py (the generator of
BENCHMARKS.md's COCO-size figures), at 40 images: each planted file is named
once, the others pass, a second check reads the records, a changed or damaged
record is never trusted, and nothing in the dataset folder is created or changed.
"""

import io
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from keras_yolo_mgpu.cli.check_dataset import main
from keras_yolo_mgpu.data import images
from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.data.host import check_cache_fits
from keras_yolo_mgpu.data.scan import scan_image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _listing(folder):
    """Every file and folder under `folder` with its size and mtime: what 'unchanged' means here."""
    found = {}
    for directory, folders, files in os.walk(folder):
        for name in folders + files:
            stat = os.stat(os.path.join(directory, name))
            found[os.path.join(directory, name)] = (stat.st_size, stat.st_mtime_ns)
    return found


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    out = tmp_path_factory.mktemp("coco_small") / "data"
    script = os.path.join(REPO, "scripts", "make_coco_size_dataset.py")
    subprocess.run(
        [sys.executable, script, "--out", str(out), "--images", "40", "--distinct", "3", "--num-classes", "4"],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": REPO},
        timeout=120,
    )
    return out


def _check(dataset, cache, capsys, caplog):
    caplog.clear()
    with caplog.at_level(logging.INFO):
        status = main(["--data", str(dataset / "train.json"), "--scan-cache", str(cache)])
    return status, capsys.readouterr().out, caplog.text


def test_planted_files_named_once_records_reused_dataset_untouched(planted, tmp_path, capsys, caplog):
    cache = tmp_path / "cache"
    before = _listing(planted)
    status, out, log = _check(planted, cache, capsys, caplog)
    assert status == 1
    for name in ("planted_zero_bytes.jpg", "planted_not_an_image.jpg", "planted_missing.jpg"):
        assert sum(name in line for line in out.splitlines()) == 1, out
    assert "image not found" in out and out.count("unreadable image") == 2
    assert out.count("planted_label_outside.jpg") == 0  # a COCO problem names the image id: the last one
    assert "[image 40]: box 7 (600,10,700,60" in out and "extends outside the 640x480 image" in out
    assert log.count("planted_truncated.jpg has no JPEG end-of-image marker") == 1  # kept, decoded as far as it goes
    assert "40 images listed, 37 usable; 40 images, 280 boxes" in out
    assert "scanning image headers: 40 of 40 images" in log
    assert sorted(p.name.split("-")[0] for p in cache.iterdir()) == ["records", "scan"]

    # The second start (a new process: once per process) reads the records: the same report, no file opened again.
    images._WARNED_TRUNCATED.clear()
    status2, out2, log2 = _check(planted, cache, capsys, caplog)
    assert (status2, out2) == (status, out)
    assert "read from its record" in log2 and "all 40 images unchanged" in log2
    assert log2.count("planted_truncated.jpg has no JPEG end-of-image marker") == 1  # still named, from the record

    # A damaged record is rebuilt, never trusted; the report stays the same.
    for record in cache.iterdir():
        record.write_bytes(b"not a record")
    status3, out3, log3 = _check(planted, cache, capsys, caplog)
    assert (status3, out3) == (status, out)
    assert "images read in" in log3 and "scanning image headers: 40 of 40" in log3
    assert _listing(planted) == before  # nothing created or changed in the dataset's folder


def test_a_changed_image_is_scanned_again(planted, tmp_path, capsys, caplog):
    cache = tmp_path / "cache"
    _check(planted, cache, capsys, caplog)
    image = planted / "images" / "000000000003.jpg"
    stat = os.stat(image)
    try:
        os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        _, _, log = _check(planted, cache, capsys, caplog)
    finally:
        os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    # The image is a hard link to one of 3 sources: the listed names that share its inode share its mtime.
    changed = sum(os.path.samestat(os.stat(p), stat) for p in (planted / "images").iterdir())
    assert 5 < changed < 35
    assert f"scanning image headers: {changed} of 40 images" in log
    assert f"{40 - changed} unchanged, from the scan record" in log


def test_scan_image_modes(planted):
    folder = planted / "images"
    good = str(folder / "000000000001.jpg")
    assert scan_image(good)[2:5] == (640, 480, 0)
    assert scan_image(good, "none")[2:5] == (-1, -1, 0)
    assert scan_image(good, "full")[2:5] == (640, 480, 0)
    truncated = scan_image(str(folder / "planted_truncated.jpg"))
    assert truncated[2:5] == (640, 480, 3) and "end-of-image" in truncated[5]
    head = planted.parent / "head.jpg"  # outside the dataset: it stays as generated
    head.write_bytes((folder / "000000000001.jpg").read_bytes()[:100])  # cut inside the header
    try:
        assert "truncated" in scan_image(str(head))[5] and scan_image(str(head))[4] == 2
    finally:
        head.unlink()


def test_a_cache_that_cannot_fit_is_refused_with_both_numbers(tmp_path):
    records = [Annotation(f"/x/{i}.jpg", np.zeros((0, 5), np.float32), size=(640, 480)) for i in range(2)]
    # 416x312 placed x 3 bytes per 4:3 image.
    assert check_cache_fits(str(tmp_path / "c"), records, (416, 416)) == 2 * 416 * 312 * 3
    # 10,000 images of unknown size count the whole 4160x4160 canvas: 519 GB.
    many = [Annotation(f"/y/{i}.jpg", records[0].boxes) for i in range(10_000)]
    with pytest.raises(
        ValueError, match=r"--cache ram: the decoded images need about 519\.2 GB \(10000 images .* but only"
    ):
        check_cache_fits("ram", many, (4160, 4160))


def test_exif_orientation_is_read_in_either_byte_order_from_the_first_exif_segment(tmp_path):
    """The header parser's Orientation, where Pillow's `getexif` finds it: big- and little-endian Exif, after an XMP
    segment, and only the first Exif segment."""
    from keras_yolo_mgpu.data.images import image_size_and_orientation
    from keras_yolo_mgpu.data.scan import _exif_orientation

    def exif(order: str, orientation: int, at: int = 8) -> bytes:
        """A TIFF block whose first directory, at byte `at`, holds the Orientation alone."""
        endian = "big" if order == "MM" else "little"
        entry = (0x0112).to_bytes(2, endian) + (3).to_bytes(2, endian) + (1).to_bytes(4, endian)
        entry += orientation.to_bytes(2, endian) + b"\0\0"
        header = order.encode() + (42).to_bytes(2, endian) + at.to_bytes(4, endian)
        return header + bytes(at - 8) + (1).to_bytes(2, endian) + entry + bytes(4)

    assert _exif_orientation(exif("MM", 6)) == 6 and _exif_orientation(exif("II", 8)) == 8
    assert _exif_orientation(exif("II", 9)) == 1 and _exif_orientation(b"II*\0") == 1

    def segment(payload: bytes) -> bytes:
        return b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload

    plain = io.BytesIO()
    Image.new("RGB", (40, 30)).save(plain, "JPEG")
    body = plain.getvalue()[2:]
    xmp = segment(b"http://ns.adobe.com/xap/1.0/\0<x/>")
    path = tmp_path / "turned.jpg"
    path.write_bytes(
        b"\xff\xd8" + xmp + segment(b"Exif\0\0" + exif("MM", 6)) + segment(b"Exif\0\0" + exif("II", 3)) + body
    )
    assert image_size_and_orientation(str(path)) == ((40, 30), 6)  # Pillow's reading
    assert scan_image(str(path))[2:4] == (30, 40) and scan_image(str(path))[6] == 6
    # A directory past the first 4 KB the scan reads of the segment: it reads the rest.
    far = tmp_path / "far.jpg"
    far.write_bytes(b"\xff\xd8" + segment(b"Exif\0\0" + exif("II", 8, at=6000)) + body)
    assert image_size_and_orientation(str(far)) == ((40, 30), 8)
    assert scan_image(str(far))[2:4] == (30, 40) and scan_image(str(far))[6] == 8
