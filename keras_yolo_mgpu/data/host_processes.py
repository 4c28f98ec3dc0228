"""Worker processes that make the host's batches: the feed past one interpreter lock.

One JAX process drives every GPU of a host, and its batches came from worker
threads, which share its interpreter lock: on one H100 (2026-11-26, 16 CPU
cores) 16 threads decoded and augmented about 880 images/s of YOLOv3-416
(`bench e2e` 873, `train.py --quiet` 882), less than one GPU's step (990).
Processes have a lock each. This module is what runs in them: it imports
numpy, OpenCV and Pillow through `data.host`, and neither Keras nor JAX nor
TensorFlow, so a worker starts in about a second and holds no accelerator.

Each worker receives the `HostBatches` once (`start_worker`, the pool's
initializer) and then only batch indices (`make_batch`): batch `k` is a pure
function of `k` and the stream's settings, so the batches, and their order,
are those of the threads, whatever the number of workers (tested).

Workers end with the process that started them: they ignore Ctrl-C (the
parent handles it and shuts the pool down), and a watchdog thread ends a
worker whose parent has gone (killed with SIGKILL, say) within a second.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from multiprocessing import shared_memory

import numpy as np

_HOST = None
# How often a worker looks for its parent.
PARENT_CHECK_SECONDS = 0.5


def start_worker(host, parent: int) -> None:
    """The pool's initializer: keeps `host` (a `data.host.HostBatches`) for `make_batch` and watches `parent`.

    `parent` is the starting process's id, passed in rather than read here: a
    worker still starting when its parent was killed would read its new
    parent's (init's) id and never notice.
    """
    global _HOST
    _HOST = host
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch():
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(0)  # the parent is gone: no orphan keeps decoding

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def batch_arrays(host, index: int):
    """Batch `index` of `host` as Keras reads it: `(x, y[, sample_weight])` of numpy arrays.

    `x`: `{"image": (B, h, w, 3) uint8, "boxes": (B, max_boxes, 5) float32, "hsv": (B, 12) float32}`;
    `y`: (B, 1) float32 zeros; `sample_weight`: (B,) for validation batches.
    """
    batch = host.batch(int(index))
    x = {"image": batch.images, "boxes": batch.boxes, "hsv": batch.hsv.astype(np.float32)}
    y = np.zeros((len(batch.images), 1), np.float32)
    return (x, y) if batch.weights is None else (x, y, batch.weights)


def make_batch(index: int):
    """Batch `index` of the worker's `HostBatches`, handed over in shared memory: `(block name, layout)`.

    The arrays (16.6 MB of uint8 image at 416 px and batch 32) are written
    once into a block the parent reads once (`take_batch`), instead of being
    pickled through a pipe and unpickled (three copies and the parent's
    interpreter lock held for the last).
    """
    x, *rest = batch_arrays(_HOST, index)
    arrays = [x["image"], x["boxes"], x["hsv"], *rest]
    offsets = np.cumsum([0] + [array.nbytes for array in arrays])
    block = shared_memory.SharedMemory(create=True, size=max(1, int(offsets[-1])))
    try:
        for array, offset in zip(arrays, offsets, strict=False):
            np.ndarray(array.shape, array.dtype, block.buf, int(offset))[...] = array
        layout = [(array.shape, array.dtype.str, int(offset)) for array, offset in zip(arrays, offsets, strict=False)]
        return block.name, layout
    finally:
        block.close()  # the parent unlinks it once read


def take_batch(handed):
    """The parent's side of `make_batch`: the batch `(x, y[, sample_weight])` as numpy arrays; frees the block."""
    name, layout = handed
    block = shared_memory.SharedMemory(name=name)
    try:
        image, boxes, hsv, *rest = (
            np.ndarray(shape, np.dtype(dtype), block.buf, offset).copy() for shape, dtype, offset in layout
        )
    finally:
        block.close()
        block.unlink()
    return ({"image": image, "boxes": boxes, "hsv": hsv}, *rest)


def discard_batch(made) -> None:
    """Frees the shared block of a batch made but never taken (a `make_batch` future's done-callback)."""
    if made.cancelled() or made.exception() is not None:
        return
    try:
        block = shared_memory.SharedMemory(name=made.result()[0])
    except FileNotFoundError:  # taken meanwhile
        return
    block.close()
    block.unlink()
