"""`python -m keras_yolo_mgpu.bench train`: training images/sec on N devices.

Feeds generated images and targets from memory (a repeated tf.data
dataset), so the number measures the model step and the replica
communication, not the input pipeline (`bench pipeline` measures that).
Prints one line per timed step, then a JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from keras_yolo_mgpu.cli import args as cli
from keras_yolo_mgpu.model.architectures import MODEL_NAMES, model_name

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(prog="python -m keras_yolo_mgpu.bench train", description=__doc__.splitlines()[0])
    cli.add_device_args(parser)
    parser.add_argument("--tiny", action="store_true", help="alias of --model yolov3-tiny")
    parser.add_argument("--model", choices=MODEL_NAMES, default=None, help="network (default: yolov3)")
    parser.add_argument("--input-size", type=cli.input_size, default=(416, 416), metavar="HxW")
    parser.add_argument("--num-classes", type=cli.positive_int, default=80)
    parser.add_argument(
        "--batch-size", type=cli.positive_int, default=None, help="GLOBAL batch (default: 8 per replica)"
    )
    parser.add_argument("--freeze-body", type=int, choices=(0, 1, 2), default=0)
    parser.add_argument("--parallel", choices=("strategy", "multi_gpu_model"), default="strategy")
    parser.add_argument("--no-sync-bn", action="store_true")
    parser.add_argument("--mixed-precision", action="store_true")
    parser.add_argument("--warmup-steps", type=cli.positive_int, default=3)
    parser.add_argument("--steps", type=cli.positive_int, default=10, help="timed steps")
    return parser


def _synthetic_batch(global_batch, input_shape, anchors, num_classes, seed=0):
    import numpy as np

    from keras_yolo_mgpu.model.targets import preprocess_true_boxes

    rng = np.random.default_rng(seed)
    height, width = input_shape
    images = rng.random((global_batch, height, width, 3), dtype=np.float32)
    boxes = np.zeros((global_batch, 10, 5), np.float32)
    for b in range(global_batch):
        for t in range(rng.integers(1, 11)):
            w, h = rng.uniform(0.05, 0.6) * width, rng.uniform(0.05, 0.6) * height
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            boxes[b, t] = [x, y, x + w, y + h, rng.integers(num_classes)]
    y_true = preprocess_true_boxes(boxes, input_shape, anchors, num_classes)
    x = {"image": images, **{f"y_true_{i}": t for i, t in enumerate(y_true)}}
    return x, np.zeros((global_batch, 1), np.float32)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    cli.setup_logging()
    from keras_yolo_mgpu.parallel import devices as parallel

    devices = parallel.select_devices(args.gpus, simulate=args.simulate_devices)  # before any TF op
    import keras
    import tensorflow as tf

    from keras_yolo_mgpu.model.loss import totalloss
    from keras_yolo_mgpu.model.yolo3 import create_model
    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors

    if args.mixed_precision:
        keras.mixed_precision.set_global_policy("mixed_float16")
    replicas = len(devices)
    global_batch = args.batch_size or 8 * replicas
    if global_batch % replicas:
        print(f"error: global batch {global_batch} does not divide over {replicas} replicas", file=sys.stderr)
        return 2
    kind = model_name(args.model, args.tiny) or "yolov3"
    anchors = get_anchors(default_anchors_path(model=kind))
    if args.parallel == "strategy":
        strategy = parallel.make_strategy(devices)
    else:
        strategy = tf.distribute.get_strategy()
    with strategy.scope():
        body, train_model = create_model(
            args.input_size,
            anchors,
            args.num_classes,
            freeze_body=args.freeze_body,
            sync_bn=not args.no_sync_bn and replicas > 1 and args.parallel == "strategy",
            model=kind,
        )
        model = (
            parallel.multi_gpu_model(train_model, devices=devices)
            if args.parallel == "multi_gpu_model"
            else train_model
        )
        model.compile(optimizer=keras.optimizers.SGD(1e-4), loss=totalloss)
    x, y = _synthetic_batch(global_batch, args.input_size, anchors, args.num_classes)
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat().prefetch(2)

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self._start)

    timer = Timer()
    total_steps = args.warmup_steps + args.steps
    model.fit(dataset, steps_per_epoch=total_steps, epochs=1, verbose=0, callbacks=[timer])
    timed = timer.times[args.warmup_steps :]
    for index, seconds in enumerate(timed, 1):
        print(f"step {index:3d}: {seconds * 1000:8.1f} ms  {global_batch / seconds:8.1f} images/sec")
    seconds_per_step = sorted(timed)[len(timed) // 2]
    result = {
        "benchmark": "train",
        "model": kind,
        "input_size": list(args.input_size),
        "replicas": replicas,
        "devices": devices,
        "parallel": args.parallel,
        "global_batch": global_batch,
        "median_step_ms": round(seconds_per_step * 1000, 2),
        "images_per_sec": round(global_batch / seconds_per_step, 2),
        "mean_images_per_sec": round(global_batch * len(timed) / sum(timed), 2),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
