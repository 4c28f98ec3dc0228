"""Validation mAP during training (`--eval-every N`).

Every N epochs (and after the run's last) the template weights (averaged
with `--ema`) are copied into a separate single-device inference body and
scored with `evaluation.mean_ap.evaluate_detections` (the COCO protocol).
The epoch's logs get `val_mAP` (mAP@[.5:.95]) and `val_mAP50` (mAP@.5), so
history.csv, checkpoints, ReduceLROnPlateau and EarlyStopping see them like
`val_loss`, and `val_mAP_seconds` / `epoch_seconds`. Callbacks that monitor
them are wrapped in `OnEvaluatedEpochs`, so their patience counts evaluations.

An unreadable image is scored as a grey image (its boxes count as missed),
with one warning: a bad file never stops the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import keras
import numpy as np

from keras_yolo_mgpu.backend import inference as backend_inference
from keras_yolo_mgpu.data.images import read_image
from keras_yolo_mgpu.evaluation.mean_ap import (
    EVAL_MAX_DETECTIONS,
    EVAL_MIN_SCORE,
    _image_size,
    coco_results,
    evaluate_detections,
)
from keras_yolo_mgpu.inference.detector import YOLO
from keras_yolo_mgpu.model.yolo3 import build_body
from keras_yolo_mgpu.training.callbacks import overrides_batch_end
from keras_yolo_mgpu.training.run_state import callback_key, callback_states, restore_callback_states

logger = logging.getLogger(__name__)

MAP_KEY = "val_mAP"
MAP50_KEY = "val_mAP50"
# Letterboxed validation images are kept in RAM up to this many bytes.
EVAL_CACHE_BYTES = 1 << 30


class MeanAPEvaluation(keras.callbacks.Callback):
    """Adds `val_mAP` and `val_mAP50` to the logs every `every` epochs.

    Args:
        template_model: the single-device body being trained.
        annotations: validation `Annotation`s.
        class_names: the class names.
        anchors: (A, 2) anchors of the body.
        input_shape: (height, width) evaluation size, multiples of 32.
        every: evaluate after epochs `every`, `2 * every`, ... (1-based).
        last_epoch: the run's final epoch (1-based), always evaluated.
        batch_size: images per forward pass.
        masks: anchor masks of the body (default: keras-yolo3's).
        kind: architecture name (`model.architectures`; default by anchor count).
    """

    def __init__(
        self,
        template_model: keras.Model,
        annotations: Sequence,
        class_names: Sequence[str],
        anchors,
        input_shape: tuple[int, int],
        every: int,
        last_epoch: int,
        batch_size: int = 8,
        masks=None,
        kind: str | None = None,
    ):
        super().__init__()
        if every < 1:
            raise ValueError(f"`every` must be >= 1 epoch. Received: every={every}")
        if not annotations:
            raise ValueError("validation mAP needs validation images; none were given")
        self.template_model = template_model
        self.annotations = list(annotations)
        self.class_names = list(class_names)
        self.anchors = np.asarray(anchors, np.float32).reshape(-1, 2)
        self.input_shape = (int(input_shape[0]), int(input_shape[1]))
        self.every = int(every)
        self.last_epoch = int(last_epoch)
        self.batch_size = int(batch_size)
        self.masks = masks
        self.kind = kind
        self._detector = None
        self._prepared = None
        self._epoch_start = None
        self._warned: set[str] = set()

    def due(self, epoch: int) -> bool:
        """Whether the 0-based `epoch` ends with an evaluation."""
        return (epoch + 1) % self.every == 0 or epoch + 1 == self.last_epoch

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or not self.due(epoch):
            return
        start = time.perf_counter()
        metrics = self.evaluate()
        seconds = time.perf_counter() - start
        logs[MAP_KEY] = metrics["mAP"]
        logs[MAP50_KEY] = metrics["mAP50"]
        logs["val_mAP_seconds"] = seconds
        if self._epoch_start is not None:
            epoch_seconds = time.perf_counter() - self._epoch_start
            logs["epoch_seconds"] = epoch_seconds
            logger.info(
                "epoch %d: val_mAP %.4f, val_mAP50 %.4f (%.1f s, %.1f%% of the epoch's %.1f s)",
                epoch + 1,
                metrics["mAP"],
                metrics["mAP50"],
                seconds,
                100.0 * seconds / max(epoch_seconds, 1e-9),
                epoch_seconds,
            )

    def evaluate(self) -> dict:
        """The evaluator's result dict for the template's current weights."""
        detector = self._detector_with_current_weights()
        detections, sizes = [], []
        for start, images, shapes in self._batches(detector):
            detections.extend(coco_results(start, detector.detect_letterboxed(images, shapes)))
            sizes.extend((int(w), int(h)) for h, w in shapes)
        result = evaluate_detections(detections, self.annotations, self.class_names, image_sizes=sizes)
        for key in ("mAP", "mAP50"):
            if result[key] is None:  # no ground truth at all
                result[key] = 0.0
        return result

    def _detector_with_current_weights(self):
        if self._detector is None:
            # A body of its own, so the detector never touches the training's (mirrored) variables;
            # on JAX outside training's DataParallel, so its weights sit on one device.
            with backend_inference.outside_distribution():
                body = build_body(self.anchors, len(self.class_names), model=self.kind)
            self._detector = YOLO.from_body(
                body,
                self.anchors,
                self.class_names,
                score=EVAL_MIN_SCORE,
                model_image_size=self.input_shape,
                max_boxes=EVAL_MAX_DETECTIONS,
                max_detections=EVAL_MAX_DETECTIONS,
                batch_size=self.batch_size,
                masks=self.masks,
                kind=self.kind,
            )
        self._detector.body.set_weights(self.template_model.get_weights())
        return self._detector

    def _read(self, detector, annotation):
        try:
            return detector.preprocess(read_image(annotation.image_path))
        except (OSError, ValueError) as error:
            if annotation.image_path not in self._warned:
                self._warned.add(annotation.image_path)
                logger.warning(
                    "validation mAP: cannot read %s (%s); scored as a grey image", annotation.image_path, error
                )

            width, height = _image_size(annotation)
            grey = np.full((*self.input_shape, 3), 128, np.uint8)
            return grey, (max(height, 1), max(width, 1))

    def _batches(self, detector):
        """Yields (first index, (B, H, W, 3) uint8 letterboxed, (B, 2) original (h, w))."""
        height, width = self.input_shape
        cache = len(self.annotations) * height * width * 3 <= EVAL_CACHE_BYTES
        if cache and self._prepared is not None:
            yield from self._prepared
            return
        prepared = []
        for start in range(0, len(self.annotations), self.batch_size):
            chunk = [self._read(detector, a) for a in self.annotations[start : start + self.batch_size]]
            batch = (start, np.stack([c[0] for c in chunk]), np.array([c[1] for c in chunk], np.float32))
            if cache:
                prepared.append(batch)
            yield batch
        if cache:
            self._prepared = prepared


class OnEvaluatedEpochs(keras.callbacks.Callback):
    """Runs `callback`'s epoch-end only on epochs whose logs hold `key`; every other hook is passed through.

    For callbacks that monitor `val_mAP` computed every N > 1 epochs: no
    epoch without one warns about a missing metric.
    """

    def __init__(self, callback: keras.callbacks.Callback, key: str):
        super().__init__()
        self.callback = callback
        self.key = key

    def set_model(self, model):
        super().set_model(model)
        self.callback.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        self.callback.set_params(params)

    def on_train_begin(self, logs=None):
        self.callback.on_train_begin(logs)

    def on_train_end(self, logs=None):
        self.callback.on_train_end(logs)

    def on_epoch_begin(self, epoch, logs=None):
        self.callback.on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and self.key in logs:
            self.callback.on_epoch_end(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        self.callback.on_train_batch_end(batch, logs)

    @property
    def async_safe(self) -> bool:
        """Whether Keras may run the step loop ahead of the batch-end hook: as safe as the wrapped callback."""
        return getattr(self.callback, "async_safe", False) or not overrides_batch_end(self.callback)

    # The wrapped callback's counters are part of the run state (--resume).

    def get_run_state(self):
        return next(iter(callback_states([self.callback]).values()), None)

    def set_run_state(self, state):
        restore_callback_states([self.callback], {callback_key(self.callback, 0): state})
