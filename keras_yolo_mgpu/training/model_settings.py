"""What a run's model is: its classes, anchors, masks and kind, and its seeded start weights.

Both are decided before any strategy exists, so the device count changes neither.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from keras_yolo_mgpu.keras_compat import set_random_seed
from keras_yolo_mgpu.model.architectures import get_architecture, model_name

# MAX_BOXES: keras-yolo3's max_boxes, the boxes kept per training image.
from keras_yolo_mgpu.model.boxes import MAX_BOXES, resolve_masks
from keras_yolo_mgpu.model.yolo3 import build_body, set_objectness_prior
from keras_yolo_mgpu.resources import get_anchors, get_classes, resolve_resource
from keras_yolo_mgpu.training.config import TrainConfig
from keras_yolo_mgpu.weights.loading import WeightsMismatchError, load_weights
from keras_yolo_mgpu.weights.metadata import MetadataError, read_metadata

logger = logging.getLogger(__name__)


def _target_cells_bound(iou_thresh: float | None, masks) -> int:
    """The most target cells one image can fill at one scale: a box fills one per anchor it is assigned to."""
    return MAX_BOXES if iou_thresh is None else MAX_BOXES * max(len(mask) for mask in masks)


def _model_settings(config: TrainConfig, class_names: list[str] | None = None):
    """Class names, anchors and masks of a run.

    Classes are always the dataset's (`class_names`, default `config.classes`).
    Anchors and masks come from the flags, else the start weights' metadata,
    else the defaults. Start weights of another model kind are an error;
    other anchors or masks than theirs only a warning (keras-yolo3 users
    train k-means anchors from COCO weights).

    Returns:
        `(class_names, anchors (N, 2), masks, kind)`, `kind` one of
        `model.architectures.MODEL_NAMES`.
    """
    class_names = get_classes(config.classes) if class_names is None else list(class_names)
    # --anchors auto: these anchors until the boxes are read (training/anchor_fit.py).
    anchors_path = None if config.anchors == "auto" else config.anchors
    start = read_metadata(config.weights) if config.weights and os.path.isfile(config.weights) else None
    requested = model_name(config.model, config.tiny)
    if start is None:
        anchors = get_anchors(resolve_resource(anchors_path, "anchors", tiny=config.tiny, model=requested))
        kind = get_architecture(requested, len(anchors)).name
        return class_names, anchors, resolve_masks(config.masks, len(anchors)), kind
    if config.model is not None and config.model != start.kind:
        raise MetadataError(f"--model says {config.model} but the start weights {config.weights} are {start.kind}")
    if anchors_path:
        anchors = get_anchors(anchors_path)
    elif config.tiny and len(start.anchors) != 6:
        raise MetadataError(f"--tiny says tiny YOLOv3 but the start weights {config.weights} are {start.kind}")
    else:
        anchors = start.anchors_array
    if len(anchors) != len(start.anchors):
        raise MetadataError(
            f"--anchors ({config.anchors}) has {len(anchors)} anchors but the start weights {config.weights} "
            f"are {start.kind} with {len(start.anchors)}: the networks differ"
        )
    if not np.allclose(anchors, start.anchors_array):
        logger.warning("training with other anchors than the start weights %s were saved with", config.weights)
    masks = resolve_masks(config.masks if config.masks is not None else start.masks_list, len(anchors))
    if masks != start.masks_list:
        logger.warning("training with masks %s; the start weights used %s", masks, start.masks_list)
    return class_names, anchors, masks, start.kind


def _initial_weights(config: TrainConfig, anchors, num_classes: int, kind: str | None = None) -> list:
    """The run's start weights: seeded init, then `config.weights`, built outside any strategy.

    `seed` alone decides them, whatever the device count. Raises ValueError
    when `config.weights` does not fit the model, unless `config.weights_partial`.
    """
    set_random_seed(config.seed)
    template = build_body(anchors, num_classes, model=kind)
    if config.weights:
        try:
            report = load_weights(
                template, config.weights, skip_mismatch=config.weights_partial, allow_new_classes=True
            )
        except WeightsMismatchError as error:
            if config.weights_partial:  # the layers cannot be paired at all: another network
                raise ValueError(f"{error} Nothing was trained.") from None
            raise ValueError(
                f"{error} Nothing was trained. To start anyway from the layers that do match, leaving the others "
                "at their random initial values, pass --weights-partial (TrainConfig.weights_partial)."
            ) from None
        # A backbone file's head (no file layer: `source` empty) is said by the loader.
        kept = [s.layer for s in report.skipped if not s.layer.startswith("yolo_output_") and s.source]
        if kept:
            logger.warning(
                "--weights-partial: %d layer(s) start from random values, not from %s: %s%s",
                len(kept),
                config.weights,
                ", ".join(kept[:5]),
                "" if len(kept) <= 5 else f" and {len(kept) - 5} more",
            )
    else:
        logger.info(
            "no --weights: the network starts from random values (from scratch); to fine-tune the official "
            "weights instead, as the README's quick start does: --weights %s (downloaded once)",
            get_architecture(kind, len(anchors)).name,
        )
    if config.objectness_prior:
        # Only output convolutions not loaded from `config.weights`.
        fresh = None if not config.weights else {s.layer for s in report.skipped}
        set_objectness_prior(template, num_classes, config.objectness_prior, layer_names=fresh)
    weights = template.get_weights()
    del template
    return weights
