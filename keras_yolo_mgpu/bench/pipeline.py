"""Input pipeline throughput: `python -m keras_yolo_mgpu.bench pipeline ...` (usage: `cli/bench_pipeline.py`).

Each row is a generator, optionally with its own image cache (`NAME@ram`, `NAME@/some/folder`;
`--cache` is the default for rows without one). Rows are timed in interleaved rounds, so load
from other processes disturbs them alike. A row times `--batches` batches after `--warmup`
(at least one more than the parallel workers, whose first batches arrive at once); a row with
a cache is timed warm, after one full pass fills it (`cache_seconds`). `cpu_ms_per_image` is
the CPU time of the process, all threads, and of its worker processes (`bench.cpu_time`) per
image: on a shared machine the robust figure; None where the workers cannot be found.
`main_cpu_ms_per_image` is the training process's share of it.

- `tfdata-device`: `data.tf_dataset.make_dataset(training=True)`, the host's part of
  TensorFlow's training input (uint8 images, padded boxes, HSV draws), which
  `data.device_side.DeviceInputs` finishes in the step;
- `pydataset`: the same batches from `data.py_dataset.make_py_dataset` through Keras's
  `PyDataset` worker threads, JAX's training input (`--without-tensorflow` proves it needs
  no TensorFlow); on JAX each batch is placed on the first device, as the trainer places it;
- `pyprocesses`: `pydataset` with worker processes (`--feed processes`, `data.host_processes`);
- `grain`: the same batches from google/grain's worker processes (`data.grain_feed`; needs
  `pip install grain`), placed as the trainer would place them;
- `reference`: keras-yolo3's single-threaded generator (from a checkout, `bench.baseline`);
- `decode-only`: the files read, decoded and resized (bilinear) with TF's native ops in a
  parallel map, no augmentation, no targets: the reference the ratios are taken against.

The last line is one JSON object: the row's record for one row and one round, otherwise
`rows` with each row's per-round figures, medians and `cpu_ratio_to_decode_only`.
"""

from __future__ import annotations

import gc
import logging
import os
import statistics
import sys
import time

import numpy as np

from keras_yolo_mgpu.bench.baseline import load_reference
from keras_yolo_mgpu.bench.cpu_time import tree_cpu_seconds
from keras_yolo_mgpu.data.host import HostBatches
from keras_yolo_mgpu.optional import tensorflow as tf

logger = logging.getLogger(__name__)

GENERATORS = ("tfdata-device", "pydataset", "pyprocesses", "grain", "reference", "decode-only")
# Rows whose workers are `--workers`.
FEEDS = ("pydataset", "pyprocesses", "grain")
NEEDS_TENSORFLOW = ("tfdata-device", "decode-only")
# Rows no longer made, and the row to time instead: `tfdata` timed the host
# building the dense targets, which only the device builds.
RETIRED = {"tfdata": "tfdata-device"}


def _check_generator(generator: str) -> None:
    """ValueError naming the generators (and the replacement of a retired one)."""
    if generator not in GENERATORS:
        instead = f" ({generator!r} was retired: time {RETIRED[generator]!r})" if generator in RETIRED else ""
        raise ValueError(f"`generator` must be one of {GENERATORS}{instead}. Received: generator={generator!r}")


def parse_rows(specs: str, default_cache: str | None = None) -> list[tuple[str, str | None]]:
    """'a,b@ram,c@/tmp/x' -> [(generator, cache), ...]; ValueError naming an unknown generator."""
    rows = []
    for spec in specs.split(","):
        generator, _, cache = spec.strip().partition("@")
        _check_generator(generator)
        cache = cache or default_cache
        if cache and generator in ("reference", "decode-only"):
            raise ValueError(f"{generator!r} reads the files every time: it has no cache. Received: {spec!r}")
        rows.append((generator, cache))
    return rows


def _decode_only_dataset(annotations, input_shape, batch_size: int):
    """Read + decode + resize only, all in TF ops: the reference for any pipeline."""

    def element(path):
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        return tf.image.resize(image, input_shape) / 255.0  # bilinear, float32

    paths = tf.data.Dataset.from_tensor_slices([a.image_path for a in annotations])
    dataset = paths.repeat().map(element, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


class _Row:
    """One row's batches: `iterator`, the `host` (for the cache) or None, `close()`."""

    def __init__(self, generator, annotations, input_shape, anchors, num_classes, batch_size, seed, cache, workers):
        self.host, self._adapter, self._dataset, self._feed = None, None, None, None
        if generator == "reference":
            np.random.seed(seed)
            self.iterator = load_reference("keras_yolo3_generator").data_generator(
                annotations, batch_size, input_shape, anchors, num_classes
            )
        elif generator == "decode-only":
            self.iterator = iter(_decode_only_dataset(annotations, input_shape, batch_size))
        elif generator in ("pydataset", "pyprocesses"):
            # Keras's feed when its row runs: importing this module starts no backend.
            from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

            from keras_yolo_mgpu.data.py_dataset import make_py_dataset

            options = {"seed": seed, "cache": cache, "workers": workers, "to_device": _trainer_placement()}
            options["use_multiprocessing"] = generator == "pyprocesses"
            dataset = make_py_dataset(annotations, input_shape, num_classes, batch_size, training=True, **options)
            self.host, self._dataset = dataset.host, dataset
            # What `fit` does with a PyDataset: its workers make batches ahead.
            self._adapter = PyDatasetAdapter(dataset)
            self._adapter.on_epoch_begin()
            placed = options["to_device"] is not None
            self.iterator = iter(self._adapter.get_jax_iterator() if placed else self._adapter.get_numpy_iterator())
        elif generator == "grain":
            from keras_yolo_mgpu.data.grain_feed import GrainFeed  # grain is optional: imported by its row

            self.host = HostBatches(
                annotations, input_shape, num_classes, batch_size, training=True, seed=seed, cache=cache
            )
            # Its workers start at the first batch: after `run_benchmark` has warmed the cache they share.
            self._feed = GrainFeed(self.host, workers=workers, to_device=_trainer_placement())
            self.iterator = iter(self._feed)
        else:
            # tf.data, TensorFlow's: off the JAX path (`--without-tensorflow`).
            from keras_yolo_mgpu.data.tf_dataset import DatasetBuilder

            builder = DatasetBuilder(
                annotations, input_shape, anchors, num_classes, batch_size, training=True, seed=seed, cache=cache
            )
            self.host = builder.host
            self.iterator = iter(builder.build())

    def close(self):
        if self._adapter is not None:
            self._adapter.on_epoch_end()  # stops Keras's enqueuer
            # The batches made ahead that are still being made would otherwise
            # run on into the next row's timed window (its CPU time).
            self._dataset.close(wait=True)
        if self._feed is not None:
            self.iterator.close()  # ends grain's worker processes
            self._feed.close()
        # tf.data worker threads calling back into Python can hang interpreter
        # shutdown while an iterator is alive: end it now.
        self.iterator = None
        gc.collect()
        _wait_until_idle()


def _trainer_placement():
    """What one training process does with each batch ahead of its step, as `data.streams` sets it up.

    JAX: the batch placed on the first device (`distribution.batch_placer`),
    in the feed's threads; on the CPU a copy of the thread feed's batches, none
    of the processes' (JAX keeps their aligned shared views as they are).
    TensorFlow: None (its strategy places the batches of a tf.data dataset).
    """
    # Keras when a row places batches: importing this module starts no backend.
    import keras

    from keras_yolo_mgpu.backend import distribution

    if distribution.INPUT_PIPELINE != "py_dataset":
        return None
    return distribution.batch_placer(distribution.make_distribution(keras.distribution.list_devices()[:1]))


def _wait_until_idle(timeout: float = 10.0, interval: float = 0.1) -> None:
    """Returns once this process and its workers use (almost) no CPU, or after `timeout` seconds.

    A closed pipeline's threads and worker processes may still be finishing
    the elements they had started (tf.data's parallel map and prefetch, a
    pool's running tasks): their CPU time would otherwise count in the next
    row's timed window.
    """

    def cpu_seconds():
        tree = tree_cpu_seconds()
        return time.process_time() if tree is None else tree

    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        before = cpu_seconds()
        time.sleep(interval)
        if cpu_seconds() - before < 0.05 * interval:
            return


def run_benchmark(
    generator: str,
    annotations,
    input_shape: tuple[int, int],
    anchors,
    num_classes: int,
    batch_size: int,
    batches: int,
    warmup: int = 3,
    seed: int = 0,
    cache: str | None = None,
    workers: int | None = None,
) -> dict:
    """Times `batches` batches of one row after `warmup` (and a full pass into its cache); its record.

    `build_seconds` is the time to make the pipeline (part of `warmup_seconds`);
    `cache_seconds` the full pass that fills the cache (not part of either).
    """
    _check_generator(generator)
    start = time.perf_counter()
    row = _Row(generator, annotations, input_shape, anchors, num_classes, batch_size, seed, cache, workers)
    # Building the pipeline is paid at every start of training and every stage.
    build_seconds = time.perf_counter() - start
    cache_seconds = None
    if cache is not None and row.host is not None:
        cache_start = time.perf_counter()
        cached = row.host.source.warm(workers)
        cache_seconds = time.perf_counter() - cache_start
        logger.info("%s@%s: %d of %d images in the cache", generator, cache, cached, len(annotations))
        start += cache_seconds
    if generator != "reference":
        # Parallel workers start together and finish their first batches together: the
        # timed batches must not be those, made ahead during the warm-up (CPU time missed).
        warmup = max(warmup, (workers or os.cpu_count() or 1) + 1)
    try:
        for _ in range(warmup):
            next(row.iterator)
        warmup_seconds = time.perf_counter() - start
        # The process's threads and its worker processes (None: the workers cannot be found).
        start, cpu_start, main_start = time.perf_counter(), tree_cpu_seconds(), time.process_time()
        for _ in range(batches):
            next(row.iterator)
        seconds = time.perf_counter() - start
        cpu_end = tree_cpu_seconds()
        main_seconds = time.process_time() - main_start  # this process's threads alone
    finally:
        row.close()
    images = batches * batch_size
    measured = cpu_start is not None and cpu_end is not None
    return {
        "benchmark": "pipeline",
        "generator": generator,
        "images_per_sec": round(batches * batch_size / seconds, 2),
        "batches_per_sec": round(batches / seconds, 4),
        "batch_size": batch_size,
        "batches": batches,
        "warmup_batches": warmup,
        "build_seconds": round(build_seconds, 2),
        "warmup_seconds": round(warmup_seconds, 2),
        "cache_seconds": None if cache_seconds is None else round(cache_seconds, 2),
        "seconds": round(seconds, 3),
        "cpu_ms_per_image": round(1000 * (cpu_end - cpu_start) / images, 3) if measured else None,
        "main_cpu_ms_per_image": round(1000 * main_seconds / images, 3),
        "input_size": list(input_shape),
        "num_images": len(annotations),
        "augment": generator != "decode-only",
        "cache": cache,
        "workers": workers if generator in FEEDS else None,
        "tensorflow_loaded": "tensorflow" in sys.modules,
        "cpu_count": os.cpu_count(),
    }


def run_rounds(rows: list[tuple[str, str | None]], rounds: int, annotations, *args, **kwargs) -> dict:
    """Every row once per round, `rounds` times; per row its figures by round and their medians.

    Args:
        rows: (generator, cache) pairs (`parse_rows`).
        rounds: interleaved rounds.
        *args, **kwargs: `run_benchmark`'s, after `generator` and `annotations`
            (`cache` comes from the rows).

    Returns:
        `{"benchmark": "pipeline", "rounds": ..., "rows": [...]}`; each row
        has `cpu_ms_per_image` and `images_per_sec` by round, their
        medians, and, when `decode-only` is a row, `cpu_ratio_to_decode_only`
        (median over median).
    """
    records: dict[tuple[str, str | None], list[dict]] = {row: [] for row in rows}
    for number in range(rounds):
        for generator, cache in rows:
            record = run_benchmark(generator, annotations, *args, cache=cache, **kwargs)
            records[(generator, cache)].append(record)
            cpu = record["cpu_ms_per_image"]
            logger.info(
                "round %d %s%s: %s CPU-ms/image, %.1f images/s",
                number + 1,
                generator,
                f"@{cache}" if cache else "",
                "not measured" if cpu is None else f"{cpu:.3f}",
                record["images_per_sec"],
            )
    summary = []
    for (generator, cache), found in records.items():
        cpu = [r["cpu_ms_per_image"] for r in found]
        speed = [r["images_per_sec"] for r in found]
        summary.append(
            {
                "generator": generator,
                "cache": cache,
                "cpu_ms_per_image": cpu,
                "images_per_sec": speed,
                "median_cpu_ms_per_image": None if None in cpu else round(statistics.median(cpu), 3),
                "median_images_per_sec": round(statistics.median(speed), 2),
                "build_seconds": [r["build_seconds"] for r in found],
                "cache_seconds": [r["cache_seconds"] for r in found],
            }
        )
    reference = next((row for row in summary if row["generator"] == "decode-only"), None)
    for row in summary:
        if reference is not None:
            cpu, reference_cpu = row["median_cpu_ms_per_image"], reference["median_cpu_ms_per_image"]
            measured = cpu is not None and reference_cpu
            row["cpu_ratio_to_decode_only"] = round(cpu / reference_cpu, 3) if measured else None
    first = next(iter(records.values()))[0]
    keys = ("batch_size", "batches", "warmup_batches", "input_size", "num_images", "cpu_count", "tensorflow_loaded")
    return {"benchmark": "pipeline", "rounds": rounds, **{key: first[key] for key in keys}, "rows": summary}
