"""Export trained weights as a deployable detector: SavedModel, TFLite or ONNX.

`python -m keras_yolo_mgpu.export --weights W --classes C --anchors A --format savedmodel|tflite|onnx`

The exported model contains the whole inference path after the letterbox:
the network, decoding (`YoloDecode`) and per-class NMS (`YoloNMS`); its inputs
and outputs are `layers.build_inference_model`'s, with `decoded_boxes` and
`decoded_scores` (all boxes before NMS, for a host's own NMS) added.

* savedmodel: any batch size, TensorFlow's batched NMS op; signature
  `serving_default`.
* tflite: batch size 1, only TFLite builtin ops (single-image NMS per class),
  so the stock interpreter runs it without the Flex delegate.
* onnx: any batch size, through tf2onnx (opset 17) and checked with
  onnxruntime; both are optional (`pip install tf2onnx onnxruntime`).

`--int8` / `--half` quantise a TFLite export (`quantize`); the check against the
Keras model is on by default (`export_check`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Sequence

from keras_yolo_mgpu import outputs
from keras_yolo_mgpu.fileio import atomic_write, replace_directory
from keras_yolo_mgpu.inference import export_check
from keras_yolo_mgpu.inference.export_check import image_paths, sample_paths
from keras_yolo_mgpu.inference.quantize import (
    DEFAULT_CALIBRATION_IMAGES,
    PRECISIONS,
    calibration_batches,
    convert_quantized,
)
from keras_yolo_mgpu.optional import onnx, onnxruntime, tf2onnx
from keras_yolo_mgpu.optional import tensorflow as tf
from keras_yolo_mgpu.weights.metadata import ATTRIBUTE, make_metadata, settings_for, sidecar_path, write_sidecar

logger = logging.getLogger(__name__)

FORMATS = ("savedmodel", "tflite", "onnx")
ONNX_OPSET = 17
ONNX_MISSING = "ONNX export is not available: pip install tf2onnx onnxruntime"
# tf2onnx runs each of its graph optimizers on a deep copy of the graph, to go back to the graph before it if the
# optimizer fails; with every copy of the weights, the conversion's peak memory grows (BENCHMARKS.md, "ONNX export's
# memory"). Set to FALSE, tf2onnx optimizes the graph itself, and an optimizer that fails fails the export. A value the
# user set is kept.
CATCH_ERRORS = "TF2ONNX_CATCH_ERRORS"
# Written into every SavedModel folder this tool exports: only such a folder
# (or an empty one) is ever replaced by a new export.
EXPORT_MARKER = "keras_yolo_mgpu_export.json"


class ExportError(RuntimeError):
    """An export that cannot be made or does not match the Keras model."""


def keras_backend_in_use() -> str | None:
    """The backend this process's Keras runs on, None before Keras is imported (which fixes it)."""
    if "keras" not in sys.modules:
        return None
    # Keras once it is imported: importing this module (the command's flags) starts no backend.
    import keras

    return keras.backend.backend()


def use_keras_on_tensorflow() -> None:
    """Makes this process's Keras run on TensorFlow, whose formats every export is written through.

    Before Keras is imported, `KERAS_BACKEND` is set to tensorflow (a weights file of a JAX run loads as it
    is); once Keras runs on another backend, ExportError says to export from another process.
    """
    backend = keras_backend_in_use()
    if backend is None:
        if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
            logger.info("export runs Keras on TensorFlow, which writes SavedModel, TFLite and ONNX (not on %s)",
                        os.environ["KERAS_BACKEND"])  # fmt: skip
        os.environ["KERAS_BACKEND"] = "tensorflow"
        return
    if backend != "tensorflow":
        raise ExportError(
            f"exports are written through TensorFlow, and Keras runs on {backend} in this process: "
            "export from a process with KERAS_BACKEND=tensorflow (the weights file loads there as it is), or call "
            "keras_yolo_mgpu.export(...), which does"
        )


def build_export_model(
    weights: str,
    anchors,
    class_names: Sequence[str],
    *,
    input_size: tuple[int, int] = (416, 416),
    masks=None,
    kind: str | None = None,
    **options,
):
    """The inference model (`inference.layers.build_detection_model`) with `weights` loaded, decoded outputs too.

    `kind` is the network (`model.architectures.MODEL_NAMES`; None: YOLOv3 or
    tiny YOLOv3 by anchor count), which also sets YOLOv4's `scale_x_y`.
    `options`: `build_detection_model`'s `score`, `iou`, `max_boxes`,
    `max_detections`, `nms_method` and `batch_size`.
    """
    # Keras's detector when a model is built: importing this module (the command's flags) starts no backend.
    from keras_yolo_mgpu.inference.detector import load_body
    from keras_yolo_mgpu.inference.layers import build_detection_model

    settings = make_metadata(anchors, list(class_names), input_size, masks, kind=kind)
    body = load_body(weights, settings.anchors_array, len(settings.class_names), settings.kind)
    return build_detection_model(body, settings, decoded_outputs=True, **options)


def _input_signature(model):
    image, image_shape = model.inputs
    return [
        tf.TensorSpec(image.shape, tf.float32, name="image"),
        tf.TensorSpec(image_shape.shape, tf.float32, name="image_shape"),
    ]


def export_savedmodel(model, path: str, fixed_batch: bool = False, mark: bool = False) -> str:
    """Writes a SavedModel directory with a `serving_default` signature.

    `fixed_batch`: the signature keeps the model's own batch size instead of
    any batch. The TFLite export needs it: traced with a batch of None,
    padded NMS becomes a `tf.map_fn`, a TFLite WHILE whose body is a second
    subgraph, and INT8 quantisation then quantises that body's box gathers
    (the denylist of float tensors covers the main graph only), which
    returned all-zero boxes for a trained network.

    `mark`: writes `EXPORT_MARKER` inside, before the folder moves into place.
    """
    signature = [_input_signature(model)] if fixed_batch else None

    def write(folder):
        model.export(folder, format="tf_saved_model", verbose=False, input_signature=signature)
        if mark:
            with open(os.path.join(folder, EXPORT_MARKER), "w", encoding="utf-8") as f:
                f.write('{"written_by": "keras_yolo_mgpu.export", "format": "savedmodel"}\n')

    # A failed export leaves an existing folder at `path` as it was.
    return replace_directory(path, write)


def _check_output(output: str, fmt: str, overwrite: bool, weights: str | None = None, say: bool = True) -> None:
    """Raises FileExistsError when writing `output` would replace something this tool did not write.

    A `.tflite`/`.onnx` file and the `.metadata.json` beside any export
    follow the project's rule (`outputs`): refused when it is `weights`,
    replaced when this project wrote it and it is unchanged, else only with
    `overwrite`. `say`: log a replacement (off for the check made again
    after building).
    """
    files = [sidecar_path(output)] if fmt == "savedmodel" else [output, sidecar_path(output)]
    for path in files:
        if say:
            outputs.check_output(path, inputs=[weights], overwrite=overwrite)
        elif os.path.lexists(path) and not overwrite and not outputs.written_here(path):
            raise outputs.OutputExistsError(f"--output {path} appeared while the model was built; nothing was written")
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


def export_tflite(model, path: str, precision: str = "float32", calibration=None) -> str:
    """Writes a `.tflite` file (builtin ops only); `model` must use padded NMS, batch 1.

    `precision` "float16" or "int8" quantises (`quantize.convert_quantized`);
    "int8" needs `calibration` (`quantize.calibration_batches`).
    """
    with tempfile.TemporaryDirectory() as folder:
        saved = export_savedmodel(model, os.path.join(folder, "saved_model"), fixed_batch=True)
        try:
            flatbuffer = convert_quantized(saved, precision, calibration, network=_network_name(model))
        except ValueError:  # our own argument errors, not the converter's
            raise
        except Exception as error:  # the converter raises many kinds
            raise ExportError(f"TFLite conversion failed: {error}") from None

    def write(temporary):
        with open(temporary, "wb") as f:
            f.write(flatbuffer)

    return atomic_write(path, write)


def _network_name(model) -> str:
    """The name of the YOLO body nested in the export model (the layer that INT8 quantises)."""
    # Keras once a model exists: importing this module (the command's flags) starts no backend.
    import keras

    return next(layer.name for layer in model.layers if isinstance(layer, keras.Model))


def _import_onnx_tools():
    """tf2onnx, imported with onnxruntime (which checks the export); ExportError when either is missing."""
    try:
        onnxruntime.module()
        return tf2onnx.module()
    except ImportError:
        raise ExportError(ONNX_MISSING) from None


def export_onnx(model, path: str, opset: int = ONNX_OPSET) -> str:
    """Writes an `.onnx` file through tf2onnx."""
    converter = _import_onnx_tools()
    signature = _input_signature(model)

    @tf.function(input_signature=signature)
    def serve(image, image_shape):
        return model([image, image_shape], training=False)

    def convert(temporary: str) -> None:
        converter.convert.from_function(serve, input_signature=signature, opset=opset, output_path=temporary)

    chosen = CATCH_ERRORS in os.environ  # the user's choice, kept
    try:
        with contextlib.nullcontext() if chosen else _environment_variable(CATCH_ERRORS, "FALSE"):
            atomic_write(path, convert)
    except Exception as error:  # tf2onnx raises many kinds
        retry = "" if chosen else f" ({CATCH_ERRORS}=TRUE has tf2onnx skip an optimizer that fails)"
        raise ExportError(f"ONNX conversion failed: {error}{retry}") from None
    return path


@contextlib.contextmanager
def _environment_variable(name: str, value: str):
    """`name` set to `value` inside the block, unset after it."""
    os.environ[name] = value
    try:
        yield
    finally:
        del os.environ[name]


def default_output(weights: str, fmt: str, precision: str = "float32") -> str:
    stem = os.fspath(weights)
    for suffix in (".weights.h5", ".keras", ".h5"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    if precision != "float32":
        stem += "_" + precision
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
    precision: str = "float32",
    images: str | None = None,
    calibration_images: int = DEFAULT_CALIBRATION_IMAGES,
) -> dict:
    """Exports `weights` in format `fmt`; returns `{"format", "path", "check", "metadata", "precision", "size"}`.

    `precision` "float16" or "int8" quantises a TFLite export (`quantize`);
    INT8 calibrates on `calibration_images` of `images` (a folder or an
    annotation file of training images). The check (`export_check`) runs on
    images of `images` when given, else on generated scenes with objects.

    Classes, anchors, masks and input size default to the weights' metadata
    (explicit ones must agree), else COCO's names, YOLOv3's anchors,
    keras-yolo3's masks and 416; `settings` (a `ModelMetadata`) replaces
    them all. They are written beside the export as `<output>.metadata.json`
    (and into the ONNX file's `metadata_props`), so the exported model
    still says which classes its class ids are.

    Nothing the user made is removed or overwritten: a SavedModel replaces
    only an empty folder or a previous export of this tool (it holds
    `EXPORT_MARKER`); a `.tflite`/`.onnx` file replaces an existing file
    only when this project wrote it (a re-run) or with `overwrite`. Every
    export is written beside `output` and moved into place when complete,
    so an interrupted export leaves the previous one.

    Raises:
        FileExistsError: `output` exists and may not be replaced (see above).
        ExportError: the format cannot be made here (ONNX tools missing) or
            the export does not match the Keras model.
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}. Received: format={fmt!r}")
    _check_precision(fmt, precision, images)
    output = output or default_output(weights, fmt, precision)
    _check_output(output, fmt, overwrite, weights)  # before the slow part
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
    _check_output(output, fmt, overwrite, weights, say=False)  # again: building took a while
    _write(model, fmt, output, settings, precision, images, calibration_images)
    metadata_path = write_sidecar(output, settings)
    outputs.record_written([output, metadata_path])  # a SavedModel folder is known by its EXPORT_MARKER
    size = export_size(output)
    logger.info("wrote %s (%s, %s, %.2f MB) and %s", output, fmt, precision, size / 1e6, metadata_path)
    result = {"format": fmt, "path": output, "check": None, "metadata": metadata_path}
    result.update(precision=precision, size=size)
    if check:
        result["check"] = run_check(model, fmt, output, images, precision, max_boxes, max_detections)
    return result


def _write(model, fmt: str, output: str, settings, precision: str, images: str | None, calibration_images: int):
    """Writes the export file or folder (and ONNX's embedded metadata)."""
    if fmt == "tflite":
        calibration = _calibration(images, calibration_images, settings.input_shape) if precision == "int8" else None
        export_tflite(model, output, precision, calibration)
        return
    if fmt == "savedmodel":
        export_savedmodel(model, output, mark=True)
    else:
        export_onnx(model, output)
        _add_onnx_metadata(output, settings)


def _check_precision(fmt: str, precision: str, images: str | None) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}. Received: precision={precision!r}")
    if precision != "float32" and fmt != "tflite":
        raise ValueError(f"--int8 and --half quantise a TFLite export; use --format tflite (received {fmt})")
    if precision == "int8" and not images:
        raise ValueError(
            "--int8 calibrates on training images: give --images FOLDER_OR_ANNOTATION_FILE (a few hundred images; "
            "a run's weights take the images it trained on, its train_split.txt)"
        )


def _calibration(images: str, count: int, input_shape):
    paths = sample_paths(image_paths(images), count, seed=1)
    logger.info("calibrating INT8 ranges on %d images of %s", len(paths), images)
    return calibration_batches(paths, input_shape)


def export_size(path: str) -> int:
    """Bytes of an export: the file, or every file of a SavedModel folder."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def run_check(model, fmt: str, path: str, images: str | None, precision: str, max_boxes: int, max_detections: int):
    """`export_check.check_export` on images of `images`, else on generated scenes; raises ExportError."""
    # The runners' module imports Keras: importing this module (the command's flags) starts no backend.
    from keras_yolo_mgpu.inference.export_formats import open_runner

    input_shape = tuple(model.inputs[0].shape[1:3])
    if images:
        pixels, shapes = export_check.real_check_images(images, input_shape)
        source = f"images of {images}"
    else:
        pixels, shapes = export_check.synthetic_check_images(input_shape)
        source = "generated scenes"
    try:
        return export_check.check_export(
            model,
            open_runner(path, fmt),
            pixels,
            shapes,
            source=source,
            max_boxes=max_boxes,
            max_detections=max_detections,
            tolerance=export_check.TOLERANCES[precision],
        )
    except export_check.ExportCheckError as error:
        raise ExportError(f"{path}: {error} (the file is kept, to inspect; it is no export to use)") from None


def _add_onnx_metadata(path: str, settings) -> None:
    """Stores the metadata JSON in the ONNX model's `metadata_props` (key `keras_yolo_mgpu_metadata`)."""
    model = onnx.load(path)
    entry = model.metadata_props.add()
    entry.key, entry.value = ATTRIBUTE, settings.to_json()
    atomic_write(path, lambda temporary: onnx.save(model, temporary))
