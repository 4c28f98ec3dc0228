"""`python train.py`: train YOLOv3 / tiny YOLOv3 on one or several GPUs.

Examples:
    python train.py --data my_dataset/data.yaml --weights model_data/yolo.weights.h5 --gpus 4
    python train.py --annotations train.txt --classes model_data/voc_classes.txt \
        --weights model_data/yolo.weights.h5 --gpus 4
    python train.py --resume logs/003
    python train.py --demo
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import logging
import os
import shlex
import sys
from collections.abc import Mapping, Sequence

from keras_yolo_mgpu.cli import args as cli
from keras_yolo_mgpu.cli.dataset_args import SCAN_CACHE_HELP
from keras_yolo_mgpu.cli.demo import main as demo_main
from keras_yolo_mgpu.cli.keras_yolo3_folder import apply_keras_yolo3_paths, is_keras_yolo3_folder
from keras_yolo_mgpu.cli.quiet import keras_backend_name
from keras_yolo_mgpu.cli.runner import CommandError, UsageError
from keras_yolo_mgpu.cli.script_settings import ScriptSettings, run_with_settings
from keras_yolo_mgpu.data.dataset_source import detect_kind
from keras_yolo_mgpu.data.multiscale import check_size_range
from keras_yolo_mgpu.model.architectures import BOX_LOSSES
from keras_yolo_mgpu.training.config import DEFAULT_BATCH_SIZE, DEFAULT_VAL_SPLIT, TrainConfig
from keras_yolo_mgpu.training.named_recipes import DEFAULT_RECIPE, RECIPE_FIELDS, RECIPES, resolve_recipe
from keras_yolo_mgpu.weights.download import DARKNET_SUFFIX, resolve_weights

logger = logging.getLogger("train")

START_HELP = """\
No --data given, and no keras-yolo3 train.txt in this folder. To train:
  1. Point --data at your dataset as it is: a YOLO-format data.yaml or folder (images/ + labels/),
     a COCO instances .json, a Pascal VOC folder (Annotations/ + JPEGImages/), or a keras-yolo3
     annotation file (then also --classes my_classes.txt)
  2. Check it:  python -m keras_yolo_mgpu.check_dataset --data my_dataset/data.yaml
  3. Train:     python train.py --data my_dataset/data.yaml [--weights W] [--gpus N]
Or run the built-in demo on generated data:  python train.py --demo  (or: make demo)"""


def next_log_dir(root: str = "logs") -> str:
    """First free `logs/NNN` folder, so runs never overwrite each other; says so when it is not the first."""
    index = 0
    while os.path.exists(os.path.join(root, f"{index:03d}")):
        index += 1
    chosen = os.path.join(root, f"{index:03d}")
    if index:
        earlier = (
            f"{root}/000 holds an earlier run"
            if index == 1
            else f"{root}/000 to {root}/{index - 1:03d} hold earlier runs"
        )
        logger.info(
            "run folder %s (%s; --log-dir chooses, and --log-dir %s/000 --overwrite writes over it as keras-yolo3 did)",
            chosen,
            earlier,
            root,
        )
    return chosen


def build_parser() -> cli.ArgumentParser:
    """train.py's flags, in the groups --help prints them."""
    parser = cli.ArgumentParser(prog="train.py", description="Train YOLOv3 on one or several GPUs (keras-yolo-mgpu).")
    _add_data_group(parser.add_argument_group("data"))
    _add_model_group(parser.add_argument_group("model"))
    recipe = parser.add_argument_group("recipe")
    add_recipe_name_arg(recipe)
    _add_schedule_args(recipe)
    add_recipe_args(recipe)
    add_precision_args(recipe)
    _add_devices_group(parser.add_argument_group("devices"))
    _add_run_group(parser.add_argument_group("run"))
    return parser


def _add_data_group(data) -> None:
    """The dataset, its split, augmentation, caches and the JAX feed."""
    data.add_argument(
        "--data",
        metavar="PATH",
        help="the dataset, its kind recognised: YOLO-format data.yaml or folder, COCO .json, VOC folder, "
        "or a keras-yolo3 annotation file; class names and the validation split come from it where it has them",
    )
    data.add_argument(
        "--image-dir", default=None, help="COCO: folder of the JSON's images (default: beside it, or images/)"
    )
    data.add_argument("--annotations", help="keras-yolo3 annotation file: `path x1,y1,x2,y2,class ...` per line")
    data.add_argument(
        "--val-annotations",
        default=None,
        help="validation annotation file (default: split --val-split off --annotations)",
    )
    data.add_argument(
        "--val-split", type=cli.unit_float, default=DEFAULT_VAL_SPLIT, help="fraction held out for validation"
    )
    data.add_argument("--no-augment", action="store_true", help="turn training augmentation off")
    data.add_argument(
        "--cache",
        default=None,
        help="cache decoded images: 'ram' or a folder; refused at the start when its estimate exceeds the free "
        "memory or disk",
    )
    data.add_argument("--scan-cache", metavar="DIR", default=None, help=SCAN_CACHE_HELP)
    data.add_argument(
        "--feed",
        choices=("auto", "threads", "processes"),
        default="auto",
        help="JAX: make batches in worker threads of the training process, or in worker processes (each with "
        "its own interpreter lock; the same batches). auto (default): processes where two workers or more feed "
        "GPUs, threads on one core or a CPU-only run; the log says which",
    )
    data.add_argument(
        "--workers", type=cli.positive_int, default=None, help="JAX: feed workers (default: one per CPU core)"
    )
    data.add_argument(
        "--strict",
        action="store_true",
        help="refuse to start when the annotation check finds problems (default: skip bad lines)",
    )


def _add_model_group(model) -> None:
    """The network, its start weights and what stage 1 freezes."""
    cli.add_model_args(
        model,
        weights_help="start weights: .weights.h5, .keras, a Keras 2 .h5 from keras-yolo3, or Darknet .weights "
        "(converted as convert.py does; its cfg from --cfg, a .cfg beside it, or the official net's by file size)",
    )
    model.add_argument("--cfg", default=None, help="Darknet cfg of Darknet --weights (default: a .cfg beside them)")
    model.add_argument(
        "--weights-partial",
        action="store_true",
        help="start from --weights even where its layers do not fit the model: those layers keep their random "
        "initial values (default: refuse; only the output convs of another class count are replaced silently)",
    )
    cli.add_freeze_args(
        model,
        default=None,
        help="stage 1: 1 freezes Darknet-53, 2 all but the output convs, 0 nothing (default: the recipe's)",
    )


def _add_schedule_args(recipe) -> None:
    """Epochs, stages, batch sizes, optimizer, learning rates, seed and steps."""
    recipe.add_argument(
        "--epochs", type=cli.positive_int, default=None, help="total epochs (default: the recipe's, 100)"
    )
    recipe.add_argument(
        "--freeze-epochs",
        type=int,
        default=None,
        help="end of stage 1 (--freeze-body frozen); 0 skips stage 1 (default: the recipe's: every epoch for default, "
        "half of --epochs for keras-yolo3)",
    )
    recipe.add_argument(
        "--bottleneck-epochs",
        type=cli.non_negative_int,
        default=0,
        help="stage 0 first, keras-yolo3's train_bottleneck.py: epochs of the output convolutions alone, on the "
        "body's features of the letterboxed images, computed once (batch 8, Adam 1e-3, one device; default 0: "
        "none; train_bottleneck.py: 30)",
    )
    _add_batch_args(recipe)
    recipe.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    recipe.add_argument(
        "--lr",
        "--lr1",
        dest="lr1",
        type=float,
        default=None,
        help="stage 1 learning rate (default: the recipe's; default recipe: 3e-3 from scratch, 1e-3 with --weights)",
    )
    recipe.add_argument("--lr2", type=float, default=None, help="stage 2 learning rate (default: the recipe's)")
    recipe.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seeds everything random in the run (initial weights, data order, augmentation): the same command "
        "and seed give the same weights (default: a fresh seed, recorded in the run's args.json)",
    )
    recipe.add_argument(
        "--steps-per-epoch",
        type=cli.positive_int,
        default=None,
        help="override steps per epoch (default: all images once)",
    )


def _add_batch_args(recipe) -> None:
    """The stages' global batch sizes, and the memory `--batch-size auto` fits into."""
    recipe.add_argument(
        "--batch-size",
        type=cli.batch_size_or_auto,
        default=DEFAULT_BATCH_SIZE,
        help=f"GLOBAL batch size of stage 1 (split over the replicas), or 'auto': {DEFAULT_BATCH_SIZE}, or the "
        "largest below it whose training step fits each device's memory, measured before the first step (JAX: the "
        "compiled step's own figures; TensorFlow: a trial step) and recorded in args.json",
    )
    recipe.add_argument(
        "--memory-budget",
        metavar="GIB",
        type=cli.positive_float,
        default=None,
        help="--batch-size auto: GiB per device to fit into (default: 90%% of the device's memory)",
    )
    recipe.add_argument(
        "--batch-size2",
        type=cli.positive_int,
        default=None,
        help="global batch size of stage 2 (default: --batch-size)",
    )


def _add_devices_group(devices) -> None:
    """The devices, the strategy and the way a step runs on them."""
    cli.add_device_args(devices)
    devices.add_argument(
        "--strategy", choices=("mirrored", "multiworker"), default="mirrored", help="multiworker reads TF_CONFIG"
    )
    cli.add_parallel_arg(devices)


def _add_run_group(run) -> None:
    """The run folder, --resume, --demo and what the run shows and writes besides its weights."""
    run.add_argument("--log-dir", default=None, help="run folder (default: next free logs/NNN)")
    run.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        metavar="RUN",
        help="continue an interrupted run with its saved arguments: RUN is its folder or a checkpoint in it "
        "(without RUN: the folder --log-dir names)",
    )
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in a --log-dir that holds a run, deleting the earlier run's files first "
        "(keras-yolo3 wrote over logs/000/; a folder that also holds other files is refused)",
    )
    run.add_argument(
        "--demo", action="store_true", help="generate the synthetic demo dataset and train on it (same as `make demo`)"
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument(
        "--no-pictures",
        action="store_true",
        help="leave out the run's pictures (labels.jpg, train_batch*.jpg, results.png, val_pred.jpg; docs/data.md)",
    )


def multi_scale_range(text: str) -> tuple[int, int]:
    """`320,608` -> (320, 608): the range of multi-scale training sizes."""
    try:
        low, high = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX like 320,608, got {text!r}") from None
    try:
        return check_size_range((low, high))  # the range rule lives with the sizes it draws
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def precision_choice(text: str) -> bool:
    """`mixed` -> True, `float32` -> False: TrainConfig.mixed_precision."""
    if text not in ("float32", "mixed"):
        raise argparse.ArgumentTypeError(f"expected float32 or mixed, got {text!r}")
    return text == "mixed"


def add_precision_args(group) -> None:
    """--precision / --no-jit (and the older --mixed-precision / --jit): default None, the device's choice."""
    group.add_argument(
        "--precision",
        dest="mixed_precision",
        type=precision_choice,
        default=None,
        metavar="{float32,mixed}",
        help="mixed: float16 compute, float32 variables and loss (default: mixed on GPUs after a start-up check, "
        "float32 on the CPU)",
    )
    group.add_argument(
        "--mixed-precision", dest="mixed_precision", action="store_const", const=True, help="same as --precision mixed"
    )
    group.add_argument(
        "--jit",
        dest="jit",
        action="store_const",
        const=True,
        default=None,
        help="XLA-compile the training step (default: on GPUs after a start-up check, off on the CPU)",
    )
    group.add_argument("--no-jit", dest="jit", action="store_const", const=False, help="no XLA, on GPUs too")


def add_recipe_name_arg(group) -> None:
    """--recipe and --save-period: the named set of defaults (training/named_recipes.py) and periodic checkpoints."""
    group.add_argument(
        "--recipe",
        choices=tuple(RECIPES),
        default=None,
        help=f"named defaults for every recipe flag; a flag given overrides its part (default: {DEFAULT_RECIPE}, "
        "the best measured; keras-yolo3: the original's two stages, see docs/training.md)",
    )
    group.add_argument(
        "--save-period",
        type=int,
        default=None,
        metavar="N",
        help="also keep the weights of every Nth epoch as ep*.weights.h5 (default: the recipe's: 0 = only "
        "best.weights.h5 and last.weights.h5; keras-yolo3 keeps a file at every improvement)",
    )
    group.add_argument(
        "--patience",
        type=int,
        default=None,
        metavar="N",
        help="end a one-stage run (nothing frozen) after N evaluations without a better --monitor; 0 runs every "
        "epoch (default: the recipe's: 30 for default; keras-yolo3 stops only in stage 2, after 10)",
    )


def add_recipe_args(group) -> None:
    """The modern recipe's options (keras_yolo_mgpu/training/recipe_options.py); defaults are keras-yolo3's."""
    group.add_argument(
        "--eval-every",
        type=int,
        default=None,
        metavar="N",
        help="COCO mAP@[.5:.95] / mAP@.5 on the validation set every N epochs, logged as val_mAP / val_mAP50 "
        "(default: the recipe's; 0 = never, 1 with --monitor val_mAP or val_mAP50)",
    )
    group.add_argument(
        "--monitor",
        choices=("val_loss", "val_mAP", "val_mAP50"),
        default=None,
        help="what checkpoints (best.weights.h5), ReduceLROnPlateau and EarlyStopping follow (default: the recipe's)",
    )
    group.add_argument(
        "--lr-schedule",
        choices=("plateau", "cosine"),
        default="plateau",
        help="plateau: constant rate, ReduceLROnPlateau in stage 2 (keras-yolo3); cosine: per-step cosine decay",
    )
    group.add_argument(
        "--warmup-epochs", type=float, default=0.0, metavar="E", help="linear warm-up of the rate, per step"
    )
    group.add_argument(
        "--ema",
        type=float,
        default=None,
        metavar="DECAY",
        help="exponential moving average of the weights (e.g. 0.999); evaluated and saved weights use it",
    )
    _add_data_and_loss_args(group)


def _add_data_and_loss_args(group) -> None:
    """The recipe's data and loss options: multi-scale sizes, mosaic, objectness prior, box loss, --iou-thresh."""
    group.add_argument(
        "--multi-scale",
        type=multi_scale_range,
        default=None,
        metavar="MIN,MAX",
        help="a new square training size, a multiple of 32 in [MIN, MAX], every 10 steps (validation: --input-size)",
    )
    group.add_argument(
        "--mosaic", type=cli.unit_float, default=0.0, metavar="P", help="probability of a 4-image mosaic per sample"
    )
    group.add_argument(
        "--objectness-prior",
        type=cli.unit_float,
        default=None,
        metavar="P",
        help="output convolutions not loaded from --weights start every cell at objectness P (e.g. 0.01; "
        "default: the recipe's; 0 = keras-yolo3's zero bias, i.e. 0.5)",
    )
    group.add_argument(
        "--box-loss",
        choices=BOX_LOSSES,
        default=None,
        help="box regression: keras-yolo3's xy cross-entropy + wh squared error, or CIoU "
        "(default: the model's: yolov3 for YOLOv3, ciou for YOLOv4)",
    )
    group.add_argument(
        "--ciou-weight",
        type=float,
        default=None,
        metavar="W",
        help="weight of the CIoU box term (default: the model's: 0.07 for YOLOv4 as yolov4.cfg's iou_normalizer, "
        "1.0 for YOLOv3 with --box-loss ciou)",
    )
    cli.add_iou_thresh_arg(group)


# Flags whose TrainConfig field differs, and how to read them; every other flag sets its field as parsed.
_FLAG_FIELDS = {
    "input_size": ("input_shape", lambda value: tuple(value or (416, 416))),
    "no_augment": ("augment", lambda value: not value),
    "no_sync_bn": ("sync_bn", lambda value: not value),
    "quiet": ("verbose", lambda value: 0 if value else 1),
    "no_pictures": ("pictures", lambda value: not value),
}
# Flags that name the run to resume or set the logging: `verbose` is -v, not TrainConfig.verbose (--quiet).
_RUN_FLAGS = ("resume", "log_dir", "verbose")
_PATH_FIELDS = {"annotations", "val_annotations", "classes", "anchors", "weights", "cfg", "data", "image_dir"}


def config_from_args(args):
    """The TrainConfig of a new run from its parsed flags."""
    converted = {field: convert(getattr(args, dest)) for dest, (field, convert) in _FLAG_FIELDS.items()}
    # Every recipe flag defaults to None: given ones override the recipe's values.
    given = {field: getattr(args, field) for field in RECIPE_FIELDS}
    recipe = resolve_recipe(args.recipe or DEFAULT_RECIPE, given, pretrained=args.weights is not None)
    # Input files by absolute path: args.json then names the same files when --resume runs from another folder.
    given_paths = {field: getattr(args, field) for field in _PATH_FIELDS}
    paths = {field: os.path.abspath(path) for field, path in given_paths.items() if path and os.path.exists(path)}
    return TrainConfig(
        **cli.flag_values(
            TrainConfig,
            args,
            **converted,
            **recipe,
            **paths,
            resume=False,
            log_dir=args.log_dir or next_log_dir(),
        )
    )


# Flags that say how a resumed run executes, not what it computes: they apply to the resumed process.
# Every other flag given with --resume must agree with the run's args.json.
RESUME_OVERRIDES = ("quiet", "gpus", "simulate_devices", "cache", "scan_cache", "no_pictures", "feed", "workers")


def given_flags(argv=None) -> dict:
    """The flags present on the command line (dest -> value), defaults left out."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return vars(parser.parse_args(argv))


def apply_resume_flags(config, args, given: dict) -> tuple:
    """Checks flags given with --resume against the saved run; returns (the config to run, the contradictions).

    Flags in `RESUME_OVERRIDES` apply to the returned config; any other that
    differs from the saved setting is a contradiction, naming both values.
    """
    problems, overrides = [], {}
    for dest, value in sorted(given.items()):
        if dest in _RUN_FLAGS:
            continue
        field, convert = _FLAG_FIELDS.get(dest, (dest, lambda value: value))
        if dest in RESUME_OVERRIDES:
            new = convert(value)
            if getattr(config, field) != new:
                logger.warning(
                    "--resume: --%s applies to this resumed process (the run had %s=%r)",
                    dest.replace("_", "-"),
                    field,
                    getattr(config, field),
                )
                overrides[field] = new
            continue
        if not hasattr(config, field):
            problems.append(f"--{dest.replace('_', '-')} has no meaning for a resumed run")
            continue
        wanted, saved = convert(value), getattr(config, field)
        if field in _PATH_FIELDS and wanted and saved:
            same = os.path.abspath(wanted) == os.path.abspath(saved)
        else:
            same = wanted == saved
        if same:
            logger.info("--resume: --%s agrees with the saved run", dest.replace("_", "-"))
        else:
            problems.append(f"--{dest.replace('_', '-')} {value} (the run has {field}={saved!r})")
    return dataclasses.replace(config, **overrides), problems


def run(args, given: dict | None = None, settings: ScriptSettings | None = None) -> int:
    """The command; `given`: the flags present on the command line (for --resume); `settings`: the script
    (keras-yolo3's, whose folder paths apply) and what its file sets (`cli.script_settings`)."""
    if args.demo:
        return demo_main(["--verbose"] if args.verbose else [])
    config = config_for(args, given, settings)
    if config is None:
        print(START_HELP)
        return 2
    run_training(config)
    return 0


def closing_lines(result) -> list[str]:
    """The log's last lines: what the run left (its best and final weights) and the commands that use them."""
    epochs = f"{result.epochs_run} epoch" + ("" if result.epochs_run == 1 else "s")
    lines = [f"done: {epochs} in {result.log_dir}; final weights (the last epoch's) {result.final_weights}"]
    weights = result.final_weights
    if result.best_weights:
        weights = result.best_weights
        best = f" (epoch {result.best_epoch}, {result.monitor} {result.best_value:.4f})" if result.best_epoch else ""
        lines.append(f"best weights by {result.monitor}: {result.best_weights}{best}")
    weights = shlex.quote(weights)  # a command to paste, whatever the folder's name
    # evaluate.py --weights alone scores what the run validated on; a run that validated on nothing needs images.
    images = "" if "val_loss" in (result.history or {}) else " --data VAL_DATASET (the run validated on no images)"
    lines.append(
        f"next: python evaluate.py --weights {weights}{images}; python yolo_video.py --model {weights} --image"
    )
    return lines


def config_for(args, given: dict | None = None, settings: ScriptSettings | None = None):
    """The run's `TrainConfig`, resolved once from the parsed flags: a new run's, or the saved run's (--resume).

    `settings`: the script and what its file sets, already the parser's
    defaults; its dataset files apply where no dataset flag is given.
    None when no dataset is named and the folder is no keras-yolo3 folder.

    Raises:
        UsageError: flags that do not fit together, or contradict a resumed run.
    """
    if args.resume:
        if args.overwrite:
            raise UsageError("--resume continues the run, --overwrite starts over in its folder: drop one")
        return _resumed_config(args, given or {})
    settings = settings or ScriptSettings()
    if not args.annotations and not args.data:
        if not is_keras_yolo3_folder() and not settings.dataset_path("annotation_path"):
            return None
        apply_keras_yolo3_paths(args, settings)
        if args.recipe is None:
            logger.info(
                "recipe: this project's default (one stage, nothing frozen, EMA, best weights by validation "
                "mAP: docs/training.md); --recipe keras-yolo3 trains keras-yolo3's two stages exactly"
            )
    _check_new_run_flags(args)
    config = config_from_args(args)
    _warn_of_unread_flags(args, config)
    return config


def _run_to_resume(args) -> str:
    """The run folder --resume continues: `--resume RUN` (the folder, or a file in it), else --log-dir."""
    if args.resume is True:
        if not args.log_dir:
            runs = sorted(glob.glob(os.path.join("logs", "[0-9][0-9][0-9]", "args.json")))
            latest = f" (the latest run here: {os.path.dirname(runs[-1])})" if runs else ""
            raise UsageError(f"--resume needs the run to continue: --resume RUN_FOLDER{latest}")
        return args.log_dir
    if not os.path.exists(args.resume):
        raise UsageError(f"--resume: not found: {args.resume}")
    folder = args.resume if os.path.isdir(args.resume) else os.path.dirname(args.resume) or "."
    if args.log_dir and os.path.abspath(args.log_dir) != os.path.abspath(folder):
        raise UsageError(f"--resume {args.resume} continues {folder}, but --log-dir names {args.log_dir}: drop one")
    return folder


def _resumed_config(args, given: dict):
    """The saved run's config in the folder --resume names, with the flags that apply to a resumed process."""
    log_dir = _run_to_resume(args)
    args_json = os.path.join(log_dir, "args.json")
    if not os.path.isfile(args_json):
        raise UsageError(f"--resume: {args_json} not found; nothing to resume in {log_dir}")
    with open(args_json, encoding="utf-8") as handle:
        config = TrainConfig.from_json(handle.read())
    if os.path.abspath(config.log_dir) != os.path.abspath(log_dir):
        # A run folder is the run: a copied or moved folder continues where it is, never its original.
        logger.info(
            "--resume continues %s (its args.json names %s: the folder was moved or copied)", log_dir, config.log_dir
        )
    config = dataclasses.replace(config, resume=True, log_dir=log_dir)
    config, problems = apply_resume_flags(config, args, given)
    if problems:
        raise UsageError(
            "--resume continues the run as it was started (its settings are in "
            f"{args_json}); these flags contradict it: " + "; ".join(problems) + ". Drop them, or start a "
            "new run (--weights of this run's checkpoint to start from it)."
        )
    return config


def _check_new_run_flags(args) -> None:
    """Refuses a new run's flags that do not fit together or name missing files; resolves --weights by name."""
    if args.annotations and args.data:
        raise UsageError("give --data or --annotations, not both (--data reads keras-yolo3 files too)")
    if args.simulate_devices and args.gpus is None:
        raise UsageError("--simulate-devices needs --gpus N (the number of devices to simulate)")
    if args.data and not os.path.exists(args.data):
        raise UsageError(f"--data: not found: {args.data}")
    for flag, path in (
        ("--annotations", args.annotations),
        ("--val-annotations", args.val_annotations),
        ("--classes", args.classes),
        ("--anchors", None if args.anchors == "auto" else args.anchors),
        ("--weights", args.weights),
        ("--cfg", args.cfg),
    ):
        if flag == "--weights" and path:
            # An official net's name (`yolov3-tiny`) is downloaded once; checked last, so a typo fails first.
            path = resolve_weights(path)
            if path != args.weights:
                logger.info("--weights %s: the official Darknet weights, cached at %s", args.weights, path)
                args.weights = path
        if path and not os.path.isfile(path):
            raise UsageError(f"{flag}: file not found: {path}")
    if args.cfg and not (args.weights or "").endswith(DARKNET_SUFFIX):
        raise UsageError(
            f"--cfg {args.cfg} is read only to convert Darknet --weights (a .weights file), and there are none: "
            "the network is --model's (yolov3, yolov3-tiny, yolov4, yolov4-tiny); drop --cfg, or give the Darknet "
            "weights it describes"
        )
    if args.annotations and not args.classes:
        raise UsageError("--annotations needs --classes, the class names file of your dataset")


def _warn_of_unread_flags(args, config) -> None:
    """A warning for each flag given that this run will not read: ignored in silence, it would look applied."""
    unread = []  # (flag, why)
    if config.freeze_epochs >= config.epochs:
        why = "the run has one stage, which takes every epoch (--freeze-epochs below --epochs makes a stage 2)"
        unread += [(flag, why) for flag in ("--lr2", "--batch-size2") if getattr(args, flag[2:].replace("-", "_"))]
    if args.memory_budget is not None and config.batch_size != "auto":
        unread.append(("--memory-budget", f"it sizes --batch-size auto; the batch is {config.batch_size}"))
    if args.image_dir and (args.annotations or detect_kind(args.data) != "coco"):
        unread.append(("--image-dir", "it is the folder of a COCO JSON's images; this dataset names its images"))
    for flag, why in unread:
        logger.warning("%s is not used: %s", flag, why)


def run_training(config):
    """`training.trainer.train(config)`, then the log's closing lines; returns its `TrainResult`.

    Raises:
        CommandError: the run ran out of device memory, said in one paragraph.
    """
    from keras_yolo_mgpu.training.trainer import train

    try:
        result = train(config)
    except Exception as error:
        paragraph = out_of_memory_paragraph(error, config)
        if paragraph is None:
            raise
        raise CommandError(paragraph) from error
    for line in closing_lines(result):
        logger.info("%s", line)
    return result


def _gib(size: int | None) -> str:
    return "an unstated amount" if size is None else f"{size / 2**30:.1f} GiB"


def _size(size: int) -> str:
    """`size` bytes in the unit that reads best: 48 KiB, 384.0 MiB, 1.5 GiB."""
    if size >= 2**30:
        return _gib(size)
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size // 2**10} KiB"


def out_of_memory_paragraph(error: BaseException, config) -> str | None:
    """What to tell a user whose run ran out of device or host memory, in one paragraph; None for any other error.

    Host memory: a `MemoryError`, or a feed worker process that ended
    abruptly (`data.py_dataset.FeedWorkerEnded`: the kernel's out-of-memory
    killer ends a process when the host's memory runs out).
    """
    from keras_yolo_mgpu.backend import memory
    from keras_yolo_mgpu.data.py_dataset import FeedWorkerEnded

    on_host = isinstance(error, (MemoryError, FeedWorkerEnded))
    found = None if on_host else memory.out_of_memory(error)
    if not on_host and found is None:
        return None
    # `--batch-size auto` is resolved inside the run: named as the flag, sized as the batch it starts from.
    batch = config.batch_size if isinstance(config.batch_size, int) else DEFAULT_BATCH_SIZE
    smaller = max(1, batch // 2)
    height, width = config.input_shape
    at = f"{'global batch ' if isinstance(config.batch_size, int) else '--batch-size '}{config.batch_size} "
    at += f"({height}x{width} input)"
    if os.path.isdir(config.log_dir):
        kept = f"The run folder {config.log_dir} keeps what it saved (--resume {shlex.quote(config.log_dir)} goes on)."
    else:
        kept = "Nothing was saved before it, and no run folder is left."
    if on_host:
        what = str(error) if isinstance(error, FeedWorkerEnded) else "the host ran out of memory (MemoryError)"
        fewer = ""
        if (config.backend or keras_backend_name()) == "jax":  # the JAX feed's flags
            fewer = "fewer --workers, --feed threads, " if isinstance(error, FeedWorkerEnded) else "fewer --workers, "
        return (
            f"{what}, at {at}: one batch's images alone take {_size(batch * height * width * 3)}, and "
            f"several are made ahead. To use less of the host's memory: --batch-size {smaller}, {fewer}or no --cache "
            f"ram. {kept}"
        )
    requested, limit = found
    return (
        f"out of memory at {at}: "
        f"an allocation asked for {_gib(requested)} and the device has {_gib(limit)}. Try --batch-size auto (the "
        f"largest batch up to {DEFAULT_BATCH_SIZE} that fits, measured before the first step) or a smaller batch: "
        f"--batch-size {smaller}, and halve again until it runs. {kept}"
    )


def main(argv: Sequence[str] | None = None, settings: Mapping[str, object] | None = None) -> int:
    """`python train.py`; `settings`: what train.py sets in its file (`cli.script_settings.TRAIN_SETTINGS`)."""
    return run_script(build_parser, ScriptSettings("train.py", settings or {}), argv)


def run_script(build_parser, settings: ScriptSettings, argv: Sequence[str] | None) -> int:
    """The command of a script whose file sets `settings` (train.py, train_bottleneck.py)."""

    def body(args):
        return run(args, given_flags(argv) if args.resume else None, settings)

    # A resumed run is the run as it was started (its args.json): the settings are not said again.
    return run_with_settings(build_parser, body, settings, argv, log=lambda args: not args.resume, tensorflow=True)


if __name__ == "__main__":
    sys.exit(main())
