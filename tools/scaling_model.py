#!/usr/bin/env python3
"""A model of N-GPU training throughput from measured parts, with its assumptions stated.

    python tools/scaling_model.py --model yolov3 --markdown

No multi-GPU machine has been available, so this predicts data-parallel
throughput at 2, 4 and 8 GPUs from parts measured elsewhere or here:

- the one-GPU step: its time at batch 32 per mode, measured on one
  H100 (BENCHMARKS.md, "GPU (one H100)"); the step at the per-replica batch
  B/N is modelled as `t(b) = t0 + b * (t(32) - t0) / 32`, with `t0`, the
  part of a step that does not shrink with the batch (kernel launches,
  optimizer update), an assumption (`--fixed-ms`);
- gradient bytes per step: the model's trainable parameters (counted here
  by building it) x 4 (float32 gradients; mixed precision keeps float32
  variables), all-reduced once per step with a ring: each GPU sends and
  receives 2 (N-1)/N of them;
- collective calls per step: 2 per synchronized BatchNormalization layer
  (forward statistics, backward sums: model/batch_norm.py), counted here,
  each a small all-reduce on the critical path; their latency on logical
  devices is measured here (CPU, MirroredStrategy, TensorFlow's ring
  collectives), the NCCL latency on GPUs is an assumption;
- the input pipeline: images/s per host core measured by `bench pipeline`
  (891.1 images/s on the H100's 16-core host: `--pipeline-per-core 55.7`),
  times the host's cores (`--host-cores`).

Assumptions (stated in the output): no overlap of the gradient all-reduce
with the backward pass (TensorFlow's MirroredStrategy all-reduces after the
gradients are computed); NVLink 4 at 350 GB/s and PCIe 4.0 x16 at 22 GB/s of
achievable all-reduce bus bandwidth; NCCL latency 15 us (NVLink) / 30 us
(PCIe) per small all-reduce.

Engines (`--engine`):

- `tensorflow`: several replicas run without XLA (Keras 3.15 cannot compile
  the replicated step: training/precision.py), so N > 1 uses the
  mixed-precision step without XLA; `--assume-xla-replicas` shows what
  compiling each replica's step would give.
- `jax`: one SPMD program compiled by XLA at every N (backend/jax/distribution.py),
  mixed_bfloat16; the one-GPU step is the bare jitted step measured on one
  H200 (docs/gpu.md, 2026-11-26: 28.6 ms at batch 32), a cross-card figure next
  to the H100's. The same all-reduce and BatchNormalization collective
  costs are charged, with no overlap (XLA may overlap them on GPUs: the
  model then errs low).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

# One H100, global batch 32, median step ms (BENCHMARKS.md, "GPU (one H100)", 2026-11-25).
H100_STEP_MS = {
    ("yolov3", "mixed+xla"): 49.0,
    ("yolov3", "mixed"): 120.0,
    ("yolov3", "float32"): 148.0,
    ("yolov3-tiny", "mixed+xla"): 21.0,
    ("yolov3-tiny", "mixed"): 48.0,
    ("yolov3-tiny", "float32"): 48.5,
}
# One H200, global batch 32, the whole train step jax.jit-compiled (Keras 3.15.1 on JAX 0.11.2, 2026-11-26;
# docs/measurements.md).
H200_JAX_STEP_MS = {("yolov3", "bf16+xla"): 28.6, ("yolov3", "float32+xla"): 50.3}
LINKS = {"NVLink": {"gbytes_per_s": 350.0, "latency_us": 15.0}, "PCIe": {"gbytes_per_s": 22.0, "latency_us": 30.0}}
BATCH = 32


def count_model(model_name: str, num_classes: int) -> tuple[int, int]:
    """(trainable parameters, BatchNormalization layers) of the network."""
    from keras_yolo_mgpu.model.architectures import get_architecture
    from keras_yolo_mgpu.model.batch_norm import BatchNormalization
    from keras_yolo_mgpu.model.yolo3 import build_body
    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors

    tiny = get_architecture(model_name).name.endswith("tiny")
    body = build_body(get_anchors(default_anchors_path(tiny)), num_classes, sync_bn=True, model=model_name)
    parameters = sum(int(w.numpy().size) for w in body.trainable_weights)
    bn_layers = sum(isinstance(layer, BatchNormalization) for layer in body.layers)
    return parameters, bn_layers


def measure_collective_latency_us(replicas: int, calls: int = 50, rounds: int = 5) -> float:
    """Median time of one small all-reduce (1,025 floats: a BN layer's statistics) on `replicas` logical CPUs."""
    import tensorflow as tf

    from keras_yolo_mgpu.backend.tensorflow.distribution import mirrored_strategy

    # Collective keys of its own: a second strategy in one process would collide (backend/tensorflow/distribution.py).
    strategy = mirrored_strategy([f"/cpu:{i}" for i in range(replicas)])

    def replica_fn():
        context = tf.distribute.get_replica_context()
        value = tf.ones([1025])
        for _ in range(calls):  # chained: each waits for the previous, like BN layers in a step
            value = context.all_reduce(tf.distribute.ReduceOp.SUM, value) * 0.5
        return value

    step = tf.function(lambda: strategy.run(replica_fn))
    step()  # trace
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) / calls)
    return 1e6 * statistics.median(times)


def step_ms(one_gpu_ms: float, per_replica_batch: float, fixed_ms: float) -> float:
    """Per-replica compute time at `per_replica_batch`, linear in the batch above `fixed_ms` (measured at 32)."""
    return fixed_ms + (one_gpu_ms - fixed_ms) * per_replica_batch / BATCH


def predict(args, parameters: int, bn_layers: int) -> list[dict]:
    """Images/s and efficiency per link and GPU count."""
    rows = []
    gradient_bytes = 4 * parameters
    pipeline_capacity = args.pipeline_per_core * args.host_cores
    if args.engine == "jax":
        if (args.model, "bf16+xla") not in H200_JAX_STEP_MS:
            raise SystemExit(f"no measured JAX step for {args.model}: only {sorted({m for m, _ in H200_JAX_STEP_MS})}")
        step_table, best_mode = H200_JAX_STEP_MS, "bf16+xla"
    else:
        step_table, best_mode = H100_STEP_MS, "mixed+xla"
    one_gpu = BATCH / (step_table[(args.model, best_mode)] / 1000)  # images/s at batch 32
    for link_name, link in LINKS.items():
        for replicas in (1, 2, 4, 8):
            xla = replicas == 1 or args.assume_xla_replicas or args.engine == "jax"
            mode = best_mode if xla else "mixed"
            per_replica = args.batch_per_replica or BATCH / replicas
            compute = step_ms(step_table[(args.model, mode)], per_replica, args.fixed_ms)
            ring = 2 * (replicas - 1) / replicas * gradient_bytes / (link["gbytes_per_s"] * 1e9) * 1000
            collectives = 0.0 if replicas == 1 else 2 * bn_layers * link["latency_us"] / 1000
            step = compute + ring + collectives
            images = min(replicas * per_replica / (step / 1000), pipeline_capacity)
            rows.append({
                "link": link_name, "gpus": replicas, "mode": mode, "compute_ms": round(compute, 2),
                "gradient_all_reduce_ms": round(ring, 2), "bn_collectives_ms": round(collectives, 2),
                "step_ms": round(step, 2), "images_per_sec": round(images, 1),
                "pipeline_bound": images == pipeline_capacity,
                "efficiency": round(images / (replicas * one_gpu), 2),
            })  # fmt: skip
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| link | GPUs | step mode | compute ms | gradient all-reduce ms | BN collectives ms | images/s | "
        "efficiency vs N x 1 GPU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        bound = " (pipeline-bound)" if r["pipeline_bound"] else ""
        lines.append(
            f"| {r['link']} | {r['gpus']} | {r['mode']} | {r['compute_ms']} | {r['gradient_all_reduce_ms']} | "
            f"{r['bn_collectives_ms']} | {r['images_per_sec']}{bound} | {r['efficiency']:.2f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("yolov3", "yolov3-tiny"), default="yolov3")
    parser.add_argument("--num-classes", type=int, default=80)
    parser.add_argument("--fixed-ms", type=float, default=5.0, help="step time that does not shrink with the batch")
    parser.add_argument(
        "--pipeline-per-core",
        type=float,
        default=round(891.1 / 16, 1),
        help="training pipeline images/s per host core (default: bench pipeline's 891.1 on the H100's 16-core host)",
    )
    parser.add_argument("--host-cores", type=int, default=16)
    parser.add_argument(
        "--batch-per-replica", type=int, default=None, help="fixed per-replica batch (default: global batch 32 / N)"
    )
    parser.add_argument("--assume-xla-replicas", action="store_true", help="N > 1 replicas with the XLA step")
    parser.add_argument(
        "--engine",
        choices=("tensorflow", "jax"),
        default="tensorflow",
        help="tensorflow: MirroredStrategy, no XLA beyond one replica (H100 steps); jax: XLA at every N (H200 step)",
    )
    parser.add_argument("--measure-latency", type=int, nargs="*", default=[2, 4], metavar="N")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)

    if args.measure_latency:
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * max(args.measure_latency)
        )
    parameters, bn_layers = count_model(args.model, args.num_classes)
    latencies = {n: round(measure_collective_latency_us(n), 1) for n in args.measure_latency}
    rows = predict(args, parameters, bn_layers)
    summary = {
        "model": args.model, "trainable_parameters": parameters, "gradient_mbytes": round(4 * parameters / 1e6, 1),
        "bn_layers": bn_layers, "collectives_per_step": 2 * bn_layers + 1,
        "logical_cpu_all_reduce_latency_us": latencies, "links": LINKS, "fixed_ms": args.fixed_ms,
        "pipeline_images_per_sec": round(args.pipeline_per_core * args.host_cores, 1), "engine": args.engine,
        "rows": rows,
    }  # fmt: skip
    if args.markdown:
        print(markdown(rows))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
