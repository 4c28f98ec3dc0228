"""Where a run stands, saved at every epoch end, so `--resume` continues it exactly.

Keras's `BackupAndRestore` restores the epoch, the weights and the optimizer,
but not the callbacks' counters (`wait`, `best`) nor the position in the
data stream. `RunStateCheckpoint` saves all of it, atomically, in two steps:

1. the model's weights and optimizer state to `backup/stage<S>-epoch<EEE>.weights.h5`;
2. `run_state.json`, replaced in one `os.replace`, which names that file
   and holds the stage, the epochs done, the stream position and the
   callbacks' state.

`run_state.json` is the commit point: a kill before step 2 leaves the
previous state and its weights file (deleted only after step 2).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import keras

from keras_yolo_mgpu.fileio import write_text_atomic
from keras_yolo_mgpu.training.checkpoint import save_weights_atomic
from keras_yolo_mgpu.training.run_folder import RUN_STATE_FILE

logger = logging.getLogger(__name__)

BACKUP_DIR = "backup"
_BACKUP_PREFIX = "stage"
_WEIGHTS_SUFFIX = ".weights.h5"

# The counters each Keras callback resets in `on_train_begin` and updates at epoch end. A callback of
# another class can take part by defining `get_run_state() -> dict` and `set_run_state(dict)`.
_CALLBACK_ATTRIBUTES = {
    keras.callbacks.ReduceLROnPlateau: ("wait", "cooldown_counter", "best"),
    keras.callbacks.EarlyStopping: ("wait", "stopped_epoch", "best", "best_epoch"),
    keras.callbacks.ModelCheckpoint: ("best", "_epochs_since_last_save"),
}


@dataclasses.dataclass
class RunState:
    """The run after its last finished epoch.

    Attributes:
        stage: 1 (frozen body) or 2 (everything trains).
        epoch: epochs finished over both stages (Keras's index of the next epoch).
        stream_position: training images drawn from the data stream so far.
        weights: the weights file, relative to the run folder.
        weights_kind: `"fit"`, the trained model with its optimizer state, or
            `"body"`, the template alone (stage 1's final weights: stage 2
            starts with a fresh optimizer, as an uninterrupted run does).
        callbacks: each tracked callback's counters, by `callback_key`.
        stopped: EarlyStopping ended the stage: nothing is left to train.
        finished: the final weights are written.
    """

    stage: int
    epoch: int
    stream_position: int
    weights: str | None = None
    weights_kind: str = "fit"
    callbacks: dict = dataclasses.field(default_factory=dict)
    stopped: bool = False
    finished: bool = False


def read_run_state(run_dir: str) -> RunState | None:
    """The saved state of the run in `run_dir`, or None when no epoch has finished yet."""
    path = os.path.join(run_dir, RUN_STATE_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        try:
            values = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON ({error}); it was not written by this project") from None
    known = {f.name for f in dataclasses.fields(RunState)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{path}: unknown entries {unknown}; was it written by a newer version?")
    return RunState(**values)


def write_run_state(run_dir: str, state: RunState) -> None:
    """Replaces `run_state.json` in one step (the commit point of an epoch's save)."""
    text = json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True) + "\n"
    write_text_atomic(os.path.join(run_dir, RUN_STATE_FILE), text)


def remove_stale_files(run_dir: str, keep: str | None) -> None:
    """Deletes `backup/stage*.weights.h5` files but `keep`, and `fileio.atomic_write`'s hidden `.*.tmp*` files."""
    backup = os.path.join(run_dir, BACKUP_DIR)
    keep_path = os.path.abspath(os.path.join(run_dir, keep)) if keep else None
    for folder in (run_dir, backup):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            ours = name.startswith(".") and ".tmp" in name
            ours |= folder == backup and name.startswith(_BACKUP_PREFIX) and name.endswith(_WEIGHTS_SUFFIX)
            if ours and os.path.isfile(path) and os.path.abspath(path) != keep_path:
                os.remove(path)


def callback_key(callback, index: int) -> str:
    return f"{index}:{type(callback).__name__}"


def callback_states(callbacks) -> dict:
    """The counters of every callback that has any, JSON-ready."""
    states = {}
    for index, callback in enumerate(callbacks):
        state = _get_state(callback)
        if state is not None:
            states[callback_key(callback, index)] = state
    return states


def restore_callback_states(callbacks, states: dict) -> None:
    """Sets the counters `callback_states` saved; run after the callbacks' own `on_train_begin`."""
    for index, callback in enumerate(callbacks):
        key = callback_key(callback, index)
        if key not in states:
            continue
        if hasattr(callback, "set_run_state"):
            callback.set_run_state(states[key])
            continue
        for name, value in states[key].items():
            setattr(callback, name, value)


def _get_state(callback) -> dict | None:
    if hasattr(callback, "get_run_state"):
        return callback.get_run_state()
    for kind, names in _CALLBACK_ATTRIBUTES.items():
        if isinstance(callback, kind):
            return {name: _plain(getattr(callback, name, None)) for name in names if hasattr(callback, name)}
    return None


def _plain(value):
    """numpy / TF scalars -> Python numbers for JSON (inf and nan included)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return float(value)


class RunStateCheckpoint(keras.callbacks.Callback):
    """Saves the run's state at every epoch end; restores the callbacks' counters on resume.

    Put it LAST: it saves after the other callbacks update their counters,
    and restores after their `on_train_begin` resets them.

    Args:
        run_dir: folder to write `run_state.json` and `backup/` into (a
            non-chief worker's is a scratch folder: every worker saves).
        stage: 1 or 2.
        initial_epoch: the epoch this `fit` starts at.
        start_position: the stream position of the dataset this `fit` reads.
        images_per_epoch: `steps_per_epoch * global_batch_size`.
        tracked: the callbacks whose counters are part of the run.
        restore: the saved counters to set at `on_train_begin` (resume).
    """

    def __init__(
        self,
        run_dir: str,
        *,
        stage: int,
        initial_epoch: int,
        start_position: int,
        images_per_epoch: int,
        tracked,
        restore: dict | None = None,
    ):
        super().__init__()
        self.run_dir = run_dir
        self.stage = stage
        self.initial_epoch = initial_epoch
        self.start_position = start_position
        self.images_per_epoch = images_per_epoch
        self.tracked = list(tracked)
        self.restore = restore
        self.last_state: RunState | None = None

    def on_train_begin(self, logs=None):
        if self.restore:
            restore_callback_states(self.tracked, self.restore)

    def on_epoch_end(self, epoch, logs=None):
        done = epoch + 1
        state = RunState(
            stage=self.stage,
            epoch=done,
            stream_position=self.start_position + (done - self.initial_epoch) * self.images_per_epoch,
            weights=os.path.join(BACKUP_DIR, f"{_BACKUP_PREFIX}{self.stage}-epoch{done:03d}{_WEIGHTS_SUFFIX}"),
            callbacks=callback_states(self.tracked),
            stopped=bool(self.model.stop_training),
        )
        save_weights_atomic(self.model, os.path.join(self.run_dir, state.weights))
        write_run_state(self.run_dir, state)
        remove_stale_files(self.run_dir, keep=state.weights)
        self.last_state = state


def restore_fit_weights(fit_model, path: str) -> None:
    """Loads a `RunStateCheckpoint` backup: the model's weights and its optimizer's state.

    Call inside the strategy scope, after `compile`: the optimizer's variables are created here.
    """
    if fit_model.optimizer is not None and not fit_model.optimizer.built:
        fit_model.optimizer.build(fit_model.trainable_variables)
    fit_model.load_weights(path)
