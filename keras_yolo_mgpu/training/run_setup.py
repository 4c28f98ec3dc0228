"""The steps of a training run before its first `fit`: the run folder, the settings and data, the models, the callbacks.

`trainer._TrainingRun` adds the two stages and lists the attributes each step fills in.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import time
from functools import partial

import keras
import numpy as np

from keras_yolo_mgpu.backend import memory
from keras_yolo_mgpu.data.host import HostBatches, check_cache_fits
from keras_yolo_mgpu.keras_compat import patch_multiworker_first_batch_build, patch_multiworker_log_reduction
from keras_yolo_mgpu.model.architectures import resolve_iou_thresh
from keras_yolo_mgpu.model.boxes import MAX_BOXES
from keras_yolo_mgpu.model.loss import totalloss
from keras_yolo_mgpu.optional import event_pb2
from keras_yolo_mgpu.training import batch_fit, precision, run_state
from keras_yolo_mgpu.training.anchor_fit import run_anchors
from keras_yolo_mgpu.training.callbacks import EpochTensorBoard, HistoryCSVLogger, StopOnInterrupt, Throughput
from keras_yolo_mgpu.training.checkpoint_policy import epoch_checkpoints
from keras_yolo_mgpu.training.config import DEFAULT_BATCH_SIZE
from keras_yolo_mgpu.training.model_settings import _initial_weights, _model_settings, _target_cells_bound
from keras_yolo_mgpu.training.pictures import RunPictures, write_data_pictures
from keras_yolo_mgpu.training.recipe_options import RecipeCallbacks, make_optimizer
from keras_yolo_mgpu.training.run_folder import (
    FINAL_WEIGHTS,
    _trim_history,
    _write_args_json,
    open_run_folder,
)
from keras_yolo_mgpu.training.training_data import TrainingData
from keras_yolo_mgpu.training.training_model import create_model
from keras_yolo_mgpu.weights.metadata import make_metadata
from keras_yolo_mgpu.weights.start_weights import resolve_start_weights
from keras_yolo_mgpu.wording import counted

logger = logging.getLogger(__name__)

# The barrier after which the other processes read the chief's records of the dataset.
DATA_BARRIER = "keras_yolo_mgpu_dataset_records"


class RunSetup:
    """The set-up steps; they read what `trainer._TrainingRun.__init__` sets (`config`, `engine`, `chief`, ...)."""

    def open_log_dir(self):
        """Creates the run folder with args.json, or finds where a resumed run stands.

        A resumed run drops the files and history.csv rows of epochs after its
        last saved state. Returns that `RunState`, or None: a new run, or a
        resumed one killed before its first epoch ended (it starts over).
        """
        config = self.config
        if self.chief:
            self.folder_lock = open_run_folder(config)
        state = run_state.read_run_state(config.log_dir) if config.resume else None
        if state is not None and state.finished:
            final = shlex.quote(os.path.join(config.log_dir, FINAL_WEIGHTS))
            raise ValueError(
                f"the run in {config.log_dir} already finished ({FINAL_WEIGHTS} is written); nothing to resume. "
                f"To train further, start a new run with --weights {final}."
            )
        if config.resume and self.chief:
            run_state.remove_stale_files(config.log_dir, keep=state.weights if state else None)
            _trim_history(self.history_csv, state.epoch if state else 0)
            if state is not None:
                logger.info(
                    "resume: %d epoch(s) done (stage %d), stream at image %d",
                    state.epoch,
                    state.stage,
                    state.stream_position,
                )
        return state

    def read_settings_and_data(self) -> None:
        """The model's classes, anchors, masks and kind, the metadata it saves with, and the checked annotations."""
        config = self.config
        # args.json names the weights as given (a Darknet file stays one); the run starts from their conversion.
        self.weights_as_given = config.weights
        config = self.config = dataclasses.replace(config, weights=resolve_start_weights(config, self.run_dir))
        # Several processes scan once: the chief writes the records (data/scan.py), the others then read them.
        if not self.chief:
            self.engine.wait_for_all_workers(DATA_BARRIER)
        data = TrainingData(config, write_record=self.chief)
        self.class_names, self.anchors, self.masks, self.kind = _model_settings(config, data.class_names)
        self.iou_thresh = resolve_iou_thresh(config.iou_thresh, self.kind)
        self.train_annotations, self.val_annotations = data.splits(self.run_dir)
        if self.chief:
            self.engine.wait_for_all_workers(DATA_BARRIER)
        check_cache_fits(config.cache, [*self.train_annotations, *self.val_annotations], config.input_shape)
        self.anchors = run_anchors(
            config, self.anchors, self.masks, self.train_annotations, self.run_dir, self.iou_thresh
        )
        # Stored in every checkpoint, so a trained file alone is enough to detect with.
        self.metadata = make_metadata(self.anchors, self.class_names, config.input_shape, self.masks, kind=self.kind)
        logger.info(
            "%d training and %d validation images, %s, %d anchors, %d replica(s) on %s",
            len(self.train_annotations),
            len(self.val_annotations),
            counted(len(self.class_names), "classes"),
            len(self.anchors),
            self.engine.replicas,
            ", ".join(self.engine.devices) or "the cluster",
        )

    def choose_precision_and_jit(self) -> None:
        """Mixed precision and XLA: the device's defaults, checked on the first batch (training/precision.py).

        A resumed run keeps what its args.json records; a new one records there what passed the checks.
        """
        config = self.config
        kind = precision.training_device_kind(self.engine.devices)
        mixed_policy = precision.mixed_policy_name(self.engine.backend, self.engine.bfloat16)
        planned = not (config.resume and None not in (config.mixed_precision, config.jit))
        if planned:
            plan = precision.plan_settings(
                kind,
                mixed_precision=config.mixed_precision,
                jit=config.jit,
                multi_scale=config.multi_scale,
                replicas=self.engine.replicas,
                backend=self.engine.backend,
                bfloat16=self.engine.bfloat16,
            )
            for reason in plan.reasons:
                logger.info(reason)
            # bfloat16 by default is checked on the run's first step (precision.first_step_check).
            self.first_step_policy = plan.mixed_policy if plan.check_mixed_precision else None
            mixed_precision, jit = precision.run_checks(plan, self.check_model, self.first_inputs)
            config = self.config = dataclasses.replace(config, mixed_precision=mixed_precision, jit=jit)
            mixed_policy = plan.mixed_policy
        if config.resume and config.dtype_policy and config.dtype_policy.startswith("mixed_"):
            mixed_policy = config.dtype_policy  # as the run started
        precision.apply_policy(config.mixed_precision, mixed_policy)
        if planned:
            config = self.config = dataclasses.replace(config, dtype_policy=keras.config.dtype_policy().name)
            if self.chief:
                _write_args_json(dataclasses.replace(config, weights=self.weights_as_given))

    def choose_batch_size(self) -> None:
        """`--batch-size auto`: the largest global batch up to the default whose step fits each device.

        Measured with every layer trainable (the stage that needs the most)
        under the run's precision (`training.batch_fit`); args.json records
        the batch chosen.
        """
        config = self.config
        if config.batch_size != "auto":
            return
        replicas = self.engine.replicas
        budget_given = config.memory_budget is not None
        budget = int(
            config.memory_budget * 2**30 if budget_given else memory.device_memory_bytes() * batch_fit.DEFAULT_MARGIN
        )
        model = self.check_model()
        model.compile(optimizer=make_optimizer(config, config.lr1, 0, 1), loss=totalloss, jit_compile=bool(config.jit))
        one_image = self.first_inputs(per_device=1, largest=True)
        started = time.perf_counter()
        fit = batch_fit.largest_fitting_batch(
            lambda size: memory.training_step_bytes(model, _repeated(one_image, size)),
            budget,
            most=batch_fit.auto_ceiling(len(self.train_annotations), replicas, DEFAULT_BATCH_SIZE),
        )
        logger.info(
            "%s (%d sizes measured in %.1f s)",
            batch_fit.describe(fit, replicas, budget_given, len(self.train_annotations)),
            len(fit.measured),
            time.perf_counter() - started,
        )
        logger.debug("--batch-size auto: step bytes by images per device: %s", fit.measured)
        batch = fit.per_device * replicas
        config = self.config = dataclasses.replace(config, batch_size=batch)
        self.batch_sizes = [batch, config.batch_size2 or batch]
        if self.chief:
            _write_args_json(dataclasses.replace(config, weights=self.weights_as_given))

    def precision_callbacks(self) -> list:
        """The first-step check of a run on bfloat16 by default (`precision.first_step_check`), else nothing."""
        policy = getattr(self, "first_step_policy", None)
        if policy != "mixed_bfloat16" or not self.config.mixed_precision:
            return []
        return [precision.first_step_check(policy)]

    def start_weights(self) -> list:
        """The seeded start weights of a new run (and --weights), built once."""
        if getattr(self, "_start_weights", None) is None:
            self._start_weights = _initial_weights(self.config, self.anchors, len(self.class_names), self.kind)
        return self._start_weights

    def model_settings(self) -> dict:
        """`create_model`'s arguments for this run, but `freeze_body` and `sync_bn`."""
        config = self.config
        return dict(
            # Multi-scale: one model for every training size (validation keeps --input-size).
            input_shape=(None, None) if config.multi_scale else config.input_shape,
            anchors=self.anchors,
            num_classes=len(self.class_names),
            # As many true boxes per scale as the targets can hold: exact, static shapes, less memory.
            max_true_boxes=_target_cells_bound(self.iou_thresh, self.masks),
            masks=self.masks,
            model=self.kind,
            box_loss=config.box_loss,
            ciou_weight=config.ciou_weight,
            # The HSV jitter, the scaling to float and the targets run in the step (data/device_side.py).
            device_inputs=True,
            iou_thresh=self.iou_thresh,
        )

    def check_model(self):
        """A training model on the default device from the start weights, for the start-up checks."""
        body, train_model = create_model(freeze_body=0, **self.model_settings())
        body.set_weights(self.start_weights())
        return train_model

    def host_batches(self, batch_size: int):
        """The training stream's batches of `batch_size` from its start, made on the host alone (`data.host`)."""
        config = self.config
        return HostBatches(
            self.train_annotations,
            config.input_shape,
            len(self.class_names),
            batch_size,
            training=True,
            augment=config.augment,
            seed=config.seed,
            max_boxes=MAX_BOXES,
            multi_scale=config.multi_scale,
            mosaic=config.mosaic,
        )

    def first_inputs(self, per_device: int | None = None, largest: bool = False):
        """One replica's first training batch as model inputs, for the start-up checks (`data.streams.first_batch`).

        `per_device`: its images (default: the run's; one while the batch is
        still "auto"); `largest`: at the largest training size (multi-scale's top).
        """
        if per_device is None:
            per_device = max(1, (self.batch_sizes[0] or self.engine.replicas) // self.engine.replicas)
        batch = self.host_batches(per_device).batch(0)
        inputs = {"image": batch.images, "boxes": batch.boxes, "hsv": batch.hsv.astype("float32")}
        if largest and self.config.multi_scale:
            top = max(self.config.multi_scale)
            inputs["image"] = np.zeros((per_device, top, top, inputs["image"].shape[-1]), inputs["image"].dtype)
        return inputs

    def build_models(self, freeze_body: int) -> None:
        """The template body and its training model under the strategy; a new run's start weights in it.

        A resumed run takes every weight from its backup later (`fit_stage`).
        """
        initial_weights = self.start_weights() if self.state is None else None
        with self.engine.strategy.scope():
            self.body, train_model = create_model(
                freeze_body=freeze_body, sync_bn=self.engine.sync_bn, **self.model_settings()
            )
            if initial_weights is not None:
                self.body.set_weights(initial_weights)
                # The variables hold them now: one copy of every weight less for the whole run.
                self._start_weights = None
            self.fit_model = self.engine.wrap(train_model)
        if self.config.strategy == "multiworker":
            # Two Keras 3.15 bugs with the collective strategy, see keras_compat.py.
            patch_multiworker_first_batch_build(self.fit_model)
            patch_multiworker_log_reduction()

    def make_callbacks(self) -> None:
        """The recipe's callbacks and those both stages share (throughput, CSV, plot, TensorBoard, checkpoints)."""
        run_dir = self.run_dir
        self.recipe = RecipeCallbacks(self)
        self.throughput = Throughput(self.batch_sizes[0])
        self.common_callbacks = [
            StopOnInterrupt(),
            self.throughput,
            # Append: both stages (and a resumed run) add rows to one file; a new run starts in an empty folder.
            HistoryCSVLogger(self.history_csv, self.recipe.required_columns, append=True),
            RunPictures(
                self.history_csv,
                run_dir,
                partial(write_data_pictures, self) if self.chief and self.config.pictures else None,
                results=self.config.pictures,
            ),
            *_tensorboard(run_dir),
            *epoch_checkpoints(self),
        ]


def _repeated(inputs: dict, size: int) -> dict:
    """`inputs` (one image's) repeated to `size` images: a batch of the shapes a step of `size` takes."""
    return {name: np.repeat(array, size, axis=0) for name, array in inputs.items()}


def _tensorboard(run_dir: str) -> list:
    """The epoch curves for TensorBoard, where its package is installed (the same curves are in history.csv)."""
    if not event_pb2.available:
        logger.info("no TensorBoard logs: the tensorboard package is not installed (pip install tensorboard)")
        return []
    return [EpochTensorBoard(os.path.join(run_dir, "tensorboard"))]
