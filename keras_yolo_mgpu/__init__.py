"""keras-yolo-mgpu: YOLOv3 for Keras 3 with multi-GPU training that equals one GPU.

The public names follow keras-yolo3 so its users find their way, and the
commands are functions with the same flags and defaults (`train`, `evaluate`,
`detect`, `export`, `check_dataset`). They are imported lazily, so
tools that need no TensorFlow (annotation converters, k-means, the dataset
checker's help) start instantly.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "anchor_masks": "model.boxes",
    "box_iou": "model.boxes",
    "letterbox_image": "data.letterbox",
    "yolo_correct_boxes": "model.boxes",
    "yolo_eval": "model.boxes",
    "yolo_head": "model.boxes",
    "YoloLoss": "model.loss",
    "totalloss": "model.loss",
    "yolo_loss": "model.loss",
    "darknet_body": "model.yolo3",
    "freeze_layers": "model.yolo3",
    "tiny_yolo_body": "model.yolo3",
    "yolo_body": "model.yolo3",
    "yolo4_body": "model.yolo4",
    "yolo4_tiny_body": "model.yolo4",
    "Mish": "model.yolo4",
    "get_anchors": "resources",
    "get_classes": "resources",
    "model_data_path": "resources",
    "preprocess_true_boxes": "data.device_side",
    "multi_gpu_model": "backend.tensorflow.replica_model",
    "TemplateModelCheckpoint": "training.checkpoint",
    "create_model": "training.training_model",
    "load_weights": "weights.loading",
    "YOLO": "inference.detector",
    "Detections": "inference.detector",
    # The commands as functions (api.py).
    "train": "api",
    "evaluate": "api",
    "detect": "api",
}
# The modules of `python -m keras_yolo_mgpu.export` / `.check_dataset`, which, called, are the API's functions of
# the same names (`api.CommandModule`).
_COMMAND_MODULES = ("export", "check_dataset")

__all__ = sorted([*_EXPORTS, *_COMMAND_MODULES])


def __getattr__(name: str):
    if name in _COMMAND_MODULES:
        return importlib.import_module(f".{name}", __name__)
    if name not in _EXPORTS:
        raise AttributeError(f"module 'keras_yolo_mgpu' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
