"""Training callbacks: throughput in the progress bar, a loss plot, and a Ctrl-C or SIGTERM that is never lost."""

from __future__ import annotations

import contextlib
import csv
import itertools
import logging
import os
import signal
import socket
import threading
import time

import keras
import numpy as np

from keras_yolo_mgpu.optional import event_pb2, record_writer, summary_pb2, tensor_util
from keras_yolo_mgpu.optional import pyplot as plt

logger = logging.getLogger(__name__)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's time limit, `docker stop`, `kill`): the run stops as after Ctrl-C.

    `exit_status` is 143 (128 + SIGTERM), what a shell reports for a process
    SIGTERM ended; the commands exit with it.
    """

    exit_status = 128 + signal.SIGTERM

    def __str__(self) -> str:
        return "terminated (SIGTERM)"


def _raise_terminated(signum, frame):
    raise Terminated


@contextlib.contextmanager
def sigterm_stops_the_run():
    """While the block runs, SIGTERM raises `Terminated` in the main thread, as Ctrl-C raises KeyboardInterrupt.

    For a whole run: between its stages, while it sets up and while it saves
    its final weights, where no `fit` (and so no `StopOnInterrupt`) is
    running. SIGTERM's default there would end the process at once, saying
    nothing, and a new run's unstarted folder would stay. A handler the
    user's program set is kept.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class StopOnInterrupt(keras.callbacks.Callback):
    """Stops training at the next step after Ctrl-C or SIGTERM, even when Python dropped the exception.

    Python ignores an exception raised in a garbage-collection callback: a
    Ctrl-C that lands in JAX's `_xla_gc_callback` is lost, and the run trains
    on. The handler remembers the interrupt, and the next step raises it again
    in the main thread. SIGTERM raises `Terminated`, a `KeyboardInterrupt`:
    the run stops as after Ctrl-C, saying what its folder keeps, where the
    signal's default would end the process at once. Only Python's default
    handlers are replaced (a handler the user's program set is kept).
    """

    async_safe = True

    def __init__(self):
        super().__init__()
        self.interrupted: type[KeyboardInterrupt] | None = None
        self._previous: dict[int, object] = {}

    def _on_signal(self, signum, frame):
        self.interrupted = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
        raise self.interrupted

    def _raise_if_interrupted(self, *_args, **_kwargs):
        if self.interrupted is not None:
            raise self.interrupted

    on_epoch_begin = on_train_batch_begin = on_test_batch_begin = _raise_if_interrupted

    def on_train_begin(self, logs=None):
        if threading.current_thread() is not threading.main_thread():
            return
        defaults = {signal.SIGINT: (signal.default_int_handler,), signal.SIGTERM: (signal.SIG_DFL, _raise_terminated)}
        for signum, replaceable in defaults.items():
            if signal.getsignal(signum) in replaceable:
                self._previous[signum] = signal.signal(signum, self._on_signal)

    def on_train_end(self, logs=None):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}


class Throughput(keras.callbacks.Callback):
    """Adds `images_per_sec` to the logs: images trained per second of wall time on the device.

    The rate counts from the end of an epoch's first step (compiling left
    out) to the end of its latest, by the steps' indices, so it is right for
    any `steps_per_execution`. `async_safe`: the hook waits for its step's
    loss in Keras's callback thread pool, never in the step loop.
    """

    async_safe = True

    def __init__(self, global_batch_size: int):
        super().__init__()
        self.global_batch_size = global_batch_size
        # Batch-end hooks of consecutive steps may run in different pool threads.
        self._lock = threading.Lock()
        self._first = None  # (step index, time) of the epoch's first finished step
        self._latest = None  # (step index, time) of its latest finished step
        self._epoch_begin = None
        self._logged_first = False

    def on_epoch_begin(self, epoch, logs=None):
        with self._lock:
            self._first = self._latest = None
        self._epoch_begin = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if logs and "loss" in logs:
            float(logs["loss"])  # waits for this step in the callback thread, not in the step loop
        now = time.perf_counter()
        with self._lock:
            if self._first is None or batch < self._first[0]:
                self._first = (batch, now)
            if self._latest is None or batch > self._latest[0]:
                self._latest = (batch, now)
            rate = self._rate()
            first = not self._logged_first
            self._logged_first = True
        if first:  # the start-up time a user waits for (BENCHMARKS.md measures it)
            logger.info("first training step done (%.1f s)", now - self._epoch_begin)
        if logs is not None and rate is not None:
            logs["images_per_sec"] = rate

    def on_epoch_end(self, epoch, logs=None):
        with self._lock:
            rate = self._rate()
        if logs is not None and rate is not None:
            logs["images_per_sec"] = rate

    def _rate(self) -> float | None:
        if self._first is None or self._latest[0] <= self._first[0]:
            return None
        steps = self._latest[0] - self._first[0]
        return steps * self.global_batch_size / max(self._latest[1] - self._first[1], 1e-9)


def overrides_batch_end(callback) -> bool:
    """Whether `callback` has a batch-end hook of its own.

    Keras 3 then waits for every step's results before dispatching the next
    one, unless the callback says it is `async_safe`.
    """
    base, kind = keras.callbacks.Callback, type(callback)
    return kind.on_train_batch_end is not base.on_train_batch_end or kind.on_batch_end is not base.on_batch_end


_EVENT_FILE_NUMBERS = itertools.count()


class EventFile:
    """One TensorBoard event file, as `tf.summary` writes it (`tensorboard`'s protos and record framing).

    TensorBoard's own `EventFileWriter` opens its file through `tensorboard.compat.tf`, which imports
    TensorFlow wherever it is installed; this opens it with `open`.
    """

    def __init__(self, folder: str):
        os.makedirs(folder, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
        self._records = record_writer.RecordWriter(
            open(os.path.join(folder, f"{name}.{next(_EVENT_FILE_NUMBERS)}"), "wb")
        )
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _write(self, event) -> None:
        self._records.write(event.SerializeToString())

    def scalar(self, tag: str, value: float, step: int) -> None:
        """A point of the scalar curve `tag`: a float32 scalar tensor of the scalars plugin, as `tf.summary.scalar`."""
        event = event_pb2.Event(wall_time=time.time(), step=int(step))
        event.summary.value.add(
            tag=tag,
            tensor=tensor_util.make_tensor_proto(np.float32(value)),
            metadata=summary_pb2.SummaryMetadata(
                plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
                data_class=summary_pb2.DataClass.DATA_CLASS_SCALAR,
            ),
        )
        self._write(event)

    def flush(self) -> None:
        self._records.flush()

    def close(self) -> None:
        self._records.close()


class EpochTensorBoard(keras.callbacks.Callback):
    """The epoch curves that `keras.callbacks.TensorBoard` writes, through TensorBoard's own writer.

    As Keras's callback (`update_freq="epoch"`) writes them: at step `epoch`,
    `log_dir/train` gets `epoch_<name>` for each training value and the
    optimizer's learning rate, `log_dir/validation` gets `epoch_<name>` for
    each `val_<name>`, and after each evaluation `evaluation_<name>_vs_iterations`
    at the optimizer's step count. Keras's writes through `tf.summary`, so a JAX run would
    import TensorFlow for it, and TensorFlow takes GPU memory beside JAX once
    it runs an op; `EventFile` needs no TensorFlow. The files are flushed
    every epoch, so TensorBoard shows a run as it trains.
    """

    def __init__(self, log_dir: str):
        super().__init__()
        self.log_dir = log_dir
        self._writers: dict = {}

    def _write(self, part: str, values: dict, step: int, prefix: str = "epoch_") -> None:
        if part not in self._writers:
            self._writers[part] = EventFile(os.path.join(self.log_dir, part))
        for name, value in values.items():
            self._writers[part].scalar(prefix + name, value, step=step)
        self._writers[part].flush()

    def _learning_rates(self) -> dict:
        """Keras's callback's `learning_rate` entries (`_collect_learning_rate`): one per optimizer."""
        optimizer = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)  # a LossScaleOptimizer's
        if hasattr(optimizer, "optimizers"):
            return {
                f"learning_rate_{o.name}": float(keras.ops.convert_to_numpy(o.learning_rate))
                for o in optimizer.optimizers
            }
        if isinstance(optimizer, keras.optimizers.Optimizer):
            return {"learning_rate": float(keras.ops.convert_to_numpy(optimizer.learning_rate))}
        return {}

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        train = {name: value for name, value in logs.items() if not name.startswith("val_")}
        self._write("train", {**train, **self._learning_rates()}, epoch)
        validation = {name[len("val_") :]: value for name, value in logs.items() if name.startswith("val_")}
        if validation:
            self._write("validation", validation, epoch)

    def on_test_end(self, logs=None):
        if logs and getattr(self.model.optimizer, "iterations", None) is not None:
            step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            self._write("validation", {f"evaluation_{name}_vs_iterations": v for name, v in logs.items()}, step, "")

    def on_train_end(self, logs=None):
        for writer in self._writers.values():
            writer.close()
        self._writers = {}


def read_history(history_csv: str) -> dict[str, list[float]]:
    """Columns of a Keras CSVLogger file as float lists."""
    with open(history_csv, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    columns: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            try:
                columns.setdefault(key, []).append(float(value))
            except (TypeError, ValueError):
                columns.setdefault(key, []).append(float("nan"))
    return columns


def best_epoch(history: dict[str, list[float]], monitor: str, mode: str) -> tuple[int, float] | None:
    """(epoch, value) of `history`'s (read_history) first epoch with the best `monitor` value, else None.

    The first: a save-best-only checkpoint saves on a strict improvement
    only. Epochs without the value (NaN: not evaluated that epoch) are skipped.
    """
    values = np.asarray(history.get(monitor, []), dtype=np.float64)
    if not np.isfinite(values).any():
        return None
    index = int(np.nanargmax(values) if mode == "max" else np.nanargmin(values))
    epochs = history.get("epoch") or range(1, len(values) + 1)
    return int(epochs[index]), float(values[index])


def plot_history(history_csv: str, output_png: str) -> None:
    """Plots `loss` and `val_loss` against epoch (numbered from 1 in history.csv) into `output_png`."""
    plt.matplotlib.use("Agg")  # files, no display; a no-op once set
    history = read_history(history_csv)
    if not history.get("epoch"):
        return
    epochs = history["epoch"]
    figure, axis = plt.subplots(figsize=(6, 4), dpi=100)
    for key, label in (("loss", "training"), ("val_loss", "validation")):
        if key in history:
            axis.plot(epochs, history[key], marker="o", markersize=3, label=label)
    axis.set_xlabel("epoch")
    axis.set_ylabel("loss (per image)")
    axis.set_yscale("log")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
    axis.set_title(os.path.basename(os.path.dirname(os.path.abspath(output_png))) or "training")
    figure.tight_layout()
    temporary = output_png + ".tmp.png"
    figure.savefig(temporary)
    plt.close(figure)
    os.replace(temporary, output_png)


class HistoryCSVLogger(keras.callbacks.CSVLogger):
    """`CSVLogger` whose columns stay the same for the whole run.

    Keras's takes its columns from the first epoch, so a key some epochs
    lack (`val_mAP` with `--eval-every N > 1`) would be dropped or shift the
    columns after a resume. Here they are the existing header, else the first
    epoch's keys plus `required_columns`; a missing value is `NA`. Epochs are
    numbered from 1 (as checkpoint names), and each row records `learning_rate`.
    """

    def __init__(self, filename: str, required_columns=(), append: bool = True):
        super().__init__(filename, append=append)
        self.required_columns = tuple(required_columns)

    def on_train_begin(self, logs=None):
        header = None
        if self.append and os.path.isfile(self.filename):
            with open(self.filename, encoding="utf-8") as handle:
                header = handle.readline().strip()
        super().on_train_begin(logs)
        if header:
            self.keys = [key for key in header.split(self.sep) if key != "epoch"]

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        rate = self._learning_rate()
        if rate is not None:
            logs.setdefault("learning_rate", rate)
        if self.keys is None:
            self.keys = sorted(set(logs) | set(self.required_columns))
        super().on_epoch_end(epoch + 1, logs)

    def _learning_rate(self) -> float | None:
        optimizer = getattr(getattr(self, "model", None), "optimizer", None)
        if optimizer is None:
            return None
        try:
            return float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        except (TypeError, ValueError, AttributeError):
            return None
