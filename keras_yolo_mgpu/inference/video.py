"""Video in and out on threads, so decoding and encoding overlap the model.

keras-yolo3's video loop read, detected, drew and wrote one frame at a time
on one thread, fed OpenCV's BGR frames to a model trained on RGB, crashed on
the `None` frame at the end of every file and wrote with a codec taken from
the input that often would not open. Here `VideoReader` and `VideoWriter` each
run on a thread; the end of a file, a dropped network stream (`rtsp://`, `rtmp://`,
`http(s)://`, through OpenCV's FFmpeg backend) and a read error all end the input
normally; the writer picks `mp4v` (`MJPG` for `.avi`) with an `.avi` fallback and
renames the finished video onto its destination, on an error or Ctrl-C too (an MP4
is unreadable until its index is written at the end).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import re
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import cv2
import numpy as np

from keras_yolo_mgpu.data.formats.records import IMAGE_EXTENSIONS

logger = logging.getLogger(__name__)

DEFAULT_FPS = 30.0
# (fourcc, extension) tried in order for each requested extension.
_CODECS = {
    ".mp4": [("mp4v", ".mp4"), ("MJPG", ".avi")],
    ".m4v": [("mp4v", ".m4v"), ("MJPG", ".avi")],
    ".mov": [("mp4v", ".mov"), ("MJPG", ".avi")],
    ".avi": [("MJPG", ".avi"), ("XVID", ".avi")],
    ".mkv": [("mp4v", ".mkv"), ("MJPG", ".avi")],
}
_END = object()


class VideoError(RuntimeError):
    """A video input or output that cannot be used; the message says why."""


# URL schemes OpenCV's FFmpeg backend opens as a video stream.
STREAM_SCHEMES = ("rtsp", "rtsps", "rtmp", "rtmps", "http", "https")
_URL = re.compile(r"^([a-z][a-z0-9+.-]*)://", re.IGNORECASE)
# FFmpeg's decoders that draw characters: its `tty` demuxer takes .txt, .nfo,
# .asc ... files as ANSI art and OpenCV reads a text file as a "video" of its
# pages (a 10 KB README is 43 frames). The codec name is what FFmpeg decided
# after probing the content, so no list of extensions or magic bytes to keep.
_TEXT_CODECS = {"ansi", "bint", "xbin", "idf"}
# Still images open as one-frame videos (FFmpeg's image2 demuxer); GIFs stay
# allowed, as FFmpeg plays an animated GIF.
_STILL_IMAGE_EXTENSIONS = tuple(e for e in IMAGE_EXTENSIONS if e != ".gif")


def is_stream(source: str | int) -> bool:
    """True for a network stream URL (`STREAM_SCHEMES`)."""
    match = _URL.match(str(source)) if not isinstance(source, int) else None
    return bool(match) and match.group(1).lower() in STREAM_SCHEMES


def display_name(source: str | int) -> str:
    """How `source` is named in messages: `camera 0`, a path, or a URL without its password."""
    if isinstance(source, int):
        return f"camera {source}"
    if not is_stream(source):
        return str(source)
    parts = urlsplit(str(source))
    if parts.password is None:
        return str(source)
    host = parts.hostname or ""
    host = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=host))


def parse_source(source: str | int) -> str | int:
    """`"0"` -> camera 0; a `rtsp://`, `rtmp://`, `http(s)://` URL as given; anything else is a file that must exist.

    Raises:
        VideoError: no such file, or a URL of another scheme.
    """
    if isinstance(source, int):
        return source
    text = str(source).strip()
    if text.isdigit() and not os.path.exists(text):
        return int(text)
    if is_stream(text):
        return text
    match = _URL.match(text)
    if match and not os.path.exists(text):
        raise VideoError(
            f"video input {text}: {match.group(1)}:// is not a stream OpenCV opens here "
            f"(give {', '.join(s + '://' for s in STREAM_SCHEMES)}, a file or a camera index)"
        )
    if not os.path.isfile(text):
        raise VideoError(f"video input not found: {text} (give a video file, a stream URL or a camera index like 0)")
    return text


def _fourcc_text(capture: cv2.VideoCapture) -> str:
    code = int(capture.get(cv2.CAP_PROP_FOURCC)) & 0xFFFFFFFF
    return code.to_bytes(4, "little").decode("latin-1").rstrip("\0 ")


@contextlib.contextmanager
def _opencv_errors_only():
    """OpenCV logs only errors in the block, unless -v.

    Its WARN lines for a camera or stream it cannot open would precede the VideoError that says the same in the
    user's terms.
    """
    previous = cv2.utils.logging.getLogLevel()
    if not logger.isEnabledFor(logging.DEBUG):
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)
    try:
        yield
    finally:
        cv2.utils.logging.setLogLevel(previous)


def open_capture(source: str | int) -> tuple[cv2.VideoCapture, np.ndarray]:
    """Opens `source` (as `parse_source` reads it) and decodes its first frame.

    Returns:
        `(capture, first_frame)`: the open capture, the (H, W, 3) BGR frame.

    Raises:
        VideoError: not found, not a video (a text file, a still image), or
            no frame decodes.
    """
    source = parse_source(source)
    name = display_name(source)
    if isinstance(source, str) and not is_stream(source) and source.lower().endswith(_STILL_IMAGE_EXTENSIONS):
        raise VideoError(f"video input {name} is an image, not a video: detect it with --image {name}")
    with _opencv_errors_only():
        capture = cv2.VideoCapture(source)
    if not capture.isOpened():
        capture.release()
        raise VideoError(f"cannot open video input {name}: not a video OpenCV can decode, or no such camera or stream")
    codec = _fourcc_text(capture).lower()
    if codec in _TEXT_CODECS:
        capture.release()
        raise VideoError(
            f"video input {name} is a text file, not a video (FFmpeg would render its characters as frames, "
            f"codec {codec!r})"
        )
    try:
        ok, first = capture.read()
    except cv2.error as error:
        ok, first = False, None
        logger.debug("reading the first frame of %s: %s", name, error)
    if not ok or first is None:
        capture.release()
        if isinstance(source, int):
            why = "the camera sent no frame (in use by another program, or no permission?)"
        elif is_stream(source):
            # FFmpeg reads an .mp4 whose index sits at its end only where the server can seek (HTTP byte ranges).
            why = "the stream sent no decodable frame (an .mp4 over HTTP needs a server that serves byte ranges)"
        else:
            why = "the file is empty or not a readable video"
        raise VideoError(f"cannot read any frame from {name}: {why}")
    return capture, first


def check_video_input(source: str | int) -> None:
    """Raises `VideoError` unless a video file decodes (`open_capture`); a camera or stream is only parsed.

    Opening a camera or a stream twice costs seconds (or a second
    connection), so they are tried once, by the reader.
    """
    source = parse_source(source)
    if isinstance(source, str) and not is_stream(source):
        capture, _ = open_capture(source)
        capture.release()


class _Worker(threading.Thread):
    """A daemon thread whose exception is re-raised in the caller's thread."""

    def __init__(self, target: Callable[[], None], name: str):
        super().__init__(name=name, daemon=True)
        self._work, self._error = target, None

    def run(self):
        try:
            self._work()
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            self._error = error

    def raise_if_failed(self):
        if self._error is not None:
            error, self._error = self._error, None
            raise error


class VideoReader:
    """Frames of a video file, camera or network stream as RGB arrays, decoded on a thread.

    Iterating yields `(index, frame, extra)` where `frame` is RGB (OpenCV's
    BGR with `rgb=False`) and `extra` is `transform(frame)` (None without a
    transform), computed on the reader thread. Use as a context manager, or
    call `close()`.

    Attributes:
        fps: frames per second of the input (`DEFAULT_FPS` when the input
            does not say, e.g. many cameras).
        size: (width, height) of the frames.
        frame_count: frames in a file (as its header says), None for cameras,
            live streams or when unknown.
        input_ended: the input stopped giving frames (its end, a dropped
            stream, an unplugged camera, a read error), as opposed to
            `max_frames` or `close()` stopping the reader.
        read_error: OpenCV's error when a frame failed to decode mid-stream
            (the reader then ends there, keeping the frames before it).

    Raises:
        VideoError: the input cannot be opened, is not a video, or yields no frame.
    """

    def __init__(
        self,
        source: str | int,
        *,
        transform: Callable | None = None,
        rgb: bool = True,
        queue_size: int = 16,
        max_frames: int | None = None,
    ):
        self.source = parse_source(source)
        self.name = display_name(self.source)
        self.is_stream = is_stream(self.source)
        self._capture, first = open_capture(self.source)
        self._first = first
        fps = self._capture.get(cv2.CAP_PROP_FPS)
        self.fps = float(fps) if fps and np.isfinite(fps) and 0 < fps < 1000 else DEFAULT_FPS
        self.size = (first.shape[1], first.shape[0])
        count = int(self._capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        self.frame_count = count if count > 0 and not isinstance(self.source, int) else None
        if max_frames is not None:
            self.frame_count = min(self.frame_count or max_frames, max_frames)
        self._max_frames = max_frames
        self._transform = transform
        self._rgb = rgb
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._worker = _Worker(self._read_loop, "video-reader")
        self._started = False
        self.input_ended = False
        self.read_error: str | None = None

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _read_loop(self):
        try:
            frame, index = self._first, 0
            self._first = None
            while frame is not None and not self._stop.is_set():
                if self._max_frames is not None and index >= self._max_frames:
                    break
                if self._rgb:
                    frame = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
                extra = self._transform(frame) if self._transform else None
                if not self._put((index, frame, extra)):
                    break
                index += 1
                frame = self._read_next()
        finally:
            self._put(_END)

    def _read_next(self) -> np.ndarray | None:
        """The next BGR frame, or None at the end of the input."""
        try:
            ok, frame = self._capture.read()
        except cv2.error as error:  # a corrupt packet OpenCV raises on: the frames before it stand
            self.read_error = str(error).strip().splitlines()[-1] if str(error).strip() else repr(error)
            ok, frame = False, None
        if not ok or frame is None:
            # OpenCV says the same False for the end of a file, a stream the
            # server closed and a camera unplugged: all end the input here.
            self.input_ended = True
            return None
        return frame

    def _start(self):
        if self._started:
            raise RuntimeError("a VideoReader can be iterated once")
        self._started = True
        self._worker.start()

    def __iter__(self) -> Iterator[tuple[int, np.ndarray, object]]:
        for batch in self.batches(1):
            yield batch[0]

    def batches(self, batch_size: int) -> Iterator[list[tuple[int, np.ndarray, object]]]:
        """Lists of up to `batch_size` items, without waiting to fill one.

        The first item of a batch is waited for; more are taken only while
        the reader has them ready. A file's reader runs ahead, so its
        batches are full; a camera's frames go through as they come.
        """
        self._start()
        while True:
            item = self._queue.get()
            if item is _END:
                self._worker.raise_if_failed()
                return
            batch, ended = [item], False
            while len(batch) < batch_size:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _END:
                    ended = True
                    break
                batch.append(item)
            yield batch
            if ended:
                self._worker.raise_if_failed()
                return

    def close(self):
        self._stop.set()
        if self._started:
            self._worker.join(timeout=5)
        self._capture.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def planned_video_path(path: str | os.PathLike) -> str:
    """The file a `VideoWriter` for `path` writes unless its codec is missing.

    `.mp4`, `.m4v`, `.mov`, `.mkv` and `.avi` as given; any other extension
    gets `.mp4` appended (`out` -> `out.mp4`, `out.webm` -> `out.webm.mp4`).
    """
    path = os.fspath(path)
    return path if os.path.splitext(path)[1].lower() in _CODECS else path + ".mp4"


def _temporary_beside(path: Path) -> str:
    # The real extension last: OpenCV picks the container from it.
    fd, temporary = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    os.close(fd)
    return temporary


def open_video_writer(
    path: str | os.PathLike,
    fps: float,
    size: tuple[int, int],
    *,
    check: Callable[[str], None] | None = None,
) -> tuple[cv2.VideoWriter, str, str, str]:
    """Opens a writer, on a temporary file, with the first codec that works for `path`'s extension.

    Args:
        path: output file. `.mp4` (and `.m4v`, `.mov`, `.mkv`) use `mp4v`,
            `.avi` uses `MJPG`; any other extension gets `.mp4` appended
            (`planned_video_path`).
        fps: frames per second.
        size: (width, height).
        check: called with the file the video will be renamed to, once the
            codec is chosen, before any frame is written (the output rule,
            `keras_yolo_mgpu.outputs.check_output`); what it raises closes
            the writer and removes the temporary file.

    Returns:
        `(writer, temporary_path, final_path, fourcc)`: the writer writes
        `temporary_path` beside `final_path`; `final_path` ends in `.avi`
        when the fallback was needed. Rename it when done (`VideoWriter`
        does).

    Raises:
        VideoError: no codec could be opened.
    """
    path = Path(planned_video_path(path))
    suffix = path.suffix.lower()
    path.parent.mkdir(parents=True, exist_ok=True)
    tried = []
    for fourcc, extension in _CODECS[suffix]:
        candidate = path if extension == suffix else path.with_suffix(extension)
        temporary = _temporary_beside(candidate)
        writer = cv2.VideoWriter(temporary, cv2.VideoWriter_fourcc(*fourcc), float(fps), tuple(size))
        if writer.isOpened():
            try:
                if check is not None:
                    check(str(candidate))
            except BaseException:
                writer.release()
                os.remove(temporary)
                raise
            if candidate != path:
                logger.warning("codec for %s unavailable; writing %s with %s instead", path.name, candidate, fourcc)
            return writer, temporary, str(candidate), fourcc
        writer.release()
        with contextlib.suppress(OSError):
            os.remove(temporary)
        tried.append(f"{fourcc} ({candidate.name})")
    raise VideoError(f"cannot write video {path}: OpenCV opened none of the codecs {', '.join(tried)}")


class VideoWriter:
    """Encodes RGB frames (BGR with `rgb=False`) on a thread; `write` returns at once.

    Frames keep the input's size and frame rate. An optional `transform`
    (e.g. drawing boxes) runs on the writer thread: `write(frame, *args)`
    encodes `transform(frame, *args)`. Frames go to a temporary file beside
    `path`; `close()` (also on an error or Ctrl-C, through `with`) finishes
    it and renames it onto `path`, so whatever was written is kept as a
    valid video and `path` never holds a half-written one. Nothing written:
    `path` is left as it was and `saved` is False.

    Attributes:
        path: the file written (`.avi` when the codec fallback was needed).
        fourcc: the codec.
        frames_written: frames encoded so far.
        saved: `close()` renamed the video onto `path`.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        fps: float,
        size: tuple[int, int],
        *,
        transform: Callable | None = None,
        rgb: bool = True,
        queue_size: int = 16,
        check: Callable[[str], None] | None = None,
    ):
        self._writer, self._temporary, self.path, self.fourcc = open_video_writer(path, fps, size, check=check)
        self._rgb = rgb
        self.size = tuple(size)
        self._transform = transform
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._worker = _Worker(self._write_loop, "video-writer")
        self._worker.start()
        self._closed = False
        self.frames_written = 0
        self.saved = False

    def _write_loop(self):
        while True:
            item = self._queue.get()
            if item is _END:
                return
            frame, args = item
            if self._transform is not None:
                frame = self._transform(frame, *args)
            if (frame.shape[1], frame.shape[0]) != self.size:
                frame = cv2.resize(frame, self.size)
            frame = np.ascontiguousarray(frame)
            self._writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR) if self._rgb else frame)
            self.frames_written += 1

    def _put(self, item) -> None:
        # A worker that died stops consuming: re-raise its error instead of
        # blocking forever on a full queue.
        while True:
            self._worker.raise_if_failed()
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                if not self._worker.is_alive():
                    self._worker.raise_if_failed()
                    raise VideoError("the video writer thread stopped") from None

    def write(self, frame: np.ndarray, *args) -> None:
        """Queues one (H, W, 3) uint8 frame (blocks while the queue is full)."""
        self._put((frame, args))

    def close(self) -> None:
        """Finishes encoding every queued frame, closes the file and renames it onto `path`."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._worker.is_alive():
                self._put(_END)
            self._worker.join()
        finally:
            # Released first: the container's index is written here, which
            # makes the frames so far a video that plays.
            self._writer.release()
            self._finish()
        self._worker.raise_if_failed()

    def _finish(self) -> None:
        if not self.frames_written:
            with contextlib.suppress(OSError):
                os.remove(self._temporary)
            return
        # mkstemp creates the file 0600; give it what a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self._temporary, 0o666 & ~umask)
        os.replace(self._temporary, self.path)
        self.saved = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
