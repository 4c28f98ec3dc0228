"""`python -m keras_yolo_mgpu.bench infer`: video detection fps against the bare forward pass.

Two measurements on the same frames of one generated video:

* `forward_fps`: the network alone (`body` on batches of letterboxed frames
  already in memory, as float32 in [0, 1]): the ceiling for any pipeline;
* `fps`: the full `yolo_video.py` path, `process_video`: decode, BGR->RGB,
  letterbox, model, decoding, NMS, drawing, BGR conversion and encoding to
  an mp4 file.

With `exported` files (`python -m keras_yolo_mgpu.export` of the same
weights: ONNX in onnxruntime, TFLite in its interpreter, a SavedModel), each
is measured the same two ways in the same rounds: its runtime's call
(network, decoding and NMS) on the same batches, and the full path with the
file as `yolo_video.py` runs it.

Both are warmed up first (tracing is not timed). The two are measured in
alternating rounds and each reports its best round, so other work on a
shared machine slows both alike rather than whichever ran second. The last line
printed is JSON with `fps`, `forward_fps` and `ratio` = fps / forward_fps, and
for each export its own two figures and `keras_ratio` = the Keras path's fps /
the export's.
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
from keras_yolo_mgpu.resources import get_anchors, resolve_resource
from keras_yolo_mgpu.weights.metadata import settings_for

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
    exported: tuple[str, ...] = (),
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
        exported: exported models of the same network (`.onnx`, `.tflite`, a
            SavedModel folder, each with its metadata sidecar), timed beside it.
    """
    # Keras, and the modules that import it, when the benchmark runs: importing this module starts no backend.
    from keras_yolo_mgpu.backend import inference as backend_inference
    from keras_yolo_mgpu.inference.detector import YOLO, load_body
    from keras_yolo_mgpu.inference.export_formats import ExportedDetector, export_format, open_runner
    from keras_yolo_mgpu.model.batch_norm import fold_batch_norm

    if exported and not weights:
        raise ValueError("exported models are timed against the weights they were exported from: give --weights")
    for path in exported:
        if export_format(path) is None:
            raise ValueError(f"{path} is not an exported model (a SavedModel folder, .tflite or .onnx file)")

    masks = None
    if weights:  # the network, classes, anchors and masks the file records; a flag given must agree with it
        if not os.path.exists(weights):
            raise FileNotFoundError(f"weights file not found: {weights}")
        chosen = model or ("yolov3" if full else None)
        settings = settings_for(weights, classes_path=classes, anchors_path=anchors, model=chosen)
        kind, anchors_array, masks = settings.kind, np.asarray(settings.anchors, np.float32), settings.masks_list
        class_names = list(settings.class_names)
        body = load_body(weights, anchors_array, len(class_names), kind)
    else:
        kind = model or ("yolov3" if full else "yolov3-tiny")
        anchors_array = get_anchors(resolve_resource(anchors, "anchors", model=kind))
        class_names = [f"class_{i}" for i in range(num_classes)]
        body = _random_body(anchors_array, len(class_names), output_gain=output_gain, model=kind)
    body = fold_batch_norm(body)  # as `YOLO` runs a weights file
    yolo = YOLO.from_body(
        body,
        anchors_array,
        class_names,
        score=score,
        model_image_size=input_size,
        batch_size=batch_size,
        masks=masks,
        kind=kind,
    )
    # Each export as the Keras side is measured: its runtime's call on the batches, and the full video path.
    sides = [("keras", yolo, backend_inference.compile_forward(body, input_size))]
    for path in exported:
        detector = ExportedDetector(path, settings=yolo.metadata, score=score, batch_size=batch_size)
        sides.append((path, detector, _export_forward(open_runner(path), frame_size)))
    if output_dir:
        os.makedirs(output_dir, exist_ok=True)
    # The videos stay in output_dir, else in a folder removed afterwards.
    folder = contextlib.nullcontext(output_dir) if output_dir else tempfile.TemporaryDirectory(prefix="bench_infer_")
    with folder as video_dir:
        return _measure(sides, video_dir, num_frames=frames, frame_size=frame_size, full=full, repeats=repeats)


def _export_forward(runner, frame_size: tuple[int, int]):
    """An export's runtime call on a batch of letterboxed frames: network, decoding and its own NMS."""

    def forward(batch: np.ndarray):
        return runner(batch, np.tile(np.asarray(frame_size, np.float32), (len(batch), 1)))

    return forward


def _fresh(path: str) -> str:
    """`path`, its previous round's video deleted: the benchmark's own temporary file, replaced without a log line."""
    if os.path.exists(path):
        os.remove(path)
    return path


def _round(name: str, yolo, forward, batches, video: str, output: str, figures: dict) -> str:
    """One round of one side: the bare call over `batches`, then the full path; keeps each one's best."""
    frames = sum(len(batch) for batch in batches)
    cpu = time.process_time()
    fps = time_forward(forward, batches)
    forward_cpu = (time.process_time() - cpu) / frames
    cpu = time.process_time()
    stats = process_video(yolo, video, _fresh(output), batch_size=len(batches[0]), progress=False)
    full_cpu = (time.process_time() - cpu) / stats["frames"]
    best = figures.setdefault(name, {"forward_fps": 0.0, "full": None, "forward_cpu": [], "full_cpu": []})
    best["forward_fps"] = max(best["forward_fps"], fps)
    if best["full"] is None or stats["fps"] > best["full"]["fps"]:
        best["full"] = stats
    best["forward_cpu"].append(forward_cpu)
    best["full_cpu"].append(full_cpu)
    return (
        f"{name}: bare {fps:.2f} frames/s ({1000 * forward_cpu:.1f} CPU-ms/frame), "
        f"full path {stats['fps']:.2f} frames/s ({1000 * full_cpu:.1f} CPU-ms/frame)"
    )


def _measure(sides, folder: str, *, num_frames, frame_size, full, repeats) -> dict:
    """Every side's two measurements on a generated video in `folder`, in interleaved rounds.

    `sides`: `(name, detector, forward)` tuples, the Keras model's first;
    its detector sets the input size, batch and classes.
    """
    # Keras, and the modules that import it, when the benchmark runs: importing this module starts no backend.
    from keras_yolo_mgpu.backend import NAME
    from keras_yolo_mgpu.backend import inference as backend_inference

    yolo = sides[0][1]
    input_size, batch_size, class_names = yolo.model_image_size, yolo.batch_size, yolo.class_names
    video = make_synthetic_video(
        os.path.join(folder, "input.mp4"), num_frames=num_frames, frame_size=frame_size, fps=25.0
    )
    with VideoReader(video) as reader:
        frames = np.stack([letterbox_array(rgb, input_size) for _, rgb, _ in reader])
    model_name = "YOLOv3" if full else "tiny YOLOv3"
    gpus = len(backend_inference.local_devices()[0])
    logger.info(
        f"{model_name} {input_size[0]}x{input_size[1]}, {len(class_names)} classes; {len(frames)} frames "
        f"{frame_size[0]}x{frame_size[1]}; batch {batch_size}; {os.cpu_count()} CPUs, GPUs: {gpus}; {NAME}",
    )
    batches = [frames[i : i + batch_size].astype(np.float32) / 255.0 for i in range(0, len(frames), batch_size)]
    output = os.path.join(folder, "output.mp4")
    for _, detector, forward in sides:  # warm-up: tracing and first-shape setup are not timed
        time_forward(forward, batches[:2])
        process_video(detector, video, _fresh(output), batch_size=batch_size, max_frames=2 * batch_size, progress=False)

    # Interleaved rounds, best of each: a machine shared with other work slows every side alike instead of
    # whichever ran last. CPU time (all threads of this process) per frame is reported too: on a shared
    # machine, wall-clock rates favour whichever side runs more threads, CPU time does not.
    figures: dict[str, dict] = {}
    for round_index in range(repeats):
        for name, detector, forward in sides:
            logger.info(f"round {round_index + 1}, " + _round(name, detector, forward, batches, video, output, figures))
    keras = figures["keras"]
    best, bare = keras["full"], keras["forward_fps"]
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
        "boxes_per_frame": _boxes_per_frame(best),
        "forward_cpu_ms_per_frame": round(1000 * min(keras["forward_cpu"]), 2),
        "full_cpu_ms_per_frame": round(1000 * min(keras["full_cpu"]), 2),
        "cpu_ratio": round(min(keras["forward_cpu"]) / min(keras["full_cpu"]), 4),
        "exported": [_export_figures(detector, figures[name], best) for name, detector, _ in sides[1:]],
        "cpus": os.cpu_count(),
        "gpus": gpus,
        "backend": NAME,
        "machine": platform.machine(),
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    return result


def _boxes_per_frame(stats: dict) -> float:
    return round(stats["detections"] / max(stats["frames"], 1), 2)


def _export_figures(detector, figures: dict, keras_best: dict) -> dict:
    """An export's row of the result; `keras_ratio` is the Keras full path's frames/s over the export's."""
    best, path = figures["full"], detector.model_path
    row = {
        "path": path,
        "format": detector.format,
        "fps": round(best["fps"], 3),
        "forward_fps": round(figures["forward_fps"], 3),
        "boxes_per_frame": _boxes_per_frame(best),
        "forward_cpu_ms_per_frame": round(1000 * min(figures["forward_cpu"]), 2),
        "full_cpu_ms_per_frame": round(1000 * min(figures["full_cpu"]), 2),
        "keras_ratio": round(keras_best["fps"] / best["fps"], 4) if best["fps"] else 0.0,
    }
    logger.info(
        f"{path}: full path {row['fps']:.2f} frames/s, its runtime's call {row['forward_fps']:.2f}; "
        f"the Keras path runs at {row['keras_ratio']:.3f}x it"
    )
    return row
