"""Running exported detectors, one runner per export format (SavedModel, TFLite, ONNX).

An export (`inference.export`) holds the network, decoding and NMS; its
`<path>.metadata.json` sidecar holds the class names, anchors and input
size. `ExportedDetector` opens both and answers like `detector.YOLO`
(`detect`, `detect_batch`, `detect_letterboxed`, `draw`), so `evaluate.py`
and `yolo_video.py` measure and run the file a user deploys, by the runtime
that deploys it: TensorFlow for a SavedModel, the stock TFLite interpreter
for `.tflite`, onnxruntime for `.onnx`.

The detector runs NMS on the export's `decoded_boxes` and `decoded_scores` on the
host, with the score and IoU asked for now (evaluation needs a floor of 0.001, a
deployment 0.3) and the export's own `YoloNMS` arithmetic; the network and the
decoding (where quantisation acts) are always the export's own.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings

import numpy as np

from keras_yolo_mgpu.backend import distribution
from keras_yolo_mgpu.backend import inference as backend_inference
from keras_yolo_mgpu.data.scan import cache_dir
from keras_yolo_mgpu.inference.detector import YOLO
from keras_yolo_mgpu.inference.layers import OUTPUT_NAMES, non_max_suppression
from keras_yolo_mgpu.optional import onnxruntime
from keras_yolo_mgpu.optional import tensorflow as tf
from keras_yolo_mgpu.weights.metadata import read_metadata, sidecar_path

logger = logging.getLogger(__name__)

ONNX_MISSING = "ONNX export is not available: pip install tf2onnx onnxruntime"
EXPORT_SUFFIXES = {".tflite": "tflite", ".onnx": "onnx"}


def export_format(path: str) -> str | None:
    """ "savedmodel", "tflite" or "onnx" for an exported model's path; None for anything else (weights)."""
    path = os.fspath(path)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "saved_model.pb")):
        return "savedmodel"
    return EXPORT_SUFFIXES.get(os.path.splitext(path)[1].lower())


def _savedmodel_runner(path: str):
    """`serving_default` of an exported SavedModel; any batch size."""
    serve = tf.saved_model.load(path).signatures["serving_default"]

    def run(image: np.ndarray, image_shape: np.ndarray) -> dict:
        out = serve(image=tf.constant(image, tf.float32), image_shape=tf.constant(image_shape, tf.float32))
        return {k: v.numpy() for k, v in out.items()}

    return run


def _tflite_runner(path: str, num_threads: int | None = None):
    """A `.tflite` export in the stock interpreter (builtin ops only), one image at a time (batch 1)."""
    # Every core, as TensorFlow uses for the Keras model (the interpreter's own default may be one).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice
        interpreter = tf.lite.Interpreter(model_path=path, num_threads=num_threads or os.cpu_count())
    runner = interpreter.get_signature_runner()

    def run(image: np.ndarray, image_shape: np.ndarray) -> dict:
        parts = [
            runner(
                image=np.asarray(image[i : i + 1], np.float32),
                image_shape=np.asarray(image_shape[i : i + 1], np.float32),
            )
            for i in range(len(image))
        ]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    return run


def _onnx_runner(path: str):
    """An `.onnx` export in onnxruntime (CPU); any batch size."""
    try:
        runtime = onnxruntime.module()
    except ImportError:
        raise RuntimeError(ONNX_MISSING) from None
    session = runtime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(image: np.ndarray, image_shape: np.ndarray) -> dict:
        feed = {"image": np.asarray(image, np.float32), "image_shape": np.asarray(image_shape, np.float32)}
        return dict(zip(names, session.run(None, feed)))

    return run


RUNNERS = {"savedmodel": _savedmodel_runner, "tflite": _tflite_runner, "onnx": _onnx_runner}


def open_runner(path: str, fmt: str | None = None):
    """A callable `(image (N, H, W, 3) float32 in [0, 1], image_shape (N, 2)) -> dict of numpy outputs`.

    Raises:
        ValueError: `path` is not an exported model.
    """
    fmt = fmt or export_format(path)
    if fmt not in RUNNERS:
        raise ValueError(
            f"{path} is not an exported model (a SavedModel folder, .tflite or .onnx file); formats: {tuple(RUNNERS)}"
        )
    return RUNNERS[fmt](path)


def host_nms(outputs: dict, *, score: float, iou: float, max_boxes: int, max_detections: int) -> dict:
    """NMS of an export's `decoded_boxes` (N, K, 4) / `decoded_scores` (N, K, C), as `YoloNMS` runs it.

    Returns:
        `boxes` (N, M, 4), `scores` (N, M), `classes` (N, M), `valid_detections` (N,) as numpy.
    """
    nms = make_nms_runner(
        max_boxes_per_class=int(max_boxes),
        max_detections=int(max_detections),
        iou_threshold=float(iou),
        score_threshold=float(score),
    )
    return dict(zip(OUTPUT_NAMES, nms(outputs["decoded_boxes"], outputs["decoded_scores"])))


@functools.lru_cache(maxsize=8)
def make_nms_runner(**options):
    """A function `(boxes (N, K, 4), scores (N, K, C)) -> (boxes, scores, classes, valid)` as numpy.

    `options`: `layers.non_max_suppression`'s keyword arguments. TensorFlow
    runs its NMS op eagerly; JAX compiles `greedy_nms` once per input shape
    (`backend.inference.compile_for_host`), so one function per setting is kept.
    """
    nms = backend_inference.compile_for_host(lambda boxes, scores: non_max_suppression(boxes, scores, **options))

    def run(boxes: np.ndarray, scores: np.ndarray) -> tuple:
        with backend_inference.outside_distribution():
            results = nms(np.asarray(boxes, np.float32), np.asarray(scores, np.float32))
        return tuple(np.asarray(value) for value in results)

    return run


def _export_settings(path: str, settings):
    """The sidecar's `ModelMetadata`; `settings` (from the flags) must describe the same model."""
    saved = read_metadata(path)
    if saved is None:
        raise FileNotFoundError(
            f"{sidecar_path(path)} not found: an exported model is run with the metadata file written beside it "
            "(class names, anchors, input size); copy it along with the model"
        )
    if settings is not None and tuple(settings.input_shape) != tuple(saved.input_shape):
        raise ValueError(
            f"{path} was exported for input {saved.input_shape[0]}x{saved.input_shape[1]}; "
            f"--input-size {settings.input_shape[0]}x{settings.input_shape[1]} cannot change it (export again)"
        )
    if settings is not None and list(settings.class_names) != list(saved.class_names):
        raise ValueError(f"the class names given do not match {sidecar_path(path)}'s {list(saved.class_names)}")
    return saved


class ExportedDetector(YOLO):
    """`detector.YOLO`'s interface over an exported model and its metadata sidecar.

    Args:
        path: SavedModel folder, `.tflite` or `.onnx` file.
        settings: `ModelMetadata` from the command's flags (they must agree
            with the sidecar); None reads the sidecar alone.
        score, iou, max_boxes, max_detections, batch_size: as for `YOLO`;
            NMS runs on the host on the export's decoded outputs.
    """

    def __init__(
        self,
        path: str,
        *,
        settings=None,
        score: float = 0.3,
        iou: float = 0.45,
        max_boxes: int = 20,
        max_detections: int = 100,
        batch_size: int = 8,
        fmt: str | None = None,
    ):
        self.model_path = os.fspath(path)
        self.format = fmt or export_format(self.model_path)
        self._setup(
            None, _export_settings(self.model_path, settings), score, iou, 1, max_boxes, max_detections, batch_size
        )
        self._export = open_runner(self.model_path, self.format)

    def run_export(self, images: np.ndarray, image_shapes) -> dict:
        """The export's raw outputs for (N, H, W, 3) uint8 letterboxed images (keras-yolo3's / 255)."""
        image = np.asarray(images, np.float32) / 255.0
        return self._export(image, np.asarray(image_shapes, np.float32).reshape(-1, 2))

    def _run(self, images: np.ndarray, image_shapes: np.ndarray) -> dict:
        """`YOLO.detect_letterboxed`'s detections: NMS on the host on the export's decoded outputs."""
        out = self.run_export(images, image_shapes)
        if "decoded_boxes" in out:
            return host_nms(
                out, score=self.score, iou=self.iou, max_boxes=self.max_boxes, max_detections=self.max_detections
            )
        # An export from before decoded outputs: its own NMS, at the score it was exported with.
        logger.warning("%s has no decoded outputs: using its built-in NMS and score threshold", self.model_path)
        return out


def open_detector(path: str, *, settings=None, score: float = 0.3, iou: float = 0.45, gpu_num: int = 1, **options):
    """`ExportedDetector` for an exported model, else `detector.YOLO` for weights; arguments as for `YOLO`.

    The commands' detector (yolo_video.py, evaluate.py): on JAX its compiled
    programs are kept in the user's cache folder (`data.scan.cache_dir`, as
    training's), so a later run of the same model skips XLA's compile.
    """
    distribution.use_compilation_cache(cache_dir())
    if export_format(path) is not None:
        if gpu_num > 1:
            logger.warning("--gpu_num %d is ignored for an exported model: it runs in its own runtime", gpu_num)
        return ExportedDetector(path, settings=settings, score=score, iou=iou, **options)
    return YOLO(path, settings=settings, score=score, iou=iou, gpu_num=gpu_num, **options)
