"""Our training step beside keras-yolo3's, variants of ours and the step's parts, or on both Keras backends.

Made the training-step tables of BENCHMARKS.md, docs/measurements.md and docs/gpu.md. It takes every flag of
`python -m keras_yolo_mgpu.bench train`, and these:

    python tools/train_step_compare.py --tiny --input-size 416 --num-classes 20 --batch-size 8 \\
        --reference keras-yolo3 --variants keras-bn --breakdown --rounds 7 --steps 2 --warmup-steps 2
    python tools/train_step_compare.py --backends tensorflow,jax --tiny --input-size 128 --num-classes 4 \\
        --batch-size 8 --rounds 3

* `--reference keras-yolo3`: keras-yolo3's model and scalar loss under Keras 2 (`tf_keras`), the tests' reference
  `tests/keras_yolo3_model.py`, built beside ours in the same process (one device, float32).
* `--variants`: more sides of ours (`VARIANTS`).
* `--breakdown`: forward, loss, backward, optimizer and Keras's train step of each side (`step_parts.py`).
* `--backends A,B`: our step in one process per backend (Keras picks its backend once per process), the parent
  asking each for one round at a time, alternating which goes first, so load that drifts hits both.

The sides of one process run in interleaved rounds whose order alternates, so a ratio comes from one machine
state. With `--reference`, `--variants` or `--breakdown` our side takes keras-yolo3's inputs (`--inputs dense`)
unless `--inputs` says otherwise. The last line is one JSON object: `ratio_vs_<side>` is ours over that side,
`ratio_<b>_vs_<a>` with `--backends` the second backend's images/sec over the first's.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
from collections.abc import Sequence

# Keras only inside the functions: each child of `--backends` sets KERAS_BACKEND before its first Keras import.
from keras_yolo_mgpu.cli import bench_train, quiet
from keras_yolo_mgpu.cli.bench import print_result
from keras_yolo_mgpu.cli.runner import run_command

REFERENCES = ("keras-yolo3",)
#: Variants of our step, each timed as its own side: what it changes.
VARIANTS = {
    "keras-bn": "Keras 3's own BatchNormalization training path instead of the fused kernel",
    "keras-adam": "Keras 3's own Adam update instead of the fused kernel (needs --optimizer adam)",
    "xla": "jit_compile=True (XLA)",
}
BACKENDS = ("tensorflow", "jax")


def _names(text: str, known, what: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {what} {unknown}; choose from {', '.join(known)}")
    return names


def _backend_pair(text: str) -> list[str]:
    names = _names(text, BACKENDS, "backend(s)")
    if len(set(names)) != 2:
        raise argparse.ArgumentTypeError(f"expected two of {', '.join(BACKENDS)}, e.g. tensorflow,jax")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = bench_train.build_parser()
    parser.prog, parser.description = "python tools/train_step_compare.py", __doc__.splitlines()[0]
    parser.set_defaults(inputs=None, rounds=None)
    parser.add_argument("--reference", choices=REFERENCES, default=None, help="also time keras-yolo3's step")
    parser.add_argument(
        "--variants",
        type=lambda text: _names(text, VARIANTS, "variant(s)"),
        default=[],
        help=f"comma-separated variants of ours: {', '.join(VARIANTS)}",
    )
    parser.add_argument("--breakdown", action="store_true", help="also time forward/loss/backward/optimizer parts")
    parser.add_argument(
        "--backends",
        type=_backend_pair,
        default=None,
        metavar="A,B",
        help="time our step on two Keras backends (tensorflow,jax), one process each, in interleaved rounds",
    )
    defaults = {
        "inputs": "default: dense with --reference, --variants or --breakdown, else device",
        "rounds": "default: 3 with --reference or --backends, else 1",
    }
    for action in parser._actions:
        action.help = defaults.get(action.dest, action.help)
    return parser


# -- one process: keras-yolo3, variants, parts --------------------------------------------------------------------


def _variant_side(name: str, setup: dict):
    import keras

    from keras_yolo_mgpu.bench import train as bench
    from keras_yolo_mgpu.model.batch_norm import BatchNormalization
    from keras_yolo_mgpu.training.ema import make_ema_kwargs

    def unfused_batch_norm(body):
        for layer in body.layers:
            if isinstance(layer, BatchNormalization):
                layer.fused = False

    if name == "keras-adam":
        ema = make_ema_kwargs(setup["options"]["ema"])
        return bench.build_our_side(
            setup, name, make_optimizer=lambda: keras.optimizers.Adam(bench.LEARNING_RATE, **ema)
        )
    if name == "keras-bn":
        return bench.build_our_side(setup, name, adjust_body=unfused_batch_norm)
    return bench.build_our_side(setup, name, jit=True)


def _reference_side(setup: dict):
    import tensorflow as tf

    from keras_yolo_mgpu.bench import train as bench
    from keras_yolo_mgpu.bench.baseline import load_reference

    options, anchors, x, y = setup["options"], setup["anchors"], setup["x"], setup["y"]
    reference_model = load_reference("keras_yolo3_model")  # needs tf_keras: ImportError says how to get it
    tf_keras = reference_model.tf_keras
    body = reference_model.build_body(options["tiny"], options["num_classes"], seed=None)
    model = reference_model.create_training_model(body, options["input_size"], anchors, options["num_classes"])
    # keras-yolo3 trains with Adam (Keras 2's: TensorFlow's fused kernel), without an EMA.
    optimizer = tf_keras.optimizers.Adam if options["optimizer"] == "adam" else tf_keras.optimizers.SGD
    model.compile(optimizer=optimizer(bench.LEARNING_RATE), loss={"yolo_loss": lambda y_true, y_pred: y_pred})
    inputs = tuple(x[key] for key in ("image", *sorted(k for k in x if k.startswith("y_true_"))))
    dataset = tf.data.Dataset.from_tensors((inputs, y)).repeat().prefetch(2)
    global_batch = setup["record"]["global_batch"]
    return bench.Side(
        "keras-yolo3", model, dataset, tf_keras.callbacks.Callback, global_batch, body=body, train_model=model
    )


def _step_parts(side, setup: dict):
    """The `step_parts.StepParts` of one side: its network, loss and optimizer on the benchmark's batch."""
    import keras
    import tensorflow as tf
    from step_parts import StepParts

    from keras_yolo_mgpu.bench import train as bench
    from keras_yolo_mgpu.bench.baseline import load_reference

    options, anchors, x = setup["options"], setup["anchors"], setup["x"]
    num_classes = options["num_classes"]
    inputs = [tf.constant(x[key]) for key in ("image", *sorted(k for k in x if k.startswith("y_true_")))]
    if side.name == "keras-yolo3":
        scalar_yolo_loss = load_reference("keras_yolo3_model").scalar_yolo_loss
        optimizer = type(side.model.optimizer)(bench.LEARNING_RATE)
        return StepParts(
            side.body,
            side.train_model,
            lambda loss_args: scalar_yolo_loss(loss_args, anchors, num_classes),
            lambda grads, variables: optimizer.apply_gradients(zip(grads, variables)),
            inputs,
        )
    keras_adam = side.name == "keras-adam"
    optimizer = keras.optimizers.Adam(bench.LEARNING_RATE) if keras_adam else bench.our_optimizer(options)
    optimizer.build(side.train_model.trainable_variables)
    return StepParts(
        side.body,
        side.train_model,
        side.train_model.get_layer("yolo_loss"),  # the loss layer the side trains with, on the head outputs
        optimizer.apply,
        inputs,
        jit=options["jit"] or side.name == "xla",
    )


def _breakdown(sides: list, setup: dict, rounds: int) -> dict:
    """Per-part medians (ms) per side, with the derived forward/loss/backward/optimizer/Keras split."""
    from step_parts import PARTS, time_parts

    times = time_parts({side.name: _step_parts(side, setup) for side in sides}, rounds)
    report = {}
    for side in sides:
        median = {part: statistics.median(times[side.name][part]) * 1000 for part in PARTS}
        fit_ms = statistics.median([t for round_times in side.rounds for t in round_times]) * 1000
        report[side.name] = {
            "parts_ms": {part: round(value, 1) for part, value in median.items()},
            "parts_ms_rounds": {part: [round(t * 1000, 1) for t in times[side.name][part]] for part in PARTS},
            "split_ms": {
                "forward": round(median["forward"], 1),
                "loss": round(median["forward+loss"] - median["forward"], 1),
                "backward": round(median["gradients"] - median["forward+loss"], 1),
                "optimizer": round(median["step"] - median["gradients"], 1),
                "keras_fit_overhead": round(fit_ms - median["step"], 1),
                "fit_step": round(fit_ms, 1),
            },
        }
    return report


def compare_sides(*, reference=None, variants=(), breakdown=False, warmup_steps=3, steps=10, rounds=3,
                  on_round=None, **settings) -> dict:  # fmt: skip
    """Ours, keras-yolo3's step and `variants` of ours in interleaved rounds; with `breakdown`, their parts.

    `settings`: `bench.train.run_train_benchmark`'s (network, size, batch, devices, optimizer ...).
    """
    import keras

    from keras_yolo_mgpu.bench import train as bench

    if keras.backend.backend() == "jax":
        raise ValueError(
            "--variants, --reference and --breakdown time TensorFlow's kernels: use KERAS_BACKEND=tensorflow"
        )
    if "keras-adam" in variants and settings.get("optimizer") != "adam":
        raise ValueError("variant keras-adam compares Adam updates: add --optimizer adam")
    settings["inputs"] = settings.get("inputs") or ("dense" if reference or breakdown or variants else "device")
    if (reference or breakdown) and settings["inputs"] != "dense":
        raise ValueError("--reference and --breakdown feed keras-yolo3's inputs: drop --inputs device")
    setup = bench.set_up(_with_defaults(bench.run_train_benchmark, settings))
    replicas, options = setup["engine"].replicas, setup["options"]
    if reference and (replicas > 1 or options["mixed_precision"]):
        raise ValueError("keras-yolo3 is timed on one device in float32 (keras-yolo3 has neither)")
    if reference and options["model"] not in ("yolov3", "yolov3-tiny"):
        raise ValueError(f"keras-yolo3 has no {options['model']}")
    if breakdown and (replicas > 1 or options["parallel"] == "multi_gpu_model"):
        raise ValueError("--breakdown times one device")
    sides = [bench.build_our_side(setup)]
    sides += [_reference_side(setup)] if reference else []
    sides += [_variant_side(name, setup) for name in variants]
    bench.time_rounds(sides, warmup_steps, steps, rounds, on_round)
    result = bench.side_figures(setup, sides, steps, rounds)
    if breakdown:
        result["breakdown"] = _breakdown(sides, setup, rounds)
    return result


def _with_defaults(function, settings: dict) -> dict:
    """`settings` completed with `function`'s defaults, less its timing arguments (TypeError for a misspelt one)."""
    import inspect

    from keras_yolo_mgpu.bench.train import TIMING

    bound = inspect.signature(function).bind(**settings)
    bound.apply_defaults()
    return {name: value for name, value in bound.arguments.items() if name not in TIMING}


# -- two processes: the backends ----------------------------------------------------------------------------------


def _serve_rounds(connection, backend: str, settings: dict, warmup_steps: int) -> None:
    """The child: builds one backend's side, then times a round of steps per request until told to stop."""
    os.environ["KERAS_BACKEND"] = backend
    quiet.configure_environment()  # as the command itself starts: TensorFlow's loader lines dropped
    quiet.quiet_tensorflow_import()
    # After KERAS_BACKEND: this import starts Keras on the child's backend.
    from keras_yolo_mgpu.bench import train as bench

    try:
        setup = bench.set_up(_with_defaults(bench.run_train_benchmark, {**settings, "inputs": "device"}))
        side = bench.build_our_side(setup)
        side.fit(warmup_steps)  # compiling, first-step allocations
        connection.send(("ready", setup["record"]))
        while True:
            request, steps = connection.recv()
            if request == "stop":
                break
            connection.send(("round", side.fit(steps)))
    except Exception as error:  # reported to the parent, which raises it with the backend's name
        connection.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        connection.close()


def compare_backends(backends=BACKENDS, *, rounds=3, steps=10, warmup_steps=3, on_round=None, **settings) -> dict:
    """Times `rounds` x `steps` steps of the same training step per backend; returns the result record.

    Returns:
        `{"benchmark": "train-backends", ...}` with each backend's images/sec per round and their median, and
        `ratio_<b>_vs_<a>` (the second backend's images/sec over the first's) from the medians and per round.
    """
    context = multiprocessing.get_context("spawn")
    children, setups = {}, {}
    try:
        for backend in backends:
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_serve_rounds, args=(child_end, backend, settings, warmup_steps))
            process.start()
            children[backend] = (process, parent_end)
        for backend, (_, connection) in children.items():
            setups[backend] = _receive(connection, backend, "ready")
        times: dict[str, list[list[float]]] = {backend: [] for backend in backends}
        for round_index in range(rounds):
            for backend in backends if round_index % 2 == 0 else backends[::-1]:
                children[backend][1].send(("round", steps))
                times[backend].append(_receive(children[backend][1], backend, "round"))
            if on_round:
                on_round(
                    round_index, {b: setups[b]["global_batch"] / statistics.median(times[b][-1]) for b in backends}
                )
    finally:
        for process, connection in children.values():
            try:
                connection.send(("stop", 0))
            except (BrokenPipeError, OSError):
                pass
            process.join(timeout=60)
    return _backends_result(backends, setups, times, rounds, steps)


def _receive(connection, backend: str, expected: str):
    kind, payload = connection.recv()
    if kind == "error":
        raise RuntimeError(f"{backend}: {payload}")
    if kind != expected:
        raise RuntimeError(f"{backend}: expected {expected!r}, got {kind!r}")
    return payload


def _backends_result(backends, setups, times, rounds, steps) -> dict:
    first, second = backends
    global_batch = setups[first]["global_batch"]
    result = {"benchmark": "train-backends", "rounds": rounds, "steps_per_round": steps, "global_batch": global_batch}
    per_round = {}
    for backend in backends:
        per_round[backend] = [global_batch / statistics.median(round_times) for round_times in times[backend]]
        result[backend] = {
            **setups[backend],
            "images_per_sec_rounds": [round(value, 2) for value in per_round[backend]],
            "images_per_sec": round(statistics.median(per_round[backend]), 2),
            "median_step_ms": round(statistics.median([t for r in times[backend] for t in r]) * 1000, 2),
        }
    ratios = [b / a for a, b in zip(per_round[first], per_round[second])]
    key = f"ratio_{second}_vs_{first}"
    result[key] = round(result[second]["images_per_sec"] / result[first]["images_per_sec"], 3)
    result[f"{key}_rounds"] = [round(ratio, 3) for ratio in ratios]
    result[f"{key}_median_of_rounds"] = round(statistics.median(ratios), 3)
    return result


# -- the command --------------------------------------------------------------------------------------------------


def run(args) -> int:
    from keras_yolo_mgpu.bench.train import run_train_benchmark

    settings = bench_train.bench_settings(run_train_benchmark, args)
    settings["rounds"] = args.rounds or (3 if args.reference or args.backends else 1)
    if args.backends:
        if args.variants or args.reference or args.breakdown:
            raise ValueError("--backends times our step only: drop --variants, --reference and --breakdown")
        settings.pop("inputs")
        return print_result(compare_backends(args.backends, **settings))
    if not (args.reference or args.variants or args.breakdown):
        raise ValueError("nothing to compare: add --reference, --variants, --breakdown or --backends")
    result = compare_sides(reference=args.reference, variants=args.variants, breakdown=args.breakdown, **settings)
    if "breakdown" in result:
        _print_breakdown(result["breakdown"])
    return print_result(result)


def _print_breakdown(breakdown: dict) -> None:
    names = list(breakdown)
    print(f"{'part (ms, median)':22s}" + "".join(f"{name:>14s}" for name in names))
    for part in (*breakdown[names[0]]["parts_ms"], "keras_fit_overhead", "fit_step"):
        values = [breakdown[n]["parts_ms"].get(part, breakdown[n]["split_ms"].get(part)) for n in names]
        print(f"{part:22s}" + "".join(f"{value:14.1f}" for value in values))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv, tensorflow=True)


if __name__ == "__main__":
    raise SystemExit(main())
