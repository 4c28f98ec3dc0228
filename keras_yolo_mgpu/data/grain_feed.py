"""The host's batches as a grain dataset: `data.host.HostBatches` fed by google/grain's worker processes.

    feed = GrainFeed(HostBatches(annotations, (416, 416), num_classes, 32, training=True, seed=0), workers=2)
    model.fit(feed.dataset, steps_per_epoch=..., ...)  # Keras's `GrainDatasetAdapter`
    feed.close()

Element `k` of `feed.dataset` is batch `k` of the `HostBatches` as Keras reads
it (`host_processes.batch_arrays`). Batch `k` is a pure function of `k`, and
grain's `mp_prefetch` gives worker `i` of `N` the batches `i, i + N, ...` and
hands them back in order, so the batches are the same for 0 (made here, on
demand), 1 or N workers. grain's iterator state (`get_state` / `set_state`)
resumes an iterator of the same feed.

grain 0.2.18 (`process_prefetch`) copies each array a worker returns into a
fresh shared block, freed when the last view of it goes. Here a worker makes
the images in their block in the first place (`HostBatches.batch(k, images)`),
so they are written once; arrays under `MIN_SHARED_BYTES` are pickled. grain
reuses no block between batches (the hand-written process feed does,
`host_processes.BatchSlots`).

`--cache ram` with worker processes: one `data.shared_image_cache.SharedImageCache`
for them all. grain pickles the dataset (cloudpickle, before it starts a
worker), which a `multiprocessing` lock refuses outside process start-up, so
the cache's lock here is a file lock (`_FileLock`). Nothing here imports
TensorFlow.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
from collections.abc import Callable

import cv2
import grain
import numpy as np
from absl import flags
from grain._src.python.ipc.shared_memory_array import SharedMemoryArray

from keras_yolo_mgpu.data.host import HostBatches
from keras_yolo_mgpu.data.host_processes import batch_arrays
from keras_yolo_mgpu.data.shared_image_cache import SharedImageCache
from keras_yolo_mgpu.heap import reuse_freed_memory

__all__ = ["GrainFeed", "MIN_SHARED_BYTES"]

# Arrays smaller than this cross from a worker pickled, not in a shared block of their own.
MIN_SHARED_BYTES = 1 << 16
# The training stream's length as grain sees it: endless for any run.
_ENDLESS = 1 << 62
# grain 0.2.18 reads this absl flag when JAX is imported, and fails in a program that parses no absl flags
# (google/grain#1355, fixed after 0.2.18): its default (False) is read once it is marked as given.
_UNPARSED_FLAG = "grain_enable_multiprocess_worker_profiling"
# Set in grain's worker processes (`_start_worker`): the images are then made in shared memory.
_in_worker = False


def _start_worker(worker_index: int, worker_count: int) -> None:
    """grain's `worker_init_fn`: one OpenCV thread per worker, glibc's freed buffers kept (`host_processes`)."""
    global _in_worker
    _in_worker = True
    cv2.setNumThreads(1)
    reuse_freed_memory()


class _MakeBatch(grain.transforms.Map):
    """Batch index `k` -> batch `k` of `host` as Keras reads it; in a worker, its images in a shared block."""

    def __init__(self, host: HostBatches):
        self.host = host

    def map(self, index: int):
        images = SharedMemoryArray(self.host.images_shape, np.uint8) if _in_worker else None
        return batch_arrays(self.host, int(index), images)


class _FileLock:
    """A lock between processes (and this process's threads) that pickles as its file's path.

    `flock` on the file, under a thread lock: an `flock` is held per open
    file, so threads of one process sharing it would not exclude each other.
    """

    def __init__(self, path: str):
        self.path = path
        self._fd = None
        self._threads = threading.Lock()

    def __getstate__(self):
        return {"path": self.path}

    def __setstate__(self, state):
        self.__init__(state["path"])

    def __enter__(self):
        self._threads.acquire()
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._threads.release()


class GrainFeed:
    """`host`'s batches as a grain `IterDataset` (`dataset`), made by `workers` grain worker processes.

    Args:
        host: the `data.host.HostBatches` to serve.
        workers: grain worker processes (`mp_prefetch`); 0 makes every batch
            in this process when asked; None: one per core.
        ahead: batches each worker makes ahead (grain's
            `per_worker_buffer_size`), and batches placed ahead by `to_device`.
        to_device: None, or a function applied to every batch ahead of its
            step, in a thread of grain's (`ThreadPrefetchIterDataset`),
            e.g. a `jax.device_put` onto the devices that will train on it.

    `close()` frees the shared RAM cache; iterators with worker processes
    end them with their own `close()`.
    """

    def __init__(
        self,
        host: HostBatches,
        *,
        workers: int | None = None,
        ahead: int = 2,
        to_device: Callable | None = None,
    ):
        workers = (os.cpu_count() or 1) if workers is None else workers
        if workers < 0 or ahead < 1:
            raise ValueError(f"`workers` must be >= 0 and `ahead` >= 1. Received: workers={workers}, ahead={ahead}")
        self.host, self.workers = host, workers
        self._lock_path = None
        if workers and host.source.ram and host.source.shared is None:
            handle, self._lock_path = tempfile.mkstemp(prefix="grain-cache-", suffix=".lock")
            os.close(handle)
            host.source.shared = SharedImageCache(host.annotations, host.source.canvas_size, _FileLock(self._lock_path))
        batches = grain.MapDataset.range(host.num_batches or _ENDLESS).map(_MakeBatch(host))
        # In a worker, one thread makes its batches (more would only share its one core); none in this process.
        dataset = batches.to_iter_dataset(grain.ReadOptions(num_threads=1 if workers else 0, prefetch_buffer_size=1))
        if workers:
            if not flags.FLAGS.is_parsed():
                flags.FLAGS[_UNPARSED_FLAG].present = True
            options = grain.experimental.DatasetOptions(min_shm_size=MIN_SHARED_BYTES)
            dataset = grain.experimental.WithOptionsIterDataset(dataset, options)
            dataset = dataset.mp_prefetch(
                grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=ahead),
                worker_init_fn=_start_worker,
            )
        if to_device is not None:
            dataset = grain.experimental.ThreadPrefetchIterDataset(dataset.map(to_device), prefetch_buffer_size=ahead)
        self.dataset = dataset

    def __iter__(self):
        return iter(self.dataset)

    def close(self) -> None:
        """Frees the shared RAM cache (and its lock file) this feed made for its workers."""
        shared = self.host.source.shared
        if self._lock_path is not None and shared is not None:
            shared.close()
            self.host.source.shared = None
        if self._lock_path is not None:
            os.unlink(self._lock_path)
            self._lock_path = None
