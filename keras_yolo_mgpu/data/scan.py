"""What the dataset check reads of each image: its header, not its pixels, in parallel, remembered.

`scan_images(paths, mode)` gives, for each image, its (width, height) as
displayed (EXIF orientation applied, as every command reads it; the
orientation too) or the problem that keeps it out of training:

- `"header"` (the default of every command): the size and format from the
  file's header, plus the JPEG end-of-image marker (`FF D9`) in the last two
  bytes. A JPEG without it is kept, and decoded as far as it goes when
  training reads it, with a warning naming it. A file whose header no reader
  parses is `unreadable-image`. Tens of microseconds per JPEG, against about
  1 ms for a full decode; an image whose pixels then fail to decode is
  skipped by training with a warning (`host.ImageSource.read`);
- `"full"` (`check_dataset --full`): every image decoded as training decodes it;
- `"none"` (`check_dataset --no-images`): only whether the file exists.

The record (`ScanRecord`), keyed by each image's path, size and mtime and by
`SCAN_VERSION`, is written atomically to the user's cache folder
(`cache_dir()`, never the dataset's) so the next start stats the files
instead of opening them; an entry whose file changed is scanned again, a
record unreadable or of another version is rebuilt, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from keras_yolo_mgpu.data import images
from keras_yolo_mgpu.data.images import displayed_size, image_size_and_orientation, read_image
from keras_yolo_mgpu.fileio import atomic_write
from keras_yolo_mgpu.progress import progress_bar

logger = logging.getLogger(__name__)

__all__ = [
    "CACHE_ENV",
    "MODES",
    "SCAN_VERSION",
    "cache_dir",
    "record_path",
    "scan_images",
]

# Bump when what a scan finds or how a record is laid out changes: older records are then rebuilt.
SCAN_VERSION = 2
MODES = ("none", "header", "full")
# The folder of the records: this variable, else $XDG_CACHE_HOME/keras-yolo-mgpu, else ~/.cache/keras-yolo-mgpu.
CACHE_ENV = "KERAS_YOLO_MGPU_CACHE"
# `--scan-cache none` (or the variable set to it): no record read or written.
NO_CACHE = ("none", "off")

# Status codes of a scanned image, as the record stores them.
OK, MISSING, UNREADABLE, TRUNCATED = 0, 1, 2, 3
_KINDS = {MISSING: "missing-file", UNREADABLE: "unreadable-image"}
# JPEG frame headers (SOF0-SOF15 but DHT C4, JPG C8 and DAC CC): they hold the height and width.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Bytes of an Exif segment read for its first directory (the rest only where the directory lies beyond).
_EXIF_HEAD = 4096
# Markers without a length field: TEM and the restart markers.
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})


class _Truncated(ValueError):
    """The file ends inside its header."""


def cache_dir(override: str | None = None) -> str | None:
    """The folder of scan records, or None when records are turned off.

    Args:
        override: `--scan-cache` (a folder, or "none"); default: `$KERAS_YOLO_MGPU_CACHE`, else
            `$XDG_CACHE_HOME/keras-yolo-mgpu`, else `~/.cache/keras-yolo-mgpu`.
    """
    chosen = override or os.environ.get(CACHE_ENV)
    if chosen:
        return None if chosen.lower() in NO_CACHE else os.path.abspath(os.path.expanduser(chosen))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "keras-yolo-mgpu")


def record_path(folder: str, what: str, key: dict) -> str:
    """`folder/<what>-<hash of key>.npz`: one record per dataset source and reading options."""
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return os.path.join(folder, f"{what}-{digest}.npz")


def save_record(path: str, meta: dict, texts: dict[str, list[str]], **arrays) -> None:
    """Writes a record atomically: `meta` as JSON, each of `texts` NUL-joined (no path holds a NUL), `arrays`."""

    def write(temporary: str) -> None:
        with open(temporary, "wb") as handle:
            encoded = {name: np.frombuffer("\0".join(values).encode(), np.uint8) for name, values in texts.items()}
            np.savez(handle, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), **encoded, **arrays)

    atomic_write(path, write)


def record_text(array: np.ndarray) -> list[str]:
    """A `texts` entry of `save_record`, read back."""
    return array.tobytes().decode().split("\0")


def load_record(path: str, expected: dict, read: Callable, log: logging.Logger, unreadable: str):
    """`read(meta, data)` of the record at `path`, with its npz open; None when missing, damaged, or stale.

    Args:
        expected: what `meta` must hold (the version, the key).
        unreadable: the log message of a damaged record, with `%s` for its path, the error's type and the error.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(data["meta"].tobytes().decode())
            if any(meta.get(name) != value for name, value in expected.items()):
                return None
            return read(meta, data)
    except Exception as error:  # noqa: BLE001 - a damaged record is rebuilt, never trusted
        if not isinstance(error, FileNotFoundError):
            log.info(unreadable, path, type(error).__name__, error)
        return None


# --- one image -------------------------------------------------------------------------


def _jpeg_size(handle) -> tuple[int, int, int]:
    """(stored width, height, EXIF orientation) from the headers of the JPEG open in `handle` (just after its FF D8).

    The orientation is the first Exif segment's (the one Pillow reads), 1 without one.
    """
    orientation = None
    while True:
        prefix = handle.read(2)
        if len(prefix) < 2:
            raise _Truncated("the file ends before the JPEG frame header")
        if prefix[0] != 0xFF:
            raise ValueError(f"no JPEG marker at byte {handle.tell() - 2}")
        marker = prefix[1]
        while marker == 0xFF:  # fill bytes before a marker
            byte = handle.read(1)
            if not byte:
                raise _Truncated("the file ends before the JPEG frame header")
            marker = byte[0]
        if marker in _STANDALONE:
            continue
        if marker in (0xD9, 0xDA):
            raise ValueError("no JPEG frame header before the image data")
        field = handle.read(2)
        if len(field) < 2:
            raise _Truncated("the file ends before the JPEG frame header")
        length = int.from_bytes(field, "big")
        if marker in _SOF_MARKERS:
            frame = handle.read(5)
            if len(frame) < 5:
                raise _Truncated("the file ends inside the JPEG frame header")
            height, width = int.from_bytes(frame[1:3], "big"), int.from_bytes(frame[3:5], "big")
            if not width or not height:
                raise ValueError(f"JPEG frame header of {width}x{height} pixels")  # Pillow decides (DNL)
            return width, height, orientation or 1
        if length < 2:
            raise ValueError(f"JPEG segment of length {length}")
        if marker == 0xE1 and orientation is None:  # APP1: Exif, or XMP
            # The first directory sits near the start; a phone's Exif block (thumbnail included) runs to 64 KB.
            segment = handle.read(min(length - 2, _EXIF_HEAD))
            if segment.startswith(b"Exif\0\0"):
                orientation = _exif_orientation(segment[6:])
                if orientation is None:  # a directory further in: the whole block
                    segment += handle.read(length - 2 - len(segment))
                    orientation = _exif_orientation(segment[6:]) or 1
            handle.seek(length - 2 - len(segment), os.SEEK_CUR)
            continue
        handle.seek(length - 2, os.SEEK_CUR)


def _exif_orientation(tiff: bytes) -> int | None:
    """The Orientation tag (0x0112) of an Exif block's first image directory; 1 where it has none or a bad one.

    None when the directory runs past the end of `tiff` (a block read in part).
    """
    order = {b"II": "little", b"MM": "big"}.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return 1
    directory = int.from_bytes(tiff[4:8], order)
    if directory + 2 > len(tiff):
        return None
    count = int.from_bytes(tiff[directory : directory + 2], order)
    for start in range(directory + 2, directory + 2 + 12 * count, 12):
        entry = tiff[start : start + 12]
        if len(entry) < 12:
            return None
        if int.from_bytes(entry[0:2], order) == 0x0112:  # a SHORT: the first 2 bytes of the value field
            value = int.from_bytes(entry[8:10], order)
            return value if 1 <= value <= 8 else 1
    return 1


def _header(path: str, file_size: int) -> tuple[tuple[int, int], int, bool]:
    """(stored (width, height), EXIF orientation, whether a JPEG lacks its end marker); raises when unreadable."""
    with open(path, "rb") as handle:
        if handle.read(3) == b"\xff\xd8\xff":
            handle.seek(2)
            try:
                width, height, orientation = _jpeg_size(handle)
            except _Truncated:
                raise
            except ValueError:
                orientation = None  # an unusual layout: Pillow's parser has the last word
            if orientation is not None:
                handle.seek(max(file_size - 2, 0))
                return (width, height), orientation, handle.read(2) != b"\xff\xd9"
    size, orientation = image_size_and_orientation(path)  # lazy: reads the header only
    return size, orientation, False


def scan_image(path: str, mode: str = "header") -> tuple[int, int, int, int, int, str | None, int]:
    """What the check needs of one image.

    Args:
        path: the image file.
        mode: one of `MODES` (see the module docstring).

    Returns:
        (file size, mtime_ns, width, height, status, message, orientation):
        width and height as displayed, -1 when unknown (missing, unreadable,
        or mode "none"); status one of OK, MISSING, UNREADABLE, TRUNCATED;
        message says what is wrong; orientation the EXIF one, 1-8 (1 when unknown).
    """
    try:
        stat = os.stat(path)
    except OSError:
        return -1, -1, -1, -1, MISSING, f"image not found: {path}", 1
    if not os.path.isfile(path):
        return -1, -1, -1, -1, MISSING, f"image not found: {path}", 1
    found = (stat.st_size, stat.st_mtime_ns)
    if mode == "none":
        return *found, -1, -1, OK, None, 1
    try:
        if mode == "full":
            pixels = read_image(path)  # decoded as training will decode it: a truncated file is recovered here
            return *found, pixels.shape[1], pixels.shape[0], OK, None, image_size_and_orientation(path)[1]
        stored, orientation, truncated = _header(path, stat.st_size)
    except _Truncated as error:
        return *found, -1, -1, UNREADABLE, f"unreadable image {path}: truncated: {error}", 1
    except Exception as error:  # noqa: BLE001 - any reader failure is a finding
        return *found, -1, -1, UNREADABLE, f"unreadable image {path}: {type(error).__name__}: {error}", 1
    width, height = displayed_size(stored, orientation)
    if truncated:
        message = f"{path} has no JPEG end-of-image marker (truncated?)"
        return *found, width, height, TRUNCATED, message, orientation
    return *found, width, height, OK, None, orientation


# --- many images, and their record -------------------------------------------------------


class ScanRecord:
    """The scan of a list of images, as arrays: what one record file holds.

    Attributes:
        paths: the images, in the order scanned.
        stats: (N, 2) int64 file size and mtime_ns (-1: missing).
        sizes: (N, 2) int32 (width, height) as displayed (-1: unknown).
        status: (N,) int8 OK, MISSING, UNREADABLE or TRUNCATED.
        messages: index -> message, for the images that are not OK.
        orientations: (N,) int8 EXIF orientation, 1-8 (1 when unknown).
    """

    def __init__(self, paths: list[str], stats, sizes, status, messages: dict[int, str], orientations=None):
        self.paths = paths
        self.stats = np.asarray(stats, np.int64).reshape(-1, 2)
        self.sizes = np.asarray(sizes, np.int32).reshape(-1, 2)
        self.status = np.asarray(status, np.int8).reshape(-1)
        self.messages = messages
        self.orientations = np.ones(len(paths), np.int8) if orientations is None else np.asarray(orientations, np.int8)

    def result(self, index: int) -> tuple[tuple[int, int] | None, str | None, str | None]:
        """(size or None, problem kind or None, message or None) of image `index`, as `data.check` takes it."""
        width, height = (int(v) for v in self.sizes[index])
        size = (width, height) if width > 0 else None
        status = int(self.status[index])
        return size, _KINDS.get(status), self.messages.get(index) if status in _KINDS else None

    def save(self, path: str, mode: str) -> None:
        """Writes the record atomically (a reader sees the old file or the new one)."""
        meta = {"version": SCAN_VERSION, "mode": mode, "messages": self.messages}
        arrays = {"stats": self.stats, "sizes": self.sizes, "status": self.status, "orientations": self.orientations}
        save_record(path, meta, {"paths": self.paths}, **arrays)

    @classmethod
    def load(cls, path: str, mode: str) -> ScanRecord | None:
        """The record at `path`, or None when it is missing, unreadable, or of another version or mode."""

        def read(meta, data):
            messages = {int(k): v for k, v in meta["messages"].items()}
            arrays = (data[name] for name in ("stats", "sizes", "status"))
            return cls(record_text(data["paths"]), *arrays, messages, data["orientations"])

        expected = {"version": SCAN_VERSION, "mode": mode}
        record = load_record(path, expected, read, logger, "scan record %s unreadable (%s: %s): scanning again")
        if record is None:
            return None
        lengths = {len(part) for part in (record.paths, record.stats, record.sizes, record.status, record.orientations)}
        if len(lengths) != 1:
            return None
        return record


def _stat(path: str) -> tuple[int, int]:
    try:
        stat = os.stat(path)
    except OSError:
        return -1, -1
    return stat.st_size, stat.st_mtime_ns


def _in_parallel(function: Callable, items: Sequence, workers: int | None, *, enabled: bool, **bar_options) -> list:
    """`[function(item) for item in items]` in threads (file reads release the GIL).

    With a progress display (`progress.progress_bar`) when `enabled`.
    """
    chunk = 256  # a future per chunk, not per file: 118k futures cost more than the headers
    chunks = [items[i : i + chunk] for i in range(0, len(items), chunk)]
    results: list = []
    bar = progress_bar(len(items), enabled=enabled, unit_scale=True, smoothing=0.1, **bar_options)
    with ThreadPoolExecutor(workers or min(8, os.cpu_count() or 1)) as pool:
        for part in pool.map(lambda part: [function(item) for item in part], chunks):
            results.extend(part)
            bar.update(len(part))
    bar.close()
    return results


def scan_images(
    paths: list[str],
    mode: str = "header",
    *,
    record: str | None = None,
    write_record: bool = True,
    workers: int | None = None,
    progress: bool = False,
) -> ScanRecord:
    """Scans `paths` (see the module docstring), reusing the record at `record` for unchanged files.

    Args:
        paths: image files (duplicates allowed: each is scanned once).
        mode: one of `MODES`.
        record: the record file (`record_path`), or None for none.
        write_record: write the record back when something was scanned (the
            chief of several processes does; the others only read it).
        workers: threads (default: the CPU count, at most 8).
        progress: a bar on a terminal, a line every half minute in a log (`progress.progress_bar`); a
            summary with the rate is logged either way.

    Returns:
        A `ScanRecord` of the distinct paths, sorted.
    """
    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {MODES}. Received: mode={mode!r}")
    paths = sorted(set(paths))
    start = time.perf_counter()
    old = ScanRecord.load(record, mode) if record else None
    reuse: dict[str, int] = {}
    if old is not None:
        # Statting is ~20x cheaper than opening and parsing: the unchanged files come from the record.
        stats = _in_parallel(_stat, paths, workers, desc="checking the scan record", unit="image", enabled=progress)
        position = {path: index for index, path in enumerate(old.paths)}
        for path, stat in zip(paths, stats):
            index = position.get(path)
            if index is not None and tuple(old.stats[index]) == stat:  # (-1, -1): still missing
                reuse[path] = index
    todo = [path for path in paths if path not in reuse]
    desc = {"header": "scanning image headers", "full": "decoding images", "none": "finding images"}[mode]
    scanned = dict(
        zip(todo, _in_parallel(lambda p: scan_image(p, mode), todo, workers, desc=desc, unit="image", enabled=progress))
    )
    rows, messages = [], {}
    for index, path in enumerate(paths):
        if path in reuse:
            at = reuse[path]
            row = (*old.stats[at], *old.sizes[at], old.status[at], old.messages.get(at), old.orientations[at])
        else:
            row = scanned[path]
        rows.append((*row[:5], row[6]))
        if row[5] is not None:
            messages[index] = row[5]
    table = np.array(rows, np.int64).reshape(-1, 6)
    result = ScanRecord(paths, table[:, 0:2], table[:, 2:4], table[:, 4], messages, table[:, 5])
    elapsed = time.perf_counter() - start
    if todo:
        logger.info(
            "%s: %d of %d images in %.1f s (%.0f images/s)%s",
            desc,
            len(todo),
            len(paths),
            elapsed,
            len(todo) / max(elapsed, 1e-9),
            f"; {len(reuse)} unchanged, from the scan record" if reuse else "",
        )
    elif paths:
        logger.info("scan record %s: all %d images unchanged (%.1f s)", record, len(paths), elapsed)
    if record and write_record and todo:
        try:
            result.save(record, mode)
        except OSError as error:  # a read-only cache folder costs the next start time, not this run
            logger.warning("cannot write the scan record %s (%s): the next start scans again", record, error)
    _warn_truncated(result)
    return result


def _warn_truncated(result: ScanRecord) -> None:
    """Names each JPEG without its end marker once per process; training's decode then stays quiet about it."""
    for index in np.flatnonzero(result.status == TRUNCATED):
        path = result.paths[index]
        if path not in images._WARNED_TRUNCATED:
            images._WARNED_TRUNCATED.add(path)
            logger.warning("%s: decoded as far as it goes when read", result.messages[int(index)])
