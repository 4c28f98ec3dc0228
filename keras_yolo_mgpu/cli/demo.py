"""The built-in demo (`make demo`): data, multi-device training, mAP, video.

    python -m keras_yolo_mgpu.demo [--out demo_output] [--quick]

1. Generates a synthetic detection dataset (`data/synthetic.py`).
2. Fits anchors to its boxes (k-means) and trains tiny YOLOv3 from scratch
   with every visible GPU, or on 2 simulated devices (the CPU split in two),
   so the multi-GPU code path runs on any machine, with `RECIPE`.
3. Evaluates mAP@[.5:.95] and mAP@0.5 of the best weights on the validation split.
4. Runs the detector on a generated video clip.
5. Prints where every output is, and a summary with the wall time and mAP.

Everything goes under `--out`; a rerun replaces the previous demo's outputs, and
a folder whose `data/`, `train/`, ... the demo did not write is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from keras_yolo_mgpu.cli.args import ArgumentParser, positive_int
from keras_yolo_mgpu.cli.runner import CommandError, UsageError, run_command
from keras_yolo_mgpu.data.kmeans import box_sizes_from_annotations, kmeans_anchors
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset, make_synthetic_video
from keras_yolo_mgpu.evaluation.mean_ap import evaluate_weights, format_report
from keras_yolo_mgpu.inference.media import process_video
from keras_yolo_mgpu.resources import format_anchors
from keras_yolo_mgpu.training.config import TrainConfig
from keras_yolo_mgpu.training.named_recipes import DEFAULT_RECIPE, RECIPES

logger = logging.getLogger(__name__)

# The data and schedule that reach mAP@[.5:.95] >= 0.6 from scratch in under 10 minutes on a 2-core CPU
# (BENCHMARKS.md, "Demo"): many distinct images seen a few times each generalise better than a few hundred
# seen often. A `drop_epoch` uses train()'s two stages: stage 1 at `lr`, stage 2 at `lr / 10`.
DEFAULTS = dict(
    num_train=2400,
    num_val=150,
    image_size=128,
    epochs=6,
    drop_epoch=None,
    batch_size=16,
    lr=RECIPES[DEFAULT_RECIPE]["lr1"],
    max_objects=4,
)
# train.py's default recipe, less the schedule fields `demo_train_config` sets from DEFAULTS: the best row
# of BENCHMARKS.md's recipe table (`tools/reports.py recipe-table`, same data, epochs and seed).
RECIPE: dict = {
    key: RECIPES[DEFAULT_RECIPE][key]
    for key in ("eval_every", "monitor", "ema", "objectness_prior", "iou_thresh", "save_period")
}
# A smoke run: every stage, tiny sizes (tests/test_demo.py).
QUICK = dict(num_train=24, num_val=8, image_size=64, epochs=1, drop_epoch=None, batch_size=8, lr=1e-3, max_objects=3)

# Anchor 0 belongs to no output scale of the tiny masks: this fraction of the smallest box is never a best anchor.
_UNUSED_ANCHOR_FRACTION = 0.25
_OUTPUTS = ("data", "anchors.txt", "train", "eval", "video", "summary.json")


def _fit_anchors(annotation_path: str, out_path: Path) -> np.ndarray:
    """6 tiny-YOLOv3 anchors: k-means (k=5) on the boxes plus an unused anchor 0."""
    sizes = box_sizes_from_annotations(annotation_path)
    fitted, mean_iou = kmeans_anchors(sizes, 5, seed=0)
    smallest = np.maximum(np.floor(sizes.min(axis=0) * _UNUSED_ANCHOR_FRACTION), 1)
    anchors = np.concatenate([smallest[None], np.rint(fitted)]).astype(np.float32)
    out_path.write_text(format_anchors(anchors) + "\n", encoding="utf-8")
    logger.info("anchors %s (mean IoU of boxes with the 5 fitted anchors: %.3f)", format_anchors(anchors), mean_iou)
    return anchors


def _devices_plan(gpus: int | None) -> tuple[int | None, bool, str]:
    """(gpus, simulate_devices, description) for TrainConfig, from the physical devices only (`train()` splits them)."""
    from keras_yolo_mgpu.backend import distribution

    visible = len(distribution.visible_accelerators(cpu_devices=gpus or 2))
    if visible:
        count = min(gpus or visible, visible)
        return count, False, f"{count} GPU(s)"
    count = gpus or 2
    return count, True, f"{count} simulated devices (the CPU split in {count}; no GPU visible)"


# Left in --out by every demo, so that a rerun knows the outputs there are its own to replace.
_MARKER = ".keras-yolo-mgpu-demo"


def _claim(out: Path) -> None:
    """Makes `out` the demo's folder, its earlier outputs deleted; refuses one whose output names are a user's.

    A rerun deletes `_OUTPUTS` before writing them again, so a folder must be
    the demo's before anything in it is deleted: it carries `_MARKER`, or
    (written before the marker was) a demo's summary.json. A folder without
    any of those names is taken as it is: the demo writes nothing else.

    Raises:
        CommandError: `out` holds one of `_OUTPUTS` and is no demo's folder.
    """
    present = [name for name in _OUTPUTS if os.path.lexists(out / name)]
    if present and not _is_demo_folder(out):
        raise CommandError(
            f"--out {out} holds {', '.join(present)}, which no demo wrote (no {_MARKER} there): the demo would "
            "replace them. Choose another --out, a new or empty folder"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / _MARKER).write_text("the outputs of python -m keras_yolo_mgpu.demo, replaced by its next run\n")
    for name in present:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _is_demo_folder(out: Path) -> bool:
    if (out / _MARKER).is_file():
        return True
    try:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and {"mAP50", "settings", "outputs"} <= summary.keys()


@contextlib.contextmanager
def _timed(seconds: dict[str, float], name: str):
    """Records the wall seconds of the block as `seconds[name]` (summary.json's `seconds`)."""
    start = time.perf_counter()
    yield
    seconds[name] = time.perf_counter() - start


def run_demo(out_dir: str | os.PathLike, settings: dict, *, gpus: int | None = None, video_frames: int = 60) -> dict:
    """Runs the whole demo; returns the summary (also written to summary.json).

    Args:
        out_dir: folder for every output; the previous demo's outputs in it
            are replaced, a user's refused (`_claim`).
        settings: `DEFAULTS`' keys and `seed` (summary.json's `settings`);
            `image_size` is the network input side and the longer side of
            every image, `drop_epoch` the epochs at `lr` before `lr / 10`
            (None: no drop), `batch_size` the global batch, rounded up to
            a multiple of the devices.
        gpus: devices to train on (default: all visible GPUs, else 2
            simulated devices).
        video_frames: length of the generated clip.
    """
    from keras_yolo_mgpu.training.trainer import train

    s = settings
    start = time.perf_counter()
    seconds: dict[str, float] = {}
    out = Path(out_dir).resolve()
    _claim(out)

    with _timed(seconds, "data"):
        data, anchors_path = make_demo_data(
            out, s["num_train"], s["num_val"], s["image_size"], s["max_objects"], s["seed"]
        )

    schedule = {k: s[k] for k in ("batch_size", "image_size", "epochs", "drop_epoch", "lr", "seed")}
    config, device_text = _planned_train_config(
        data, anchors_path, out / "train", gpus=gpus, recipe=RECIPE, verbose=2, **schedule
    )
    with _timed(seconds, "train"):
        result = train(config)

    with _timed(seconds, "evaluate"):
        weights = weights_to_evaluate(result)
        metrics = _evaluate_demo(weights, data, anchors_path, s["image_size"], out / "eval")

    with _timed(seconds, "video"):
        clip, video = _detect_demo_video(
            weights, data, anchors_path, s["image_size"], out / "video", video_frames, s["seed"]
        )

    outputs = _demo_outputs(out, data, anchors_path, result, weights, metrics, clip, video)
    summary = _summary(settings, config, result, metrics, video, outputs, device_text, seconds, start)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def _summary(settings, config, result, metrics, video, outputs, device_text, seconds, start) -> dict:
    """summary.json: the headline mAPs, the time of each step (since `start`), the devices, settings and outputs."""
    return {
        "mAP50": metrics["mAP50"],
        "mAP": metrics["mAP"],
        "wall_seconds": round(time.perf_counter() - start, 1),
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "devices": device_text,
        "replicas": result.replicas,
        "epochs_run": result.epochs_run,
        "settings": {**settings, "batch_size": config.batch_size, "recipe": RECIPE},
        "outputs": outputs,
        "video": {k: video[k] for k in ("frames", "fps", "detections")},
    }


def _planned_train_config(data, anchors_path, log_dir, *, gpus: int | None, batch_size: int, **options):
    """`(demo_train_config(...), the devices in words)`; the global batch is `batch_size` rounded up to the replicas."""
    gpu_count, simulate, device_text = _devices_plan(gpus)
    replicas = gpu_count or 1
    global_batch = -(-batch_size // replicas) * replicas
    logger.info("training tiny YOLOv3 on %s, global batch %d", device_text, global_batch)
    config = demo_train_config(
        data, anchors_path, log_dir, global_batch=global_batch, gpus=gpu_count, simulate=simulate, **options
    )
    return config, device_text


def _evaluate_demo(weights: str, data, anchors_path: Path, image_size: int, eval_dir: Path) -> dict:
    """mAP of `weights` on the validation split, logged; writes metrics.json, the PR curve and the detections."""
    eval_dir.mkdir()
    metrics = evaluate_weights(
        weights,
        data.val,
        data.classes,
        str(anchors_path),
        input_size=(image_size, image_size),
        pr_curve=str(eval_dir / "pr_curve.png"),
        save_detections=str(eval_dir / "detections.json"),
        progress=False,
    )
    (eval_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    logger.info("validation:\n%s", format_report(metrics))
    return metrics


def _detect_demo_video(
    weights: str, data, anchors_path: Path, image_size: int, video_dir: Path, num_frames: int, seed: int
) -> tuple[str, dict]:
    """Generates a 320x240 clip and runs the detector on it; returns (clip path, `process_video`'s stats)."""
    from keras_yolo_mgpu.inference.detector import YOLO

    frame_size = (240, 320)
    clip = make_synthetic_video(
        video_dir / "input.mp4",
        num_frames=num_frames,
        frame_size=frame_size,
        seed=seed + 1,
        texture_scale=max(frame_size) / image_size,
    )
    yolo = YOLO(weights, str(anchors_path), data.classes, score=0.5, model_image_size=(image_size, image_size))
    video = process_video(
        yolo, clip, str(video_dir / "detections.mp4"), save_json=str(video_dir / "detections.jsonl"), progress=False
    )
    return clip, video


def _demo_outputs(out: Path, data, anchors_path: Path, result, weights: str, metrics: dict, clip, video) -> dict:
    """Where every output of the demo is (summary.json's `outputs`, printed at the end)."""
    return {
        "dataset": str(out / "data"),
        "train_annotations": data.train,
        "val_annotations": data.val,
        "classes": data.classes,
        "anchors": str(anchors_path),
        "training_log": result.log_dir,
        "weights": weights,
        "loss_plot": str(Path(result.log_dir) / "loss.png"),
        "metrics": str(out / "eval" / "metrics.json"),
        "pr_curve": metrics.get("pr_curve"),
        "detections": str(out / "eval" / "detections.json"),
        "input_video": clip,
        "output_video": video["output"],
        "video_detections": str(out / "video" / "detections.jsonl"),
    }


def make_demo_data(out: Path, num_train: int, num_val: int, image_size: int, max_objects: int, seed: int):
    """The synthetic dataset under `out/data` and its anchors file: (DatasetPaths, anchors path)."""
    # Half square, half 4:3 or 3:4 images: training sees letterbox bars as on the video's 320x240 frames.
    short = image_size * 3 // 4
    sizes = [(image_size, image_size), (image_size, image_size), (short, image_size), (image_size, short)]
    data = make_synthetic_dataset(out / "data", num_train, num_val, sizes, seed=seed, max_objects=max_objects)
    anchors_path = out / "anchors.txt"
    _fit_anchors(data.train, anchors_path)
    return data, anchors_path


def demo_train_config(
    data,
    anchors_path,
    log_dir,
    *,
    recipe: dict,
    image_size: int,
    epochs: int,
    drop_epoch: int | None,
    global_batch: int,
    lr: float,
    seed: int,
    gpus: int | None,
    simulate: bool,
    verbose: int,
):
    """The demo's TrainConfig: tiny YOLOv3 from scratch with `recipe`'s options."""
    if recipe.get("lr_schedule") == "cosine":
        drop_epoch = None  # the cosine decays the rate itself, in one stage
    return TrainConfig(
        annotations=data.train,
        val_annotations=data.val,
        classes=data.classes,
        anchors=str(anchors_path),
        tiny=True,
        input_shape=(image_size, image_size),
        batch_size=global_batch,
        freeze_epochs=min(drop_epoch or epochs, epochs),
        epochs=epochs,
        freeze_body=0,
        lr1=lr,
        lr2=lr / 10,
        seed=seed,
        augment=False,  # letterbox only: the data are already varied (see BENCHMARKS.md)
        log_dir=str(log_dir),
        gpus=gpus,
        simulate_devices=simulate,
        cache="ram",
        reduce_lr_patience=3,
        early_stopping_patience=max(6, epochs),
        verbose=verbose,
        **recipe,
    )


def weights_to_evaluate(result) -> str:
    """The run's best-by-mAP weights when it monitored val_mAP, else its final weights."""
    if result.monitor in ("val_mAP", "val_mAP50") and result.best_weights:  # recipe_options.MAP_MONITORS: no Keras here
        return result.best_weights
    return result.final_weights


def format_summary(summary: dict) -> str:
    """The demo's closing message: outputs, then the headline numbers."""
    width = max(len(k) for k in summary["outputs"])
    lines = ["", "Demo outputs:"]
    lines += [f"  {name:<{width}}  {path}" for name, path in summary["outputs"].items() if path]
    seconds = ", ".join(f"{k} {v:.0f} s" for k, v in summary["seconds"].items())

    def fmt(value):
        return "n/a" if value is None else f"{value:.3f}"

    lines += [
        "",
        f"Trained tiny YOLOv3 from scratch for {summary['epochs_run']} epoch(s), "
        f"{summary['replicas']} replica(s): {summary['devices']}.",
        f"Validation mAP@[.5:.95] = {fmt(summary['mAP'])}   mAP@0.5 = {fmt(summary['mAP50'])}",
        f"Video: {summary['video']['frames']} frames at {summary['video']['fps']:.1f} fps, "
        f"{summary['video']['detections']} boxes.",
        f"Wall time {summary['wall_seconds'] / 60:.1f} min ({seconds}).",
    ]
    return "\n".join(lines)


def _add_override(parser: argparse.ArgumentParser, flag: str, what: str, key: str, *, default_text: str = "") -> None:
    """A positive-int flag that overrides `DEFAULTS[key]` (None: keep the default, or --quick's)."""
    parser.add_argument(
        flag, type=positive_int, default=None, help=f"{what} (default: {default_text or DEFAULTS[key]})"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m keras_yolo_mgpu.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="demo_output", help="folder for all outputs")
    parser.add_argument("--quick", action="store_true", help="a fast smoke run of every stage (no learning result)")
    _add_override(parser, "--epochs", "training epochs", "epochs")
    _add_override(
        parser, "--drop-epoch", "epochs before the learning rate drops 10x", "drop_epoch", default_text="no drop"
    )
    _add_override(parser, "--num-train", "training images", "num_train")
    _add_override(parser, "--num-val", "validation images", "num_val")
    _add_override(parser, "--input-size", "image and network side, multiple of 32", "image_size")
    _add_override(parser, "--batch-size", "global batch", "batch_size")
    parser.add_argument("--lr", type=float, default=None, help=f"Adam learning rate (default: {DEFAULTS['lr']})")
    parser.add_argument(
        "--gpus",
        type=positive_int,
        default=None,
        help="devices to train on (default: all visible GPUs, else 2 simulated)",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser


def run(args) -> int:
    if args.input_size is not None and args.input_size % 32:
        raise UsageError(f"--input-size must be a multiple of 32, got {args.input_size}")
    base = QUICK if args.quick else DEFAULTS
    flags = {**vars(args), "image_size": args.input_size}  # a flag left out (None) keeps `base`'s value
    settings = {key: base[key] if flags.get(key) is None else flags[key] for key in base}
    summary = run_demo(args.out, {**settings, "seed": args.seed}, gpus=args.gpus, video_frames=8 if args.quick else 60)
    print(format_summary(summary))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv, tensorflow=True)
