"""The RAM cache of worker processes: one shared-memory block that all of them fill and read.

With a `--cache ram` dict each (`data.host.ImageSource`), N worker processes
would hold up to N copies of the dataset and each decode an image again the
first time it met it. This block holds every image once, for the training
process and its workers alike.

Layout: a table of `(num_images, 7)` int64 rows (state, file mtime_ns, file
size, image w, image h (as displayed), cached w, cached h), then each image's pixels at an
offset fixed from its letterbox size (`Annotation.size`; the whole canvas when
unknown), so the block's size is `check_cache_fits`' estimate.

An entry is written once: the first process to claim it (under the lock)
writes the pixels, then marks it ready; other processes meanwhile decode the
image themselves, and readers take the lock to read the state (a memory
barrier: a reader that sees "ready" sees the pixels). An entry whose file
changed since is never rewritten: that image is decoded from its file for the
rest of the run. `close` frees the block's name (multiprocessing's resource
tracker does if the training process is killed).
"""

from __future__ import annotations

from multiprocessing import shared_memory

import numpy as np

from keras_yolo_mgpu.data.host_processes import check_shared_memory_fits
from keras_yolo_mgpu.data.letterbox import letterbox_bytes

__all__ = ["SharedImageCache"]

EMPTY, CLAIMED, READY = 0, 1, 2
_COLUMNS = 7  # state, mtime_ns, file size, image w, image h (as displayed), cached w, cached h


class SharedImageCache:
    """Decoded images of one dataset in one shared block (see the module docstring).

    Args:
        annotations: the dataset's; image `i` is entry `i`.
        canvas_size: (w, h) the images are letterboxed into.
        lock: a `multiprocessing` lock of the context the workers start
            with (passed to them with this object when they are spawned).

    Raises:
        ValueError: the block cannot fit in the shared-memory folder's free
            space (giving both numbers).
    """

    def __init__(self, annotations, canvas_size: tuple[int, int], lock):
        canvas = (int(canvas_size[0]), int(canvas_size[1]))
        capacities = [letterbox_bytes(annotation.size, canvas) for annotation in annotations]
        self.offsets = np.concatenate([[0], np.cumsum(capacities, dtype=np.int64)]) + 8 * _COLUMNS * len(capacities)
        size = int(self.offsets[-1])
        check_shared_memory_fits(
            size,
            f"--cache ram with worker processes keeps {len(capacities)} decoded images in one shared block, which",
            "pass --cache DIR, or --feed threads",
        )
        self.lock = lock
        self._block = shared_memory.SharedMemory(create=True, size=max(1, size))
        self._owner = True
        self._view()

    def _view(self) -> None:
        self.table = np.ndarray((len(self.offsets) - 1, _COLUMNS), np.int64, self._block.buf, 0)

    def __getstate__(self):
        return {"name": self._block.name, "offsets": self.offsets, "lock": self.lock}

    def __setstate__(self, state):
        self.offsets, self.lock = state["offsets"], state["lock"]
        self._block = shared_memory.SharedMemory(name=state["name"])
        self._owner = False
        self._view()

    def get(self, index: int, stat) -> tuple[np.ndarray, tuple[int, int]] | None:
        """Image `index` if cached from the file `stat` describes: ((h', w', 3) uint8 read-only view, its (w, h))."""
        with self.lock:
            state, mtime, file_size, stored_w, stored_h, width, height = (int(v) for v in self.table[index])
        if state != READY or (mtime, file_size) != (stat.st_mtime_ns, stat.st_size):
            return None
        pixels = np.ndarray((height, width, 3), np.uint8, self._block.buf, int(self.offsets[index]))
        pixels.flags.writeable = False
        return pixels, (stored_w, stored_h)

    def put(self, index: int, stat, pixels: np.ndarray, size: tuple[int, int]) -> None:
        """Stores image `index` unless another process has claimed its entry, or it does not fit its room."""
        if pixels.nbytes > self.offsets[index + 1] - self.offsets[index]:
            return  # larger than its annotation's size said: decoded from the file at each use
        with self.lock:
            if self.table[index, 0] != EMPTY:
                return
            self.table[index, 0] = CLAIMED
        np.ndarray(pixels.shape, np.uint8, self._block.buf, int(self.offsets[index]))[...] = pixels
        self.table[index, 1:] = (stat.st_mtime_ns, stat.st_size, *size, pixels.shape[1], pixels.shape[0])
        with self.lock:
            self.table[index, 0] = READY

    def close(self) -> None:
        """Frees the block's name (the training process's, once); mappings go with their processes."""
        if self._owner:
            self._owner = False
            self._block.unlink()
