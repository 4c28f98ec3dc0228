"""docs/training.md's recipe table on real photos: `scripts/recipe_table.py --weights W ...` runs this.

Each row is one `train.py` run (its `main`, in this process) on a fixed
split of a real dataset, fine-tuned from `--weights`, with the row's flags
on top of the common ones (input size, batch, epochs, seed). Rows: the
`keras-yolo3` recipe, the `default` recipe, then the default with each of
its parts removed one at a time. Every row evaluates validation mAP every
epoch (`--eval-every 1`, which trains nothing: keras-yolo3's row keeps
monitoring val_loss) so the table can give the peak mAP@0.5, its epoch, the
value at epoch 8 and that of the weights the run keeps as best
(best.weights.h5: by val_mAP for the default, by val_loss for keras-yolo3).

The data: an annotation file (`--annotations`) or a folder of VOC XML
(`--voc-xml` with `--voc-images`); the first `--train-count` lines sorted by
image path train, the rest validate. A row whose folder holds a finished
run (history.csv with every epoch) is read, not run again. Writes
`<out>/real_table.json` after every row and prints the Markdown table.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

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
