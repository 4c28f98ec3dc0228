"""The input pipeline without TensorFlow: the host's batches in a `keras.utils.PyDataset`.

    train = make_py_dataset(annotations, (416, 416), num_classes, 32, training=True, seed=0)
    model.fit(train, steps_per_epoch=steps_per_epoch(len(annotations), 32), ...)

For Keras on JAX, where TensorFlow need not be installed: nothing here or in
`data.host` imports it. The batches are `make_dataset`'s (`data.tf_dataset`).

Batches are made ahead in `workers` threads of the dataset's own, in order, or
in `workers` processes (`use_multiprocessing`, `data.host_processes`), not in
Keras's enqueuer: Keras 3.15's multi-worker enqueuer keeps one index counter
for an endless dataset, and the batch `fit` takes to build the compiled loss
(`Trainer._symbolic_build`) is then lost, so training started at batch 1.
Keras itself sees a one-worker dataset, whose batch `k` is always stream batch
`k`. Under a `keras.distribution`, Keras 3.15's JAX trainer copies a batch to
the devices just before its step (`JAXEpochIterator._get_distributed_iterator`):
`to_device` moves that copy into the worker threads, ahead of the step, e.g.
`lambda batch: jax.device_put(batch, layout)` with `layout =
distribution.get_data_layout((batch_size,)).backend_layout`; Keras then takes
the placed arrays as they are. The training stream is endless (`num_batches`
None): Keras asks for batch k, k + 1, ... across epochs, as on TensorFlow. Under
a multi-process JAX run each process makes its slice of every global batch
(`num_shards=jax.process_count(), shard_index=jax.process_index()`).
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import keras

from keras_yolo_mgpu.data import host_processes
from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.data.host import HostBatches
from keras_yolo_mgpu.data.host_processes import batch_arrays
from keras_yolo_mgpu.data.shared_image_cache import SharedImageCache

__all__ = ["FeedWorkerEnded", "HostDataset", "make_py_dataset"]


class FeedWorkerEnded(RuntimeError):
    """A worker process making batches ended without being asked to: the feed cannot go on.

    On Linux most often the kernel's out-of-memory killer, which ends a
    process when the host's memory runs out; else a crash (a decoder's).
    """

    def __init__(self):
        super().__init__(
            "a worker process making batches ended abruptly: killed (on Linux most often by the kernel's "
            "out-of-memory killer when the host's memory runs out; `dmesg` names the process it killed) or crashed"
        )


class HostDataset(keras.utils.PyDataset):
    """`HostBatches` as Keras reads a dataset: batch `k` -> `(x, y[, sample_weight])`.

    Args:
        host: the `data.host.HostBatches` to serve.
        workers: threads (or processes) making batches ahead (default: one per core).
        use_multiprocessing: processes instead of threads (`data.host_processes`;
            started with "spawn"; `--cache ram` is then one block of shared
            memory for them all, `data.shared_image_cache`); the same batches.
        max_queue_size: batches made ahead at most.
        to_device: None, or a function applied to every `(x, y[, sample_weight])`
            ahead of its step, in a thread: the one that made it, or with
            processes one that waits for it, e.g. a `jax.device_put` onto the
            devices that will train on it.
    """

    def __init__(
        self,
        host: HostBatches,
        *,
        workers: int | None = None,
        use_multiprocessing: bool = False,
        max_queue_size: int = 10,
        to_device: Callable | None = None,
    ):
        # One in-process worker as far as Keras knows (module docstring): Keras asks for
        # batches in order, in its training thread; `threads` make them ahead.
        super().__init__(workers=1, use_multiprocessing=False, max_queue_size=max_queue_size)
        self.host = host
        self.to_device = to_device
        self.threads = workers or os.cpu_count() or 1
        self.in_processes = use_multiprocessing
        self.ahead = max(1, max_queue_size)
        self._pool = None
        self._processes = None
        self._slots = None  # the processes' `host_processes.BatchSlots`
        self._logs = None  # what the processes log, said here (`host_processes.WorkerLogs`)
        # "spawn": JAX's and TensorFlow's threads make a forked copy of this process unsafe.
        self._context = multiprocessing.get_context("spawn")
        # Batches of worker processes not yet taken, with their shared blocks: freed on `close`.
        self._unclaimed: dict[Future, str | None] = {}
        # Batch index -> (the future of its placed batch, that of the worker process's batch or None).
        self._pending: dict[int, tuple[Future, Future | None]] = {}
        self._lock = threading.Lock()
        if use_multiprocessing and host.source.ram:
            # One RAM cache for the workers (and this process), made before they start (they get it with `host`).
            host.source.shared = SharedImageCache(host.annotations, host.source.canvas_size, self._context.Lock())

    @property
    def num_batches(self) -> int | None:
        return self.host.num_batches

    @property
    def shared_blocks(self) -> int:
        """Shared blocks the worker processes' batches were handed over in (0 with threads)."""
        return 0 if self._slots is None else len(self._slots.blocks)

    @property
    def batches_in_own_blocks(self) -> int:
        """Worker-process batches handed over in a fresh shared block instead of a reused one (0 when none were)."""
        return 0 if self._slots is None else self._slots.own_blocks

    def make(self, index: int):
        """Batch `index`, made here (no look-ahead): `(x, y[, sample_weight])` of numpy arrays."""
        return batch_arrays(self.host, index)

    def _made_and_placed(self, index: int):
        batch = self.make(index)
        return batch if self.to_device is None else self.to_device(batch)

    def _placed(self, made: Future, slots: host_processes.BatchSlots, slot: str | None):
        with self._lock:
            if made not in self._unclaimed:  # dropped meanwhile: `_drop` frees it
                return None
            del self._unclaimed[made]
        # A worker's error is raised here, with its traceback.
        batch = host_processes.take_batch(made.result(), slots, slot)
        return batch if self.to_device is None else self.to_device(batch)

    def __getitem__(self, index: int):
        """Batch `index`, made ahead with the next `max_queue_size` ones.

        Raises:
            FeedWorkerEnded: a worker process ended (the pool cannot make another batch).
        """
        try:
            return self._get(int(index))
        except BrokenProcessPool as error:
            raise FeedWorkerEnded() from error

    def _get(self, index: int):
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads)
                if self.in_processes:
                    self._logs = host_processes.WorkerLogs(self._context)
                    self._processes = ProcessPoolExecutor(
                        self.threads,
                        mp_context=self._context,
                        initializer=host_processes.start_worker,
                        initargs=(self.host, os.getpid(), self._logs.queue, logging.getLogger().getEffectiveLevel()),
                    )
                    # Blocks for the batches in flight (those ahead, the one being taken, a spare); more are
                    # made while the consumer still holds batches it was given (lent, `take_batch`).
                    self._slots = host_processes.BatchSlots(
                        self.ahead + 2, host_processes.largest_batch_bytes(self.host)
                    )
            # Batches behind `index` are no longer wanted (a new pass started over).
            for stale in [k for k in self._pending if k < index]:
                self._drop(*self._pending.pop(stale))
            last = index + self.ahead if self.num_batches is None else min(index + self.ahead, self.num_batches - 1)
            for k in range(index, last + 1):
                if k not in self._pending:
                    self._pending[k] = self._submit(k)
            placed, _ = self._pending.pop(index)
        return placed.result()

    def _submit(self, index: int) -> tuple[Future, Future | None]:
        if self.in_processes:  # made in a process, placed ahead by a thread that waits for it
            slot = self._slots.take()
            made = self._processes.submit(host_processes.make_batch, index, slot)
            self._unclaimed[made] = slot
            return self._pool.submit(self._placed, made, self._slots, slot), made
        return self._pool.submit(self._made_and_placed, index), None

    def _drop(self, placed: Future, made: Future | None) -> None:
        """Cancels a batch no longer wanted (the caller holds `_lock`)."""
        placed.cancel()
        if made in self._unclaimed:  # else its placing thread took it, and gives its block back
            self._release(made)

    def _release(self, made: Future) -> None:
        """Drops a worker's batch not taken: its shared block is freed now if made, else once it is."""
        slot = self._unclaimed.pop(made)
        made.cancel()
        made.add_done_callback(functools.partial(host_processes.discard_batch, self._slots, slot))

    def close(self, wait: bool = False) -> None:
        """Stops the workers; batches made ahead are dropped.

        `wait`: return only once the batches being made have finished (a
        benchmark's next row must not pay for them).
        """
        with self._lock:
            for placed, made in self._pending.values():
                self._drop(placed, made)
            self._pending.clear()
            for made in list(self._unclaimed):  # batches being taken when `fit` stopped waiting for them
                self._release(made)
            pools, self._pool, self._processes = (self._processes, self._pool), None, None
            slots, self._slots = self._slots, None
            logs, self._logs = self._logs, None
        # Outside the lock: a placing thread being waited for may be about to take it.
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=wait, cancel_futures=True)
        if logs is not None:
            logs.close()
        if slots is not None:
            slots.close()
        if self.in_processes and self.host.source.shared is not None:
            # Freed with the workers: a dataset used again has each process keep its own cache.
            self.host.source.shared.close()
            self.host.source.shared = None

    def __del__(self):
        self.close()


def make_py_dataset(
    annotations: list[Annotation],
    input_shape: tuple[int, int],
    num_classes: int,
    batch_size: int,
    *,
    training: bool,
    workers: int | None = None,
    use_multiprocessing: bool = False,
    max_queue_size: int = 10,
    to_device: Callable | None = None,
    **kwargs,
) -> HostDataset:
    """The training or validation stream as a `keras.utils.PyDataset` (see the module docstring).

    Args:
        annotations, input_shape, num_classes, batch_size, training:
            as `data.tf_dataset.make_dataset`'s.
        workers, use_multiprocessing, max_queue_size, to_device: `HostDataset`'s.
        **kwargs: `data.host.HostBatches`' options, as `make_dataset`'s.
    """
    host = HostBatches(annotations, input_shape, num_classes, batch_size, training=training, **kwargs)
    return HostDataset(
        host,
        workers=workers,
        use_multiprocessing=use_multiprocessing,
        max_queue_size=max_queue_size,
        to_device=to_device,
    )
