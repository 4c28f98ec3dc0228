"""The networks `--model` selects, and what each needs besides its body.

| name          | body              | anchors file               | scale_x_y (coarse first) | box loss | iou_thresh |
|---------------|-------------------|----------------------------|--------------------------|----------|------------|
| `yolov3`      | `yolo_body`       | `yolo_anchors.txt`         | 1                        | `yolov3` | -          |
| `yolov3-tiny` | `tiny_yolo_body`  | `tiny_yolo_anchors.txt`    | 1                        | `yolov3` | -          |
| `yolov4`      | `yolo4_body`      | `yolo4_anchors.txt`        | 1.05, 1.1, 1.2           | `ciou`   | 0.213      |
| `yolov4-tiny` | `yolo4_tiny_body` | `yolo4_tiny_anchors.txt`   | 1.05, 1.05               | `ciou`   | -          |

The scale_x_y values, the CIoU box loss and the anchor assignment's
`iou_thresh` are those of AlexeyAB's yolov4.cfg / yolov4-tiny.cfg (`-`: the
best anchor only, as keras-yolo3; yolov4-tiny.cfg sets no iou_thresh). Every model shares the anchor masks, targets
and per-sample loss of `model/boxes.py` and `model/loss.py`.
"""

from __future__ import annotations

import dataclasses
import importlib

from keras_yolo_mgpu.resources import MODEL_ANCHORS_FILES

MODEL_NAMES = ("yolov3", "yolov3-tiny", "yolov4", "yolov4-tiny")
#: Box regression terms of the loss (`model/loss.py`); each model has its default below.
BOX_LOSSES = ("yolov3", "ciou")
#: yolov4.cfg's `iou_normalizer`: the weight of each positive's 1 - CIoU.
YOLOV4_CIOU_WEIGHT = 0.07
#: yolov4.cfg's `iou_thresh`: anchors above this IoU with a box also learn it.
YOLOV4_IOU_THRESH = 0.213


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One network family member.

    Attributes:
        name: the `--model` name.
        builder: `module:function` of the body builder, e.g. `model.yolo3:yolo_body`.
        num_anchors: anchors the body expects (9 or 6).
        scale_x_y: per output scale, coarse first; 1.0 is YOLOv3's decoding.
        box_loss: `"yolov3"` (keras-yolo3's xy BCE + wh squared error) or `"ciou"`.
        ignore_thresh: the loss's default ignore threshold (the cfgs': 0.5
            for YOLOv3 as in keras-yolo3, 0.7 for YOLOv4).
        ciou_weight: weight of each positive's 1 - CIoU when the box loss is
            CIoU: yolov4.cfg's `iou_normalizer` 0.07 for YOLOv4; 1.0 for
            YOLOv3 (`--box-loss ciou`), the weight keras-yolo3's box terms
            have in the same loss.
        iou_thresh: the targets' default Darknet `iou_thresh`: a box also
            trains every other anchor of its masks with IoU above it
            (`data.device_side.build_targets`); None: its best anchor only.
    """

    name: str
    builder: str
    num_anchors: int
    scale_x_y: tuple[float, ...]
    box_loss: str
    ignore_thresh: float
    ciou_weight: float = 1.0
    iou_thresh: float | None = None

    @property
    def anchors_file(self) -> str:
        """The default anchors in `model_data/` (`resources.MODEL_ANCHORS_FILES`)."""
        return MODEL_ANCHORS_FILES[self.name]

    @property
    def tiny(self) -> bool:
        return self.num_anchors == 6

    @property
    def decode_scale_x_y(self) -> list[float] | None:
        """`scale_x_y` for the decoding layers and the loss: None where it is 1.0 (YOLOv3)."""
        return None if set(self.scale_x_y) == {1.0} else list(self.scale_x_y)

    def body_builder(self):
        """The body function, `(inputs, num_anchors, num_classes, *, sync_bn) -> keras.Model`."""
        module, function = self.builder.split(":")
        return getattr(importlib.import_module(f"keras_yolo_mgpu.{module}"), function)


_ARCHITECTURES = {
    "yolov3": Architecture("yolov3", "model.yolo3:yolo_body", 9, (1.0, 1.0, 1.0), "yolov3", 0.5),
    "yolov3-tiny": Architecture("yolov3-tiny", "model.yolo3:tiny_yolo_body", 6, (1.0, 1.0), "yolov3", 0.5),
    "yolov4": Architecture(
        "yolov4",
        "model.yolo4:yolo4_body",
        9,
        (1.05, 1.1, 1.2),
        "ciou",
        0.7,
        YOLOV4_CIOU_WEIGHT,
        YOLOV4_IOU_THRESH,
    ),
    "yolov4-tiny": Architecture(
        "yolov4-tiny",
        "model.yolo4:yolo4_tiny_body",
        6,
        (1.05, 1.05),
        "ciou",
        0.7,
        YOLOV4_CIOU_WEIGHT,
    ),
}


def get_architecture(name: str | None = None, num_anchors: int | None = None) -> Architecture:
    """The architecture called `name`; without a name, YOLOv3 or tiny YOLOv3 by anchor count.

    Raises:
        ValueError: unknown name, or `num_anchors` that the model cannot use.
    """
    if name is None:
        name = "yolov3-tiny" if num_anchors == 6 else "yolov3"
    if name not in _ARCHITECTURES:
        raise ValueError(f"model must be one of {MODEL_NAMES}. Received: model={name!r}")
    architecture = _ARCHITECTURES[name]
    if num_anchors is not None and num_anchors != architecture.num_anchors:
        raise ValueError(
            f"{name} uses {architecture.num_anchors} anchors but {num_anchors} were given "
            f"(default anchors: model_data/{architecture.anchors_file})"
        )
    return architecture


def resolve_iou_thresh(requested: float | None, name: str) -> float | None:
    """The targets' Darknet `iou_thresh`: `requested`, else model `name`'s.

    Returns None where each box trains its best anchor only (no threshold,
    or Darknet's "off", a threshold >= 1).
    """
    value = get_architecture(name).iou_thresh if requested is None else requested
    return None if value is None or value >= 1.0 else value


def model_name(model: str | None, tiny: bool = False) -> str | None:
    """The `--model` value with `--tiny` as the alias of `yolov3-tiny` (None when neither is given)."""
    if tiny:
        if model not in (None, "yolov3-tiny"):
            raise ValueError(f"--tiny means --model yolov3-tiny; it contradicts --model {model}")
        return "yolov3-tiny"
    return model
