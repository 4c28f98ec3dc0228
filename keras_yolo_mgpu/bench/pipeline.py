"""Input pipeline throughput: `python -m keras_yolo_mgpu.bench pipeline ...`.

    python scripts/make_bench_images.py --out /tmp/bench_images --num 256
    python -m keras_yolo_mgpu.bench pipeline --annotations /tmp/bench_images/train.txt \\
        --classes model_data/voc_classes.txt --input-size 416 --batch-size 32 --batches 20 \\
        [--generator {tfdata,reference,decode-only}]

Times `--batches` training batches after `--warmup` batches and prints, as
its last line, one JSON object (`images_per_sec`, `batches_per_sec`,
`cpu_ms_per_image`: process CPU time of all threads per image, ...).

- `tfdata` (default): `data.make_dataset(training=True)`, full augmentation
  and targets, as training consumes it.
- `reference`: keras-yolo3's single-threaded generator (see
  `reference_generator`), the baseline.
- `decode-only`: the same files read, decoded and resized (bilinear) to the
  input size with TF's native ops in a parallel tf.data map; no augmentation,
  no targets: the ceiling for any pipeline on these files.
"""

from __future__ import annotations

import gc
import logging
import os
import time

import numpy as np

logger = logging.getLogger(__name__)

GENERATORS = ("tfdata", "reference", "decode-only")


def _decode_only_dataset(annotations, input_shape, batch_size: int):
    """Read + decode + resize only, all in TF ops: the ceiling for any pipeline."""
    import tensorflow as tf

    def element(path):
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        return tf.image.resize(image, input_shape) / 255.0  # bilinear, float32

    paths = tf.data.Dataset.from_tensor_slices([a.image_path for a in annotations])
    dataset = paths.repeat().map(element, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _batches(generator: str, annotations, input_shape, anchors, num_classes, batch_size, seed, cache):
    """An iterator over training batches of the chosen generator."""
    if generator == "reference":
        from keras_yolo_mgpu.bench.reference_generator import data_generator

        np.random.seed(seed)
        return data_generator(annotations, batch_size, input_shape, anchors, num_classes)
    if generator == "decode-only":
        return iter(_decode_only_dataset(annotations, input_shape, batch_size))
    from keras_yolo_mgpu.data.pipeline import make_dataset

    dataset = make_dataset(
        annotations, input_shape, anchors, num_classes, batch_size, training=True, augment=True, seed=seed, cache=cache
    )
    return iter(dataset)


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
) -> dict:
    """Times `batches` batches after `warmup`; returns the result record.

    `build_seconds` is the time to make the pipeline (part of `warmup_seconds`).
    """
    if generator not in GENERATORS:
        raise ValueError(f"`generator` must be one of {GENERATORS}. Received: generator={generator!r}")
    start = time.perf_counter()
    iterator = _batches(generator, annotations, input_shape, anchors, num_classes, batch_size, seed, cache)
    # Building the pipeline (tracing its map functions) is paid at every start of training and every stage.
    build_seconds = time.perf_counter() - start
    for _ in range(warmup):
        next(iterator)
    warmup_seconds = time.perf_counter() - start
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(iterator)
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start  # all threads of the process
    # tf.data worker threads calling back into Python can hang interpreter
    # shutdown while an iterator is alive: end it now.
    del iterator
    gc.collect()
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
        "seconds": round(seconds, 3),
        "cpu_ms_per_image": round(1000 * cpu_seconds / (batches * batch_size), 3),
        "input_size": list(input_shape),
        "num_images": len(annotations),
        "augment": generator != "decode-only",
        "cache": cache,
        "cpu_count": os.cpu_count(),
    }
