#!/usr/bin/env python3
"""Where the training pipeline's CPU time goes: each stage left out in turn, interleaved rounds.

    python scripts/make_bench_images.py --out /tmp/bench_images --num 256
    python scripts/pipeline_stages.py --annotations /tmp/bench_images/train.txt --rounds 3

Variants, each the real tf.data pipeline (`data.tf_dataset.DatasetBuilder`
over `data.host.HostBatches`) with one stage changed (a subclass overrides
one method), timed like `bench pipeline` (CPU time of every thread per image)
in rounds that visit every variant, so that load from other processes
disturbs all of them alike:

- `host`: the host's share, what training reads (uint8 canvas, padded
  boxes, HSV draws: `make_dataset`);
- `no-place`: `host` without resizing and placing the image (the decoded
  image is not touched; the canvas stays grey);
- `full-decode`: `host` decoding every JPEG whole (no reduced-scale DCT
  decoding);
- `host-ram`: `host` from a warm RAM cache (`--cache ram`): no decoding;
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
    """name -> (DatasetBuilder options, HostBatches subclass or None); None: decode-only."""
    from keras_yolo_mgpu.data import host
    from keras_yolo_mgpu.data.images import decode_image
    from keras_yolo_mgpu.data.letterbox import GREY

    class NoPlace(host.HostBatches):
        def augmented(self, params, index, out, order):
            self.source.read(self.source.decode, int(index), (int(params["nw"]), int(params["nh"])))
            out[...] = GREY
            boxes = host.augment_boxes(self.boxes_of(index), (1, 1), params, out.shape[:2], self.max_boxes, order)
            return boxes, (params["hue"], params["sat"], params["val"])

    class WholeDecodes(host.ImageSource):
        def decode(self, index, reduce_to=None):
            pixels, _, size = decode_image(self.annotations[index].image_path)
            return pixels, size, host.np.array(size, host.np.float32)

    class FullDecode(host.HostBatches):
        def __post_init__(self):
            super().__post_init__()
            self.source = WholeDecodes(self.annotations, self.input_shape, self.cache)

    return {
        "host": ({}, None),
        "no-place": ({}, NoPlace),
        "full-decode": ({}, FullDecode),
        "host-ram": ({"cache": "ram"}, None),
        "decode-only": None,
    }


def time_variant(variant, annotations, input_shape, anchors, num_classes, batch_size, batches, warmup=3):
    """CPU-ms per image (all threads) and images/s of `batches` batches after `warmup`."""
    import os

    from keras_yolo_mgpu.bench.pipeline import _decode_only_dataset, _wait_until_idle
    from keras_yolo_mgpu.data.tf_dataset import DatasetBuilder

    if variant is None:
        dataset = _decode_only_dataset(annotations, input_shape, batch_size)
    else:
        options, host_class = variant
        builder = DatasetBuilder(
            annotations, input_shape, anchors, num_classes, batch_size, training=True, seed=0, **options
        )
        if host_class is not None:
            old = builder.host
            builder.host = host_class(
                annotations, input_shape, num_classes, batch_size, training=True, seed=0, cache=old.cache
            )
        builder.host.source.warm()  # a cache, if any, is timed warm
        dataset = builder.build()
    iterator = iter(dataset)
    for _ in range(max(warmup, (os.cpu_count() or 1) + 1)):  # past the parallel calls' first batches
        next(iterator)
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(iterator)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    del iterator
    gc.collect()
    _wait_until_idle()  # what the closed pipeline's threads still finish is not the next variant's
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
