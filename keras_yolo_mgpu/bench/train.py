"""`python -m keras_yolo_mgpu.bench train`: training images/sec, against keras-yolo3 too.

Feeds one generated batch from memory (a repeated tf.data dataset), so the
number measures the model step and the replica communication, not the input
pipeline (`bench pipeline` measures that). Each step is timed from Keras's
batch-begin callback to its batch-end callback, which waits for the loss.

    python -m keras_yolo_mgpu.bench train --tiny --input-size 416 --num-classes 20 --batch-size 8 \\
        --reference keras-yolo3 [--variants keras-bn,static-mask,xla] [--breakdown]

`--reference keras-yolo3` builds keras-yolo3's model and scalar loss under
Keras 2 (`tf_keras`, see `reference_model.py`) next to ours in the same
process and times them in interleaved rounds (the order alternates), so
`ratio` = ours / keras-yolo3 comes from one run on one machine state.
`--variants` adds variants of ours to the same rounds (see `VARIANTS`);
`--breakdown` also times the parts of a step (see `step_parts.py`). Prints
one line per round, then a JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time

from keras_yolo_mgpu.cli import args as cli

logger = logging.getLogger(__name__)

REFERENCES = ("keras-yolo3",)
#: Variants of our step, each timed as its own side: what it changes.
VARIANTS = {
    "keras-bn": "Keras 3's own BatchNormalization training path instead of the fused kernel",
    "static-mask": "ignore mask from a static top-k gather of at most 20 true boxes (max_true_boxes=20)",
    "xla": "jit_compile=True (XLA) with the static ignore mask",
}
#: The pipeline's bound on boxes per image; what `max_true_boxes` is set to.
MAX_BOXES = 20


def _variant_list(text: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {unknown}; choose from {sorted(VARIANTS)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(prog="python -m keras_yolo_mgpu.bench train", description=__doc__.splitlines()[0])
    cli.add_device_args(parser)
    parser.add_argument("--tiny", action="store_true", help="tiny YOLOv3 (default: full YOLOv3)")
    parser.add_argument("--input-size", type=cli.input_size, default=(416, 416), metavar="HxW")
    parser.add_argument("--num-classes", type=cli.positive_int, default=80)
    parser.add_argument(
        "--batch-size", type=cli.positive_int, default=None, help="GLOBAL batch (default: 8 per replica)"
    )
    parser.add_argument(
        "--simulated-gpu-memory",
        type=cli.positive_int,
        default=None,
        metavar="MiB",
        help="with --simulate-devices on a GPU: memory of each logical GPU (default: the library's)",
    )
    parser.add_argument("--freeze-body", type=int, choices=(0, 1, 2), default=0)
    parser.add_argument("--parallel", choices=("strategy", "multi_gpu_model"), default="strategy")
    parser.add_argument("--no-sync-bn", action="store_true")
    parser.add_argument("--mixed-precision", action="store_true", help="mixed_float16 (ours only)")
    parser.add_argument("--jit", action="store_true", help="XLA (jit_compile=True) with the static ignore mask")
    parser.add_argument("--reference", choices=REFERENCES, default=None, help="also time keras-yolo3's step")
    parser.add_argument(
        "--variants", type=_variant_list, default=[], help=f"comma-separated variants of ours: {', '.join(VARIANTS)}"
    )
    parser.add_argument("--breakdown", action="store_true", help="also time forward/loss/backward/optimizer parts")
    parser.add_argument("--warmup-steps", type=cli.positive_int, default=3)
    parser.add_argument("--steps", type=cli.positive_int, default=10, help="timed steps per round and side")
    parser.add_argument("--rounds", type=cli.positive_int, default=None, help="default: 3 with --reference, else 1")
    return parser


def synthetic_batch(global_batch, input_shape, anchors, num_classes, seed=0):
    """One batch: uniform random images, 1-10 random boxes per image and their targets.

    Returns:
        `(x, y)`: x a dict with `image` (N, H, W, 3) and `y_true_<l>` arrays,
        y zeros (N, 1) (the targets are model inputs).
    """
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


def _step_timer(callback_base):
    """A callback class (Keras 3 or Keras 2 base) recording each step's seconds."""

    class StepTimer(callback_base):
        def __init__(self):
            super().__init__()
            self.times: list[float] = []

        def on_train_batch_begin(self, batch, logs=None):
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            float(logs["loss"])  # the step has finished (GPUs run asynchronously)
            self.times.append(time.perf_counter() - self._start)

    return StepTimer


class _Side:
    """One model to time: fits `steps` steps on the repeated batch, keeps the step times."""

    def __init__(self, name, model, dataset, callback_base, global_batch, parts=None):
        self.name, self.model, self.dataset, self.global_batch = name, model, dataset, global_batch
        self.timer_class = _step_timer(callback_base)
        self.parts = parts
        self.rounds: list[list[float]] = []

    def fit(self, steps: int) -> list[float]:
        timer = self.timer_class()
        self.model.fit(self.dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[timer])
        return timer.times

    def images_per_sec(self, times) -> float:
        return self.global_batch / statistics.median(times)


def _build_ours(name, args, anchors, strategy, devices, x, y, global_batch):
    import keras
    import tensorflow as tf

    from keras_yolo_mgpu.bench.step_parts import StepParts
    from keras_yolo_mgpu.model.batch_norm import BatchNormalization
    from keras_yolo_mgpu.model.loss import totalloss, yolo_loss
    from keras_yolo_mgpu.model.yolo3 import create_model
    from keras_yolo_mgpu.parallel import devices as parallel

    jit = args.jit or name == "xla"
    static_mask = jit or name == "static-mask"
    replicas = len(devices)
    with strategy.scope():
        body, train_model = create_model(
            args.input_size,
            anchors,
            args.num_classes,
            freeze_body=args.freeze_body,
            sync_bn=not args.no_sync_bn and replicas > 1 and args.parallel == "strategy",
            max_true_boxes=MAX_BOXES if static_mask else None,
        )
        if name == "keras-bn":
            for layer in body.layers:
                if isinstance(layer, BatchNormalization):
                    layer.fused = False
        model = (
            parallel.multi_gpu_model(train_model, devices=devices)
            if args.parallel == "multi_gpu_model"
            else train_model
        )
        model.compile(optimizer=keras.optimizers.SGD(1e-4), loss=totalloss, jit_compile=jit)
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat().prefetch(2)
    parts = None
    if args.breakdown:
        optimizer = keras.optimizers.SGD(1e-4)
        optimizer.build(train_model.trainable_variables)
        inputs = [tf.constant(x[key]) for key in ("image", *sorted(k for k in x if k.startswith("y_true_")))]
        max_true_boxes = MAX_BOXES if static_mask else None
        parts = StepParts(
            body,
            train_model,
            lambda loss_args: yolo_loss(loss_args, anchors, args.num_classes, max_true_boxes=max_true_boxes),
            optimizer.apply,
            inputs,
            jit=jit,
        )
    return _Side(name, model, dataset, keras.callbacks.Callback, global_batch, parts)


def _build_reference(args, anchors, x, y, global_batch):
    import tensorflow as tf

    try:
        from keras_yolo_mgpu.bench import reference_model
    except ImportError as error:
        raise SystemExit(f"error: --reference keras-yolo3: {error}") from None
    import tf_keras

    from keras_yolo_mgpu.bench.step_parts import StepParts

    body = reference_model.build_body(args.tiny, args.num_classes, seed=None)
    model = reference_model.create_training_model(body, args.input_size, anchors, args.num_classes)
    model.compile(optimizer=tf_keras.optimizers.SGD(1e-4), loss={"yolo_loss": lambda y_true, y_pred: y_pred})
    inputs = tuple(x[key] for key in ("image", *sorted(k for k in x if k.startswith("y_true_"))))
    dataset = tf.data.Dataset.from_tensors((inputs, y)).repeat().prefetch(2)
    parts = None
    if args.breakdown:
        optimizer = tf_keras.optimizers.SGD(1e-4)
        parts = StepParts(
            body,
            model,
            lambda loss_args: reference_model.scalar_yolo_loss(loss_args, anchors, args.num_classes),
            lambda grads, variables: optimizer.apply_gradients(zip(grads, variables)),
            [tf.constant(t) for t in inputs],
        )
    return _Side("keras-yolo3", model, dataset, tf_keras.callbacks.Callback, global_batch, parts)


def _breakdown_report(sides, rounds):
    """Per-part medians (ms) per side, with the derived forward/loss/backward/optimizer/Keras split."""
    from keras_yolo_mgpu.bench.step_parts import PARTS, time_parts

    times = time_parts({side.name: side.parts for side in sides}, rounds)
    report = {}
    for side in sides:
        median = {part: statistics.median(times[side.name][part]) * 1000 for part in PARTS}
        fit_ms = statistics.median([t for round_times in side.rounds for t in round_times]) * 1000
        report[side.name] = {
            "parts_ms": {part: round(value, 1) for part, value in median.items()},
            "parts_ms_all": {part: [round(t * 1000, 1) for t in times[side.name][part]] for part in PARTS},
            "split_ms": {
                "forward": round(median["forward"], 1),
                "loss": round(median["forward+loss"] - median["forward"], 1),
                "backward": round(median["gradients"] - median["forward+loss"], 1),
                "optimizer": round(median["step"] - median["gradients"], 1),
                "keras_fit_overhead": round(fit_ms - median["step"], 1),
                "fit_step": round(fit_ms, 1),
            },
        }
    header = f"{'part (ms, median)':22s}" + "".join(f"{side.name:>14s}" for side in sides)
    print(header)
    for part in (*PARTS, "fit_step"):
        values = [
            report[s.name]["parts_ms"].get(part, report[s.name]["split_ms"].get(part, float("nan"))) for s in sides
        ]
        print(f"{part:22s}" + "".join(f"{v:14.1f}" for v in values))
    return report


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    cli.setup_logging()
    from keras_yolo_mgpu.parallel import devices as parallel

    if args.simulate_devices and args.simulated_gpu_memory:
        devices = parallel.simulate_devices(args.gpus or 2, memory_limit_mb=args.simulated_gpu_memory)
    else:
        devices = parallel.select_devices(args.gpus, simulate=args.simulate_devices)  # before any TF op
    import keras
    import tensorflow as tf

    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors

    replicas = len(devices)
    global_batch = args.batch_size or 8 * replicas
    if global_batch % replicas:
        print(f"error: global batch {global_batch} does not divide over {replicas} replicas", file=sys.stderr)
        return 2
    if args.reference and (replicas > 1 or args.mixed_precision):
        print("error: --reference compares one device in float32 (keras-yolo3 has neither)", file=sys.stderr)
        return 2
    if args.breakdown and (replicas > 1 or args.parallel == "multi_gpu_model"):
        print("error: --breakdown times one device", file=sys.stderr)
        return 2
    if args.mixed_precision:
        keras.mixed_precision.set_global_policy("mixed_float16")
    rounds = args.rounds or (3 if args.reference else 1)
    anchors = get_anchors(default_anchors_path(args.tiny))
    strategy = parallel.make_strategy(devices) if args.parallel == "strategy" else tf.distribute.get_strategy()
    x, y = synthetic_batch(global_batch, args.input_size, anchors, args.num_classes)

    sides = [_build_ours("ours", args, anchors, strategy, devices, x, y, global_batch)]
    if args.reference:
        sides.append(_build_reference(args, anchors, x, y, global_batch))
    for name in args.variants:
        sides.append(_build_ours(name, args, anchors, strategy, devices, x, y, global_batch))

    for side in sides:  # tracing, first-step allocations
        side.fit(args.warmup_steps)
    for round_index in range(rounds):
        order = sides if round_index % 2 == 0 else sides[::-1]
        for side in order:
            side.rounds.append(side.fit(args.steps))
        line = "  ".join(f"{side.name} {side.images_per_sec(side.rounds[-1]):7.2f}" for side in sides)
        print(f"round {round_index + 1}: images/sec  {line}")

    result = {
        "benchmark": "train",
        "model": "tiny_yolo" if args.tiny else "yolo",
        "input_size": list(args.input_size),
        "num_classes": args.num_classes,
        "replicas": replicas,
        "devices": devices,
        "parallel": args.parallel,
        "global_batch": global_batch,
        "mixed_precision": args.mixed_precision,
        "jit": args.jit,
        "steps_per_round": args.steps,
        "rounds": rounds,
    }
    for side in sides:
        per_round = [round(side.images_per_sec(times), 2) for times in side.rounds]
        all_times = [t for times in side.rounds for t in times]
        key = "" if side.name == "ours" else f"{side.name}_"
        result[f"{key}images_per_sec_rounds"] = per_round
        result[f"{key}images_per_sec"] = round(statistics.median(per_round), 2)
        result[f"{key}median_step_ms"] = round(statistics.median(all_times) * 1000, 2)
    ours = sides[0]
    for side in sides[1:]:
        ratios = [ours.images_per_sec(a) / side.images_per_sec(b) for a, b in zip(ours.rounds, side.rounds)]
        result[f"ratio_vs_{side.name}"] = round(result["images_per_sec"] / result[f"{side.name}_images_per_sec"], 3)
        result[f"ratio_vs_{side.name}_rounds"] = [round(r, 3) for r in ratios]
    if args.breakdown:
        result["breakdown"] = _breakdown_report(sides, rounds)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
