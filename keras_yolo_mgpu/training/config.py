"""The configuration of a training run: `TrainConfig`, its validation and its args.json form, and `TrainResult`."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

from keras_yolo_mgpu.model.architectures import model_name

# The fraction of the training images held out for validation where no validation split is given.
DEFAULT_VAL_SPLIT = 0.1

# JAX input feeds (TrainConfig.feed).
FEEDS = ("auto", "threads", "processes")
# The global batch of a run that names none (keras-yolo3's), and the largest `--batch-size auto` takes: the
# learning rates are set for it, and a batch that grew with the device count would train another recipe.
DEFAULT_BATCH_SIZE = 32


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs; `train.py` flags map onto these 1:1.

    Frozen: resolved once (`cli.train.config_for`); what the run itself
    settles (a drawn seed, the backend, the precision checks) makes a new
    config (`dataclasses.replace`), which args.json records.
    """

    # A keras-yolo3 annotation file, or (`data`) a dataset of any kind; `classes` may be left out when it names them.
    annotations: str | None = None
    classes: str | None = None
    data: str | None = None
    image_dir: str | None = None
    anchors: str | None = None
    tiny: bool = False
    # One of model.architectures.MODEL_NAMES; None: the start weights' kind, else YOLOv3 (tiny with `tiny`).
    model: str | None = None
    # Anchor indices per output scale, coarsest first; None: the start weights' metadata's, else keras-yolo3's.
    masks: list | None = None
    input_shape: tuple[int, int] = (416, 416)
    weights: str | None = None
    # Darknet cfg of Darknet `.weights` start weights (weights/start_weights.py).
    cfg: str | None = None
    weights_partial: bool = False
    val_annotations: str | None = None
    val_split: float = DEFAULT_VAL_SPLIT
    # The global batch, or "auto": the largest up to DEFAULT_BATCH_SIZE that fits each device's memory
    # (`training.batch_fit`), recorded.
    batch_size: int | str = DEFAULT_BATCH_SIZE
    # GiB per device `batch_size="auto"` fits into; None: `batch_fit.DEFAULT_MARGIN` of the device's memory.
    memory_budget: float | None = None
    batch_size2: int | None = None
    freeze_epochs: int = 50
    epochs: int = 100
    # Stage 0 (keras-yolo3's train_bottleneck.py): epochs of the output convolutions alone on the
    # body's features, before stage 1 (training/bottleneck.py); 0: none.
    bottleneck_epochs: int = 0
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
    # Keras's backend the run trains on, "tensorflow" or "jax", recorded by `train`: a resumed run continues on it.
    backend: str | None = None
    # None: the device's default (training/precision.py), checked at start-up; args.json records what ran.
    mixed_precision: bool | None = None
    jit: bool | None = None
    # The dtype policy the run trains under, as the start-up checks leave it ("mixed_bfloat16", ...).
    dtype_policy: str | None = None
    resume: bool = False
    # A new run in a folder that holds an earlier one deletes that run's files first (run_folder.RUN_OUTPUTS).
    overwrite: bool = False
    strict: bool = False
    cache: str | None = None
    # JAX's input feed: worker "threads" or "processes", `workers` of them (None: one per core);
    # "auto": chosen by `data.streams.choose_feed`, recorded as chosen.
    feed: str = "auto"
    workers: int | None = None
    # The folder of the records of what was read and scanned (data/scan.py); None: the user's cache folder.
    scan_cache: str | None = None
    steps_per_epoch: int | None = None
    reduce_lr_patience: int = 3
    early_stopping_patience: int = 10
    verbose: int = 1
    # The modern recipe's options (training/recipe_options.py); defaults: keras-yolo3's.
    eval_every: int = 0
    monitor: str = "val_loss"
    lr_schedule: str = "plateau"
    warmup_epochs: float = 0.0
    ema: float = 0.0
    multi_scale: tuple[int, int] | None = None
    mosaic: float = 0.0
    # Objectness the output convolutions not loaded from `weights` start at; 0: keras-yolo3's zero bias (0.5).
    objectness_prior: float = 0.0
    # "yolov3" or "ciou" (model.architectures.BOX_LOSSES); None: the model's own.
    box_loss: str | None = None
    # Weight of the CIoU term; None: the model's (Architecture.ciou_weight).
    ciou_weight: float | None = None
    # Darknet's `iou_thresh`: a box also trains every other anchor of its masks with IoU above it;
    # 1.0: its best anchor only (keras-yolo3); None: the model's (Architecture.iou_thresh).
    iou_thresh: float | None = None
    # The run's pictures (training.pictures).
    pictures: bool = True
    # The named recipe the values came from (training/named_recipes.py); an args.json without one: keras-yolo3's.
    recipe: str = "keras-yolo3"
    # Epoch checkpoints besides best and last (training/checkpoint_policy.py).
    save_period: int | None = None
    # EarlyStopping of a one-stage run with nothing frozen: evaluations without an improvement of `monitor`.
    # None or 0: every epoch runs (a two-stage run's stage 2 keeps `early_stopping_patience`, keras-yolo3's).
    patience: int | None = None

    def validate(self) -> None:
        """Raises ValueError naming the bad setting; checks nothing on disk."""
        if bool(self.data) == bool(self.annotations):
            raise ValueError("give one of data (a dataset of any kind) or annotations (a keras-yolo3 file)")
        if self.epochs < 1 or self.freeze_epochs < 0 or self.freeze_epochs > self.epochs:
            raise ValueError(
                f"need 0 <= freeze_epochs <= epochs and epochs >= 1. "
                f"Received: freeze_epochs={self.freeze_epochs}, epochs={self.epochs}"
            )
        if self.bottleneck_epochs < 0:
            raise ValueError(f"bottleneck_epochs must be >= 0. Received: bottleneck_epochs={self.bottleneck_epochs}")
        if self.patience is not None and self.patience < 0:
            raise ValueError(f"patience must be >= 0 (0: never stop early). Received: patience={self.patience}")
        if self.memory_budget is not None and not self.memory_budget > 0:
            raise ValueError(f"memory_budget must be > 0 GiB. Received: memory_budget={self.memory_budget}")
        for name in ("batch_size", "batch_size2", "steps_per_epoch", "gpus"):
            value = getattr(self, name)
            if name == "batch_size" and value == "auto":
                continue
            if isinstance(value, str):
                allowed = "a positive integer or 'auto'" if name == "batch_size" else "a positive integer"
                raise ValueError(f"{name} must be {allowed}. Received: {name}={value!r}")
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1. Received: {name}={value}")
        if self.feed not in FEEDS:
            raise ValueError(f"feed must be one of {FEEDS}. Received: feed={self.feed!r}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be >= 1. Received: workers={self.workers}")
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
        model_name(self.model, self.tiny)  # raises on an unknown or contradicting choice
        if self.simulate_devices and self.strategy == "multiworker" and not self.gpus:
            raise ValueError("simulate_devices with multiworker needs gpus (devices per worker)")
        # Imported here: both import Keras, and the commands import this module before they set TensorFlow's logging.
        from keras_yolo_mgpu.training.checkpoint_policy import validate_save_period
        from keras_yolo_mgpu.training.recipe_options import validate_recipe

        validate_recipe(self)
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
        # A run saved without iou_thresh trained each box's best anchor only; resuming keeps that.
        values.setdefault("iou_thresh", 1.0)
        values.setdefault("backend", "tensorflow")
        return cls(**values)


@dataclass
class TrainResult:
    """What a finished run left: its folder, its weights files and its history.

    `final_weights` holds the last epoch's weights; `best_weights` the epoch
    best by `monitor` (None when the run wrote no best.weights.h5), which is
    `best_epoch` (numbered from 1, over every stage and every resumed
    process) with `best_value`. `history` holds history.csv's columns, every
    epoch of the run (resumed ones too), NaN where an epoch has no value.
    """

    log_dir: str
    final_weights: str
    history: dict[str, list[float]] = field(default_factory=dict)
    epochs_run: int = 0
    replicas: int = 1
    best_weights: str | None = None
    monitor: str = "val_loss"
    best_epoch: int | None = None
    best_value: float | None = None


def draw_seed() -> int:
    """A fresh seed for a run started without one (recorded in args.json)."""
    return int.from_bytes(os.urandom(4), "little") % (2**31)
