"""Post-training quantisation of a TFLite export: float16 weights, or INT8 calibrated on real images.

* float16: weights stored as float16 (half the file); the interpreter
  computes in float32 on a CPU, float16 on a GPU delegate.
* INT8: the network's weights and activations in 8 bits (about a quarter of
  the file), ranges calibrated on a few hundred training images (and their
  mirrors) letterboxed as at inference. Inputs, outputs, decoding and NMS stay
  float32: box corners are pixels up to the image size, where 8 bits would
  leave steps of several pixels, and NMS has only a float kernel. The batch is
  fixed at 1 so NMS is unrolled in the main graph, where the float list
  applies (`export.export_savedmodel`). Still TFLite builtins only.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Callable, Iterator

import numpy as np

from keras_yolo_mgpu.data.images import read_image
from keras_yolo_mgpu.data.letterbox import letterbox_array
from keras_yolo_mgpu.optional import tensorflow as tf

logger = logging.getLogger(__name__)

PRECISIONS = ("float32", "float16", "int8")
DEFAULT_CALIBRATION_IMAGES = 200
# NMS's op kinds, none of which the network uses, kept float by kind: the
# converter names a TOPK_V2's quantised output after both of its outputs,
# so the float list of tensor names missed it, and 8-bit scores tied and
# mis-ranked the detections.
NMS_OPS = ["NON_MAX_SUPPRESSION_V5", "TOPK_V2", "GATHER", "SELECT_V2"]


def calibration_batches(paths: list[str], input_shape, mirrored: bool = True) -> Callable[[], Iterator]:
    """A representative dataset for the converter: each image letterboxed as at inference, one at a time.

    `mirrored` adds each image's left-right mirror (training's flip), so
    the ranges see twice the scenes: on the kangaroo photos (132 training
    images) the INT8 export's validation mAP@0.5 drop fell from 0.022 to
    0.004 (docs/inference.md, "INT8").

    Yields:
        dicts `{"image": (1, H, W, 3) float32 in [0, 1], "image_shape": (1, 2) float32}`.
    """

    def batches():
        for path in paths:
            array = read_image(path)
            image = letterbox_array(array, input_shape).astype(np.float32)[None] / 255.0
            image_shape = np.asarray([array.shape[:2]], np.float32)
            yield {"image": image, "image_shape": image_shape}
            if mirrored:
                yield {"image": np.ascontiguousarray(image[:, :, ::-1]), "image_shape": image_shape}

    return batches


def _converter(saved_model: str):
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter


def _float_tensor_names(flatbuffer: bytes, network: str, keep_output_convs: bool) -> list[str]:
    """Names of the float model's tensors to keep float: outside the `network` layer, and its output convolutions.

    Outside the network are decoding, NMS and the outputs. The output
    convolutions (`keep_output_convs`) give raw logits whose range (objectness
    down to about -20) would leave 8-bit steps of ~0.1 on the box sizes'
    logarithms; they hold under 0.2 % of tiny YOLOv3's weights.
    """
    # The network's module imports Keras: importing this module (the export command's) starts no backend.
    from keras_yolo_mgpu.model.yolo3 import OUTPUT_PREFIX

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        interpreter = tf.lite.Interpreter(model_content=flatbuffer)
    # Keras may suffix a layer's name scope on export (tiny_yolo_body_1/...).
    inside = re.compile(r"(^|/)" + re.escape(network) + r"(_\d+)?/")
    output_conv = re.compile(r"/" + re.escape(OUTPUT_PREFIX) + r"\d+")
    names = [t["name"] for t in interpreter.get_tensor_details()]
    return [name for name in names if not inside.search(name) or (keep_output_convs and output_conv.search(name))]


def convert_quantized(
    saved_model: str,
    precision: str,
    calibration: Callable[[], Iterator] | None = None,
    network: str = "",
    keep_output_convs: bool = True,
) -> bytes:
    """A `.tflite` flatbuffer of the SavedModel export at `precision`.

    Args:
        saved_model: folder of the export model (batch 1, padded NMS).
        precision: "float32", "float16" or "int8".
        calibration: for "int8", `calibration_batches(...)`.
        network: for "int8", the name of the network layer inside the
            export model: only its tensors are quantised.
        keep_output_convs: for "int8", leave the output convolutions in float32.

    Raises:
        ValueError: unknown precision, or "int8" without calibration images.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}. Received: precision={precision!r}")
    converter = _converter(saved_model)
    if precision == "float16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    if precision != "int8":
        return converter.convert()
    if calibration is None or not network:
        raise ValueError("INT8 quantisation needs calibration images (--images) and the network's layer name")
    keep_float = _float_tensor_names(_converter(saved_model).convert(), network, keep_output_convs)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = calibration
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.TFLITE_BUILTINS]
    options = tf.lite.experimental.QuantizationDebugOptions(denylisted_nodes=keep_float, denylisted_ops=NMS_OPS)
    debugger = tf.lite.experimental.QuantizationDebugger(
        converter=converter, debug_dataset=calibration, debug_options=options
    )
    return debugger.get_nondebug_quantized_model()
