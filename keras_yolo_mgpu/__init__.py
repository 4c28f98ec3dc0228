"""keras-yolo-mgpu: YOLOv3 for Keras 3 with multi-GPU training that equals one GPU.

The public names follow keras-yolo3 so its users find their way. They are
imported lazily, so tools that need no TensorFlow (annotation converters,
k-means, the dataset checker's help) start instantly.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "anchor_masks": "boxes",
    "box_iou": "boxes",
    "letterbox_image": "boxes",
    "yolo_correct_boxes": "boxes",
    "yolo_eval": "boxes",
    "yolo_head": "boxes",
    "YoloLoss": "loss",
    "totalloss": "loss",
    "yolo_loss": "loss",
    "create_model": "model",
    "darknet_body": "model",
    "freeze_layers": "model",
    "tiny_yolo_body": "model",
    "yolo_body": "model",
    "get_anchors": "model_data",
    "get_classes": "model_data",
    "model_data_path": "model_data",
    "preprocess_true_boxes": "targets",
    "multi_gpu_model": "parallel",
    "TemplateModelCheckpoint": "checkpoints",
    "load_weights": "checkpoints",
    "YOLO": "detector",
    "Detections": "detector",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'keras_yolo_mgpu' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
