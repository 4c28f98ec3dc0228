"""The run folder: creating it with args.json, rewriting args.json, and tidying it when a run stops or resumes."""

from __future__ import annotations

import csv
import fcntl
import fnmatch
import json
import logging
import os
import shlex
import shutil

from keras_yolo_mgpu.fileio import atomic_write, write_text_atomic

logger = logging.getLogger(__name__)

FINAL_WEIGHTS = "trained_weights_final.weights.h5"
# The validation images a run drew from its training data (--val-split), in keras-yolo3's annotation format.
HELD_OUT_FILE = "val_split.txt"
# The images a run trains on, in the same format: evaluate.py says when it scores any of them.
TRAINED_ON_FILE = "train_split.txt"
# Where a run stands after its last finished epoch (`run_state.write_run_state`).
RUN_STATE_FILE = "run_state.json"
# The recipe's checkpoints (`recipe_options.RecipeCallbacks`): best by the monitored value, and the last epoch's.
BEST_WEIGHTS = "best.weights.h5"
LAST_WEIGHTS = "last.weights.h5"
# What a run writes in its folder (fnmatch patterns of its files and folders), this project's and keras-yolo3's
# (its TensorBoard events and .h5 checkpoints): what --overwrite deletes, and all it deletes.
RUN_OUTPUTS = (
    "args.json",
    "history.csv",
    RUN_STATE_FILE,
    HELD_OUT_FILE,
    TRAINED_ON_FILE,
    "anchors.txt",
    "skipped_lines_*.txt",
    "*.h5",
    "labels.jpg",
    "train_batch*.jpg",
    "val_pred.jpg",
    "loss.png",
    "results.png",
    "tensorboard",
    "backup",
    "events.out.tfevents.*",
    ".*.tmp*",
)


def held_out_list(weights_path: str, dataset: str | None = None) -> str | None:
    """The held-out list of the run whose folder holds `weights_path`, or None.

    With `dataset` (a --data or --annotations path), only when the run's args.json names that
    dataset, so a list is never applied to another dataset's images.
    """
    run_dir = os.path.dirname(os.path.abspath(weights_path))
    held_out = os.path.join(run_dir, HELD_OUT_FILE)
    if not os.path.isfile(held_out):
        return None
    if dataset is None:
        return held_out
    recorded = _recorded_args(run_dir)
    if recorded is None:
        return None
    sources = [recorded.get("data"), recorded.get("annotations")]
    return held_out if os.path.abspath(dataset) in [os.path.abspath(s) for s in sources if s] else None


def recorded_validation(weights_path: str) -> dict[str, str] | None:
    """The validation images the run whose folder holds `weights_path` was given, as evaluate.py's settings.

    `{"annotations": FILE}` for the run's --val-annotations, `{"data": DATASET, "image_dir": ...}` for the val split
    of its --data; None when the folder has no readable args.json, the run had no validation images of its own
    (see `held_out_list` for those it drew), or the file or dataset is no longer there.
    """
    run_dir = os.path.dirname(os.path.abspath(weights_path))
    recorded = _recorded_args(run_dir)
    if recorded is None:
        return None
    if recorded.get("val_annotations"):
        found = os.path.isfile(recorded["val_annotations"])
        return {"annotations": recorded["val_annotations"]} if found else None
    # --data validated on its own val split only where it has one: then its history has validation columns.
    return recorded_dataset(weights_path) if _validated(run_dir) else None


def recorded_dataset(weights_path: str) -> dict[str, str] | None:
    """The --data of the run whose folder holds `weights_path`, as evaluate.py's settings (`{"data", "image_dir"}`).

    None when the folder has no readable args.json, the run was given no --data, or the dataset is no longer there.
    """
    recorded = _recorded_args(os.path.dirname(os.path.abspath(weights_path)))
    if recorded is None or not recorded.get("data") or not os.path.exists(recorded["data"]):
        return None
    return {"data": recorded["data"], "image_dir": recorded.get("image_dir")}


def _recorded_args(run_dir: str) -> dict | None:
    """The run's args.json as a dict, or None when it is missing or unreadable."""
    try:
        with open(os.path.join(run_dir, "args.json"), encoding="utf-8") as handle:
            recorded = json.load(handle)
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) else None


def _validated(run_dir: str) -> bool:
    """Whether the run in `run_dir` scored validation images (history.csv has a val_loss column)."""
    try:
        with open(os.path.join(run_dir, "history.csv"), newline="", encoding="utf-8") as handle:
            return "val_loss" in next(csv.reader(handle), [])
    except OSError:
        return False


def trained_on_list(weights_path: str) -> str | None:
    """The list of the images the run whose folder holds `weights_path` trained on, or None (not a run's weights)."""
    path = os.path.join(os.path.dirname(os.path.abspath(weights_path)), TRAINED_ON_FILE)
    return path if os.path.isfile(path) else None


# `config` below is the run's `training.config.TrainConfig`, not imported here: TrainConfig.validate imports
# recipe_options, which imports this module for the names of the run's files (a circle tools/import_graph.py refuses).
def open_run_folder(config) -> int:
    """Checks the run folder, locks it (`lock_run_folder`) and, for a new run, writes args.json; returns the lock.

    A new run takes an empty or missing folder; one that holds a run only with
    `config.overwrite`, which deletes the earlier run's files first. Both are
    decided under the lock, so a run still writing there keeps every file.

    Raises:
        FileNotFoundError: --resume of a folder without args.json.
        FileExistsError: a file where the folder should be; a folder holding a run, without --overwrite; with
            it, a folder that also holds something no run writes (nothing is deleted).
        BlockingIOError: another process holds the folder.
    """
    if config.resume:
        args_path = os.path.join(config.log_dir, "args.json")
        if not os.path.isfile(args_path):
            raise FileNotFoundError(f"--resume: {args_path} not found; nothing to resume in {config.log_dir}")
        return lock_run_folder(config.log_dir)
    if os.path.lexists(config.log_dir) and not os.path.isdir(config.log_dir):
        raise FileExistsError(f"--log-dir {config.log_dir} is a file, not a folder: give a folder for the run")
    os.makedirs(config.log_dir, exist_ok=True)
    lock = lock_run_folder(config.log_dir)
    try:
        _delete_earlier_run(config)
        _write_args_json(config)
    except BaseException:
        os.close(lock)
        raise
    return lock


def _delete_earlier_run(config) -> None:
    """Deletes what an earlier run left in the (locked) run folder, with `config.overwrite`; else refuses it."""
    earlier = sorted(os.listdir(config.log_dir))
    if not earlier:
        return
    if not config.overwrite:
        raise FileExistsError(
            f"log dir {config.log_dir} already holds a run. Pass --resume {shlex.quote(config.log_dir)} to continue "
            "it, choose another --log-dir, or pass --overwrite to start over there (deleting the earlier run's "
            "files; keras-yolo3 wrote over logs/000/). Nothing was changed."
        )
    foreign = [name for name in earlier if not any(fnmatch.fnmatchcase(name, p) for p in RUN_OUTPUTS)]
    if foreign:
        raise FileExistsError(
            f"--overwrite: {config.log_dir} also holds {', '.join(foreign[:5])}"
            f"{' and more' if len(foreign) > 5 else ''}, which no run writes: move it away first "
            "(nothing was deleted)"
        )
    for name in earlier:
        path = os.path.join(config.log_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    logger.warning("--overwrite: deleted the earlier run in %s (%d files and folders)", config.log_dir, len(earlier))


def _write_args_json(config) -> None:
    write_text_atomic(os.path.join(config.log_dir, "args.json"), config.to_json() + "\n")


def lock_run_folder(log_dir: str) -> int:
    """Holds an exclusive lock on the run folder for this process's life; returns the lock's descriptor.

    Two trainings writing one run would mix their files: the second is
    refused. The lock is on the folder itself (no file in it), and the
    system drops it however the process ends.

    Raises:
        BlockingIOError: another process holds the folder.
    """
    descriptor = os.open(log_dir, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise BlockingIOError(
            f"another training process is writing {log_dir}: one run folder takes one run at a time "
            "(wait for it to end, or give this run another --log-dir)"
        ) from None
    return descriptor


def _saved_work(log_dir: str) -> list[str]:
    """The weights files a run saved in `log_dir` (hidden temporaries of interrupted saves are not work)."""
    return sorted(name for name in os.listdir(log_dir) if name.endswith((".h5", ".keras")) and not name.startswith("."))


def _remove_unstarted_run(log_dir: str) -> None:
    """Deletes `log_dir` when the run saved nothing there: no finished epoch, no weights file.

    A folder with weights (the first epoch's best.weights.h5 written before
    its run state, say) is kept: --resume continues it.
    """
    if not os.path.isdir(log_dir) or os.path.isfile(os.path.join(log_dir, RUN_STATE_FILE)):
        return
    saved = _saved_work(log_dir)
    if saved:
        logger.info("kept %s: it holds %s; --resume %s continues it", log_dir, ", ".join(saved), log_dir)
        return
    shutil.rmtree(log_dir, ignore_errors=True)
    logger.info("removed %s: the run stopped before its first epoch ended", log_dir)


def _trim_history(history_csv: str, epochs_done: int) -> None:
    """Drops rows of epochs a resumed run repeats (finished after the last saved state)."""
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

    def write(temporary):
        with open(temporary, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(kept)

    atomic_write(history_csv, write)
