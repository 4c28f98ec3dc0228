"""Worker processes that make the host's batches: the feed past one interpreter lock.

One JAX process drives every GPU of a host, and its worker threads share its
interpreter lock: on a 16-core GPU host they make fewer YOLOv3-416 images per
second than one GPU's step trains (BENCHMARKS.md, "The feed past one
interpreter lock"). This module runs in the worker processes: it imports
numpy, OpenCV and Pillow, and neither Keras nor JAX nor TensorFlow, so a worker
starts in about a second and holds no accelerator.

Each worker receives the `HostBatches` once (`start_worker`) and then only
batch indices (`make_batch`): batch `k` is a pure function of `k`, so the
batches and their order are the threads'. Workers ignore Ctrl-C (the parent
shuts the pool down), and a watchdog thread ends a worker whose parent has
gone. What a worker logs is said once by the training process (`WorkerLogs`).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import shutil
import signal
import sys
import threading
import time
import weakref
from multiprocessing import shared_memory

import cv2
import numpy as np

from keras_yolo_mgpu.heap import reuse_freed_memory

_HOST = None
# How often a worker looks for its parent.
PARENT_CHECK_SECONDS = 0.5


def start_worker(host, parent: int, logs=None, level: int = logging.WARNING) -> None:
    """The pool's initializer: keeps `host` (a `data.host.HostBatches`) for `make_batch` and watches `parent`.

    `parent` is the starting process's id, passed in rather than read here: a
    worker still starting when its parent was killed would read its new
    parent's (init's) id and never notice. `logs`: the queue of a
    `WorkerLogs` that records of `level` and above go to, or None.
    """
    global _HOST
    _HOST = host
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if logs is not None:
        # A worker never waits at its exit for records the parent no longer reads.
        logs.cancel_join_thread()
        root = logging.getLogger()
        root.handlers[:] = [logging.handlers.QueueHandler(logs)]
        # Debug lines of the project only: a library's (PIL's, per PNG chunk) would flood the parent's log.
        root.setLevel(max(level, logging.INFO))
        logging.getLogger("keras_yolo_mgpu").setLevel(level)
    # One worker, one core: OpenCV's own threads in each of N workers only oversubscribe the cores (measured:
    # less CPU per image, and 2 workers scale better; BENCHMARKS.md, "The feed past one interpreter lock").
    # Rows are resized alike in any number of threads: the pixels are the same (tested).
    cv2.setNumThreads(1)
    reuse_freed_memory()

    def watch():
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(0)  # the parent is gone: no orphan keeps decoding

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def batch_arrays(host, index: int, images: np.ndarray | None = None):
    """Batch `index` of `host` as Keras reads it: `(x, y[, sample_weight])` of numpy arrays.

    `x`: `{"image": (B, h, w, 3) uint8, "boxes": (B, max_boxes, 5) float32, "hsv": (B, 12) float32}`;
    `y`: (B, 1) float32 zeros; `sample_weight`: (B,) for validation batches.
    `images`: where to make the images (`HostBatches.batch`'s), or None.
    """
    batch = host.batch(int(index), images)
    x = {"image": batch.images, "boxes": batch.boxes, "hsv": batch.hsv.astype(np.float32)}
    y = np.zeros((len(batch.images), 1), np.float32)
    return (x, y) if batch.weights is None else (x, y, batch.weights)


# Each array of a batch starts at a multiple of this many bytes in its block (a cache line): aligned for every dtype.
ALIGN = 64
_ATTACHED: dict[str, shared_memory.SharedMemory] = {}  # a worker's view of the parent's blocks, attached once


def _offsets(arrays) -> list[int]:
    """The start of each array in a block, and the block's size last: `len(arrays) + 1` aligned byte counts."""
    offsets = [0]
    for array in arrays:
        offsets.append(-(-(offsets[-1] + array.nbytes) // ALIGN) * ALIGN)
    return offsets


class WorkerLogs(logging.Handler):
    """The training process's end of its workers' log records: each said once, by the logger that made it.

    `queue` goes to `start_worker`; a thread hands each record to the
    training process's logger of the same name (its handlers, its format).
    A record whose message a worker already sent is dropped: each worker
    warns once per file, so N workers would say it N times.
    """

    def __init__(self, context):
        super().__init__()
        self.queue = context.Queue()
        self._said: set[tuple[str, int, str]] = set()
        self._thread = threading.Thread(target=self._pump, name="worker-logs", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while True:
            try:
                record = self.queue.get()
            except (EOFError, OSError):  # the queue was closed
                return
            if record is None:
                return
            self.handle(record)

    def emit(self, record: logging.LogRecord) -> None:
        key = (record.name, record.levelno, record.getMessage())
        if key in self._said:
            return
        self._said.add(key)
        logging.getLogger(record.name).handle(record)

    def close(self) -> None:
        """Says the records already sent, then stops; at interpreter exit the thread just ends with the process."""
        if self._thread is not None and not sys.is_finalizing():
            self.queue.put(None)
            self._thread.join(timeout=5)
        self._thread = None
        super().close()


def largest_batch_bytes(host) -> int:
    """Bytes of `host`'s largest batch in a block.

    B images at the input size (multi-scale's largest), boxes, HSV, y and weights, each 64-byte aligned.
    """
    size, height, width, _ = host.images_shape
    per_image = [height * width * 3, host.max_boxes * 5 * 4, 12 * 4, 4, 4]
    return sum(-(-size * nbytes // ALIGN) * ALIGN for nbytes in per_image)


SHARED_MEMORY_FOLDER = "/dev/shm"


def check_shared_memory_fits(need: int, what: str, instead: str) -> None:
    """ValueError giving both numbers when `need` bytes of `what` exceed the shared-memory folder's free space.

    A write past a full /dev/shm kills the process with SIGBUS, late and
    without a word (a container's default /dev/shm is 64 MB): refused here
    instead, at the start. No folder (not Linux): the allocation is the check.
    """
    try:
        free = shutil.disk_usage(SHARED_MEMORY_FOLDER).free
    except OSError:
        return
    if need > free:
        raise ValueError(
            f"{what} needs about {need / 1e6:,.0f} MB of shared memory, but {SHARED_MEMORY_FOLDER} has only "
            f"{free / 1e6:,.0f} MB free (a container's default is 64 MB: `docker run --shm-size=2g`); {instead}"
        )


class _Block(shared_memory.SharedMemory):
    """A shared block whose mapping outlives this object while arrays lent from it are alive.

    `SharedMemory.close` refuses (BufferError) while numpy arrays export its
    buffer; the mapping then goes with the last of them. Python's own
    `__del__` would print that refusal as an ignored exception.
    """

    def __del__(self):
        try:
            self.close()
        except (OSError, BufferError):
            pass


class BatchSlots:
    """Shared blocks of the parent's that workers write batches into, made once and reused.

    A fresh block per batch costs over ten times the CPU per image of a block
    reused (its pages faulted in and zeroed on both sides). `take` lends a
    block's name for one batch; `give_back` returns it once the batch is
    dropped, or once the last array `take_batch` lent from it is gone. Blocks
    are made as needed: `count` while batches are only made ahead, more while
    the consumer holds batches it was given. `take` returns None once closed:
    the worker then makes a block of its own, as does one whose batch does not
    fit. Thread-safe.
    """

    def __init__(self, count: int, size: int):
        self.count, self.size = count, max(1, int(size))
        self._check_fits(self.count)
        self.blocks: dict[str, shared_memory.SharedMemory] = {}
        self._free: list[str] = []
        self._lent: set[str] = set()
        # Re-entrant: `give_back` also runs as a lent array's finalizer, in whichever thread the garbage
        # collector frees it, which may be a thread inside `take` (a batch's arrays in a traceback's cycle
        # after Ctrl-C). With a plain lock that thread waited on itself, and the exit on that thread.
        self._lock = threading.RLock()
        self._closed = False
        self.own_blocks = 0  # batches a worker handed over in a block of its own (counted by `take_batch`)

    def _check_fits(self, count: int) -> None:
        check_shared_memory_fits(
            count * self.size,
            f"--feed processes hands batches over in {count} shared blocks of {self.size / 1e6:,.1f} MB; it",
            "or lower --batch-size, or pass --feed threads",
        )

    def take(self) -> str | None:
        with self._lock:
            if self._free:
                name = self._free.pop()
            elif self._closed:
                return None
            else:
                if len(self.blocks) >= self.count:
                    self._check_fits(1)  # one more, past the start's count: still refused before a SIGBUS
                block = _Block(create=True, size=self.size)
                self.blocks[name := block.name] = block
            self._lent.add(name)
            return name

    def give_back(self, name: str | None) -> None:
        """Returns a lent block (once: a second return of the same loan is ignored)."""
        with self._lock:
            if name in self._lent:
                self._lent.discard(name)
                if not self._closed:
                    self._free.append(name)

    def close(self) -> None:
        """Frees the blocks' names: each block's memory goes with the last process that maps it.

        This process's mappings stay while arrays lent from them are alive.
        """
        with self._lock:
            self._closed = True
            names, self._free = list(self.blocks), []
        for name in names:
            self.blocks[name].unlink()


def make_batch(index: int, slot: str | None = None):
    """Batch `index` of the worker's `HostBatches`, handed over in shared memory: `(block name, layout, own)`.

    The images are made in the parent's block `slot` (a `BatchSlots` name),
    the small arrays (and multi-scale's resized images) copied in after them,
    and the parent reads them once (`take_batch`) instead of unpickling them
    under its interpreter lock. Without a slot, or when the batch does not fit
    it, the worker makes a block of its own (`own` True), which the parent unlinks.
    """
    block = made_in = None
    if slot is not None:
        block = _ATTACHED.get(slot)
        if block is None:
            block = _ATTACHED[slot] = shared_memory.SharedMemory(name=slot)
        shape = _HOST.images_shape
        if block.size >= np.prod(shape):
            # The images are made where the parent reads them (the first array of the block): one copy fewer.
            made_in = np.ndarray(shape, np.uint8, block.buf, 0)
    x, *rest = batch_arrays(_HOST, index, made_in)
    arrays = [x["image"], x["boxes"], x["hsv"], *rest]
    offsets = _offsets(arrays)
    own = block is None or block.size < offsets[-1]
    if own:
        block = shared_memory.SharedMemory(create=True, size=max(1, offsets[-1]))
    try:
        for array, offset in zip(arrays, offsets, strict=False):
            if array is made_in and not own:  # already in place
                continue
            np.ndarray(array.shape, array.dtype, block.buf, offset)[...] = array
        layout = [(array.shape, array.dtype.str, offset) for array, offset in zip(arrays, offsets, strict=False)]
        return block.name, layout, own
    finally:
        if own:
            block.close()  # the parent unlinks it once read


def take_batch(handed, slots: BatchSlots, slot: str | None):
    """The parent's side of `make_batch(index, slot)`: the batch `(x, y[, sample_weight])` as numpy arrays.

    The arrays are views of the block the worker wrote, not copies (copying
    out would be nearly all of the training process's share of the feed's
    CPU): the block goes back to `slots` once the last view of them is gone.
    On the CPU, JAX keeps the views as the device arrays (their starts are
    64-byte aligned). A block the worker made of its own is copied out and
    freed at once.
    """
    name, layout, own = handed
    if not own:
        block = slots.blocks[name]
        lent = np.ndarray((block.size,), np.uint8, block.buf)
        # Runs when `lent` is freed: every array below is a view of it (its `.base`). Until then the
        # finalizer holds `slots`, and with it the block's mapping (numpy does not keep it mapped).
        weakref.finalize(lent, slots.give_back, slot).atexit = False
        image, boxes, hsv, *rest = (np.ndarray(shape, np.dtype(dtype), lent, offset) for shape, dtype, offset in layout)
        return ({"image": image, "boxes": boxes, "hsv": hsv}, *rest)
    block = shared_memory.SharedMemory(name=name)
    try:
        image, boxes, hsv, *rest = (
            np.ndarray(shape, np.dtype(dtype), block.buf, offset).copy() for shape, dtype, offset in layout
        )
    finally:
        slots.give_back(slot)
        slots.own_blocks += 1
        block.close()
        block.unlink()
    return ({"image": image, "boxes": boxes, "hsv": hsv}, *rest)


def discard_batch(slots: BatchSlots, slot: str | None, made) -> None:
    """Frees what a batch made (or cancelled) but never taken holds: a `make_batch` future's done-callback."""
    slots.give_back(slot)
    if made.cancelled() or made.exception() is not None:
        return
    name, _, own = made.result()
    if not own:
        return
    try:
        block = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:  # taken meanwhile
        return
    block.close()
    block.unlink()
