"""The training recipe: keras-yolo3's two stages on one or several devices.

Stage 1 trains with the body frozen (`freeze_body`), stage 2 unfreezes
everything with a lower learning rate, ReduceLROnPlateau and EarlyStopping.
Each run writes into one log directory: `args.json`, best checkpoints of the
template (single-device) weights, `best.weights.h5`, `last.weights.h5`,
`history.csv`, `loss.png`, TensorBoard logs,
`trained_weights_final.weights.h5` and the pictures of `training.pictures`. The modern recipe's options (validation
mAP, monitor, schedules, EMA, multi-scale, mosaic) are assembled by
`training.recipe`; their defaults are keras-yolo3's recipe.

Reproducibility: `seed` seeds every random draw of the run (the initial
weights, the validation split, the data order and augmentation). The
initial weights are built once, outside any strategy, and copied into the
model the strategy builds, so they do not depend on the device count.

Stream and resume: the training data is one stream over both stages; each
epoch reads the next `steps * global_batch` images of it. At every epoch
end `run_state.RunStateCheckpoint` saves the model, the optimizer, the
callbacks' counters and the stream position; `resume=True` continues from
there and ends with the weights of the uninterrupted run.

Devices: `parallel="strategy"` (default) uses MirroredStrategy over the
selected GPUs (or MultiWorkerMirroredStrategy), `parallel="multi_gpu_model"`
the in-graph replica model. Either way the global batch must divide by the
number of replicas, so that every replica sees the same batch size.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import partial

import numpy as np

logger = logging.getLogger(__name__)

FINAL_WEIGHTS = "trained_weights_final.weights.h5"
# Boxes kept per training image (keras-yolo3's max_boxes).
MAX_BOXES = 20
STAGE1_WEIGHTS = "trained_weights_stage_1.weights.h5"
CHECKPOINT_PATTERN = "ep{epoch:03d}-loss{loss:.3f}-val_loss{val_loss:.3f}.weights.h5"
CHECKPOINT_PATTERN_NO_VAL = "ep{epoch:03d}-loss{loss:.3f}.weights.h5"
CHECKPOINT_PATTERN_MAP = "ep{epoch:03d}-loss{loss:.3f}-val_mAP{val_mAP:.3f}.weights.h5"


@dataclass
class TrainConfig:
    """Everything a training run needs; `train.py` flags map onto these 1:1."""

    # A keras-yolo3 annotation file, or (`data`) a dataset of any kind
    # data.dataset_source reads; `classes` may be left out when it names them.
    annotations: str | None = None
    classes: str | None = None
    data: str | None = None
    image_dir: str | None = None
    anchors: str | None = None
    tiny: bool = False
    # Network, one of model.architectures.MODEL_NAMES; None: the start
    # weights' kind, else YOLOv3 (tiny YOLOv3 with `tiny` or 6 anchors).
    model: str | None = None
    # Anchor indices per output scale, coarsest first; None: keras-yolo3's
    # (or those stored in the start weights' metadata).
    masks: list | None = None
    input_shape: tuple[int, int] = (416, 416)
    weights: str | None = None
    # Darknet cfg of Darknet `.weights` start weights (weights/start_weights.py).
    cfg: str | None = None
    weights_partial: bool = False
    val_annotations: str | None = None
    val_split: float = 0.1
    batch_size: int = 32
    batch_size2: int | None = None
    freeze_epochs: int = 50
    epochs: int = 100
    freeze_body: int = 2
    optimizer: str = "adam"
    lr1: float = 1e-3
    lr2: float = 1e-4
    # None: `train` draws one and records it in args.json.
    seed: int | None = None
    augment: bool = True
    log_dir: str = "logs/000"
    gpus: int | None = None
    simulate_devices: bool = False
    strategy: str = "mirrored"
    parallel: str = "strategy"
    sync_bn: bool = True
    # None: the device's default (training/precision.py: on for GPUs, off
    # for the CPU), checked at start-up; args.json records what ran.
    mixed_precision: bool | None = None
    jit: bool | None = None
    resume: bool = False
    strict: bool = False
    cache: str | None = None
    steps_per_epoch: int | None = None
    reduce_lr_patience: int = 3
    early_stopping_patience: int = 10
    verbose: int = 1
    # The modern recipe's options (training/recipe.py); defaults: keras-yolo3's.
    eval_every: int = 0
    monitor: str = "val_loss"
    lr_schedule: str = "plateau"
    warmup_epochs: float = 0.0
    ema: float = 0.0
    multi_scale: tuple[int, int] | None = None
    mosaic: float = 0.0
    # Objectness probability the output convolutions start from where they
    # are not loaded from `weights` (model.yolo3.set_objectness_prior); 0
    # keeps keras-yolo3's zero bias (every cell starts at 0.5).
    objectness_prior: float = 0.0
    # "yolov3" or "ciou" (model.architectures.BOX_LOSSES); None: the model's own.
    box_loss: str | None = None
    # Weight of the CIoU term; None: the model's (Architecture.ciou_weight).
    ciou_weight: float | None = None
    # Darknet's `iou_thresh` for the targets: a box also trains every other
    # anchor of its masks with IoU above it (model.targets); 1.0: its best
    # anchor only (keras-yolo3); None: the model's (Architecture.iou_thresh).
    iou_thresh: float | None = None
    # The run's pictures (training.pictures): labels.jpg, train_batch*.jpg,
    # results.png, val_pred.jpg.
    pictures: bool = True
    # The named recipe the values came from (training/recipes.py); a run
    # folder from before recipes existed resumes as keras-yolo3's.
    recipe: str = "keras-yolo3"
    # Periodic checkpoints (training/checkpoint_policy.py): None writes
    # keras-yolo3's ep*.weights.h5 at every improvement, 0 none (best and
    # last only), N every Nth epoch.
    save_period: int | None = None

    def validate(self) -> None:
        """Raises ValueError naming the bad setting; checks nothing on disk."""
        if bool(self.data) == bool(self.annotations):
            raise ValueError("give one of data (a dataset of any kind) or annotations (a keras-yolo3 file)")
        if self.epochs < 1 or self.freeze_epochs < 0 or self.freeze_epochs > self.epochs:
            raise ValueError(
                f"need 0 <= freeze_epochs <= epochs and epochs >= 1. "
                f"Received: freeze_epochs={self.freeze_epochs}, epochs={self.epochs}"
            )
        for name in ("batch_size", "batch_size2", "steps_per_epoch", "gpus"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1. Received: {name}={value}")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd'. Received: optimizer={self.optimizer!r}")
        if self.parallel not in ("strategy", "multi_gpu_model"):
            raise ValueError(f"parallel must be 'strategy' or 'multi_gpu_model'. Received: parallel={self.parallel!r}")
        if self.strategy not in ("mirrored", "multiworker"):
            raise ValueError(f"strategy must be 'mirrored' or 'multiworker'. Received: strategy={self.strategy!r}")
        if self.parallel == "multi_gpu_model" and self.strategy == "multiworker":
            raise ValueError("multi_gpu_model replicates inside one process; use it with strategy='mirrored'")
        if not 0.0 <= self.val_split < 1.0:
            raise ValueError(f"val_split must be in [0, 1). Received: val_split={self.val_split}")
        if self.freeze_body not in (0, 1, 2):
            raise ValueError(f"freeze_body must be 0, 1 or 2. Received: freeze_body={self.freeze_body}")
        from keras_yolo_mgpu.model.architectures import model_name

        model_name(self.model, self.tiny)  # raises on an unknown or contradicting choice
        if self.simulate_devices and self.strategy == "multiworker" and not self.gpus:
            raise ValueError("simulate_devices with multiworker needs gpus (devices per worker)")
        from keras_yolo_mgpu.training.recipe import validate_recipe

        validate_recipe(self)
        from keras_yolo_mgpu.training.checkpoint_policy import validate_save_period

        validate_save_period(self.save_period)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        values = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"args.json has unknown settings {unknown}")
        for key in ("input_shape", "multi_scale"):
            if values.get(key) is not None:
                values[key] = tuple(values[key])
        # A run saved before --iou-thresh existed trained each box's best
        # anchor only, whatever its model's default is now; resuming keeps that.
        values.setdefault("iou_thresh", 1.0)
        return cls(**values)


@dataclass
class TrainResult:
    log_dir: str
    final_weights: str
    history: dict[str, list[float]] = field(default_factory=dict)
    epochs_run: int = 0
    replicas: int = 1


def _target_cells_bound(iou_thresh: float | None, masks) -> int:
    """The most target cells one image can fill at one scale: a box fills one per anchor it is assigned to."""
    return MAX_BOXES if iou_thresh is None else MAX_BOXES * max(len(mask) for mask in masks)


def _model_settings(config: TrainConfig, class_names: list[str] | None = None):
    """Class names, anchors and masks of a run.

    Classes are always the dataset's (`class_names`, default `config.classes`): training new
    classes from pretrained weights is the usual case. Anchors and masks
    come from the flags, else from the start weights' metadata (a converted
    or trained file knows them), else the defaults. Start weights of another
    model kind (tiny vs full) are an error naming both; other anchor values
    or masks than the start weights' are allowed (keras-yolo3 users train
    k-means anchors from COCO weights) with a warning.

    Returns:
        `(class_names, anchors (N, 2), masks, kind)`, `kind` one of
        `model.architectures.MODEL_NAMES`.
    """
    from keras_yolo_mgpu.model.architectures import get_architecture, model_name
    from keras_yolo_mgpu.model.boxes import resolve_masks
    from keras_yolo_mgpu.resources import get_anchors, get_classes, resolve_resource
    from keras_yolo_mgpu.weights.metadata import MetadataError, read_metadata

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


def _prepare_log_dir(config: TrainConfig) -> None:
    args_path = os.path.join(config.log_dir, "args.json")
    if config.resume:
        if not os.path.isfile(args_path):
            raise FileNotFoundError(f"--resume: {args_path} not found; nothing to resume in {config.log_dir}")
        return
    if os.path.isdir(config.log_dir) and os.listdir(config.log_dir):
        raise FileExistsError(
            f"log dir {config.log_dir} already holds a run. Pass --resume to continue it, "
            "or choose another --log-dir (nothing was changed)."
        )
    os.makedirs(config.log_dir, exist_ok=True)
    with open(args_path, "w", encoding="utf-8") as handle:
        handle.write(config.to_json() + "\n")


def _write_args_json(config: TrainConfig) -> None:
    from keras_yolo_mgpu.fileio import atomic_write

    def write(temporary):
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(config.to_json() + "\n")

    atomic_write(os.path.join(config.log_dir, "args.json"), write)


def draw_seed() -> int:
    """A fresh seed for a run started without one (recorded in args.json)."""
    return int.from_bytes(os.urandom(4), "little") % (2**31)


def train(config: TrainConfig) -> TrainResult:
    """Runs both stages; see the module docstring for what is written."""
    config.validate()
    if config.seed is None:
        config.seed = draw_seed()
        logger.info(
            "seed %d (drawn; recorded in args.json: pass --seed %d to repeat the run)", config.seed, config.seed
        )
    from keras_yolo_mgpu.parallel.engine import build_engine

    engine = build_engine(
        config.gpus,
        simulate=config.simulate_devices,
        strategy=config.strategy,
        parallel=config.parallel,
        sync_bn=config.sync_bn,
    )  # before any TF op
    from keras.src.backend.common import global_state

    # The dtype policy is process-global: a mixed-precision run must not
    # leave it set for whatever the process builds next (nor pin it to this
    # run's floatx, which Keras does when a layer first asks for it).
    previous_policy = global_state.get_global_attribute("dtype_policy", None)
    # A new run that stops before its first epoch ends (refused weights, bad
    # data) takes the folder it created with it: no empty run is left behind.
    new_folder = not config.resume and not (os.path.isdir(config.log_dir) and os.listdir(config.log_dir))
    try:
        return _TrainingRun(config, engine).run()
    except BaseException:
        if new_folder:
            _remove_unstarted_run(config.log_dir)
        raise
    finally:
        global_state.set_global_attribute("dtype_policy", previous_policy)


def _remove_unstarted_run(log_dir: str) -> None:
    """Deletes `log_dir` unless an epoch finished there (its run state is then what --resume continues)."""
    from keras_yolo_mgpu.training.run_state import RUN_STATE_FILE

    if os.path.isdir(log_dir) and not os.path.isfile(os.path.join(log_dir, RUN_STATE_FILE)):
        shutil.rmtree(log_dir, ignore_errors=True)
        logger.info("removed %s: the run stopped before its first epoch ended", log_dir)


def _initial_weights(config: TrainConfig, anchors, num_classes: int, kind: str | None = None) -> list:
    """The run's start weights: seeded init, then `config.weights`, built outside any strategy.

    Built once, identically whatever the device count or strategy (the
    strategy's model then receives these values), so `seed` alone decides
    them. Raises ValueError when `config.weights` does not fit the model,
    naming the layers, unless `config.weights_partial`.
    """
    import keras

    from keras_yolo_mgpu.model.yolo3 import build_body
    from keras_yolo_mgpu.weights.loading import WeightsMismatchError, load_weights

    keras.utils.set_random_seed(config.seed)
    template = build_body(anchors, num_classes, model=kind)
    if config.weights:
        try:
            report = load_weights(
                template, config.weights, skip_mismatch=config.weights_partial, allow_new_classes=True
            )
        except WeightsMismatchError as error:
            raise ValueError(
                f"{error} Nothing was trained. To start anyway from the layers that do match, leaving the others "
                "at their random initial values, pass --weights-partial (TrainConfig.weights_partial)."
            ) from None
        kept = [s.layer for s in report.skipped if not s.layer.startswith("yolo_output_")]
        if kept:
            logger.warning(
                "--weights-partial: %d layer(s) start from random values, not from %s: %s%s",
                len(kept),
                config.weights,
                ", ".join(kept[:5]),
                "" if len(kept) <= 5 else f" and {len(kept) - 5} more",
            )
    if config.objectness_prior:
        from keras_yolo_mgpu.model.yolo3 import set_objectness_prior

        # Only output convolutions that start from their initialiser: the
        # loaded ones keep what they learned.
        fresh = None if not config.weights else {s.layer for s in report.skipped}
        set_objectness_prior(template, num_classes, config.objectness_prior, layer_names=fresh)
    weights = template.get_weights()
    del template
    return weights


def _trim_history(history_csv: str, epochs_done: int) -> None:
    """Drops rows of epochs a resumed run repeats (finished after the last saved state)."""
    import csv

    if not os.path.isfile(history_csv):
        return
    with open(history_csv, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows or "epoch" not in rows[0]:
        return
    column = rows[0].index("epoch")
    kept = [rows[0]]
    for row in rows[1:]:
        try:
            # Epochs are numbered from 1: the rows 1..epochs_done are the saved state's.
            complete = len(row) == len(rows[0]) and int(row[column]) <= epochs_done
        except ValueError:  # a row cut short by the kill
            complete = False
        if complete:
            kept.append(row)
    if len(kept) == len(rows):
        return
    from keras_yolo_mgpu.fileio import atomic_write

    def write(temporary):
        with open(temporary, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(kept)

    atomic_write(history_csv, write)


def _check_batch_sizes(batch_sizes: list[int], replicas: int) -> None:
    """Raises ValueError, suggesting sizes that fit, unless every batch divides over the replicas."""
    for batch in batch_sizes:
        if batch % replicas:
            raise ValueError(
                f"global batch size {batch} does not divide over {replicas} replicas; every replica must get "
                f"the same batch. Use a multiple of {replicas}, e.g. {max(replicas, batch - batch % replicas)} or "
                f"{batch + replicas - batch % replicas}."
            )


def _extend_history(history: dict[str, list[float]], stage_history: dict[str, list[float]]) -> None:
    """Appends one stage's `fit` history to the run's."""
    for key, values in stage_history.items():
        history.setdefault(key, []).extend(values)


class _TrainingRun:
    """One run of both stages on a built engine, as named steps; `run` calls them in order.

    The steps fill in, in this order: `state` (the `run_state.RunState` a
    resumed run continues, else None), the model settings (`class_names`,
    `anchors` (N, 2), `masks`, `kind`, `metadata`), the checked
    `train_annotations` / `val_annotations`, the models (`body`, the
    single-device template that every saved file holds, and `fit_model`,
    what `fit` runs on the engine), and the callbacks (`recipe`,
    `common_callbacks`, both stages').
    """

    def __init__(self, config: TrainConfig, engine):
        from keras_yolo_mgpu.parallel.engine import is_chief

        self.config = config
        self.engine = engine
        # Global batch of stage 1 and of stage 2.
        self.batch_sizes = [config.batch_size, config.batch_size2 or config.batch_size]
        _check_batch_sizes(self.batch_sizes, engine.replicas)
        self.chief = is_chief(engine.strategy)
        # Non-chief multi-worker processes write their logs to a scratch folder.
        self.run_dir = config.log_dir if self.chief else tempfile.mkdtemp(prefix="yolo_worker_")
        self.history_csv = os.path.join(self.run_dir, "history.csv")

    def run(self) -> TrainResult:
        """Runs every step: log dir, data, model, callbacks, the two stages, the final weights."""
        self.state = self.open_log_dir()
        self.read_settings_and_data()
        self.choose_precision_and_jit()
        # Whether stage 1 (frozen body) still has epochs to run.
        stage1_left = self.config.freeze_epochs > 0 and (self.state is None or self.state.stage == 1)
        self.build_models(freeze_body=self.config.freeze_body if stage1_left else 0)
        self.make_callbacks()
        history: dict[str, list[float]] = {}
        last = self.state
        epoch = last.epoch if last else 0
        position = last.stream_position if last else 0
        if stage1_left:
            stage_history, last = self.run_stage1(epoch, position)
            _extend_history(history, stage_history)
            epoch, position = last.epoch, last.stream_position
        stage_history, last = self.run_stage2(epoch, position, last)
        _extend_history(history, stage_history)
        final_path = self.save_final_weights(last)
        if self.chief and self.config.pictures:
            from keras_yolo_mgpu.training.pictures import write_prediction_pictures

            write_prediction_pictures(self, final_path)
        return TrainResult(self.config.log_dir, final_path, history, self.epochs_run(history), self.engine.replicas)

    def open_log_dir(self):
        """Creates the run folder with args.json, or finds where a resumed run stands.

        A resumed run drops the files and history.csv rows of epochs after its
        last saved state. Returns that `RunState`, or None: a new run, or a
        resumed one killed before its first epoch ended (it starts over, as it
        began).
        """
        from keras_yolo_mgpu.training import run_state

        config = self.config
        if self.chief:
            _prepare_log_dir(config)
        state = run_state.read_run_state(config.log_dir) if config.resume else None
        if state is not None and state.finished:
            raise ValueError(
                f"the run in {config.log_dir} already finished ({FINAL_WEIGHTS} is written); nothing to resume. "
                f"To train further, start a new run with --weights {os.path.join(config.log_dir, FINAL_WEIGHTS)}."
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
        from keras_yolo_mgpu.model.architectures import resolve_iou_thresh
        from keras_yolo_mgpu.training.anchor_fit import run_anchors
        from keras_yolo_mgpu.training.training_data import open_training_data
        from keras_yolo_mgpu.weights.metadata import make_metadata
        from keras_yolo_mgpu.weights.start_weights import resolve_start_weights

        config = self.config
        resolve_start_weights(config, self.run_dir)
        data = open_training_data(config)
        self.class_names, self.anchors, self.masks, self.kind = _model_settings(config, data.class_names)
        self.iou_thresh = resolve_iou_thresh(config.iou_thresh, self.kind)
        self.train_annotations, self.val_annotations = data.splits(self.run_dir)
        self.anchors = run_anchors(config, self.anchors, self.masks, self.train_annotations, self.run_dir)
        # Stored in every checkpoint, so a trained file alone is enough to detect with.
        self.metadata = make_metadata(self.anchors, self.class_names, config.input_shape, self.masks, kind=self.kind)
        logger.info(
            "%d training and %d validation images, %d classes, %d anchors, %d replica(s) on %s",
            len(self.train_annotations),
            len(self.val_annotations),
            len(self.class_names),
            len(self.anchors),
            self.engine.replicas,
            ", ".join(self.engine.devices) or "the cluster",
        )

    def choose_precision_and_jit(self) -> None:
        """Mixed precision and XLA: the device's defaults, checked on the first batch (training/precision.py).

        A resumed run keeps what its args.json records; a new one rewrites
        args.json with what passed the checks.
        """
        from keras_yolo_mgpu.training import precision

        config = self.config
        if not (config.resume and None not in (config.mixed_precision, config.jit)):
            kind = precision.training_device_kind(self.engine.devices)
            plan = precision.plan_settings(
                kind,
                mixed_precision=config.mixed_precision,
                jit=config.jit,
                multi_scale=config.multi_scale,
                replicas=self.engine.replicas,
            )
            for reason in plan.reasons:
                logger.info(reason)
            config.mixed_precision, config.jit = precision.run_checks(plan, self.check_model, self.first_inputs)
            if self.chief:
                _write_args_json(config)
        precision.apply_policy(config.mixed_precision)

    def start_weights(self) -> list:
        """The seeded start weights of a new run (and --weights), built once."""
        if getattr(self, "_start_weights", None) is None:
            self._start_weights = _initial_weights(self.config, self.anchors, len(self.class_names), self.kind)
        return self._start_weights

    def model_settings(self, jit: bool) -> dict:
        """`create_model`'s arguments for this run, but `freeze_body` and `sync_bn`."""
        config = self.config
        return dict(
            # Multi-scale: one model for every training size (validation keeps --input-size).
            input_shape=(None, None) if config.multi_scale else config.input_shape,
            anchors=self.anchors,
            num_classes=len(self.class_names),
            # XLA needs static shapes: gather at most as many true boxes per
            # scale as the pipeline's targets can hold, so the gather is exact.
            max_true_boxes=_target_cells_bound(self.iou_thresh, self.masks) if jit else None,
            masks=self.masks,
            model=self.kind,
            box_loss=config.box_loss,
            ciou_weight=config.ciou_weight,
        )

    def check_model(self):
        """A training model on the default device from the start weights, for the start-up checks."""
        from keras_yolo_mgpu.model.yolo3 import create_model

        body, train_model = create_model(freeze_body=0, **self.model_settings(jit=True))
        body.set_weights(self.start_weights())
        return train_model

    def first_inputs(self):
        """The model inputs of one replica's first training batch (for the start-up checks)."""
        from keras_yolo_mgpu.data.pipeline import make_dataset

        config = self.config
        batch = max(1, self.batch_sizes[0] // self.engine.replicas)
        dataset = make_dataset(
            self.train_annotations,
            config.input_shape,
            self.anchors,
            len(self.class_names),
            batch,
            training=True,
            augment=config.augment,
            seed=config.seed,
            max_boxes=MAX_BOXES,
            masks=self.masks,
            multi_scale=config.multi_scale,
            mosaic=config.mosaic,
            iou_thresh=self.iou_thresh,
        )
        return next(iter(dataset))[0]

    def build_models(self, freeze_body: int) -> None:
        """The template body and its training model under the strategy, with the run's start weights.

        A resumed run takes every weight from its backup later (`fit_stage`);
        a new one starts from the seeded template (and --weights), built once
        outside the strategy.
        """
        from keras_yolo_mgpu.keras_compat import patch_multiworker_first_batch_build, patch_multiworker_log_reduction
        from keras_yolo_mgpu.model.yolo3 import create_model

        config = self.config
        initial_weights = self.start_weights() if self.state is None else None
        with self.engine.strategy.scope():
            self.body, train_model = create_model(
                freeze_body=freeze_body, sync_bn=self.engine.sync_bn, **self.model_settings(config.jit)
            )
            if initial_weights is not None:
                self.body.set_weights(initial_weights)
            self.fit_model = self.engine.wrap(train_model)
        if config.strategy == "multiworker":
            # Two Keras 3.15 bugs with the collective strategy, see keras_compat.py.
            patch_multiworker_first_batch_build(self.fit_model)
            patch_multiworker_log_reduction()

    def make_callbacks(self) -> None:
        """The recipe's callbacks and those both stages share (throughput, CSV, plot, TensorBoard, checkpoints)."""
        import keras

        from keras_yolo_mgpu.training.callbacks import HistoryCSVLogger, Throughput
        from keras_yolo_mgpu.training.checkpoint_policy import epoch_checkpoints
        from keras_yolo_mgpu.training.pictures import RunPictures, write_data_pictures
        from keras_yolo_mgpu.training.recipe import RecipeCallbacks

        run_dir = self.run_dir
        self.recipe = RecipeCallbacks(
            self.config,
            self.body,
            run_dir,
            self.val_annotations,
            self.class_names,
            self.anchors,
            self.metadata,
            masks=self.masks,
            kind=self.kind,
        )
        checkpoint_pattern = CHECKPOINT_PATTERN if self.val_annotations else CHECKPOINT_PATTERN_NO_VAL
        if self.recipe.monitor in ("val_mAP", "val_mAP50"):
            checkpoint_pattern = CHECKPOINT_PATTERN_MAP
        self.throughput = Throughput(self.batch_sizes[0])
        self.common_callbacks = [
            self.throughput,
            # Append: both stages (and a resumed run) add rows to one file; a new
            # run always starts in an empty folder.
            HistoryCSVLogger(self.history_csv, self.recipe.required_columns, append=True),
            RunPictures(
                self.history_csv,
                run_dir,
                partial(write_data_pictures, self) if self.chief and self.config.pictures else None,
                results=self.config.pictures,
            ),
            keras.callbacks.TensorBoard(os.path.join(run_dir, "tensorboard"), write_graph=False),
            *epoch_checkpoints(self.config, self.recipe, run_dir, checkpoint_pattern, self.body, self.metadata),
        ]

    def datasets(self, batch: int, start_position: int):
        """`(train, validation or None, steps per epoch)` for a global `batch`, the stream from `start_position`."""
        from keras_yolo_mgpu.data.pipeline import distribute_training_dataset, make_dataset, steps_per_epoch

        config = self.config
        # Both sets encode their targets alike: input size, anchors, classes, global batch, masks.
        encoding = (config.input_shape, self.anchors, len(self.class_names), batch)
        shared = dict(
            seed=config.seed, cache=config.cache, max_boxes=MAX_BOXES, masks=self.masks, iou_thresh=self.iou_thresh
        )
        # Under MultiWorkerMirroredStrategy each worker reads only its share.
        train_ds = distribute_training_dataset(
            self.engine.strategy,
            self.train_annotations,
            *encoding,
            augment=config.augment,
            start_position=start_position,
            multi_scale=config.multi_scale,
            mosaic=config.mosaic,
            **shared,
        )
        val_ds = None
        if self.val_annotations:
            val_ds = make_dataset(self.val_annotations, *encoding, training=False, **shared)
        steps = config.steps_per_epoch or steps_per_epoch(len(self.train_annotations), batch)
        return train_ds, val_ds, steps

    def fit_stage(self, stage, learning_rate, batch, initial_epoch, end_epoch, extra_callbacks, position, restore):
        """One stage's `fit` from `initial_epoch` to `end_epoch`, reading the stream from `position`.

        `restore`: the RunState to continue (its backup weights and optimizer,
        its callbacks' counters), or None. Returns (history, last RunState).
        """
        from keras_yolo_mgpu.training import run_state
        from keras_yolo_mgpu.training.recipe import make_optimizer

        config, fit_model, recipe = self.config, self.fit_model, self.recipe
        train_ds, val_ds, steps = self.datasets(batch, position)
        self.throughput.global_batch_size = batch
        # Schedules count the optimizer's steps from the stage's first epoch
        # (a resumed stage restores the step count with the optimizer).
        stage_start = 0 if stage == 1 else config.freeze_epochs
        with self.engine.strategy.scope():
            fit_model.compile(
                optimizer=make_optimizer(config, learning_rate, stage_start, steps),
                loss=_totalloss(),
                jit_compile=bool(config.jit),
            )
            if restore is not None and restore.weights_kind == "fit":
                run_state.restore_fit_weights(fit_model, os.path.join(config.log_dir, restore.weights))
        # The recipe's best/last checkpoints before the stage's own callbacks:
        # their positions (the keys of their saved counters) are then the same in both stages.
        tracked = [*self.common_callbacks, *recipe.checkpoints, *extra_callbacks]
        saver = run_state.RunStateCheckpoint(
            self.run_dir,
            stage=stage,
            initial_epoch=initial_epoch,
            start_position=position,
            images_per_epoch=steps * batch,
            tracked=tracked,
            restore=restore.callbacks if restore is not None else None,
        )
        if initial_epoch >= end_epoch:  # a resumed stage whose last epoch was done
            return {}, restore
        logger.info(
            "stage %d: epochs %d-%d, lr %g, global batch %d (%d per replica), %d steps/epoch, %d trainable weights",
            stage,
            initial_epoch + 1,
            end_epoch,
            learning_rate,
            batch,
            batch // self.engine.replicas,
            steps,
            len(fit_model.trainable_weights),
        )
        result = fit_model.fit(
            train_ds,
            steps_per_epoch=steps,
            validation_data=val_ds,
            epochs=end_epoch,
            initial_epoch=initial_epoch,
            callbacks=[*recipe.first(learning_rate, stage_start, steps), *tracked, *recipe.last(), saver],
            verbose=config.verbose,
        )
        return result.history, saver.last_state

    def run_stage1(self, epoch: int, position: int):
        """Stage 1 (frozen body) from `epoch` to `freeze_epochs`; saves the body as stage 2's start.

        Returns (history, the RunState stage 2 starts from).
        """
        from keras_yolo_mgpu.training import run_state
        from keras_yolo_mgpu.training.checkpoint import save_weights_atomic

        config = self.config
        stage_history, last = self.fit_stage(
            1, config.lr1, self.batch_sizes[0], epoch, config.freeze_epochs, [], position, self.state
        )
        # Stage 2 starts from stage 1's weights with a fresh optimizer, so
        # its starting point is the body's weights alone.
        stage2_start = run_state.RunState(
            stage=2,
            epoch=config.freeze_epochs,
            stream_position=last.stream_position,
            weights=STAGE1_WEIGHTS,
            weights_kind="body",
            callbacks=run_state.callback_states([*self.common_callbacks, *self.recipe.checkpoints]),
        )
        if self.chief:
            save_weights_atomic(self.body, os.path.join(config.log_dir, STAGE1_WEIGHTS), self.metadata)
            run_state.write_run_state(config.log_dir, stage2_start)
            run_state.remove_stale_files(config.log_dir, keep=None)
        return stage_history, stage2_start

    def run_stage2(self, epoch: int, position: int, last):
        """Stage 2 (every layer trainable) from `epoch` to `epochs`, with ReduceLROnPlateau and EarlyStopping.

        `last`: the RunState so far (None: none saved yet). Returns (history,
        the last RunState); nothing runs when the run has no stage 2 or a
        resumed one had stopped early.
        """
        from keras_yolo_mgpu.model.yolo3 import freeze_layers

        config = self.config
        # Stage 2 continues a saved state only on resume; after stage 1 in this
        # process its callbacks and weights are already where they should be.
        resume = self.state if self.state is not None and self.state.stage == 2 else None
        if config.epochs <= config.freeze_epochs or (resume is not None and resume.stopped):
            return {}, last
        freeze_layers(self.body, 0)
        if resume is not None and resume.weights_kind == "body":
            self.body.load_weights(os.path.join(config.log_dir, resume.weights))
        stage2_callbacks = self.recipe.plateau_callbacks(config.reduce_lr_patience, config.early_stopping_patience)
        return self.fit_stage(
            2, config.lr2, self.batch_sizes[1], epoch, config.epochs, stage2_callbacks, position, resume
        )

    def save_final_weights(self, last) -> str:
        """Writes the final template weights (chief), marks the run finished, removes the backups; returns the path.

        Every worker then waits for the others, so none exits while the chief saves.
        """
        from keras_yolo_mgpu.training import run_state
        from keras_yolo_mgpu.training.checkpoint import save_weights_atomic

        config = self.config
        final_path = os.path.join(config.log_dir, FINAL_WEIGHTS)
        if self.chief:
            save_weights_atomic(self.body, final_path, self.metadata)
            logger.info("final weights (single-device template): %s", final_path)
            if last is not None:
                # The backups served their purpose; the state stays, marked finished.
                run_state.write_run_state(config.log_dir, dataclasses.replace(last, weights=None, finished=True))
            run_state.remove_stale_files(config.log_dir, keep=None)
            try:
                os.rmdir(os.path.join(self.run_dir, run_state.BACKUP_DIR))
            except OSError:
                pass
        else:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        _wait_for_all_workers(self.engine.strategy)
        return final_path

    def epochs_run(self, history: dict[str, list[float]]) -> int:
        """Epochs the run has done in all its processes (history.csv), else in this one."""
        if self.chief and os.path.isfile(self.history_csv):
            from keras_yolo_mgpu.training.callbacks import read_history

            return len(read_history(self.history_csv).get("epoch", []))
        return len(history.get("loss", []))


def _wait_for_all_workers(strategy) -> None:
    """Multi-worker: one collective op, so no worker exits while the chief saves.

    A worker that exits early stops its heartbeats and the chief's
    coordination service then reports the whole cluster as crashed.
    """
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)


def _totalloss():
    from keras_yolo_mgpu.model.loss import totalloss

    return totalloss
