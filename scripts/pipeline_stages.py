#!/usr/bin/env python3
"""Where the training pipeline's CPU time goes: each stage left out in turn, interleaved rounds.

    python scripts/make_bench_images.py --out /tmp/bench_images --num 256
    python scripts/pipeline_stages.py --annotations /tmp/bench_images/train.txt --rounds 3

Variants, each the real `data.pipeline.DatasetBuilder` with one stage
replaced (a subclass overrides one method), timed like `bench pipeline`
(CPU time of every thread per image) in rounds that visit every variant,
so that load from other processes disturbs all of them alike:

- `full`: training as `train.py` runs it (keras-yolo3's augmentation, targets);
- `no-hsv`: the HSV jitter (OpenCV in `tf.numpy_function`) left out;
- `no-place`: resize + placement on the canvas + flip replaced by one
  bilinear resize of the decoded image to the input size;
- `fused-place`: resize + placement + flip as one `ImageProjectiveTransformV3`
  (bilinear, no area averaging): the fused-resampling candidate;
- `no-targets`: batches of images and boxes, no `y_true` built;
- `decode-only`: `bench pipeline --generator decode-only`, the reference.

Prints one line per round and a JSON summary: the median CPU-ms/image of
each variant and its ratio to decode-only.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time


def _variants():
    """name -> DatasetBuilder subclass (None: decode-only)."""
    import tensorflow as tf

    from keras_yolo_mgpu.data import pipeline
    from keras_yolo_mgpu.data.letterbox import GREY

    class NoHsv(pipeline.DatasetBuilder):
        def augment_image(self, pixels, extent, params, input_shape=None):
            input_shape = input_shape or self.input_shape
            canvas = pipeline.place_image(pixels, extent, params, input_shape)
            canvas = tf.cond(params["flip"], lambda: tf.reverse(canvas, [1]), lambda: canvas)
            return canvas / 255.0

    class NoPlace(pipeline.DatasetBuilder):
        def augment_image(self, pixels, extent, params, input_shape=None):
            input_shape = input_shape or self.input_shape
            canvas = tf.image.resize(pixels, input_shape)
            image = tf.numpy_function(
                pipeline._distort_hsv, [canvas, params["hue"], params["sat"], params["val"]], tf.float32
            )
            image.set_shape([*input_shape, 3])
            return image

    class FusedPlace(pipeline.DatasetBuilder):
        def augment_image(self, pixels, extent, params, input_shape=None):
            h, w = input_shape or self.input_shape
            sx = extent[0] / tf.cast(params["nw"], tf.float32)  # decoded pixels per canvas pixel
            sy = extent[1] / tf.cast(params["nh"], tf.float32)
            dx, dy = tf.cast(params["dx"], tf.float32), tf.cast(params["dy"], tf.float32)
            # Output (x, y) -> input (a0 x + a2, b1 y + b2), flipped: x -> w - 1 - x.
            flip = tf.cast(params["flip"], tf.float32)
            a0 = sx * (1.0 - 2.0 * flip)
            a2 = tf.where(params["flip"], sx * (w - 1 - dx + 0.5) - 0.5, sx * (0.5 - dx) - 0.5)
            b2 = sy * (0.5 - dy) - 0.5
            transform = tf.stack([a0, 0.0, a2, 0.0, sy, b2, 0.0, 0.0])[None]
            canvas = tf.raw_ops.ImageProjectiveTransformV3(
                images=tf.cast(pixels, tf.float32)[None],
                transforms=transform,
                output_shape=tf.constant([h, w]),
                fill_value=float(GREY),
                interpolation="BILINEAR",
                fill_mode="CONSTANT",
            )[0]
            image = tf.numpy_function(
                pipeline._distort_hsv, [canvas, params["hue"], params["sat"], params["val"]], tf.float32
            )
            image.set_shape([h, w, 3])
            return image

    class NoTargets(pipeline.DatasetBuilder):
        def to_model_inputs(self, images, boxes, *weights):
            return ({"image": images, "boxes": boxes}, tf.zeros([self.shard_batch_size, 1]), *weights)

    return {
        "full": pipeline.DatasetBuilder,
        "no-hsv": NoHsv,
        "no-place": NoPlace,
        "fused-place": FusedPlace,
        "no-targets": NoTargets,
        "decode-only": None,
    }


def time_variant(builder, annotations, input_shape, anchors, num_classes, batch_size, batches, warmup=3):
    """CPU-ms per image (all threads) and images/s of `batches` batches after `warmup`."""
    from keras_yolo_mgpu.bench.pipeline import _decode_only_dataset

    if builder is None:
        dataset = _decode_only_dataset(annotations, input_shape, batch_size)
    else:
        dataset = builder(
            annotations, input_shape, anchors, num_classes, batch_size, training=True, augment=True, seed=0
        ).build()
    iterator = iter(dataset)
    for _ in range(warmup):
        next(iterator)
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(iterator)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    del iterator
    gc.collect()
    images = batches * batch_size
    return 1000 * cpu / images, images / seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--annotations", required=True)
    parser.add_argument("--input-size", type=int, default=416)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=None, help="comma-separated variants (default: all)")
    args = parser.parse_args(argv)

    from keras_yolo_mgpu.data.annotations import read_annotations
    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors

    annotations = read_annotations(args.annotations)
    num_classes = 1 + max(int(a.boxes[:, 4].max()) for a in annotations if len(a.boxes))
    anchors = get_anchors(default_anchors_path(False))
    variants = _variants()
    names = args.only.split(",") if args.only else list(variants)
    shape = (args.input_size, args.input_size)
    results = {name: [] for name in names}
    for round_index in range(args.rounds):
        for name in names:
            cpu_ms, rate = time_variant(
                variants[name], annotations, shape, anchors, num_classes, args.batch_size, args.batches
            )
            results[name].append(cpu_ms)
            print(f"round {round_index}: {name:12s} {cpu_ms:6.2f} CPU-ms/image {rate:7.1f} images/s", flush=True)
    medians = {name: statistics.median(values) for name, values in results.items()}
    summary = {"cpu_ms_per_image": results, "median": medians}
    if "decode-only" in medians:
        summary["ratio_to_decode_only"] = {n: round(m / medians["decode-only"], 2) for n, m in medians.items()}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
