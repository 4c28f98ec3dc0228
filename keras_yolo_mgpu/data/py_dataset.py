"""The input pipeline without TensorFlow: the host's batches in a `keras.utils.PyDataset`.

    train = make_py_dataset(annotations, (416, 416), num_classes, 32, training=True, seed=0)
    model.fit(train, steps_per_epoch=steps_per_epoch(len(annotations), 32), ...)

For Keras on JAX, where TensorFlow need not be installed (TPU VMs, JAX GPU
images): nothing here or in `data.host` imports it (tests/test_host_pipeline.py
runs this module in a process where `import tensorflow` fails). The batches
are `data.host.HostBatches`' (the same as `make_dataset` yields on
TensorFlow): `x = {"image": (B, h, w, 3) uint8, "boxes": (B, max_boxes, 5)
float32, "hsv": (B, 12) float32}`, `y` float32 zeros (B, 1), and for
validation `sample_weight` (B,); the device finishes them
(`data.device_side.DeviceInputs`).

Batches are made ahead in `workers` threads of the dataset's own, in order
(decoding, resizing and OpenCV release the GIL), or in `workers` processes
(`use_multiprocessing`, `data.host_processes`: the feed past one interpreter
lock) whose batches threads then place on the devices, not in Keras's enqueuer:
Keras 3.15's multi-worker enqueuer keeps one index counter for an endless
dataset, and the first batch that `fit` takes to build the compiled loss
(`Trainer._symbolic_build`) is then consumed and lost: training started at
batch 1 (measured: a 1-step run's loss on JAX was batch 1's, not batch 0's
as on TensorFlow). Keras itself sees a one-worker dataset, whose batch `k`
is always stream batch `k`. Keras 3.15's JAX trainer copies a batch to the
devices one step ahead on one device, but just before its step under a
`keras.distribution` (`JAXEpochIterator._get_distributed_iterator`):
`to_device` moves the copy into the worker threads, ahead of the step, e.g.
`lambda batch: jax.device_put(batch, layout)` with `layout =
distribution.get_data_layout((batch_size,)).backend_layout` (the batch axis
only, which fits every rank); Keras then takes the placed arrays as they
are (one process: `jax.make_array_from_process_local_data` of an array with
the batch's sharding keeps its buffers). The training stream is endless (`num_batches` None): Keras keeps
asking for batch k, k + 1, ... across epochs (batches made ahead at the end
of an epoch are kept for the next), so batch `k` holds stream positions
`start_position + k * batch_size ...`, as on TensorFlow. Under a
multi-process JAX run each process makes its slice of every global batch:
`num_shards=jax.process_count(), shard_index=jax.process_index()`.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor

import keras

from keras_yolo_mgpu.data import host_processes
from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.data.host import HostBatches
from keras_yolo_mgpu.data.host_processes import batch_arrays

__all__ = ["HostDataset", "make_py_dataset"]


class HostDataset(keras.utils.PyDataset):
    """`HostBatches` as Keras reads a dataset: batch `k` -> `(x, y[, sample_weight])`.

    Args:
        host: the `data.host.HostBatches` to serve.
        workers: threads (or processes) making batches ahead (default: one per core).
        use_multiprocessing: processes instead of threads (`data.host_processes`;
            started with "spawn", each with its own RAM cache); the same batches.
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
        # One worker as far as Keras knows: Keras asks for batches in order, in
        # its training thread; the workers below make them ahead (module docstring).
        super().__init__(workers=1, use_multiprocessing=False, max_queue_size=max_queue_size)
        self.host = host
        self.to_device = to_device
        # Not `workers` / `use_multiprocessing`: those are Keras's PyDataset
        # settings, which must stay at one in-process worker.
        self.threads = workers or os.cpu_count() or 1
        self.in_processes = use_multiprocessing
        self.ahead = max(1, max_queue_size)
        self._pool = None
        self._processes = None
        # Batches of worker processes not yet taken: their shared blocks are freed on `close`.
        self._unclaimed: set[Future] = set()
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()

    @property
    def num_batches(self) -> int | None:
        return self.host.num_batches

    def make(self, index: int):
        """Batch `index`, made here (no look-ahead): `(x, y[, sample_weight])` of numpy arrays."""
        return batch_arrays(self.host, index)

    def _made_and_placed(self, index: int):
        batch = self.make(index)
        return batch if self.to_device is None else self.to_device(batch)

    def _placed(self, made: Future):
        with self._lock:
            if made not in self._unclaimed:  # closed meanwhile: `close` frees it
                return None
            self._unclaimed.discard(made)
        batch = host_processes.take_batch(made.result())  # a worker's error is raised here, with its traceback
        return batch if self.to_device is None else self.to_device(batch)

    def __getitem__(self, index: int):
        index = int(index)
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads)
                if self.in_processes:
                    # "spawn": JAX's and TensorFlow's threads make a forked copy of this process unsafe.
                    self._processes = ProcessPoolExecutor(
                        self.threads,
                        mp_context=multiprocessing.get_context("spawn"),
                        initializer=host_processes.start_worker,
                        initargs=(self.host, os.getpid()),
                    )
            # Batches behind `index` are no longer wanted (a new pass started over).
            for stale in [k for k in self._pending if k < index]:
                self._pending.pop(stale).cancel()
            last = index + self.ahead if self.num_batches is None else min(index + self.ahead, self.num_batches - 1)
            for k in range(index, last + 1):
                if k not in self._pending:
                    self._pending[k] = self._submit(k)
            future = self._pending.pop(index)
        return future.result()

    def _submit(self, index: int) -> Future:
        if self.in_processes:  # made in a process, placed ahead by a thread that waits for it
            made = self._processes.submit(host_processes.make_batch, index)
            self._unclaimed.add(made)
            return self._pool.submit(self._placed, made)
        return self._pool.submit(self._made_and_placed, index)

    def close(self, wait: bool = False) -> None:
        """Stops the workers; batches made ahead are dropped.

        `wait`: return only once the batches being made have finished (a
        benchmark's next row must not pay for them).
        """
        with self._lock:
            for future in self._pending.values():
                future.cancel()
            self._pending.clear()
            for made in self._unclaimed:
                made.add_done_callback(host_processes.discard_batch)  # now if done, else when it is
            self._unclaimed.clear()
            pools, self._pool, self._processes = (self._processes, self._pool), None, None
        # Outside the lock: a placing thread being waited for may be about to take it.
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=wait, cancel_futures=True)

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
        **kwargs: `data.host.HostBatches`' options (`augment`, `seed`,
            `max_boxes`, `cache`, `start_position`, `num_shards`,
            `shard_index`, `multi_scale`, `mosaic`), as `make_dataset`'s.
    """
    host = HostBatches(annotations, input_shape, num_classes, batch_size, training=training, **kwargs)
    return HostDataset(
        host,
        workers=workers,
        use_multiprocessing=use_multiprocessing,
        max_queue_size=max_queue_size,
        to_device=to_device,
    )
