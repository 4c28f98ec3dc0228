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

import contextlib
import logging
import os
import platform
import tempfile
import time

import numpy as np

from keras_yolo_mgpu.data.letterbox import letterbox_array
from keras_yolo_mgpu.data.synthetic import make_synthetic_video
from keras_yolo_mgpu.inference.media import process_video
from keras_yolo_mgpu.inference.video import VideoReader
from keras_yolo_mgpu.resources import get_anchors, get_classes, resolve_resource

logger = logging.getLogger(__name__)


def _random_body(anchors, num_classes: int, seed: int = 0, output_gain: float = 1.0, model: str | None = None):
    """A random network; `output_gain` scales the output convolutions' kernels.

    Untrained outputs sit near 0 (every score about 0.25), so nothing would
    be drawn; a gain of 4.5 gives about 14 boxes per frame of the
    generated video at score 0.3 with 80 classes, so drawing is measured.
    """
    # Keras, and the modules that import it, when the benchmark runs: importing this module starts no backend.
    from keras_yolo_mgpu.keras_compat import set_random_seed
    from keras_yolo_mgpu.model.yolo3 import OUTPUT_PREFIX, build_body

    set_random_seed(seed)
    body = build_body(anchors, num_classes, model=model)
    for layer in body.layers:
        if layer.name.startswith(OUTPUT_PREFIX):
            kernel, bias = layer.get_weights()
            layer.set_weights([kernel * output_gain, bias])
    return body


def time_forward(forward, batches: list[np.ndarray]) -> float:
    """Frames per second of one pass of `forward` over `batches`."""
    start = time.perf_counter()
    frames = 0
    for batch in batches:
        forward(batch)  # returns numpy arrays: the result is there
        frames += len(batch)
    return frames / (time.perf_counter() - start)


def run_infer_benchmark(
    *,
    frames: int = 96,
    frame_size: tuple[int, int] = (480, 640),
    input_size: tuple[int, int] = (416, 416),
    batch_size: int = 4,
    full: bool = False,
    model: str | None = None,
    num_classes: int = 80,
    output_gain: float = 4.5,
    weights: str | None = None,
    anchors: str | None = None,
    classes: str | None = None,
    score: float = 0.3,
    repeats: int = 5,
    output_dir: str | None = None,
) -> dict:
    """Measures both paths on one generated video; returns the result record.

    Args:
        frames, frame_size: the generated video (frame size as (height, width)).
        input_size: network input (height, width).
        batch_size: frames per forward pass, both measurements.
        full: YOLOv3 (Darknet-53) instead of tiny YOLOv3.
        model: the network (`model.architectures.MODEL_NAMES`), instead of `full`.
        num_classes, output_gain: the random model (see `_random_body`).
        weights, anchors, classes: trained weights instead of a random model.
        score: detection score threshold.
        repeats: interleaved rounds of each measurement; the best counts.
        output_dir: keep the video files here (default: a temporary folder).
    """
    # Keras, and the modules that import it, when the benchmark runs: importing this module starts no backend.
    from keras_yolo_mgpu.inference.detector import YOLO, load_body

    kind = model or ("yolov3" if full else "yolov3-tiny")
    anchors_array = get_anchors(resolve_resource(anchors, "anchors", model=kind))
    if weights:
        class_names = get_classes(classes) if classes else [f"class_{i}" for i in range(num_classes)]
        body = load_body(weights, anchors_array, len(class_names), kind)
    else:
        class_names = [f"class_{i}" for i in range(num_classes)]
        body = _random_body(anchors_array, len(class_names), output_gain=output_gain, model=kind)
    yolo = YOLO.from_body(
        body,
        anchors_array,
        class_names,
        score=score,
        model_image_size=input_size,
        batch_size=batch_size,
        kind=kind,
    )
    if output_dir:
        os.makedirs(output_dir, exist_ok=True)
    # The videos stay in output_dir, else in a folder removed afterwards.
    folder = contextlib.nullcontext(output_dir) if output_dir else tempfile.TemporaryDirectory(prefix="bench_infer_")
    with folder as video_dir:
        return _measure(yolo, body, video_dir, num_frames=frames, frame_size=frame_size, full=full, repeats=repeats)


# Over 60 lines: both sides of one measurement on the same generated video, kept together so
# they are timed the same way.
def _measure(yolo, body, folder: str, *, num_frames, frame_size, full, repeats) -> dict:
    """Both measurements on a generated video in `folder`; `yolo` sets the input size, batch and classes."""
    # Keras, and the modules that import it, when the benchmark runs: importing this module starts no backend.
    from keras_yolo_mgpu.backend import NAME
    from keras_yolo_mgpu.backend import inference as backend_inference

    input_size, batch_size, class_names = yolo.model_image_size, yolo.batch_size, yolo.class_names
    video = make_synthetic_video(
        os.path.join(folder, "input.mp4"), num_frames=num_frames, frame_size=frame_size, fps=25.0
    )
    with VideoReader(video) as reader:
        frames = np.stack([letterbox_array(rgb, input_size) for _, rgb, _ in reader])
    model_name = "YOLOv3" if full else "tiny YOLOv3"
    logger.info(
        f"{model_name} {input_size[0]}x{input_size[1]}, {len(class_names)} classes; {len(frames)} frames "
        f"{frame_size[0]}x{frame_size[1]}; batch {batch_size}; "
        f"{os.cpu_count()} CPUs, GPUs: {len(backend_inference.local_devices()[0])}; {NAME}",
    )

    forward = backend_inference.compile_forward(body, input_size)
    batches = [frames[i : i + batch_size].astype(np.float32) / 255.0 for i in range(0, len(frames), batch_size)]
    output = os.path.join(folder, "output.mp4")
    # Warm-up: tracing and first-shape setup are not timed.
    time_forward(forward, batches[:2])
    process_video(yolo, video, output, batch_size=batch_size, max_frames=2 * batch_size, progress=False)

    # Interleaved rounds, best of each: a machine shared with other work
    # slows both measurements alike instead of whichever ran second.
    # CPU time (all threads of this process) per frame is reported too: on a
    # machine shared with other work, wall-clock rates favour whichever
    # side runs more threads, CPU time does not.
    bare, best = 0.0, None
    cpu_forward, cpu_full = [], []
    for round_index in range(repeats):
        cpu = time.process_time()
        fps = time_forward(forward, batches)
        cpu_forward.append((time.process_time() - cpu) / len(frames))
        cpu = time.process_time()
        stats = process_video(yolo, video, output, batch_size=batch_size, progress=False)
        cpu_full.append((time.process_time() - cpu) / stats["frames"])
        logger.info(
            f"round {round_index + 1}: bare forward {fps:.2f} frames/s ({1000 * cpu_forward[-1]:.1f} CPU-ms/frame), "
            f"full path {stats['fps']:.2f} frames/s ({1000 * cpu_full[-1]:.1f} CPU-ms/frame)",
        )
        bare = max(bare, fps)
        if best is None or stats["fps"] > best["fps"]:
            best = stats
    logger.info(f"bare forward pass: {bare:.2f} frames/s")
    logger.info(
        f"full video path (decode, letterbox, model, NMS, draw, encode): {best['fps']:.2f} frames/s, "
        f"{best['detections']} boxes in {best['frames']} frames",
    )
    ratio = best["fps"] / bare if bare else 0.0
    logger.info(f"ratio: {ratio:.3f}")
    result = {
        "benchmark": "infer",
        "fps": round(best["fps"], 3),
        "forward_fps": round(bare, 3),
        "ratio": round(ratio, 4),
        "model": model_name,
        "input_size": list(input_size),
        "num_classes": len(class_names),
        "frames": best["frames"],
        "frame_size": list(frame_size),
        "batch_size": batch_size,
        "boxes_per_frame": round(best["detections"] / max(best["frames"], 1), 2),
        "forward_cpu_ms_per_frame": round(1000 * min(cpu_forward), 2),
        "full_cpu_ms_per_frame": round(1000 * min(cpu_full), 2),
        "cpu_ratio": round(min(cpu_forward) / min(cpu_full), 4),
        "cpus": os.cpu_count(),
        "gpus": len(backend_inference.local_devices()[0]),
        "backend": NAME,
        "machine": platform.machine(),
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    return result
