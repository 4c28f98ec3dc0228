"""Video in and out on threads, so decoding and encoding overlap the model.

keras-yolo3's video loop read, detected, drew and wrote one frame at a time
on one thread, fed OpenCV's BGR frames to a model trained on RGB, crashed on
the `None` frame at the end of every file and wrote with a codec taken from
the input that often would not open. Here:

* `VideoReader` decodes on its own thread, converts BGR to RGB and can run a
  per-frame transform there too (the letterbox), a few frames ahead;
* `VideoWriter` converts back to BGR and encodes on its own thread, with
  `mp4v` (or `MJPG` for `.avi`) and an `.avi`/`MJPG` fallback when the first
  choice does not open;
* the end of the stream is a normal end, and an input that cannot be opened
  or read raises `VideoError` with a message that says which and why.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import cv2
import numpy as np

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


def parse_source(source: str | int) -> str | int:
    """`"0"` -> camera 0; anything else is a file path (which must exist)."""
    if isinstance(source, int):
        return source
    text = str(source).strip()
    if text.isdigit() and not os.path.exists(text):
        return int(text)
    if not os.path.isfile(text):
        raise VideoError(f"video input not found: {text} (give a video file or a camera index like 0)")
    return text


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
    """Frames of a video file or camera as RGB arrays, decoded on a thread.

    Iterating yields `(index, frame, extra)` where `frame` is RGB (OpenCV's
    BGR with `rgb=False`) and `extra` is `transform(frame)` (None without a
    transform), computed on the reader thread. Use as a context manager, or
    call `close()`.

    Attributes:
        fps: frames per second of the input (`DEFAULT_FPS` when the input
            does not say, e.g. many cameras).
        size: (width, height) of the frames.
        frame_count: frames in a file, None for cameras or when unknown.

    Raises:
        VideoError: the input cannot be opened or yields no frame.
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
        self.name = f"camera {self.source}" if isinstance(self.source, int) else str(self.source)
        self._capture = cv2.VideoCapture(self.source)
        if not self._capture.isOpened():
            self._capture.release()
            raise VideoError(f"cannot open video input {self.name}: not a video OpenCV can decode, or no such camera")
        ok, first = self._capture.read()
        if not ok or first is None:
            self._capture.release()
            raise VideoError(f"cannot read any frame from {self.name}: the file is empty or not a readable video")
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
                ok, frame = self._capture.read()
                if not ok:
                    frame = None  # end of stream (or a camera unplugged): a normal end
        finally:
            self._put(_END)

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


def open_video_writer(path: str | os.PathLike, fps: float, size: tuple[int, int]) -> tuple[cv2.VideoWriter, str, str]:
    """Opens a writer with the first codec that works for `path`'s extension.

    Args:
        path: output file. `.mp4` (and `.m4v`, `.mov`, `.mkv`) use `mp4v`,
            `.avi` uses `MJPG`; any other extension gets `.mp4` appended.
        fps: frames per second.
        size: (width, height).

    Returns:
        `(writer, actual_path, fourcc)`; `actual_path` ends in `.avi` when
        the fallback was needed.

    Raises:
        VideoError: no codec could be opened.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in _CODECS:
        path = path.with_name(path.name + ".mp4")
        suffix = ".mp4"
    path.parent.mkdir(parents=True, exist_ok=True)
    tried = []
    for fourcc, extension in _CODECS[suffix]:
        candidate = path if extension == suffix else path.with_suffix(extension)
        writer = cv2.VideoWriter(str(candidate), cv2.VideoWriter_fourcc(*fourcc), float(fps), tuple(size))
        if writer.isOpened():
            if candidate != path:
                logger.warning("codec for %s unavailable; writing %s with %s instead", path.name, candidate, fourcc)
            return writer, str(candidate), fourcc
        writer.release()
        tried.append(f"{fourcc} ({candidate.name})")
    raise VideoError(f"cannot write video {path}: OpenCV opened none of the codecs {', '.join(tried)}")


class VideoWriter:
    """Encodes RGB frames (BGR with `rgb=False`) on a thread; `write` returns at once.

    Frames keep the input's size and frame rate. An optional `transform`
    (e.g. drawing boxes) runs on the writer thread: `write(frame, *args)`
    encodes `transform(frame, *args)`.
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
    ):
        self._writer, self.path, self.fourcc = open_video_writer(path, fps, size)
        self._rgb = rgb
        self.size = tuple(size)
        self._transform = transform
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._worker = _Worker(self._write_loop, "video-writer")
        self._worker.start()
        self._closed = False
        self.frames_written = 0

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
        """Finishes encoding every queued frame and closes the file."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._worker.is_alive():
                self._put(_END)
            self._worker.join()
        finally:
            self._writer.release()
        self._worker.raise_if_failed()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
