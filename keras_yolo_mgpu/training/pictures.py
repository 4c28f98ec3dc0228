"""The pictures every run folder gets, written by the chief worker.

    labels.jpg          class counts, box centres, box sizes against the anchors (before the first epoch)
    train_batch0.jpg..  the first training batches as the model receives them (augmentation, mosaic,
                        multi-scale applied), with the boxes their targets hold and the class names
    results.png         loss, val_mAP / val_mAP50 and learning rate per epoch (after every epoch)
    loss.png            loss per epoch
    val_pred.jpg        ground truth beside predictions of the best weights on validation images (at the end)

A picture that fails is logged and never stops the run; `--no-pictures` leaves all but loss.png out.
"""

from __future__ import annotations

import logging
import os

import keras
from keras import ops

from keras_yolo_mgpu.data.device_side import DeviceInputs
from keras_yolo_mgpu.inference.detector import YOLO
from keras_yolo_mgpu.plots.batches import draw_batch
from keras_yolo_mgpu.plots.labels import plot_labels
from keras_yolo_mgpu.plots.predictions import draw_predictions
from keras_yolo_mgpu.plots.results import plot_results
from keras_yolo_mgpu.training.callbacks import plot_history, read_history
from keras_yolo_mgpu.training.run_folder import BEST_WEIGHTS

logger = logging.getLogger(__name__)

__all__ = ["TRAIN_BATCH_PICTURES", "RunPictures", "write_data_pictures", "write_prediction_pictures"]

# Batches drawn at the start of a run, each as train_batch<i>.jpg.
TRAIN_BATCH_PICTURES = 3


def _guarded(what: str, draw) -> None:
    try:
        draw()
    except Exception as error:  # noqa: BLE001 - a picture must never stop training
        logger.warning("could not draw %s: %s: %s", what, type(error).__name__, error)


class RunPictures(keras.callbacks.Callback):
    """loss.png and results.png after every epoch, from history.csv; `first_pictures()` once, before the first epoch.

    `first_pictures` is None on workers other than the chief, and on a
    resumed run that already drew them.
    """

    def __init__(self, history_csv: str, run_dir: str, first_pictures=None, *, results: bool = True):
        super().__init__()
        self.history_csv = history_csv
        self.output_png = os.path.join(run_dir, "loss.png")
        self.results_png = os.path.join(run_dir, "results.png") if results else None
        self.first_pictures = first_pictures

    def on_train_begin(self, logs=None):
        if self.first_pictures is not None:
            _guarded("the data pictures", self.first_pictures)
            self.first_pictures = None  # stage 2 starts another fit: once per run

    def on_epoch_end(self, epoch, logs=None):
        try:
            plot_history(self.history_csv, self.output_png)
        except (OSError, ValueError) as error:  # a plot must never stop training
            logger.warning("could not plot %s: %s", self.history_csv, error)
        if self.results_png is None:
            return
        _guarded(self.results_png, lambda: plot_results(read_history(self.history_csv), self.results_png))


def write_data_pictures(run) -> None:
    """labels.jpg and train_batch0.jpg.. of a `trainer._TrainingRun` whose data and settings are read."""
    config, folder = run.config, run.run_dir
    if os.path.isfile(os.path.join(folder, "train_batch0.jpg")):
        return  # a resumed run drew them when it started
    _guarded(
        "labels.jpg",
        lambda: plot_labels(
            run.train_annotations, run.class_names, run.anchors, config.input_shape, os.path.join(folder, "labels.jpg")
        ),
    )
    # The very batches of the first steps (single worker), finished by the training model's own first layer.
    host = run.host_batches(run.batch_sizes[0] if config.freeze_epochs > 0 else run.batch_sizes[1])
    # float32 whatever the run's dtype policy: the pictures do not depend on it.
    finish = DeviceInputs(
        run.anchors, len(run.class_names), masks=run.masks, iou_thresh=run.iou_thresh, dtype="float32"
    )
    for index in range(TRAIN_BATCH_PICTURES):
        batch = host.batch(index)
        image, targets = finish({"image": batch.images, "boxes": batch.boxes, "hsv": batch.hsv.astype("float32")})
        inputs = {"image": ops.convert_to_numpy(image)}
        inputs.update({f"y_true_{i}": ops.convert_to_numpy(t) for i, t in enumerate(targets)})
        draw_batch(inputs, run.class_names, os.path.join(folder, f"train_batch{index}.jpg"))


def write_prediction_pictures(run, final_weights: str) -> None:
    """val_pred.jpg from best.weights.h5 (else the final weights) on the first validation images."""
    if not run.val_annotations:
        return
    best = os.path.join(run.config.log_dir, BEST_WEIGHTS)

    def draw():
        detector = YOLO(best if os.path.isfile(best) else final_weights, score=0.25, batch_size=1)
        draw_predictions(detector, run.val_annotations, run.class_names, os.path.join(run.run_dir, "val_pred.jpg"))

    _guarded("val_pred.jpg", draw)
