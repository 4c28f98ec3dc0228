"""Export trained weights as a deployable detector: SavedModel, TFLite or ONNX.

`python -m keras_yolo_mgpu.export --weights W --classes C --anchors A --format savedmodel|tflite|onnx`

The exported model contains the whole inference path after the letterbox:
the network, decoding (`YoloDecode`) and per-class NMS (`YoloNMS`).

Inputs: `image` (N, H, W, 3) float32 letterboxed RGB in [0, 1] (see
`detector.letterbox_array`) and `image_shape` (N, 2) float32 original
(height, width). Outputs: `boxes` (N, M, 4) x_min, y_min, x_max, y_max in
original pixels (not clipped), `scores` (N, M), `classes` (N, M) int32 and
`valid_detections` (N,) int32; rows past `valid_detections` are padding.

* savedmodel: any batch size, TensorFlow's batched NMS op; signature
  `serving_default`.
* tflite: batch size 1, only TFLite builtin ops (single-image NMS per class),
  so the stock interpreter runs it without the Flex delegate.
* onnx: any batch size, through tf2onnx (opset 17) and checked with
  onnxruntime; both are optional (`pip install tf2onnx onnxruntime`).

`--check` (on by default) runs the exported model and the Keras model on the
same random images and reports the largest differences; the export fails if
they exceed the tolerances below (on tiny YOLOv3 the measured differences
are about 1e-3 px and 1e-6 in score).
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections.abc import Sequence

import numpy as np

from keras_yolo_mgpu.fileio import atomic_write, replace_directory
from keras_yolo_mgpu.weights.metadata import settings_for, write_sidecar

logger = logging.getLogger(__name__)

FORMATS = ("savedmodel", "tflite", "onnx")
# Largest differences accepted between an export and the Keras model.
BOX_TOLERANCE_PX = 0.05
SCORE_TOLERANCE = 1e-4
ONNX_OPSET = 17
ONNX_MISSING = "ONNX export is not available: pip install tf2onnx onnxruntime"
# Written into every SavedModel folder this tool exports: only such a folder
# (or an empty one) is ever replaced by a new export.
EXPORT_MARKER = "keras_yolo_mgpu_export.json"


class ExportError(RuntimeError):
    """An export that cannot be made or does not match the Keras model."""


def build_export_model(
    weights: str,
    anchors,
    class_names: Sequence[str],
    *,
    input_size: tuple[int, int] = (416, 416),
    score: float = 0.3,
    iou: float = 0.45,
    max_boxes: int = 20,
    max_detections: int = 100,
    nms_method: str = "combined",
    batch_size: int | None = None,
    masks=None,
    kind: str | None = None,
):
    """The inference model (`inference.layers.build_detection_model`) with `weights` loaded.

    `kind` is the network (`model.architectures.MODEL_NAMES`; None: YOLOv3 or
    tiny YOLOv3 by anchor count), which also sets YOLOv4's `scale_x_y`.
    """
    from keras_yolo_mgpu.inference.detector import load_body
    from keras_yolo_mgpu.inference.layers import build_detection_model
    from keras_yolo_mgpu.weights.metadata import make_metadata

    settings = make_metadata(anchors, list(class_names), input_size, masks, kind=kind)
    body = load_body(weights, settings.anchors_array, len(settings.class_names), settings.kind)
    return build_detection_model(
        body,
        settings,
        score=score,
        iou=iou,
        max_boxes=max_boxes,
        max_detections=max_detections,
        nms_method=nms_method,
        batch_size=batch_size,
    )


def _input_signature(model):
    import tensorflow as tf

    image, image_shape = model.inputs
    return [
        tf.TensorSpec(image.shape, tf.float32, name="image"),
        tf.TensorSpec(image_shape.shape, tf.float32, name="image_shape"),
    ]


def export_savedmodel(model, path: str) -> str:
    """Writes a SavedModel directory with a `serving_default` signature."""
    # A failed export leaves an existing folder at `path` as it was.
    return replace_directory(path, lambda folder: model.export(folder, format="tf_saved_model", verbose=False))


def _export_marked_savedmodel(model, path: str) -> str:
    """`export_savedmodel` plus `EXPORT_MARKER` inside, written before the folder moves into place."""

    def write(folder):
        model.export(folder, format="tf_saved_model", verbose=False)
        with open(os.path.join(folder, EXPORT_MARKER), "w", encoding="utf-8") as f:
            f.write('{"written_by": "keras_yolo_mgpu.export", "format": "savedmodel"}\n')

    return replace_directory(path, write)


def _check_output(output: str, fmt: str, overwrite: bool) -> None:
    """Raises FileExistsError when writing `output` would replace something this tool did not write."""
    if not os.path.lexists(output):
        return
    if fmt == "savedmodel":
        if os.path.isdir(output) and not os.path.islink(output):
            entries = os.listdir(output)
            if not entries or EXPORT_MARKER in entries:
                return
        raise FileExistsError(
            f"--output {output} already exists and is not a SavedModel exported by this tool (it has no "
            f"{EXPORT_MARKER}); nothing was written or removed. Choose a new path (the export is a folder), or "
            "move that one away yourself."
        )
    if os.path.isdir(output):
        raise FileExistsError(f"--output {output} is a folder; a {fmt} export is a file: give a file path")
    if not overwrite:
        raise FileExistsError(
            f"--output {output} already exists; nothing was written. Pass --overwrite to replace it, or choose "
            "another path."
        )


def export_tflite(model, path: str) -> str:
    """Writes a `.tflite` file (builtin ops only); `model` must use padded NMS, batch 1."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as folder:
        saved = export_savedmodel(model, os.path.join(folder, "saved_model"))
        converter = tf.lite.TFLiteConverter.from_saved_model(saved)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        try:
            flatbuffer = converter.convert()
        except Exception as error:  # the converter raises many kinds
            raise ExportError(f"TFLite conversion failed: {error}") from None

    def write(temporary):
        with open(temporary, "wb") as f:
            f.write(flatbuffer)

    return atomic_write(path, write)


def _import_onnx_tools():
    try:
        import onnxruntime  # noqa: F401
        import tf2onnx
    except ImportError:
        raise ExportError(ONNX_MISSING) from None
    return tf2onnx


def export_onnx(model, path: str, opset: int = ONNX_OPSET) -> str:
    """Writes an `.onnx` file through tf2onnx."""
    import tensorflow as tf

    tf2onnx = _import_onnx_tools()
    signature = _input_signature(model)

    @tf.function(input_signature=signature)
    def serve(image, image_shape):
        return model([image, image_shape], training=False)

    try:
        atomic_write(
            path,
            lambda temporary: tf2onnx.convert.from_function(
                serve, input_signature=signature, opset=opset, output_path=temporary
            ),
        )
    except Exception as error:  # tf2onnx raises many kinds
        raise ExportError(f"ONNX conversion failed: {error}") from None
    return path


# ----------------------------------------------------------------------
# Running an export (for the check and for users' reference)


def run_savedmodel(path: str, image: np.ndarray, image_shape: np.ndarray) -> dict:
    import tensorflow as tf

    serve = tf.saved_model.load(path).signatures["serving_default"]
    out = serve(image=tf.constant(image, tf.float32), image_shape=tf.constant(image_shape, tf.float32))
    return {k: v.numpy() for k, v in out.items()}


def run_tflite(path: str, image: np.ndarray, image_shape: np.ndarray) -> dict:
    """Runs a batch-1 `.tflite` export on each image of the batch in turn."""
    import tensorflow as tf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice
        interpreter = tf.lite.Interpreter(model_path=path)
    runner = interpreter.get_signature_runner()
    parts = [
        runner(image=image[i : i + 1].astype(np.float32), image_shape=image_shape[i : i + 1].astype(np.float32))
        for i in range(len(image))
    ]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def run_onnx(path: str, image: np.ndarray, image_shape: np.ndarray) -> dict:
    try:
        import onnxruntime
    except ImportError:
        raise ExportError(ONNX_MISSING) from None
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    outs = session.run(None, {"image": image.astype(np.float32), "image_shape": image_shape.astype(np.float32)})
    return dict(zip(names, outs))


RUNNERS = {"savedmodel": run_savedmodel, "tflite": run_tflite, "onnx": run_onnx}


def compare_detections(reference: dict, other: dict) -> dict:
    """Largest differences between two sets of padded detections.

    Returns:
        `{"valid_equal", "classes_equal", "max_box_diff", "max_score_diff"}`
        over the valid rows (the padding is not compared).
    """
    valid_ref = np.asarray(reference["valid_detections"]).reshape(-1)
    valid_other = np.asarray(other["valid_detections"]).reshape(-1)
    result = {
        "valid_equal": bool(np.array_equal(valid_ref, valid_other)),
        "classes_equal": True,
        "max_box_diff": 0.0,
        "max_score_diff": 0.0,
    }
    for i, n in enumerate(valid_ref):
        n = int(min(n, valid_other[i]))
        if not n:
            continue
        result["classes_equal"] &= bool(np.array_equal(reference["classes"][i, :n], other["classes"][i, :n]))
        result["max_box_diff"] = max(
            result["max_box_diff"], float(np.abs(reference["boxes"][i, :n] - other["boxes"][i, :n]).max())
        )
        result["max_score_diff"] = max(
            result["max_score_diff"], float(np.abs(reference["scores"][i, :n] - other["scores"][i, :n]).max())
        )
    return result


def check_export(model, fmt: str, path: str, *, num_images: int = 2, seed: int = 0) -> dict:
    """Compares an export with the Keras model on random images.

    Raises:
        ExportError: counts or classes differ, or differences exceed
            `BOX_TOLERANCE_PX` / `SCORE_TOLERANCE`.
    """
    rng = np.random.default_rng(seed)
    height, width = model.inputs[0].shape[1:3]
    image = rng.random((num_images, height, width, 3), dtype=np.float32)
    image_shape = np.stack(
        [rng.integers(height // 2, height * 3, num_images), rng.integers(width // 2, width * 3, num_images)], axis=1
    ).astype(np.float32)
    if model.inputs[0].shape[0] == 1:
        reference_parts = [model([image[i : i + 1], image_shape[i : i + 1]], training=False) for i in range(num_images)]
        reference = {k: np.concatenate([np.asarray(p[k]) for p in reference_parts]) for k in reference_parts[0]}
    else:
        reference = {k: np.asarray(v) for k, v in model([image, image_shape], training=False).items()}
    other = RUNNERS[fmt](path, image, image_shape)
    result = compare_detections(reference, other)
    result["detections"] = int(np.asarray(reference["valid_detections"]).sum())
    if (
        not result["valid_equal"]
        or not result["classes_equal"]
        or result["max_box_diff"] > BOX_TOLERANCE_PX
        or result["max_score_diff"] > SCORE_TOLERANCE
    ):
        raise ExportError(f"the {fmt} export does not match the Keras model: {result}")
    return result


def default_output(weights: str, fmt: str) -> str:
    stem = os.fspath(weights)
    for suffix in (".weights.h5", ".keras", ".h5"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return {"savedmodel": stem + "_savedmodel", "tflite": stem + ".tflite", "onnx": stem + ".onnx"}[fmt]


def export_model(
    weights: str,
    fmt: str,
    output: str | None = None,
    *,
    classes_path: str | None = None,
    anchors_path: str | None = None,
    input_size: tuple[int, int] | None = None,
    score: float = 0.3,
    iou: float = 0.45,
    max_boxes: int = 20,
    max_detections: int = 100,
    check: bool = True,
    masks=None,
    settings=None,
    overwrite: bool = False,
) -> dict:
    """Exports `weights` in format `fmt`; returns `{"format", "path", "check", "metadata"}`.

    Classes, anchors, masks and input size default to the weights' metadata
    (explicit ones must agree), else COCO's names, YOLOv3's anchors,
    keras-yolo3's masks and 416; `settings` (a `ModelMetadata`) replaces
    them all. They are written beside the export as `<output>.metadata.json`
    (and into the ONNX file's `metadata_props`), so the exported model
    still says which classes its class ids are.

    Nothing the user made is removed or overwritten: a SavedModel replaces
    only an empty folder or a previous export of this tool (it holds
    `EXPORT_MARKER`); a `.tflite`/`.onnx` file replaces an existing file only
    with `overwrite`. Every export is written beside `output` and moved into
    place when complete, so an interrupted export leaves the previous one.

    Raises:
        FileExistsError: `output` exists and may not be replaced (see above).
        ExportError: the format cannot be made here (ONNX tools missing) or
            the export does not match the Keras model.
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}. Received: format={fmt!r}")
    _check_output(output or default_output(weights, fmt), fmt, overwrite)  # before the slow part
    if fmt == "onnx":
        _import_onnx_tools()  # fail before building anything
    if settings is None:
        settings = settings_for(
            weights, classes_path=classes_path, anchors_path=anchors_path, masks=masks, input_shape=input_size
        )
    model = build_export_model(
        weights,
        settings.anchors_array,
        list(settings.class_names),
        input_size=settings.input_shape,
        masks=settings.masks_list,
        kind=settings.kind,
        score=score,
        iou=iou,
        max_boxes=max_boxes,
        max_detections=max_detections,
        # TFLite has no batched NMS builtin: single-image NMS on a batch of 1.
        nms_method="padded" if fmt == "tflite" else "combined",
        batch_size=1 if fmt == "tflite" else None,
    )
    output = output or default_output(weights, fmt)
    _check_output(output, fmt, overwrite)  # again: building took a while
    {"savedmodel": _export_marked_savedmodel, "tflite": export_tflite, "onnx": export_onnx}[fmt](model, output)
    if fmt == "onnx":
        _add_onnx_metadata(output, settings)
    metadata_path = write_sidecar(output, settings)
    logger.info("wrote %s (%s) and %s", output, fmt, metadata_path)
    result = {"format": fmt, "path": output, "check": None, "metadata": metadata_path}
    if check:
        result["check"] = check_export(model, fmt, output)
    return result


def _add_onnx_metadata(path: str, settings) -> None:
    """Stores the metadata JSON in the ONNX model's `metadata_props` (key `keras_yolo_mgpu_metadata`)."""
    import onnx

    from keras_yolo_mgpu.weights.metadata import ATTRIBUTE

    model = onnx.load(path)
    entry = model.metadata_props.add()
    entry.key, entry.value = ATTRIBUTE, settings.to_json()
    atomic_write(path, lambda temporary: onnx.save(model, temporary))
