"""The official Darknet weights by name: `yolov3-tiny` -> a verified file in the user's cache.

`resolve_weights("yolov3-tiny")` returns `<cache>/weights/yolov3-tiny.weights`
(`data.scan.cache_dir()`), downloading it first when the cache does not hold it.
A download is checked against the official size and checksum before it takes its
final name (`fileio.atomic_write`): an interrupted, truncated or corrupted download
leaves nothing behind.

`$KERAS_YOLO_MGPU_WEIGHTS_URL` replaces the published addresses with a mirror
that holds the same file names (`<mirror>/yolov3-tiny.weights`): a local
server, a company proxy, or `file:///mnt/mirror` for a machine offline.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.client import HTTPException

from keras_yolo_mgpu.data.scan import CACHE_ENV, cache_dir
from keras_yolo_mgpu.fileio import atomic_write
from keras_yolo_mgpu.progress import progress_bar

logger = logging.getLogger(__name__)

__all__ = [
    "OFFICIAL_WEIGHTS",
    "WEIGHTS_URL_ENV",
    "OfficialWeights",
    "WeightsDownloadError",
    "cached_weights_path",
    "fetch_official_weights",
    "official_name",
    "resolve_weights",
    "weights_url",
]

WEIGHTS_URL_ENV = "KERAS_YOLO_MGPU_WEIGHTS_URL"
DARKNET_SUFFIX = ".weights"
# Seconds without a byte (connecting or reading) before the download counts as offline.
TIMEOUT_S = 30.0
_BLOCK = 1 << 20


class WeightsDownloadError(OSError):
    """The official weights could not be downloaded or failed their check; the message says where to put them."""


@dataclass(frozen=True)
class OfficialWeights:
    """One official Darknet weights file.

    Attributes:
        name: the net's name, `yolov3-tiny`; the file is `<name>.weights`.
        url: the published address.
        size: bytes of the file, header included.
        checksums: `"algorithm:hexdigest"` (hashlib names); the file passes
            when one of them matches. Several where the publisher replaced
            the file under the same address. Empty: checked by size alone.
    """

    name: str
    url: str
    size: int
    checksums: tuple[str, ...]

    @property
    def file_name(self) -> str:
        return self.name + DARKNET_SUFFIX


# No checksum was found on pjreddie.com or on AlexeyAB's
# release pages; these are the ones public downloaders of the same addresses check:
# * yolov3-tiny md5 and yolov3 md5: Darknet wrappers' Dockerfiles and Makefiles (both files), Streamlit's
#   demo-self-driving app and other download scripts (yolov3), all alike.
# * yolov4 sha1: OpenCV's test-data downloader (opencv_extra testdata/dnn/download_models.py) and
#   openvolley/ovml, for this file; md5: other downloaders of this address.
# * yolov4-tiny sha1: the file at this address was replaced in December 2020 by a retrained one (same
#   cfg, same size). OpenCV's downloader lists both: d110379b... (the first, "YOLOv4-tiny") and
#   451caaab... ("YOLOv4-tiny-2020-12", which ovml and OpenCV's samples give for this address). Both pass.
OFFICIAL_WEIGHTS: dict[str, OfficialWeights] = {
    entry.name: entry
    for entry in (
        OfficialWeights(
            "yolov3",
            "https://pjreddie.com/media/files/yolov3.weights",
            248_007_048,
            ("md5:c84e5b99d0e52cd466ae710cadf6d84c",),
        ),
        OfficialWeights(
            "yolov3-tiny",
            "https://pjreddie.com/media/files/yolov3-tiny.weights",
            35_434_956,
            ("md5:3bcd6b390912c18924b46b26a9e7ff53",),
        ),
        OfficialWeights(
            "yolov4",
            "https://github.com/AlexeyAB/darknet/releases/download/darknet_yolo_v3_optimal/yolov4.weights",
            257_717_640,
            ("sha1:0143deb6c46fcc7f74dd35bf3c14edc3784e99ee", "md5:00a4878d05f4d832ab38861b32061283"),
        ),
        OfficialWeights(
            "yolov4-tiny",
            "https://github.com/AlexeyAB/darknet/releases/download/darknet_yolo_v4_pre/yolov4-tiny.weights",
            24_251_276,
            ("sha1:451caaab22fb9831aa1a5ee9b5ba74a35ffa5dcb", "sha1:d110379b7b86899226b591ad4affc7115f707157"),
        ),
    )
}


def official_name(text: str | None) -> str | None:
    """The official net `text` names (`yolov3-tiny` or `yolov3-tiny.weights`), else None.

    A text with a folder in it (`model_data/yolov3-tiny.weights`) names a
    file, never a download: the user said where the file should be.
    """
    name = _bare_name(text)
    return name if name in OFFICIAL_WEIGHTS else None


def _bare_name(text: str | None) -> str | None:
    """`text` without the `.weights` ending, or None where it has a folder in it (a place, not a name)."""
    if not text or os.sep in text or (os.altsep and os.altsep in text):
        return None
    return text[: -len(DARKNET_SUFFIX)] if text.endswith(DARKNET_SUFFIX) else text


def weights_url(name: str) -> str:
    """Where `name`'s file is downloaded from: `$KERAS_YOLO_MGPU_WEIGHTS_URL/<name>.weights`, else the published URL."""
    entry = OFFICIAL_WEIGHTS[name]
    mirror = os.environ.get(WEIGHTS_URL_ENV)
    return f"{mirror.rstrip('/')}/{entry.file_name}" if mirror else entry.url


def cached_weights_path(name: str) -> str:
    """`<cache>/weights/<name>.weights`, whether it exists or not.

    Raises:
        WeightsDownloadError: `$KERAS_YOLO_MGPU_CACHE` turns the cache off.
    """
    entry = OFFICIAL_WEIGHTS[name]
    folder = cache_dir()
    if folder is None:
        # The user turned the cache off: writing 250 MB into it anyway would overrule them.
        raise WeightsDownloadError(
            f"{name}: ${CACHE_ENV}={os.environ.get(CACHE_ENV)} turns the cache off, and the official weights are "
            f"downloaded into it. Set ${CACHE_ENV} to a folder, or download {entry.url} yourself and pass its path"
        )
    return os.path.join(folder, "weights", entry.file_name)


def fetch_official_weights(name: str, *, progress: bool = True) -> str:
    """The path of `name`'s official weights in the cache, downloaded and verified first when absent.

    A file already in the cache is trusted when its size is the official one
    (a checksum of 250 MB at every start would cost more than it guards: the
    download was verified before it took that name).

    Args:
        name: a key of `OFFICIAL_WEIGHTS`, e.g. `"yolov3-tiny"`.
        progress: show the progress while downloading (`progress.progress_bar`).

    Raises:
        WeightsDownloadError: offline, an HTTP error, a truncated or
            corrupted download (nothing is kept), or a cached file of the
            wrong size; the message names the URL and where to put the file.
    """
    entry = OFFICIAL_WEIGHTS[name]
    path = cached_weights_path(name)
    if os.path.isfile(path):
        size = os.path.getsize(path)
        if size != entry.size:
            raise WeightsDownloadError(
                f"{path} is {size:,} bytes; the official {name} weights are {entry.size:,}. Delete it to download "
                f"{weights_url(name)} again, or put the right file there"
            )
        logger.debug("%s: cached at %s", name, path)
        return path
    url = weights_url(name)
    logger.info("%s: downloading %s into %s", name, url, path)
    atomic_write(path, lambda temporary: _download(entry, url, temporary, path, progress))
    return path


def resolve_weights(text: str | None) -> str | None:
    """What a `--weights`/`--model` value means: an existing path as is, an official net's name as its cached file.

    `"yolov3-tiny"`, and `"yolov3-tiny.weights"` when no such file exists,
    resolve to the official Darknet weights (downloaded once, see
    `fetch_official_weights`). A path comes back unchanged, so the caller's
    own "file not found" message still reports it.

    Raises:
        WeightsDownloadError: the official weights could not be had.
        FileNotFoundError: a bare word that names no file and no official net (`yolov3-tinyy`).
    """
    if not text or os.path.exists(text):
        return text
    name = official_name(text)
    if not name:
        _refuse_unknown_name(text)
        return text
    try:
        return fetch_official_weights(name)
    except WeightsDownloadError as error:
        if not text.endswith(DARKNET_SUFFIX):
            raise
        # A file name (keras-yolo3's `convert.py yolov3.cfg yolov3.weights ...`) is also where its README puts the file.
        raise WeightsDownloadError(f"{error}; or put it in {os.path.abspath('.')} as {text}") from None


def _refuse_unknown_name(text: str) -> None:
    """FileNotFoundError for a bare word (no folder, no file ending) that is no file and no official net's name.

    A path with a folder or an ending (`best.h5`) is left to the caller's own "file not found".
    """
    stem = _bare_name(text)
    if stem is None or "." in stem:
        return
    close = difflib.get_close_matches(stem, list(OFFICIAL_WEIGHTS), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise FileNotFoundError(
        f"{text}: no such file, and no official net of that name ({hint}by name, downloaded once: "
        f"{', '.join(OFFICIAL_WEIGHTS)})"
    )


def _download(entry: OfficialWeights, url: str, temporary: str, final: str, progress: bool) -> None:
    """Writes `url` to `temporary` and checks its size and checksums; raises on any difference."""
    by_hand = f"download {entry.url} yourself and put it at {final}"
    request = urllib.request.Request(url, headers={"User-Agent": "keras-yolo-mgpu"})
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as error:
        raise WeightsDownloadError(f"{url}: HTTP {error.code} {error.reason}; {by_hand}") from None
    except (urllib.error.URLError, HTTPException, OSError) as error:  # refused, DNS, timeout, reset
        reason = getattr(error, "reason", error)
        raise WeightsDownloadError(
            f"{url}: cannot connect ({reason}); offline? On a connected machine {by_hand} (or set "
            f"${WEIGHTS_URL_ENV} to a mirror holding {entry.file_name})"
        ) from None
    digests = {spec: hashlib.new(spec.split(":", 1)[0], usedforsecurity=False) for spec in entry.checksums}
    got = 0
    with response:
        announced = response.headers.get("Content-Length")
        if announced is not None and announced.isdigit() and int(announced) != entry.size:
            raise WeightsDownloadError(
                f"{url}: the server offers {int(announced):,} bytes; the official {entry.name} weights are "
                f"{entry.size:,}. Not downloaded; {by_hand}"
            )
        bar = progress_bar(entry.size, unit="byte", desc=entry.name, enabled=progress, byte_sizes=True)
        try:
            with bar, open(temporary, "wb") as handle:
                # One byte past the official size is enough to know the file is not it.
                while got <= entry.size:
                    block = response.read(min(_BLOCK, entry.size + 1 - got))
                    if not block:
                        break
                    handle.write(block)
                    for digest in digests.values():
                        digest.update(block)
                    got += len(block)
                    bar.update(len(block))
        except (HTTPException, OSError) as error:
            raise WeightsDownloadError(
                f"{url}: the download broke off after {got:,} of {entry.size:,} bytes ({error}); nothing was kept. "
                f"Try again, or {by_hand}"
            ) from None
    if got != entry.size:
        what = f"{got:,} of {entry.size:,} bytes" if got < entry.size else f"more than {entry.size:,} bytes"
        raise WeightsDownloadError(f"{url}: got {what}; nothing was kept. Try again, or {by_hand}")
    found = {spec: f"{spec.split(':', 1)[0]}:{digest.hexdigest()}" for spec, digest in digests.items()}
    if found and not any(found[spec] == spec for spec in found):
        raise WeightsDownloadError(
            f"{url}: checksum mismatch: got {', '.join(sorted(set(found.values())))}, expected "
            f"{' or '.join(entry.checksums)}; the file was not kept. Try again, or {by_hand}"
        )
    if not found:
        logger.warning("%s: no checksum known; checked by size alone", entry.name)
