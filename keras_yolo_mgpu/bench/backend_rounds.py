"""The training step on TensorFlow against JAX, in interleaved rounds on one machine.

Keras picks its backend once per process (`KERAS_BACKEND`), so each backend
gets a process of its own: both build the same network, compile their step
and warm up, then the parent asks them for one round of timed steps at a
time, alternating which goes first, as `bench train` alternates its sides.
Their ratio then comes from one machine state: load that drifts during the
run hits both (`bench train --backends tensorflow,jax`).
"""

from __future__ import annotations

import multiprocessing
import os
import statistics

BACKENDS = ("tensorflow", "jax")


def _serve_rounds(connection, backend: str, options: dict) -> None:
    """The child: builds one backend's side, then times a round of steps per request until told to stop."""
    os.environ["KERAS_BACKEND"] = backend
    # After KERAS_BACKEND: this import starts Keras on the child's backend.
    from keras_yolo_mgpu.bench import train as bench_train

    try:
        result, side = bench_train.prepare_side(**options)
        connection.send(("ready", result))
        while True:
            request, steps = connection.recv()
            if request == "stop":
                break
            connection.send(("round", side.fit(steps)))
    except Exception as error:  # reported to the parent, which raises it with the backend's name
        connection.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        connection.close()


def compare_backends(
    backends=BACKENDS, *, rounds: int = 3, steps: int = 10, warmup_steps: int = 3, on_round=None, **options
) -> dict:
    """Times `rounds` x `steps` steps of the same training step per backend; returns the result record.

    Args:
        backends: Keras backends, in the order of the first round.
        options: `bench.train.prepare_side`'s settings (network, size, batch,
            devices, precision ...), the same for every backend.
        on_round: called with `(round_index, {backend: images/sec})` after each round.

    Returns:
        `{"benchmark": "train-backends", ...}` with each backend's images/sec
        per round and their median, and `ratio_<b>_vs_<a>` (the second
        backend's images/sec over the first's) from the medians and per round.
    """
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown or len(backends) != 2:
        raise ValueError(f"backends must be two of {BACKENDS}. Received: backends={list(backends)}")
    context = multiprocessing.get_context("spawn")
    children, setups = {}, {}
    try:
        for backend in backends:
            parent_end, child_end = context.Pipe()
            process = context.Process(
                target=_serve_rounds, args=(child_end, backend, {**options, "warmup_steps": warmup_steps})
            )
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
                    round_index,
                    {b: setups[b]["global_batch"] / statistics.median(times[b][-1]) for b in backends},
                )
    finally:
        for process, connection in children.values():
            try:
                connection.send(("stop", 0))
            except (BrokenPipeError, OSError):
                pass
            process.join(timeout=60)
    return _result(backends, setups, times, rounds, steps)


def _receive(connection, backend: str, expected: str):
    kind, payload = connection.recv()
    if kind == "error":
        raise RuntimeError(f"{backend}: {payload}")
    if kind != expected:
        raise RuntimeError(f"{backend}: expected {expected!r}, got {kind!r}")
    return payload


def _result(backends, setups, times, rounds, steps) -> dict:
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
