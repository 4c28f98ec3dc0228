"""`python -m keras_yolo_mgpu.bench infer`: video detection fps against the bare forward pass.

Two measurements on the same frames of one generated video:

* `forward_fps`: the network alone (`body` on batches of letterboxed frames
  already in memory, as float32 in [0, 1]): the ceiling for any pipeline;
* `fps`: the full `yolo_video.py` path, `process_video`: decode, BGR->RGB,
  letterbox, model, decoding, NMS, drawing, BGR conversion and encoding to
  an mp4 file.

Both are warmed up first (tracing is not timed). The two are measured in
alternating rounds and each reports its best round, so other work on a
shared machine slows both alike rather than whichever ran second. The last line
printed is JSON with `fps`, `forward_fps` and `ratio` = fps / forward_fps.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

from keras_yolo_mgpu.cli.args import input_size, positive_int
from keras_yolo_mgpu.model.architectures import MODEL_NAMES


def _frame_size(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected HEIGHTxWIDTH like 480x640, got {text!r}")
    return int(parts[0]), int(parts[1])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m keras_yolo_mgpu.bench infer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=positive_int, default=96, help="frames in the generated video (default: 96)")
    parser.add_argument(
        "--frame-size", type=_frame_size, default=(480, 640), metavar="HxW", help="video frame size (default: 480x640)"
    )
    parser.add_argument(
        "--input-size", type=input_size, default=(416, 416), metavar="HxW", help="network input (default: 416)"
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=4, help="frames per forward pass, both measurements (default: 4)"
    )
    parser.add_argument("--full", action="store_true", help="YOLOv3 (Darknet-53) instead of tiny YOLOv3")
    parser.add_argument(
        "--model", choices=MODEL_NAMES, default=None, help="network (default: yolov3-tiny, yolov3 with --full)"
    )
    parser.add_argument(
        "--num-classes", type=positive_int, default=80, help="classes of the random model (default: 80, COCO)"
    )
    parser.add_argument(
        "--output-gain",
        type=float,
        default=4.5,
        help="random model: scale of the output kernels, sets the boxes per frame (default: 4.5)",
    )
    parser.add_argument(
        "--weights", default=None, help="trained weights instead of a random model (with --anchors and --classes)"
    )
    parser.add_argument("--anchors", default=None, help="anchors file for --weights")
    parser.add_argument("--classes", default=None, help="classes file for --weights")
    parser.add_argument("--score", type=float, default=0.3, help="detection score threshold (default: 0.3)")
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        help="interleaved runs of each measurement; the best counts (default: 5)",
    )
    parser.add_argument("--output-dir", default=None, help="keep the video files here (default: a temporary folder)")
    return parser


def _random_body(anchors, num_classes: int, seed: int = 0, output_gain: float = 1.0, model: str | None = None):
    """A random network; `output_gain` scales the output convolutions' kernels.

    Untrained outputs sit near 0 (every score about 0.25), so nothing would
    be drawn; a gain of 4.5 gives about 14 boxes per frame of the
    generated video at score 0.3 with 80 classes, so drawing is measured.
    """
    import keras

    from keras_yolo_mgpu.model.yolo3 import OUTPUT_PREFIX, build_body

    keras.utils.set_random_seed(seed)
    body = build_body(anchors, num_classes, model=model)
    for layer in body.layers:
        if layer.name.startswith(OUTPUT_PREFIX):
            kernel, bias = layer.get_weights()
            layer.set_weights([kernel * output_gain, bias])
    return body


def make_forward(body, input_shape):
    """A compiled bare forward pass: float32 [0, 1] frames -> raw outputs."""
    import tensorflow as tf

    height, width = input_shape
    return tf.function(
        lambda x: body(x, training=False), input_signature=[tf.TensorSpec([None, height, width, 3], tf.float32)]
    )


def time_forward(forward, batches: list[np.ndarray]) -> float:
    """Frames per second of one pass of `forward` over `batches`."""
    start = time.perf_counter()
    frames = 0
    for batch in batches:
        for out in forward(batch):
            out.numpy()  # wait for the result
        frames += len(batch)
    return frames / (time.perf_counter() - start)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from keras_yolo_mgpu.inference.detector import YOLO, load_body
    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors, get_classes

    kind = args.model or ("yolov3" if args.full else "yolov3-tiny")
    anchors = get_anchors(args.anchors or default_anchors_path(model=kind))
    if args.weights:
        class_names = get_classes(args.classes) if args.classes else [f"class_{i}" for i in range(args.num_classes)]
        body = load_body(args.weights, anchors, len(class_names), kind)
    else:
        class_names = [f"class_{i}" for i in range(args.num_classes)]
        body = _random_body(anchors, len(class_names), output_gain=args.output_gain, model=kind)
    yolo = YOLO.from_body(
        body,
        anchors,
        class_names,
        score=args.score,
        model_image_size=args.input_size,
        batch_size=args.batch_size,
        kind=kind,
    )

    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        return _run(args, yolo, body, class_names, args.output_dir)
    with tempfile.TemporaryDirectory(prefix="bench_infer_") as folder:
        return _run(args, yolo, body, class_names, folder)


def _run(args, yolo, body, class_names, folder: str) -> int:
    import tensorflow as tf

    from keras_yolo_mgpu.data.synthetic import make_synthetic_video
    from keras_yolo_mgpu.inference.detector import letterbox_array
    from keras_yolo_mgpu.inference.media import process_video
    from keras_yolo_mgpu.inference.video import VideoReader

    video = make_synthetic_video(
        os.path.join(folder, "input.mp4"), num_frames=args.frames, frame_size=args.frame_size, fps=25.0
    )
    with VideoReader(video) as reader:
        frames = np.stack([letterbox_array(rgb, args.input_size) for _, rgb, _ in reader])
    model_name = "YOLOv3" if args.full else "tiny YOLOv3"
    print(
        f"{model_name} {args.input_size[0]}x{args.input_size[1]}, {len(class_names)} classes; {len(frames)} frames "
        f"{args.frame_size[0]}x{args.frame_size[1]}; batch {args.batch_size}; "
        f"{os.cpu_count()} CPUs, GPUs: {len(tf.config.list_physical_devices('GPU'))}",
        flush=True,
    )

    forward = make_forward(body, args.input_size)
    batches = [
        frames[i : i + args.batch_size].astype(np.float32) / 255.0 for i in range(0, len(frames), args.batch_size)
    ]
    output = os.path.join(folder, "output.mp4")
    # Warm-up: tracing and first-shape setup are not timed.
    time_forward(forward, batches[:2])
    process_video(yolo, video, output, batch_size=args.batch_size, max_frames=2 * args.batch_size, progress=False)

    # Interleaved rounds, best of each: a machine shared with other work
    # slows both measurements alike instead of whichever ran second.
    # CPU time (all threads of this process) per frame is reported too: on a
    # machine shared with other work, wall-clock rates favour whichever
    # side runs more threads, CPU time does not.
    bare, best = 0.0, None
    cpu_forward, cpu_full = [], []
    for round_index in range(args.repeats):
        cpu = time.process_time()
        fps = time_forward(forward, batches)
        cpu_forward.append((time.process_time() - cpu) / len(frames))
        cpu = time.process_time()
        stats = process_video(yolo, video, output, batch_size=args.batch_size, progress=False)
        cpu_full.append((time.process_time() - cpu) / stats["frames"])
        print(
            f"round {round_index + 1}: bare forward {fps:.2f} frames/s ({1000 * cpu_forward[-1]:.1f} CPU-ms/frame), "
            f"full path {stats['fps']:.2f} frames/s ({1000 * cpu_full[-1]:.1f} CPU-ms/frame)",
            flush=True,
        )
        bare = max(bare, fps)
        if best is None or stats["fps"] > best["fps"]:
            best = stats
    print(f"bare forward pass: {bare:.2f} frames/s", flush=True)
    print(
        f"full video path (decode, letterbox, model, NMS, draw, encode): {best['fps']:.2f} frames/s, "
        f"{best['detections']} boxes in {best['frames']} frames",
        flush=True,
    )
    ratio = best["fps"] / bare if bare else 0.0
    print(f"ratio: {ratio:.3f}", flush=True)
    result = {
        "benchmark": "infer",
        "fps": round(best["fps"], 3),
        "forward_fps": round(bare, 3),
        "ratio": round(ratio, 4),
        "model": model_name,
        "input_size": list(args.input_size),
        "num_classes": len(class_names),
        "frames": best["frames"],
        "frame_size": list(args.frame_size),
        "batch_size": args.batch_size,
        "boxes_per_frame": round(best["detections"] / max(best["frames"], 1), 2),
        "forward_cpu_ms_per_frame": round(1000 * min(cpu_forward), 2),
        "full_cpu_ms_per_frame": round(1000 * min(cpu_full), 2),
        "cpu_ratio": round(min(cpu_forward) / min(cpu_full), 4),
        "cpus": os.cpu_count(),
        "gpus": len(tf.config.list_physical_devices("GPU")),
        "machine": platform.machine(),
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
