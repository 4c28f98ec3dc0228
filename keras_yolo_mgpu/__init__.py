"""keras-yolo-mgpu: YOLOv3 for Keras 3 with multi-GPU training that equals one GPU.

The public names follow keras-yolo3 so its users find their way.
"""
from .boxes import anchor_masks, box_iou, letterbox_image, yolo_correct_boxes, yolo_eval, yolo_head
from .loss import YoloLoss, totalloss, yolo_loss
from .model import create_model, darknet_body, freeze_layers, tiny_yolo_body, yolo_body
from .model_data import get_anchors, get_classes, model_data_path
from .targets import preprocess_true_boxes

__version__ = "0.1.0"

__all__ = [
    "YoloLoss",
    "anchor_masks",
    "box_iou",
    "create_model",
    "darknet_body",
    "freeze_layers",
    "get_anchors",
    "get_classes",
    "letterbox_image",
    "model_data_path",
    "preprocess_true_boxes",
    "tiny_yolo_body",
    "totalloss",
    "yolo_body",
    "yolo_correct_boxes",
    "yolo_eval",
    "yolo_head",
    "yolo_loss",
]
