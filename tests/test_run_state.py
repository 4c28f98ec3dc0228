"""The pieces of an exact resume: callback counters, the commit file, stale files, the history."""

import dataclasses
import json
import math
import os

import keras
import pytest

from keras_yolo_mgpu.training import run_state
from keras_yolo_mgpu.training.config import TrainConfig
from keras_yolo_mgpu.training.run_folder import (
    _remove_unstarted_run,
    _trim_history,
    lock_run_folder,
    open_run_folder,
    recorded_validation,
)
from keras_yolo_mgpu.training.trainer import _say_what_was_kept


def _stage2_callbacks():
    return [
        keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=3),
        keras.callbacks.EarlyStopping(monitor="loss", patience=10),
    ]


def test_callback_counters_survive_on_train_begin():
    """Keras resets these counters in on_train_begin; the restore must win over that reset."""
    before = _stage2_callbacks()
    plateau, stopping = before
    plateau.wait, plateau.best, plateau.cooldown_counter = 2, 41.5, 1
    stopping.wait, stopping.best, stopping.best_epoch = 7, 40.25, 3
    saved = run_state.callback_states(before)
    assert saved["0:ReduceLROnPlateau"] == {"wait": 2, "best": 41.5, "cooldown_counter": 1}

    after = _stage2_callbacks()
    saver = run_state.RunStateCheckpoint(
        "unused", stage=2, initial_epoch=4, start_position=0, images_per_epoch=8, tracked=after, restore=saved
    )
    for callback in [*after, saver]:  # the order fit() calls them in: the saver last
        callback.on_train_begin()
    assert (after[0].wait, after[0].best, after[0].cooldown_counter) == (2, 41.5, 1)
    assert (after[1].wait, after[1].best, after[1].best_epoch) == (7, 40.25, 3)


def test_state_round_trip_keeps_infinities(tmp_path):
    state = run_state.RunState(stage=2, epoch=5, stream_position=40, weights="backup/x.weights.h5")
    state.callbacks = {"4:TemplateModelCheckpoint": {"best": math.inf}}
    run_state.write_run_state(str(tmp_path), state)
    assert run_state.read_run_state(str(tmp_path)) == state
    assert run_state.read_run_state(str(tmp_path / "none")) is None
    (tmp_path / run_state.RUN_STATE_FILE).write_text('{"stage": 2, "epoch": 1, "stream_position": 0, "x": 1}')
    with pytest.raises(ValueError, match="unknown entries"):
        run_state.read_run_state(str(tmp_path))


def test_only_our_stale_files_are_removed(tmp_path):
    backup = tmp_path / run_state.BACKUP_DIR
    backup.mkdir()
    for name in ("stage2-epoch003.weights.h5", "stage2-epoch004.weights.h5", "mine.txt"):
        (backup / name).write_text("x")
    (tmp_path / ".trained_weights_final.abc123.tmp.weights.h5").write_text("half")  # a killed save
    (tmp_path / "notes.txt").write_text("user")
    run_state.remove_stale_files(str(tmp_path), keep="backup/stage2-epoch004.weights.h5")
    assert sorted(p.name for p in backup.iterdir()) == ["mine.txt", "stage2-epoch004.weights.h5"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup", "notes.txt"]


def test_history_keeps_only_the_epochs_the_state_covers(tmp_path):
    history = tmp_path / "history.csv"
    history.write_text("epoch,loss\n1,5.0\n2,4.0\n3,3.5\n4,3")  # epoch 4 cut short by the kill
    _trim_history(str(history), 2)
    assert history.read_text().splitlines() == ["epoch,loss", "1,5.0", "2,4.0"]


def test_a_stopped_run_that_saved_weights_keeps_its_folder(tmp_path):
    saved, unsaved = tmp_path / "saved", tmp_path / "unsaved"
    for folder in (saved, unsaved):
        folder.mkdir()
        (folder / "args.json").write_text("{}")
        (folder / ".best.abc.tmp.weights.h5").write_text("half")  # an interrupted save is not saved work
    (saved / "best.weights.h5").write_text("weights")  # the first epoch's, written before its run state
    _remove_unstarted_run(str(saved))
    _remove_unstarted_run(str(unsaved))
    assert (saved / "best.weights.h5").read_text() == "weights"
    assert not unsaved.exists()


def test_a_second_process_cannot_take_a_locked_run_folder(tmp_path):
    first = lock_run_folder(str(tmp_path))
    try:
        with pytest.raises(BlockingIOError, match="another training process is writing"):
            lock_run_folder(str(tmp_path))  # a second open of the folder, as another process's
    finally:
        os.close(first)
    os.close(lock_run_folder(str(tmp_path)))  # free again once the holder lets go


def test_a_file_as_the_run_folder_is_named(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    config = TrainConfig(annotations="a.txt", classes="c.txt", log_dir=str(tmp_path / "notes.txt"))
    with pytest.raises(FileExistsError, match=r"--log-dir .*notes.txt is a file, not a folder"):
        open_run_folder(config)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def _earlier_run(folder) -> dict[str, str]:
    """An earlier run's files in `folder`, this project's and keras-yolo3's; returns name -> text."""
    files = {
        "args.json": "{}",
        "best.weights.h5": "weights",
        "ep003-loss30.814-val_loss39.405.h5": "keras-yolo3's checkpoint",
        "events.out.tfevents.1.host": "keras-yolo3's events",
        "tensorboard/train/events.out.tfevents.2.host": "events",
        "backup/stage1-epoch2.weights.h5": "backup",
        "train_batch0.jpg": "picture",
        "val_split.txt": "images",
    }
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return files


def _files(folder) -> dict[str, str]:
    return {str(path.relative_to(folder)): path.read_text() for path in folder.rglob("*") if path.is_file()}


def test_a_new_run_over_an_earlier_one_is_refused_or_deletes_only_its_files_with_overwrite(tmp_path):
    folder = tmp_path / "logs" / "000"
    folder.mkdir(parents=True)
    earlier = _earlier_run(folder)
    config = TrainConfig(annotations="a.txt", classes="c.txt", log_dir=str(folder))
    with pytest.raises(FileExistsError, match=r"already holds a run\. .*or pass --overwrite to start over there"):
        open_run_folder(config)
    assert _files(folder) == earlier
    overwrite = dataclasses.replace(config, overwrite=True)
    # A file no run writes stops it before anything is deleted.
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"--overwrite: .*000 also holds notes.txt, which no run writes"):
        open_run_folder(overwrite)
    assert _files(folder) == {**earlier, "notes.txt": "mine"}
    (folder / "notes.txt").unlink()
    # A run still writing the folder holds its lock: nothing is deleted.
    holder = lock_run_folder(str(folder))
    try:
        with pytest.raises(BlockingIOError, match="another training process is writing"):
            open_run_folder(overwrite)
    finally:
        os.close(holder)
    assert _files(folder) == earlier
    os.close(open_run_folder(overwrite))
    assert sorted(_files(folder)) == ["args.json"]
    assert TrainConfig.from_json((folder / "args.json").read_text()) == overwrite


def test_no_validation_images_with_a_recipe_that_scores_them_says_which_flags_the_recipe_set():
    from keras_yolo_mgpu.training.config import TrainConfig
    from keras_yolo_mgpu.training.recipe_options import monitor_and_mode

    config = TrainConfig(annotations="a.txt", classes="c.txt", val_split=0.0, eval_every=1, monitor="val_mAP50")
    config = dataclasses.replace(config, recipe="default")
    with pytest.raises(ValueError, match=r"--val-split 0, .* the default recipe scores validation mAP every 1 epoch"):
        monitor_and_mode(config, has_validation=False)


def test_a_stopped_run_says_what_it_kept_only_when_resuming_would_continue_it(tmp_path, caplog):
    config = TrainConfig(annotations="a.txt", classes="c.txt", log_dir=str(tmp_path), epochs=10)
    (tmp_path / "last.weights.h5").write_bytes(b"")

    def said(error, epochs_before):
        caplog.clear()
        with caplog.at_level("WARNING", logger="keras_yolo_mgpu.training.trainer"):
            _say_what_was_kept(config, error, epochs_before)
        return [record.getMessage() for record in caplog.records]

    assert said(KeyboardInterrupt(), 0) == []  # no epoch saved: nothing to continue
    run_state.write_run_state(str(tmp_path), run_state.RunState(stage=1, epoch=3, stream_position=24))
    expected = (
        f"the run stopped; {tmp_path} keeps the weights it saved (last.weights.h5). python train.py --resume "
        f"{tmp_path} continues it from epoch 4 of 10 as if it had not stopped (from Python: train(resume='{tmp_path}'))"
    )
    assert said(KeyboardInterrupt(), 0) == [expected]
    assert said(KeyboardInterrupt(), 3) == [expected]  # Ctrl-C of a resumed run before its next epoch
    assert said(MemoryError(), 1) == [expected]  # an error after this process saved epochs 2 and 3
    # A resumed run that fails before training on would fail the same way resumed again.
    assert said(ValueError("the dataset changed"), 3) == []
    run_state.write_run_state(str(tmp_path), run_state.RunState(stage=1, epoch=10, stream_position=80, finished=True))
    assert said(KeyboardInterrupt(), 0) == []  # a finished run: nothing to resume


def test_the_validation_a_run_recorded_is_what_evaluate_takes_for_its_weights(tmp_path):
    """evaluate.py --weights RUN/W alone: the run's --val-annotations, or --data where the run scored its val split."""
    run, data = tmp_path / "run", tmp_path / "data"
    run.mkdir()
    data.mkdir()
    weights = str(run / "best.weights.h5")
    assert recorded_validation(weights) is None  # no args.json: not a run's folder
    val = tmp_path / "val.txt"
    val.write_text("a.jpg 1,1,5,5,0\n")
    (run / "args.json").write_text(json.dumps({"val_annotations": str(val), "data": None}))
    assert recorded_validation(weights) == {"annotations": str(val)}
    val.unlink()
    assert recorded_validation(weights) is None  # the file is gone: nothing to score, nothing guessed
    (run / "args.json").write_text(json.dumps({"val_annotations": None, "data": str(data), "image_dir": None}))
    (run / "history.csv").write_text("epoch,loss\n1,2.0\n")
    assert recorded_validation(weights) is None  # --data without a val split, and none drawn: no validation
    (run / "history.csv").write_text("epoch,loss,val_loss\n1,2.0,2.5\n")
    assert recorded_validation(weights) == {"data": str(data), "image_dir": None}
