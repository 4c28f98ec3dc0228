"""The training recipe: keras-yolo3's two stages on one or several devices.

Stage 1 trains with the body frozen (`freeze_body`), stage 2 unfreezes
everything with a lower learning rate, ReduceLROnPlateau and EarlyStopping.
An optional stage 0 first trains the output convolutions alone on the
body's features (`bottleneck_epochs`, `training.bottleneck`).
Each run writes into one log directory (`training.run_folder`); the recipe's
options are assembled by `training.recipe_options`.

`seed` seeds every random draw. The initial weights are built once, outside
any strategy, so they do not depend on the device count. The training data
is one stream over both stages; `run_state.RunStateCheckpoint` saves the
stream position with the model, optimizer and callbacks' counters at every
epoch end, and `resume=True` ends with the weights of the uninterrupted run.

Under a strategy the global batch must divide by the replicas; the replica
model (`parallel="multi_gpu_model"`) slices any batch (8 over 3: 3, 3, 2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shlex
import shutil
import sys
import tempfile

from keras_yolo_mgpu.backend import NAME, distribution
from keras_yolo_mgpu.data.host import steps_per_epoch
from keras_yolo_mgpu.data.scan import cache_dir
from keras_yolo_mgpu.data.streams import choose_feed, training_stream, validation_stream
from keras_yolo_mgpu.heap import limit_arenas
from keras_yolo_mgpu.keras_compat import global_dtype_policy_setting, restore_global_dtype_policy
from keras_yolo_mgpu.model.boxes import MAX_BOXES
from keras_yolo_mgpu.model.loss import totalloss
from keras_yolo_mgpu.model.yolo3 import freeze_layers
from keras_yolo_mgpu.parallel.engine import build_engine, is_chief
from keras_yolo_mgpu.progress import is_interactive
from keras_yolo_mgpu.training import bottleneck, run_state
from keras_yolo_mgpu.training.callbacks import best_epoch, read_history, sigterm_stops_the_run
from keras_yolo_mgpu.training.checkpoint import link_keras_yolo3_name, save_weights_atomic
from keras_yolo_mgpu.training.config import TrainConfig, TrainResult, draw_seed
from keras_yolo_mgpu.training.pictures import write_prediction_pictures
from keras_yolo_mgpu.training.precision import training_device_kind
from keras_yolo_mgpu.training.recipe_options import make_optimizer
from keras_yolo_mgpu.training.run_folder import BEST_WEIGHTS, FINAL_WEIGHTS, LAST_WEIGHTS, _remove_unstarted_run
from keras_yolo_mgpu.training.run_setup import RunSetup
from keras_yolo_mgpu.training.training_model import create_model

logger = logging.getLogger(__name__)

STAGE1_WEIGHTS = "trained_weights_stage_1.weights.h5"


def fit_verbosity(verbose: int) -> int:
    """`fit`'s `verbose`: Keras's progress bar on a terminal or in a notebook, else one line per epoch (2).

    Written to a file (`train.py > log.txt`, nohup), the bar's every redraw and colour code would be kept.
    """
    return 2 if verbose == 1 and not is_interactive(sys.stdout) else verbose


def train(config: TrainConfig) -> TrainResult:
    """Runs both stages into `config.log_dir`; SIGTERM stops it at any point as Ctrl-C does (`Terminated`)."""
    with sigterm_stops_the_run():
        return _train(config)


def _train(config: TrainConfig) -> TrainResult:
    config.validate()
    config = _check_backend(config)
    limit_arenas()  # before the feed's and the engine's threads first allocate
    if config.seed is None:
        config = dataclasses.replace(config, seed=draw_seed())
        logger.info(
            "seed %d (drawn; recorded in args.json: pass --seed %d to repeat the run)", config.seed, config.seed
        )

    engine = build_engine(
        config.gpus,
        simulate=config.simulate_devices,
        strategy=config.strategy,
        parallel=config.parallel,
        sync_bn=config.sync_bn,
    )  # before any TF op

    config = _choose_feed(config, engine)
    distribution.use_compilation_cache(cache_dir(config.scan_cache))
    distribution.return_memory_after_compiles()

    # The dtype policy is process-global: a mixed-precision run must not leave it set for what the process builds next.
    previous_policy = global_dtype_policy_setting()
    # A new run that stops before its first epoch ends (refused weights, bad data) removes the folder it created.
    new_folder = not config.resume and not (os.path.isdir(config.log_dir) and os.listdir(config.log_dir))
    saved_before = _saved_state(config.log_dir) if config.resume else None
    training_run = None
    try:
        training_run = _TrainingRun(config, engine)
        return training_run.run()
    except BaseException as error:
        if new_folder:
            _remove_unstarted_run(config.log_dir)
        if training_run is None or training_run.chief:
            _say_what_was_kept(config, error, saved_before.epoch if saved_before else 0)
        raise
    finally:
        if training_run is not None and training_run.folder_lock is not None:
            os.close(training_run.folder_lock)  # the next run in this process may take the folder
        restore_global_dtype_policy(previous_policy)


def _saved_state(log_dir: str) -> run_state.RunState | None:
    """The unfinished run state saved in `log_dir`, or None (none, finished, or unreadable)."""
    try:
        state = run_state.read_run_state(log_dir)
    except (OSError, ValueError):  # never mask what stopped the run
        return None
    return None if state is None or state.finished else state


def _say_what_was_kept(config: TrainConfig, error: BaseException, epochs_before: int) -> None:
    """After a run stopped: a warning naming what its folder keeps and the epoch --resume continues from.

    Said after Ctrl-C, or an error once this process saved an epoch; not when a resumed run fails before
    training on (resuming again would fail the same way), nor when no epoch was saved.
    """
    state = _saved_state(config.log_dir)
    if state is None or not (isinstance(error, KeyboardInterrupt) or state.epoch > epochs_before):
        return
    kept = [name for name in (LAST_WEIGHTS, BEST_WEIGHTS) if os.path.isfile(os.path.join(config.log_dir, name))]
    logger.warning(
        "the run stopped; %s keeps the weights it saved%s. python train.py --resume %s continues it from epoch %d "
        "of %d as if it had not stopped (from Python: train(resume=%r))",
        config.log_dir,
        f" ({', '.join(kept)})" if kept else "",
        shlex.quote(config.log_dir),
        state.epoch + 1,
        config.epochs,
        config.log_dir,
    )


def _check_backend(config: TrainConfig) -> TrainConfig:
    """`config` with Keras's backend recorded (a new run); refuses to resume a run on another backend."""
    distribution.check_feed(config.feed)
    if not config.resume or config.backend is None:
        return dataclasses.replace(config, backend=NAME)
    if config.backend != NAME:
        raise ValueError(
            f"the run in {config.log_dir} trained on the {config.backend} backend; this process runs {NAME}. "
            f"Resume it with KERAS_BACKEND={config.backend} (its optimizer state and data stream continue there), or "
            f"start a new run from its weights: --weights {shlex.quote(os.path.join(config.log_dir, LAST_WEIGHTS))}"
        )
    return config


def _choose_feed(config: TrainConfig, engine) -> TrainConfig:
    """`config` with JAX's feed chosen (`data.streams.choose_feed`) and said; TensorFlow's is tf.data."""
    if distribution.INPUT_PIPELINE == "tf.data":
        if config.workers is not None:
            logger.warning("--workers is not used: it sizes the JAX feed; tf.data sizes its own threads (AUTOTUNE)")
        return config
    feed, why = choose_feed(config.feed, config.workers, training_device_kind(engine.devices) == "GPU")
    logger.info("feed: worker %s (%s)", feed, why)
    return dataclasses.replace(config, feed=feed)


def _per_replica(batch: int, replicas: int) -> str:
    """Images per replica for the log: "4", or "2-3" where the replica model slices unevenly."""
    low, high = batch // replicas, -(-batch // replicas)
    return str(low) if low == high else f"{low}-{high}"


@contextlib.contextmanager
def _first_error_reported():
    """Raises the exception that stopped a `fit`, not one that Keras's clean-up of it raised.

    Keras 3.15's JAX trainer empties the model's variables while a step runs;
    when its first step stops (Ctrl-C while it compiles, an error in its
    first batch) its `finally` (`finalize_variable_values` with --ema) fails
    on them with "TypeError: 'NoneType' object is not callable", which would
    hide the cause (a Ctrl-C would end with status 1 instead of 130).
    """
    try:
        yield
    except TypeError as error:
        if error.__context__ is None:
            raise
        raise error.__context__ from None


def _extend_history(history: dict[str, list[float]], stage_history: dict[str, list[float]]) -> None:
    """Appends one stage's `fit` history to the run's."""
    for key, values in stage_history.items():
        history.setdefault(key, []).extend(values)


class _TrainingRun(RunSetup):
    """One run of both stages on a built engine, as named steps; `run` calls them in order.

    The steps fill in, in order: `state` (the `run_state.RunState` a resumed
    run continues, else None), `class_names`, `anchors` (N, 2), `masks`,
    `kind`, `metadata`, `train_annotations` / `val_annotations`, `body` (the
    single-device template every saved file holds), `fit_model` (what `fit`
    runs on the engine), `recipe` and `common_callbacks`.
    """

    def __init__(self, config: TrainConfig, engine):
        self.config = config
        self.engine = engine
        # Global batch of stage 1 and of stage 2 (None: "auto", measured by `choose_batch_size`).
        auto = config.batch_size == "auto"
        self.batch_sizes = [
            None if auto else config.batch_size,
            config.batch_size2 or (None if auto else config.batch_size),
        ]
        replicas = engine.replicas
        # Under a strategy every replica must get the same batch (the replica model slices unevenly).
        for batch in self.batch_sizes:
            if batch is not None and engine.parallel == "strategy" and batch % replicas:
                raise ValueError(
                    f"global batch size {batch} does not divide over {replicas} replicas; every replica must get "
                    f"the same batch. Use a multiple of {replicas}, e.g. {max(replicas, batch - batch % replicas)} or "
                    f"{batch + replicas - batch % replicas}."
                )
        self.chief = is_chief(engine.strategy)
        # The run folder's lock (run_folder.lock_run_folder), held by the chief from open_log_dir on.
        self.folder_lock = None
        # Non-chief multi-worker processes write their logs to a scratch folder.
        self.run_dir = config.log_dir if self.chief else tempfile.mkdtemp(prefix="yolo_worker_")
        self.history_csv = os.path.join(self.run_dir, "history.csv")

    def run(self) -> TrainResult:
        """Runs every step: log dir, data, model, callbacks, the two stages, the final weights."""
        self.state = self.open_log_dir()
        self.read_settings_and_data()
        self.choose_precision_and_jit()
        self.choose_batch_size()
        if self.config.bottleneck_epochs and self.state is None:
            self.run_bottleneck_stage()
        stage1_left = self.config.freeze_epochs > 0 and (self.state is None or self.state.stage == 1)
        self.build_models(freeze_body=self.config.freeze_body if stage1_left else 0)
        self.make_callbacks()
        history: dict[str, list[float]] = {}
        last = self.state
        epoch = last.epoch if last else 0
        position = last.stream_position if last else 0
        if last is not None and last.stopped and last.weights_kind == "fit":
            # EarlyStopping ended the run before it was interrupted: its last epoch's weights become the final ones.
            stage, end = last.stage, last.epoch
            rate = (self.config.lr1, self.config.lr2)[stage - 1]
            _, last = self.fit_stage(stage, rate, self.batch_sizes[stage - 1], end, end, [], position, last)
        elif stage1_left:
            stage_history, last = self.run_stage1(epoch, position)
            _extend_history(history, stage_history)
            epoch, position = last.epoch, last.stream_position
        stage_history, last = self.run_stage2(epoch, position, last)
        _extend_history(history, stage_history)
        final_path = self.save_final_weights(last)
        if self.chief and self.config.pictures:
            write_prediction_pictures(self, final_path)
        return self.result(final_path, history)

    def run_bottleneck_stage(self) -> None:
        """Stage 0 (`bottleneck_epochs`): the start weights, their output convolutions trained on features.

        On the default device, before the strategy's model is built (`training.bottleneck`); saved as
        trained_weights_stage_0.weights.h5 (and keras-yolo3's .h5). A resumed run that had saved them starts
        from them.
        """
        config = self.config
        path = os.path.join(config.log_dir, bottleneck.STAGE0_WEIGHTS)
        body, train_model = create_model(freeze_body=2, **self.model_settings())
        if config.resume and os.path.isfile(path):
            body.load_weights(path)
            logger.info("stage 0 was done before the run stopped: its weights %s are the start", path)
        else:
            body.set_weights(self.start_weights())
            bottleneck.train_output_layers(
                body,
                train_model.get_layer("yolo_loss"),
                (self.train_annotations, self.val_annotations),
                input_shape=config.input_shape,
                anchors=self.anchors,
                num_classes=len(self.class_names),
                masks=self.masks,
                iou_thresh=self.iou_thresh,
                epochs=config.bottleneck_epochs,
                seed=config.seed,
                jit=bool(config.jit),
                verbose=fit_verbosity(config.verbose),
            )
            if self.chief:
                save_weights_atomic(body, path, self.metadata)
                logger.info(
                    "stage 0 weights: %s (also as keras-yolo3's %s)",
                    path,
                    os.path.basename(link_keras_yolo3_name(path)),
                )
        self._start_weights = body.get_weights()

    def datasets(self, batch: int, start_position: int):
        """`(train, validation or None, steps per epoch)` for a global `batch`, the stream from `start_position`."""
        config = self.config
        encoding = (config.input_shape, self.anchors, len(self.class_names), batch)
        shared = dict(
            seed=config.seed, cache=config.cache, max_boxes=MAX_BOXES, masks=self.masks, iou_thresh=self.iou_thresh
        )
        train_ds = training_stream(
            self.engine,
            self.train_annotations,
            *encoding,
            augment=config.augment,
            feed=config.feed,
            workers=config.workers,
            start_position=start_position,
            multi_scale=config.multi_scale,
            mosaic=config.mosaic,
            **shared,
        )
        val_ds = None
        if self.val_annotations:
            val_ds = validation_stream(self.engine, self.val_annotations, *encoding, **shared)
        steps = config.steps_per_epoch or steps_per_epoch(len(self.train_annotations), batch)
        return train_ds, val_ds, steps

    def fit_stage(self, stage, learning_rate, batch, initial_epoch, end_epoch, extra_callbacks, position, restore):
        """One stage's `fit` from `initial_epoch` to `end_epoch`, reading the stream from `position`.

        `restore`: the RunState to continue (its backup weights and optimizer,
        its callbacks' counters), or None. Returns (history, last RunState).
        """
        config, fit_model, recipe = self.config, self.fit_model, self.recipe
        train_ds, val_ds, steps = self.datasets(batch, position)
        self.throughput.global_batch_size = batch
        # Schedules count the optimizer's steps from the stage's first epoch (restored with it on resume).
        stage_start = 0 if stage == 1 else config.freeze_epochs
        self.compile_stage(learning_rate, stage_start, steps, restore)
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
        if initial_epoch >= end_epoch:  # a resumed stage whose last epoch was done (or that had stopped early)
            if restore is not None and restore.weights_kind == "fit":
                # What the end of the interrupted `fit` would have done: with --ema the averages become the weights.
                with self.engine.strategy.scope():
                    fit_model.optimizer.finalize_variable_values(fit_model.trainable_weights)
            return {}, restore
        self.log_stage(stage, initial_epoch, end_epoch, learning_rate, batch, steps)
        # Under the strategy's scope: on JAX that is what shards each batch over the devices.
        with self.engine.strategy.scope(), _first_error_reported():
            result = fit_model.fit(
                train_ds,
                steps_per_epoch=steps,
                validation_data=val_ds,
                epochs=end_epoch,
                initial_epoch=initial_epoch,
                callbacks=[
                    *self.engine.fit_callbacks(),
                    *self.precision_callbacks(),
                    *recipe.first(learning_rate, stage_start, steps),
                    *tracked,
                    *recipe.last(),
                    saver,
                ],
                verbose=fit_verbosity(config.verbose),
            )
        return result.history, saver.last_state

    def compile_stage(self, learning_rate, stage_start: int, steps: int, restore) -> None:
        """Compiles `fit_model` for a stage with a fresh optimizer; a resumed `fit` takes back its saved state.

        `stage_start`: the epoch the stage's schedules count from.
        """
        config, fit_model = self.config, self.fit_model
        with self.engine.strategy.scope():
            fit_model.compile(
                optimizer=make_optimizer(config, learning_rate, stage_start, steps),
                loss=totalloss,
                jit_compile=bool(config.jit),
            )
            if restore is not None and restore.weights_kind == "fit":
                run_state.restore_fit_weights(fit_model, os.path.join(config.log_dir, restore.weights))

    def log_stage(self, stage, initial_epoch, end_epoch, learning_rate, batch, steps) -> None:
        """The log line that opens a stage's `fit`."""
        logger.info(
            "stage %d: epochs %d-%d, lr %g, global batch %d (%s per replica), %d steps/epoch, %d trainable weights",
            stage,
            initial_epoch + 1,
            end_epoch,
            learning_rate,
            batch,
            _per_replica(batch, self.engine.replicas),
            steps,
            len(self.fit_model.trainable_weights),
        )

    def run_stage1(self, epoch: int, position: int):
        """Stage 1 (frozen body) from `epoch` to `freeze_epochs`; saves the body as stage 2's start.

        Returns (history, the RunState stage 2 starts from).
        """
        config = self.config
        # A one-stage run with nothing frozen stops early on `patience`; keras-yolo3's frozen stage 1 never does.
        only_stage = config.freeze_epochs >= config.epochs and config.freeze_body == 0
        stopping = self.recipe.early_stopping(config.patience) if only_stage else []
        stage_history, last = self.fit_stage(
            1, config.lr1, self.batch_sizes[0], epoch, config.freeze_epochs, stopping, position, self.state
        )
        # Stage 2 starts from stage 1's weights with a fresh optimizer: the body's weights alone.
        stage2_start = run_state.RunState(
            stage=2,
            epoch=last.epoch,  # freeze_epochs, unless EarlyStopping ended a one-stage run
            stopped=last.stopped,
            stream_position=last.stream_position,
            weights=STAGE1_WEIGHTS,
            weights_kind="body",
            callbacks=run_state.callback_states([*self.common_callbacks, *self.recipe.checkpoints]),
        )
        if self.chief:
            stage1_path = os.path.join(config.log_dir, STAGE1_WEIGHTS)
            save_weights_atomic(self.body, stage1_path, self.metadata)
            link_keras_yolo3_name(stage1_path)
            run_state.write_run_state(config.log_dir, stage2_start)
            run_state.remove_stale_files(config.log_dir, keep=None)
        return stage_history, stage2_start

    def run_stage2(self, epoch: int, position: int, last):
        """Stage 2 (every layer trainable) from `epoch` to `epochs`, with ReduceLROnPlateau and EarlyStopping.

        `last`: the RunState so far (None: none saved yet). Returns (history, the last RunState);
        nothing runs when the run has no stage 2 or a resumed one had stopped early.
        """
        config = self.config
        # Stage 2 continues a saved state only on resume; after stage 1 in this process everything is in place.
        resume = self.state if self.state is not None and self.state.stage == 2 else None
        if resume is not None and resume.weights_kind == "body":
            # Stage 1's final weights: stage 2's start, or those of a one-stage run killed before it saved them.
            self.body.load_weights(os.path.join(config.log_dir, resume.weights))
        if config.epochs <= config.freeze_epochs or (resume is not None and resume.stopped):
            return {}, last
        freeze_layers(self.body, 0)
        stage2_callbacks = self.recipe.plateau_callbacks(config.reduce_lr_patience, config.early_stopping_patience)
        return self.fit_stage(
            2, config.lr2, self.batch_sizes[1], epoch, config.epochs, stage2_callbacks, position, resume
        )

    def save_final_weights(self, last) -> str:
        """Writes the final template weights (chief), marks the run finished, removes the backups; returns the path.

        Every worker then waits for the others, so none exits while the chief saves.
        """
        config = self.config
        final_path = os.path.join(config.log_dir, FINAL_WEIGHTS)
        if self.chief:
            save_weights_atomic(self.body, final_path, self.metadata)
            logger.info(
                "final weights (single-device template): %s (also as keras-yolo3's %s)",
                final_path,
                os.path.basename(link_keras_yolo3_name(final_path)),
            )
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
        self.engine.wait_for_all_workers()
        return final_path

    def result(self, final_path: str, history: dict[str, list[float]]) -> TrainResult:
        """The run's `TrainResult`: its weights files, its history (history.csv: every process's epochs; on a
        multi-worker run's other workers, `history`: this process's) and which epoch best.weights.h5 holds."""
        if self.chief and os.path.isfile(self.history_csv):
            history = read_history(self.history_csv)
        best_path = os.path.join(self.config.log_dir, BEST_WEIGHTS)
        kept = self.chief and os.path.isfile(best_path)
        epoch, value = (best_epoch(history, self.recipe.monitor, self.recipe.mode) if kept else None) or (None, None)
        return TrainResult(
            self.config.log_dir,
            final_path,
            history,
            len(history.get("epoch") or history.get("loss", [])),  # history.csv's rows, else this process's
            self.engine.replicas,
            best_weights=best_path if kept else None,
            monitor=self.recipe.monitor,
            best_epoch=epoch,
            best_value=value,
        )
