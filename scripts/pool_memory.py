#!/usr/bin/env python3
"""The scratch memory and time of a JAX training step of tiny YOLOv3, with Keras's max pooling and the project's.

    KERAS_BACKEND=jax python scripts/pool_memory.py --input-size 416 --batch-size 8

Tiny YOLOv3 (`model.yolo3.tiny_yolo_body`, 80 classes) forward and backward
in one jitted function (the loss here is the sum of squared outputs: the
pooling's share of the step does not depend on it), compiled twice: with
the pooling of `backend/jax/pooling.py` (2x2 windows at stride 2 by a
reshape) and with Keras's `max_pool` (`lax.reduce_window`, whose gradient
XLA's CPU compiler expands into index arrays of the input's size). Prints
XLA's scratch (`temp_size_in_bytes`) for each, and seconds per step (the
median of `--steps` after one warm-up), then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input-size", type=int, default=416)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)

    import jax
    import keras
    import numpy as np

    from keras_yolo_mgpu.backend.tensorflow import pooling as keras_pooling  # Keras's op alone: no TensorFlow
    from keras_yolo_mgpu.model import pooling
    from keras_yolo_mgpu.model.yolo3 import tiny_yolo_body

    if keras.backend.backend() != "jax":
        raise SystemExit("run with KERAS_BACKEND=jax")
    size = args.input_size
    model = tiny_yolo_body(keras.Input((size, size, 3)), 3, 80)
    images = np.random.default_rng(0).uniform(0, 1, (args.batch_size, size, size, 3)).astype("float32")
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss(trainable, images):
        outputs, _ = model.stateless_call(trainable, non_trainable, images, training=True)
        return sum(keras.ops.sum(keras.ops.square(output)) for output in outputs)

    record = {"benchmark": "pool-memory", "input_size": size, "batch_size": args.batch_size}
    for name, module in (("project", pooling.backend_pooling), ("keras", keras_pooling)):
        pooling.backend_pooling = module
        step = jax.jit(jax.grad(loss))
        compiled = step.lower(trainable, images).compile()
        scratch = compiled.memory_analysis().temp_size_in_bytes
        jax.block_until_ready(compiled(trainable, images))
        seconds = []
        for _ in range(args.steps):
            start = time.perf_counter()
            jax.block_until_ready(compiled(trainable, images))
            seconds.append(time.perf_counter() - start)
        record[f"{name}_scratch_mb"] = round(scratch / 1e6, 1)
        record[f"{name}_seconds_per_step"] = round(statistics.median(seconds), 3)
        print(f"{name:8s} pooling: scratch {scratch / 1e6:8.1f} MB, {statistics.median(seconds):.3f} s per step")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
