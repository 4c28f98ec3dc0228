#!/usr/bin/env python3
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

    .venv/bin/python scripts/recipe_table.py [--out recipe_table] [--rows baseline,eval_map,...]

With `--weights`, the table on real photos instead (scripts/recipe_table_real.py):

    .venv/bin/python scripts/recipe_table.py --out raccoon_table --weights yolov3-tiny.weights \
        --voc-xml raccoon_dataset/annotations --voc-images raccoon_dataset/images --classes raccoon.txt \
        --train-count 160 --input-size 320 --batch-size 8 --epochs 16 [--rows keras-yolo3,default,...]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipe_table_real  # noqa: E402  (the real-photos table, beside this script)

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


def main(argv=None) -> int:
    from keras_yolo_mgpu.cli import demo
    from keras_yolo_mgpu.cli.runner import setup_logging

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="recipe_table", help="folder for the data, runs and results")
    parser.add_argument("--rows", default=",".join(name for name, *_ in ROWS), help="rows to run, comma-separated")
    parser.add_argument("--epochs", type=int, default=TABLE_EPOCHS)
    parser.add_argument("--num-train", type=int, default=demo.DEFAULTS["num_train"], help="(smaller for a smoke run)")
    parser.add_argument("--num-val", type=int, default=demo.DEFAULTS["num_val"])
    recipe_table_real.add_real_args(parser)
    args = parser.parse_args(argv)
    setup_logging()
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    if args.weights:  # the real-photos table (scripts/recipe_table_real.py)
        rows = recipe_table_real.ROW_NAMES if args.rows == parser.get_default("rows") else args.rows.split(",")
        unknown = sorted(set(rows) - set(recipe_table_real.ROW_NAMES))
        if unknown or not args.classes or not args.train_count:
            parser.error(f"needs --classes and --train-count; rows: {recipe_table_real.ROW_NAMES} (unknown: {unknown})")
        return recipe_table_real.run_real_table(args, rows)
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


if __name__ == "__main__":
    sys.exit(main())
