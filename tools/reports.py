"""The tables of the docs that come from training or reading real data: each subcommand makes one.

python tools/reports.py NAME --help
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from subcommands import run_subcommand

PROG = "tools/reports.py"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- recipe-table -----------------------------------------------------------------------------------------------------

# (name, what the row adds, options added to the row above, train.py flags of those options)
ROWS = [
    ("baseline", "keras-yolo3's recipe (the demo before this table)", {}, ""),
    ("eval_map", "+ validation mAP every epoch, best.weights.h5 by val_mAP", {"eval_every": 1, "monitor": "val_mAP"},
     "--eval-every 1 --monitor val_mAP"),
    ("cosine", "+ cosine decay with 1 epoch of linear warm-up (one stage, no 10x drop)",
     {"lr_schedule": "cosine", "warmup_epochs": 1.0}, "--lr-schedule cosine --warmup-epochs 1"),
    ("ema", "+ EMA of the weights, decay 0.99", {"ema": 0.99}, "--ema 0.99"),
    ("multi_scale", "+ multi-scale 96-160 px (validation at 128)", {"multi_scale": (96, 160)}, "--multi-scale 96,160"),
    ("mosaic", "+ mosaic with probability 0.5", {"mosaic": 0.5}, "--mosaic 0.5"),
    ("ema_plateau", "eval_map + EMA 0.99 (keras-yolo3's schedule, no cosine)", {"ema": 0.99},
     "--eval-every 1 --monitor val_mAP --ema 0.99"),
    ("prior", "+ objectness prior 0.01 on the fresh output convs", {"objectness_prior": 0.01},
     "--objectness-prior 0.01"),
    ("no_drop", "+ one stage at lr, no 10x drop (EMA averages instead)", {"drop_epoch": None},
     "--freeze-epochs equal to --epochs (one stage)"),
    ("ciou", "+ CIoU box loss, weight 1", {"box_loss": "ciou"}, "--box-loss ciou"),
    ("lr3", "no_drop at Adam lr 3e-3 (1.5x)", {"lr": 3e-3}, "--lr 3e-3"),
    ("ema98", "lr3 with EMA decay 0.98", {"ema": 0.98}, "--ema 0.98"),
    ("iou_thresh", "lr3 + Darknet's iou_thresh 0.213 (every anchor with IoU > 0.213 learns the box)",
     {"iou_thresh": 0.213}, "--iou-thresh 0.213"),
]  # fmt: skip
# Rows that build on a named row instead of the row above.
BASE_ROW = {"ema_plateau": "eval_map", "lr3": "no_drop", "iou_thresh": "lr3"}
# Row options that are demo settings, not TrainConfig fields, and the
# table's value of each unless a row sets its own: the demo's when the table
# began (keras-yolo3's two stages, the second at lr / 10 from epoch 7; Adam
# at 2e-3); the demo now runs with the best row's.
TABLE_SETTINGS = {"drop_epoch": 6, "lr": 2e-3}
# Every row trains this long: the demo's length when the table began (the
# demo now runs 6 epochs, see demo.DEFAULTS).
TABLE_EPOCHS = 8


def _history_share(history_csv: Path) -> dict:
    """Mean seconds of validation mAP per evaluated epoch and its share of the epoch's time."""
    from keras_yolo_mgpu.training.callbacks import read_history

    history = read_history(str(history_csv))
    pairs = [
        (m, e)
        for m, e in zip(history.get("val_mAP_seconds", []), history.get("epoch_seconds", []))
        if not (math.isnan(m) or math.isnan(e))
    ]
    if not pairs:
        return {}
    seconds = sum(m for m, _ in pairs) / len(pairs)
    share = sum(m / e for m, e in pairs) / len(pairs)
    return {"val_mAP_seconds": round(seconds, 2), "val_mAP_share": round(share, 4)}


def recipe_table(argv=None) -> int:
    """BENCHMARKS.md's recipe table: the demo's training with the recipe's options added one at a time.

    Generates the demo's data once (`make demo`'s: same images, anchors, seed),
    then trains tiny YOLOv3 from scratch on the demo's devices (every GPU, else 2
    simulated devices) with the demo's epochs and batch and `TABLE_SETTINGS`'s
    rate and schedule (unless the row sets its own), once per row; each row adds
    one option to the row above (a row in `BASE_ROW` starts again from the row
    it names, e.g. `ema_plateau`: an alternative measured once the cumulative
    rows showed which option costs mAP at the demo's length; the rows after it
    build on it). Each row's weights (best.weights.h5 when the row monitors
    val_mAP, else the final weights) are scored with the project's evaluator on
    the validation split. Writes `<out>/recipe_table.json` after every row (an
    interrupted run keeps the rows it finished) and prints
    the Markdown table. Usage:

        .venv/bin/python tools/reports.py recipe-table [--out recipe_table] [--rows baseline,eval_map,...]

    With `--weights`, the table on real photos instead (scripts/py):

        .venv/bin/python tools/reports.py recipe-table --out raccoon_table --weights yolov3-tiny.weights \
            --voc-xml raccoon_dataset/annotations --voc-images raccoon_dataset/images --classes raccoon.txt \
            --train-count 160 --input-size 320 --batch-size 8 --epochs 16 [--rows keras-yolo3,default,...]
    """
    from keras_yolo_mgpu.cli import demo
    from keras_yolo_mgpu.cli.runner import setup_logging

    parser = argparse.ArgumentParser(
        prog=f"{PROG} recipe-table", description=inspect.getdoc(recipe_table).split("\n\n")[0]
    )
    parser.add_argument("--out", default="recipe_table", help="folder for the data, runs and results")
    parser.add_argument("--rows", default=",".join(name for name, *_ in ROWS), help="rows to run, comma-separated")
    parser.add_argument("--epochs", type=int, default=TABLE_EPOCHS)
    parser.add_argument("--num-train", type=int, default=demo.DEFAULTS["num_train"], help="(smaller for a smoke run)")
    parser.add_argument("--num-val", type=int, default=demo.DEFAULTS["num_val"])
    add_real_args(parser)
    args = parser.parse_args(argv)
    setup_logging()
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    if args.weights:  # the real-photos table (scripts/py)
        rows = ROW_NAMES if args.rows == parser.get_default("rows") else args.rows.split(",")
        unknown = sorted(set(rows) - set(ROW_NAMES))
        if unknown or not args.classes or not args.train_count:
            parser.error(f"needs --classes and --train-count; rows: {ROW_NAMES} (unknown: {unknown})")
        return run_real_table(args, rows)
    wanted = args.rows.split(",")
    unknown = sorted(set(wanted) - {name for name, *_ in ROWS})
    if unknown:
        parser.error(f"unknown rows {unknown}; rows: {[name for name, *_ in ROWS]}")

    from keras_yolo_mgpu.evaluation.mean_ap import evaluate_weights
    from keras_yolo_mgpu.training.trainer import train

    settings = dict(demo.DEFAULTS, epochs=args.epochs, num_train=args.num_train, num_val=args.num_val)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "recipe_table.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    if not (out / "data").is_dir():
        demo.make_demo_data(
            out, settings["num_train"], settings["num_val"], settings["image_size"], settings["max_objects"], 0
        )
    from keras_yolo_mgpu.data.synthetic import DatasetPaths

    data = DatasetPaths(
        str(out / "data" / "train.txt"), str(out / "data" / "val.txt"), str(out / "data" / "classes.txt")
    )
    gpus, simulate, device_text = demo._devices_plan(None)
    replicas = gpus or 1
    global_batch = -(-settings["batch_size"] // replicas) * replicas

    recipes: dict = {}
    recipe: dict = {}
    for name, description, options, flags in ROWS:
        recipe = {**recipes.get(BASE_ROW.get(name), recipe), **options}
        recipes[name] = recipe
        if name not in wanted:
            continue
        log_dir = out / name
        if log_dir.exists():
            raise SystemExit(f"{log_dir} exists: remove it to run row {name!r} again")
        train_options = {key: value for key, value in recipe.items() if key not in TABLE_SETTINGS}
        row_settings = {key: recipe.get(key, default) for key, default in TABLE_SETTINGS.items()}
        config = demo.demo_train_config(
            data,
            out / "anchors.txt",
            log_dir,
            recipe=train_options,
            image_size=settings["image_size"],
            epochs=settings["epochs"],
            drop_epoch=row_settings["drop_epoch"],
            global_batch=global_batch,
            lr=row_settings["lr"],
            seed=0,
            gpus=gpus,
            simulate=simulate,
            verbose=2,
        )
        start = time.perf_counter()
        result = train(config)
        train_seconds = time.perf_counter() - start
        weights = demo.weights_to_evaluate(result, config)
        metrics = evaluate_weights(
            weights,
            data.val,
            data.classes,
            str(out / "anchors.txt"),
            input_size=(settings["image_size"],) * 2,
            progress=False,
        )
        results[name] = {
            "adds": description,
            "flags": flags,
            "recipe": {k: list(v) if isinstance(v, tuple) else v for k, v in recipe.items()},
            "mAP": round(metrics["mAP"], 4),
            "mAP50": round(metrics["mAP50"], 4),
            "weights": Path(weights).name,
            "train_seconds": round(train_seconds, 1),
            "epochs_run": result.epochs_run,
            "devices": device_text,
            **_history_share(log_dir / "history.csv"),
        }
        results_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        logging.getLogger("recipe_table").info("%s: %s", name, results[name])

    print("| row | adds | mAP@[.5:.95] | mAP@.5 | training s | val mAP share of an epoch |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, *_ in ROWS:
        if name in results:
            r = results[name]
            share = f"{100 * r['val_mAP_share']:.1f} %" if "val_mAP_share" in r else "-"
            print(f"| {name} | {r['adds']} | {r['mAP']:.3f} | {r['mAP50']:.3f} | {r['train_seconds']:.0f} | {share} |")
    return 0


HALF = "{half}"  # in a row's flags: half of --epochs
# (name, what the row is, train.py flags on top of the common ones)
REAL_ROWS = [
    ("keras-yolo3", "keras-yolo3's recipe (two stages, frozen body)", ["--recipe", "keras-yolo3"]),
    ("default", "the default recipe (no recipe flags)", []),
    ("no_ema", "default without EMA", ["--ema", "0"]),
    ("no_prior", "default without the objectness prior (zero output bias)", ["--objectness-prior", "0"]),
    ("no_iou_thresh", "default with the best anchor only", ["--iou-thresh", "1"]),
    ("lr3e-3", "default at Adam 3e-3 (its rate from scratch) instead of 1e-3", ["--lr", "3e-3", "--lr2", "3e-4"]),
    ("frozen_half", "default with keras-yolo3's frozen first half", ["--freeze-body", "2", "--freeze-epochs", HALF]),
    ("anchors_auto", "default with k-means anchors (--anchors auto)", ["--anchors", "auto"]),
    ("no_patience", "default running every epoch (no early stopping)", ["--patience", "0"]),
]
ROW_NAMES = [name for name, *_ in REAL_ROWS]


def add_real_args(parser) -> None:
    real = parser.add_argument_group("real photos (any of these selects the real-data table)")
    real.add_argument("--weights", help="start weights (.weights.h5 or Darknet .weights)")
    real.add_argument("--annotations", help="annotation file of the whole dataset")
    real.add_argument("--voc-xml", help="folder of VOC XML files (instead of --annotations)")
    real.add_argument("--voc-images", help="folder of the images of --voc-xml")
    real.add_argument("--classes", help="class names file")
    real.add_argument("--train-count", type=int, help="the first N images (sorted by path) train, the rest validate")
    real.add_argument("--input-size", default="320")
    real.add_argument("--batch-size", default="8")
    real.add_argument("--seed", default="0")


def _split(args, out: Path) -> tuple[str, str]:
    """Writes `out/train.txt` and `out/val.txt`: the sorted dataset cut at --train-count."""
    from keras_yolo_mgpu.data.annotations import iter_annotation_lines

    source = args.annotations
    if source is None:
        from keras_yolo_mgpu.cli.voc import main as voc_main

        source = str(out / "all.txt")
        argv = ["--xml-dir", args.voc_xml, "--image-dir", args.voc_images, "--classes", args.classes]
        if voc_main([*argv, "--output", source]) != 0:
            raise SystemExit("voc_annotation failed")
    lines = sorted(line.rstrip("\r\n") for _, line in iter_annotation_lines(source))
    if not 0 < args.train_count < len(lines):
        raise SystemExit(f"--train-count must be in [1, {len(lines) - 1}] for {len(lines)} images")
    paths = str(out / "train.txt"), str(out / "val.txt")
    for path, part in zip(paths, (lines[: args.train_count], lines[args.train_count :])):
        Path(path).write_text("\n".join(part) + "\n", encoding="utf-8")
    return paths


def _finished(log_dir: Path, epochs: int) -> bool:
    from keras_yolo_mgpu.training.callbacks import read_history

    history = log_dir / "history.csv"
    return history.is_file() and len(read_history(str(history)).get("loss", [])) >= epochs


def summarise(log_dir: Path) -> dict:
    """Peak val mAP@0.5 (epoch), the value at epoch 8, and the kept best's, from a run's history and args."""
    from keras_yolo_mgpu.training.callbacks import read_history

    history = read_history(str(log_dir / "history.csv"))
    config = json.loads((log_dir / "args.json").read_text())
    map50 = history["val_mAP50"]
    peak = max(range(len(map50)), key=lambda i: -1 if math.isnan(map50[i]) else map50[i])
    monitored = history[config["monitor"]]
    pick = min if config["monitor"] == "val_loss" else max
    kept = pick((v, i) for i, v in enumerate(monitored) if not math.isnan(v))[1]
    by_map = max(range(len(map50)), key=lambda i: -1 if math.isnan(history["val_mAP"][i]) else history["val_mAP"][i])
    return {
        "monitor": config["monitor"],
        # What --monitor val_mAP would keep (the rule before the default moved to val_mAP50).
        "by_mAP_epoch": by_map + 1,
        "by_mAP_mAP50": round(map50[by_map], 4),
        "peak_mAP50": round(map50[peak], 4),
        "peak_epoch": peak + 1,
        "epoch8_mAP50": round(map50[7], 4) if len(map50) >= 8 else None,
        "epoch16_mAP50": round(map50[15], 4) if len(map50) >= 16 else None,
        "last_mAP50": round(map50[-1], 4),
        "kept_epoch": kept + 1,
        "kept_mAP50": round(map50[kept], 4),
        "kept_mAP": round(history["val_mAP"][kept], 4),
        "epochs_run": len(map50),
        "train_seconds": round(sum(history.get("epoch_seconds", [])), 1),
    }


def run_real_table(args, wanted: list[str]) -> int:
    from keras_yolo_mgpu.cli.train import main as train_main

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    train, val = _split(args, out)
    results_path = out / "real_table.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    common = [
        *("--annotations", train, "--val-annotations", val, "--classes", args.classes, "--weights", args.weights),
        *("--input-size", args.input_size, "--batch-size", args.batch_size, "--epochs", str(args.epochs)),
        *("--seed", args.seed, "--quiet"),
    ]
    for name, description, flags in REAL_ROWS:
        if name not in wanted:
            continue
        flags = [flag.replace(HALF, str(args.epochs // 2)) for flag in flags]
        log_dir = out / name
        if not _finished(log_dir, args.epochs):
            if log_dir.exists():
                raise SystemExit(f"{log_dir} holds an unfinished run: remove it, or --resume it with train.py")
            # --eval-every 1 for the table; a row's own flags come later and win.
            assert train_main([*common, "--eval-every", "1", *flags, "--log-dir", str(log_dir)]) == 0
        results[name] = {"is": description, "flags": " ".join(flags), **summarise(log_dir)}
        results_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        logging.getLogger("recipe_table").info("%s: %s", name, results[name])
    print(
        "| row | flags | peak val mAP@0.5 (epoch) | epoch 8 | epoch 16 | last epoch "
        "| kept best: epoch, mAP@0.5, mAP@[.5:.95] | training s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in ROW_NAMES:
        if name in results:
            r = results[name]
            print(
                f"| {name} | `{r['flags']}` | {r['peak_mAP50']:.3f} ({r['peak_epoch']}) | {r['epoch8_mAP50']} "
                f"| {r.get('epoch16_mAP50')} | {r.get('last_mAP50')} "
                f"| {r['kept_epoch']}, {r['kept_mAP50']:.3f}, {r['kept_mAP']:.3f} | {r['train_seconds']:.0f} |"
            )
    return 0


# -- anchor-fit -------------------------------------------------------------------------------------------------------


def anchor_fit(argv=None) -> int:
    """docs/training.md's anchor rows: how well an anchors file, and k-means anchors, fit a dataset's boxes.

    Prints best possible recall (YOLOv5's AutoAnchor definition) and mean best
    IoU at the input size for the given anchors and for the anchors
    `--anchors auto` would fit (training/anchor_fit.py). Usage:

        .venv/bin/python tools/reports.py anchor-fit train.txt [--anchors model_data/tiny_yolo_anchors.txt] \
            [--masks '3,4,5 1,2,3'] [--input-size 320]
    """
    parser = argparse.ArgumentParser(prog=f"{PROG} anchor-fit", description=inspect.getdoc(anchor_fit).split("\n\n")[0])
    parser.add_argument("annotations")
    parser.add_argument("--anchors", default="model_data/tiny_yolo_anchors.txt")
    parser.add_argument("--masks", default="3,4,5 1,2,3", help="anchor indices per scale (default: tiny YOLOv3's)")
    parser.add_argument("--input-size", type=int, default=320)
    args = parser.parse_args(argv)

    from keras_yolo_mgpu.cli.args import masks_arg
    from keras_yolo_mgpu.data.annotations import read_annotations
    from keras_yolo_mgpu.data.kmeans import mean_iou
    from keras_yolo_mgpu.resources import format_anchors, get_anchors
    from keras_yolo_mgpu.training.anchor_fit import best_possible_recall, box_sizes_at_input, fit_anchors, used_anchors

    masks = masks_arg(args.masks)
    sizes = box_sizes_at_input(read_annotations(args.annotations), (args.input_size, args.input_size))
    given = get_anchors(args.anchors)
    print(f"{args.annotations}: {len(sizes)} boxes at {args.input_size} px")
    for name, anchors in (("given", given), ("k-means (--anchors auto)", fit_anchors(sizes, len(given), masks))):
        used = used_anchors(anchors, masks)
        bpr, iou = best_possible_recall(sizes, used), mean_iou(sizes, used)
        print(f"  {name}: {format_anchors(anchors)}: best possible recall {bpr:.4f}, mean best IoU {iou:.3f}")
    return 0


# -- patience ---------------------------------------------------------------------------------------------------------


def stop_epoch(values: list[float], patience: int) -> int | None:
    """The 1-based epoch EarlyStopping ends after (an improvement: strictly above the best so far), or None."""
    best, wait = -math.inf, 0
    for epoch, value in enumerate(values, 1):
        if value > best:
            best, wait = value, 0
        else:
            wait += 1
            if wait >= patience:
                return epoch
    return None


def patience_replay(argv=None) -> int:
    """What `--patience` would have done to a finished run: its history replayed through EarlyStopping's rule.

        python tools/reports.py patience logs/007/history.csv --patience 5,10,15,20,30

    For each patience: the epoch after which Keras's EarlyStopping (mode max,
    min_delta 0, on `--monitor`, default val_mAP50) would have ended the run, and
    the epoch, mAP@0.5 and mAP@[.5:.95] of the best weights it would have kept.
    A run trained with `--patience 0` (every epoch) gives the whole curve
    (docs/training.md, "How long").
    """
    parser = argparse.ArgumentParser(
        prog=f"{PROG} patience", description=inspect.getdoc(patience_replay).split("\n")[0]
    )
    parser.add_argument("history", help="a run's history.csv")
    parser.add_argument("--patience", default="5,10,15,20,30", help="comma-separated patiences")
    parser.add_argument("--monitor", default="val_mAP50")
    args = parser.parse_args(argv)
    from keras_yolo_mgpu.training.callbacks import read_history

    history = read_history(args.history)
    values = history[args.monitor]
    best = max(range(len(values)), key=values.__getitem__)
    print(f"{len(values)} epochs; best epoch {best + 1}: {values[best]:.3f}")
    print("| patience | stops after epoch | keeps: epoch, mAP@0.5, mAP@[.5:.95] |")
    print("| --- | --- | --- |")
    for patience in (int(p) for p in args.patience.split(",")):
        stop = stop_epoch(values, patience)
        seen = values[: stop or len(values)]
        kept = max(range(len(seen)), key=seen.__getitem__)
        print(
            f"| {patience} | {stop or 'none'} | {kept + 1}, {history['val_mAP50'][kept]:.3f}, "
            f"{history['val_mAP'][kept]:.3f} |"
        )
    return 0


# -- formats ----------------------------------------------------------------------------------------------------------


def _targets(records, input_size, anchors, num_classes):
    from keras_yolo3_targets import dense_inputs

    from keras_yolo_mgpu.data.tf_dataset import make_dataset

    dataset = make_dataset(records, (input_size, input_size), anchors, num_classes, 8, training=False)
    batches = [list(dense_inputs(x, anchors, num_classes).values()) + [w] for x, _, w in dataset]
    return [np.concatenate(parts) for parts in zip(*batches)]  # images, targets per scale, weights


def _timed_records(path, num_classes, **options):
    from keras_yolo_mgpu.data.dataset_source import open_dataset

    start = time.perf_counter()
    dataset = open_dataset(path, **options)
    report = dataset.checked("train", num_classes)
    return dataset, report, time.perf_counter() - start


def formats(argv=None) -> int:
    """The same boxes through every dataset format `--data` reads, measured on a real VOC dataset.

    Reads a Pascal VOC folder, writes its (checked) training records again as a
    YOLO-format folder, a COCO instances JSON and a VOC folder in a temporary
    folder (images linked, not copied; the writers of tests/dataset_writers.py,
    which follow each format's own definition), opens each with
    `data.dataset_source.open_dataset`, and prints, per format: the records
    (equal boxes, as float32), the training targets of the validation pipeline
    at --input-size (its batches finished by `DeviceInputs`, as training
    finishes them; equal arrays), and the time to read and check the dataset.

        python tools/reports.py formats /path/to/voc_dataset [--input-size 416]
    """
    parser = argparse.ArgumentParser(prog=f"{PROG} formats", description=inspect.getdoc(formats).splitlines()[0])
    parser.add_argument("voc", help="a Pascal VOC dataset folder")
    parser.add_argument("--input-size", type=int, default=416)
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.join(REPO, "tests"))  # the tests' format writers and keras-yolo3's targets
    from dataset_writers import write_coco, write_voc, write_yolo

    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors

    reference, report, seconds = _timed_records(args.voc, 1)
    names = reference.class_names
    records = report.annotations
    anchors = get_anchors(default_anchors_path(False))
    want = _targets(records, args.input_size, anchors, len(names))
    rows = [("voc (the original)", reference, report, seconds)]
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "yolo" / "images" / "train").mkdir(parents=True)
        for record in records:
            os.symlink(record.image_path, folder / "yolo" / "images" / "train" / os.path.basename(record.image_path))
        linked = [
            type(r)(str(folder / "yolo" / "images" / "train" / os.path.basename(r.image_path)), r.boxes)
            for r in records
        ]
        write_yolo(folder / "yolo", {"train": linked}, names)
        write_coco(folder / "yolo" / "images" / "train" / "instances.json", linked, names)
        write_voc(folder / "voc", linked, names)
        os.symlink(folder / "yolo" / "images" / "train", folder / "voc" / "JPEGImages")
        for label, path in (
            ("yolo (data.yaml)", folder / "yolo" / "data.yaml"),
            ("coco (instances.json)", folder / "yolo" / "images" / "train" / "instances.json"),
            ("voc (rewritten)", folder / "voc"),
        ):
            rows.append((label, *_timed_records(str(path), len(names))))
        print(f"{len(records)} images, {sum(len(r.boxes) for r in records)} boxes, classes {names}")
        print("| format | images | boxes equal | targets equal | read + check (s) |")
        print("|---|---|---|---|---|")
        for label, _, checked, seconds in rows:
            got = checked.annotations
            boxes_equal = len(got) == len(records) and all(
                np.array_equal(a.boxes, b.boxes) for a, b in zip(got, records)
            )
            targets_equal = all(
                np.array_equal(a, b) for a, b in zip(_targets(got, args.input_size, anchors, len(names)), want)
            )
            print(f"| {label} | {len(got)} | {boxes_equal} | {targets_equal} | {seconds:.2f} |")
    return 0


# -- int8-calibration -------------------------------------------------------------------------------------------------


def int8_calibration(argv=None) -> int:
    """INT8 TFLite calibrated with and without the images' mirrors: mAP@0.5 of each against the Keras weights.

        python tools/reports.py int8-calibration --weights best.weights.h5 --images train.txt \
            --annotations val.txt --out /tmp/int8_report

    Both exports calibrate on the same images of `--images` (letterboxed as at
    inference); one adds each image's left-right mirror, as `export --int8`
    does (`quantize.calibration_batches`). mAP by `evaluate.py`'s code on
    `--annotations` (docs/inference.md, "Measured").
    """
    parser = argparse.ArgumentParser(
        prog=f"{PROG} int8-calibration", description=inspect.getdoc(int8_calibration).split("\n")[0]
    )
    parser.add_argument("--weights", required=True, help="trained weights with metadata (.weights.h5)")
    parser.add_argument("--images", required=True, help="training images (annotation file or folder)")
    parser.add_argument("--annotations", required=True, help="validation annotation file")
    parser.add_argument("--out", required=True, help="folder for the two exports")
    args = parser.parse_args(argv)

    from keras_yolo_mgpu.evaluation.mean_ap import evaluate_weights
    from keras_yolo_mgpu.inference import quantize
    from keras_yolo_mgpu.inference.export import export_model

    Path(args.out).mkdir(parents=True, exist_ok=True)
    keras_map = evaluate_weights(args.weights, args.annotations, progress=False)["mAP50"]
    print(f"keras: mAP@0.5 {keras_map:.4f}")
    calibration = quantize.calibration_batches
    for mirrored in (False, True):
        quantize.calibration_batches = functools.partial(calibration, mirrored=mirrored)
        try:
            path = str(Path(args.out) / f"int8_mirrored_{mirrored}.tflite")
            export_model(args.weights, "tflite", path, precision="int8", images=args.images, overwrite=True)
        finally:
            quantize.calibration_batches = calibration
        result = evaluate_weights(path, args.annotations, progress=False)
        print(f"int8, mirrors {mirrored}: mAP@0.5 {result['mAP50']:.4f} (drop {keras_map - result['mAP50']:.4f})")
    return 0


SUBCOMMANDS = {
    "recipe-table": recipe_table,
    "anchor-fit": anchor_fit,
    "patience": patience_replay,
    "formats": formats,
    "int8-calibration": int8_calibration,
}


def main(argv: list[str] | None = None) -> int:
    return run_subcommand(PROG, SUBCOMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
