"""`python -m keras_yolo_mgpu.bench exports`: every export format's size, mAP and speed, side by side.

For one weights file: the Keras model, then a SavedModel, a TFLite file in
float32, float16 and INT8 (calibrated on the training images) and ONNX
(when tf2onnx and onnxruntime are installed), each exported and checked by
`inference.export`. For each row:

* file size (bytes on disk, the SavedModel folder summed);
* mAP@0.5 and mAP@[.5:.95] on the validation annotation file, by
  `evaluation.mean_ap.evaluate_weights` (what `evaluate.py` runs);
* images/s: the detector on the validation images one at a time (batch 1,
  as on a phone; letterbox done beforehand, NMS included), warmed up, in
  `rounds` interleaved rounds over all rows; each row reports its best
  round, so other work on a shared machine slows every row alike.

The last line printed is JSON with the rows.
"""

from __future__ import annotations

import logging
import os
import time

from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.images import read_image
from keras_yolo_mgpu.data.letterbox import letterbox_array
from keras_yolo_mgpu.evaluation.mean_ap import evaluate_weights
from keras_yolo_mgpu.inference.export import export_model
from keras_yolo_mgpu.optional import onnxruntime, tf2onnx
from keras_yolo_mgpu.weights.metadata import settings_for

logger = logging.getLogger(__name__)

# (row name, export format, precision)
VARIANTS = (
    ("savedmodel", "savedmodel", "float32"),
    ("tflite", "tflite", "float32"),
    ("tflite float16", "tflite", "float16"),
    ("tflite int8", "tflite", "int8"),
    ("onnx", "onnx", "float32"),
)


def _have_onnx() -> bool:
    return tf2onnx.available and onnxruntime.available


def _export_rows(weights, settings, images, out_dir, calibration_images):
    rows = [{"name": "keras", "path": weights, "size": os.path.getsize(weights), "check": None}]
    for name, fmt, precision in VARIANTS:
        if fmt == "onnx" and not _have_onnx():
            logger.warning("skipping onnx: pip install tf2onnx onnxruntime")
            continue
        path = os.path.join(out_dir, "model_" + name.replace(" ", "_") + {"savedmodel": ""}.get(fmt, "." + fmt))
        result = export_model(
            weights,
            fmt,
            path,
            settings=settings,
            overwrite=True,
            precision=precision,
            images=images,
            calibration_images=calibration_images,
        )
        check = result["check"]
        rows.append({"name": name, "path": path, "size": result["size"], "check": check["detections_compared"]})
        logger.info(
            "%s: %.2f MB, check compared %d detections", name, result["size"] / 1e6, check["detections_compared"]
        )
    return rows


def _speed(rows, settings, annotations, rounds: int, count: int):
    # Keras when the exports are timed: importing this module starts no backend.
    from keras_yolo_mgpu.inference.export_formats import open_detector

    arrays = [read_image(a.image_path) for a in annotations[:count]]
    prepared = [(letterbox_array(a, settings.input_shape)[None], [a.shape[:2]]) for a in arrays]
    detectors = [open_detector(row["path"], settings=settings, batch_size=1) for row in rows]
    for detector in detectors:  # warm up: tracing and delegate set-up are not timed
        detector.detect_letterboxed(*prepared[0])
    best = [0.0] * len(rows)
    for _ in range(rounds):
        for i, detector in enumerate(detectors):
            start = time.perf_counter()
            for image, shape in prepared:
                detector.detect_letterboxed(image, shape)
            best[i] = max(best[i], len(prepared) / (time.perf_counter() - start))
    for row, value in zip(rows, best):
        row["images_per_s"] = value


def benchmark_exports(
    weights: str,
    images: str,
    annotations: str,
    out_dir: str,
    *,
    rounds: int = 3,
    speed_images: int = 20,
    calibration_images: int = 200,
) -> dict:
    """Exports `weights` in every format and measures each (see the module docstring).

    Args:
        weights: trained weights with metadata (classes, anchors, input size).
        images: training images (folder or annotation file): check and INT8 calibration.
        annotations: validation annotation file: mAP and speed.
        out_dir: folder for the exports (created).

    Returns:
        `{"rows": [{"name", "path", "size", "check", "mAP50", "mAP", "images_per_s"}], ...}`.
    """
    os.makedirs(out_dir, exist_ok=True)
    settings = settings_for(weights)
    rows = _export_rows(weights, settings, images, out_dir, calibration_images)
    for row in rows:
        result = evaluate_weights(row["path"], annotations, settings=settings, progress=False)
        row["mAP50"], row["mAP"] = result["mAP50"], result["mAP"]
        logger.info("%s: mAP@.5 %.3f, mAP@[.5:.95] %.3f", row["name"], row["mAP50"], row["mAP"])
    _speed(rows, settings, read_annotations(annotations), rounds, speed_images)
    keras_row = rows[0]
    for row in rows:
        row["size_vs_keras"] = row["size"] / keras_row["size"]
        row["mAP50_drop"] = keras_row["mAP50"] - row["mAP50"]
    return {"weights": weights, "annotations": annotations, "input_shape": list(settings.input_shape), "rows": rows}


def format_table(result: dict) -> str:
    """A markdown table of `benchmark_exports`'s rows."""
    lines = [
        "| format | file size | mAP@0.5 | mAP@[.5:.95] | images/s (batch 1) |",
        "|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['name']} | {row['size'] / 1e6:.1f} MB ({row['size_vs_keras']:.2f}x) | {row['mAP50']:.3f} | "
            f"{row['mAP']:.3f} | {row['images_per_s']:.1f} |"
        )
    return "\n".join(lines)
