"""The modern recipe's pieces on their own: schedules, EMA swap, mAP callback, CSV, flags."""

import math

import keras
import numpy as np
import pytest

from keras_yolo_mgpu.training.callbacks import HistoryCSVLogger, read_history
from keras_yolo_mgpu.training.ema import average_swap_callbacks
from keras_yolo_mgpu.training.evaluation_callback import OnEvaluatedEpochs
from keras_yolo_mgpu.training.schedules import (
    COSINE_FINAL_FRACTION,
    WARMUP_START_FRACTION,
    LinearWarmup,
    StageSchedule,
    rate_factor,
)


def _ultralytics_one_cycle(x, steps, y1=1.0, y2=COSINE_FINAL_FRACTION):
    # ultralytics.utils.one_cycle: a sinusoidal ramp from y1 to y2 over `steps`.
    return ((1 - math.cos(x * math.pi / steps)) / 2) * (y2 - y1) + y1


def test_cosine_follows_ultralytics_one_cycle_after_a_linear_warmup():
    epochs, warmup, steps = 10, 2.0, 5
    schedule = StageSchedule(1e-3, first_epoch=0, steps_per_epoch=steps, total_epochs=epochs, warmup_epochs=warmup)
    for step in range(epochs * steps + 1):
        position = step / steps
        expected = 1e-3 * _ultralytics_one_cycle(position, epochs)
        if position < warmup:
            expected *= np.interp(position, [0, warmup], [WARMUP_START_FRACTION, 1.0])
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-5), step


def test_stage_two_continues_the_run_position_with_its_own_base_rate():
    stage2 = StageSchedule(1e-4, first_epoch=4, steps_per_epoch=3, total_epochs=8)
    assert float(stage2(0)) == pytest.approx(1e-4 * _ultralytics_one_cycle(4, 8), rel=1e-6)
    assert float(stage2(12)) == pytest.approx(1e-4 * COSINE_FINAL_FRACTION, rel=1e-5)
    config = stage2.get_config()
    assert StageSchedule(**config).get_config() == config


def test_plateau_factor_is_one_after_warmup():
    assert float(rate_factor(0.0, total_epochs=5, warmup_epochs=1)) == pytest.approx(WARMUP_START_FRACTION)
    assert float(rate_factor(0.5, total_epochs=5, warmup_epochs=1)) == pytest.approx(0.505)
    assert float(rate_factor(3.0, total_epochs=5, warmup_epochs=1)) == 1.0


def _tiny_model(optimizer):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def test_linear_warmup_assigns_the_rate_per_step_then_leaves_it_alone():
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))

    model = _tiny_model(keras.optimizers.SGD(0.1))
    x, y = np.ones((8, 2), np.float32), np.zeros((8, 1), np.float32)
    warmup = LinearWarmup(0.1, first_epoch=0, steps_per_epoch=4, warmup_epochs=1.5)
    model.fit(x, y, batch_size=2, epochs=3, verbose=0, callbacks=[warmup, Record()])
    expected = [0.1 * np.interp(s / 4, [0, 1.5], [WARMUP_START_FRACTION, 1]) for s in range(6)] + [0.1] * 6
    np.testing.assert_allclose(seen, expected, rtol=1e-6)
    # A later change (ReduceLROnPlateau's) survives the warm-up callback.
    model.optimizer.learning_rate = 0.01
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[warmup, Record()])
    assert seen[-1] == pytest.approx(0.01)


def test_average_swap_puts_the_average_in_and_the_trained_weights_back_exactly():
    model = _tiny_model(keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5))
    x, y = np.random.default_rng(0).random((8, 2)), np.ones((8, 1))
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)  # builds the optimizer and its averages
    swap_in, swap_out = average_swap_callbacks()
    seen = {}

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen["during"] = [w.copy() for w in self.model.get_weights()]

    trained = []

    class BeforeSwap(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            trained.append([w.copy() for w in self.model.get_weights()])
            averages = self.model.optimizer._model_variables_moving_average
            seen["averages"] = [keras.ops.convert_to_numpy(a) for a in averages]

    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[BeforeSwap(), swap_in, Record(), swap_out])
    for during, average in zip(seen["during"], seen["averages"]):
        np.testing.assert_array_equal(during, average)
    assert not np.array_equal(seen["during"][0], trained[0][0])
    # After the epoch the trained weights were back (Keras then finalised
    # the fit by writing the averages, which is what it always does).
    np.testing.assert_array_equal(model.get_weights()[0], seen["averages"][0])


def test_on_evaluated_epochs_counts_only_evaluations():
    calls = []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            calls.append(epoch)

    wrapped = OnEvaluatedEpochs(Record(), "val_mAP")
    for epoch, logs in enumerate([{"loss": 1}, {"loss": 1, "val_mAP": 0.1}, {"loss": 1}]):
        wrapped.on_epoch_end(epoch, logs)
    assert calls == [1]


def test_history_csv_keeps_its_columns_when_some_epochs_lack_a_value(tmp_path):
    path = str(tmp_path / "history.csv")
    for epochs_logs in ([{"loss": 3.0}, {"loss": 2.0, "val_mAP": 0.5}], [{"loss": 1.0}]):
        logger = HistoryCSVLogger(path, required_columns=("val_mAP",), append=True)
        logger.on_train_begin()
        for epoch, logs in enumerate(epochs_logs):
            logger.on_epoch_end(epoch, logs)
        logger.on_train_end()
    history = read_history(path)
    assert history["loss"] == [3.0, 2.0, 1.0]
    assert np.isnan(history["val_mAP"][0]) and history["val_mAP"][1] == 0.5 and np.isnan(history["val_mAP"][2])


def test_train_flags_reach_the_config():
    from keras_yolo_mgpu.cli.train import build_parser, config_from_args

    args = build_parser().parse_args(
        ["--annotations", "a.txt", "--recipe", "keras-yolo3", "--monitor", "val_mAP", "--lr-schedule", "cosine"]
        + ["--warmup-epochs", "2"]
        + ["--ema", "0.999", "--log-dir", "x"]
    )
    config = config_from_args(args)
    assert (config.monitor, config.eval_every, config.lr_schedule, config.warmup_epochs, config.ema) == (
        "val_mAP",
        1,
        "cosine",
        2.0,
        0.999,
    )
    assert (config.objectness_prior, config.box_loss) == (0.0, None)  # keras-yolo3's init, the model's loss
    assert config.pictures and not config_from_args(build_parser().parse_args(["--no-pictures"])).pictures
    config.validate()
    args = build_parser().parse_args(
        ["--annotations", "a.txt", "--recipe", "keras-yolo3", "--objectness-prior", "0.01", "--box-loss", "ciou"]
        + ["--ciou-weight", "2"]
        + ["--iou-thresh", "0.213"]
    )
    config = config_from_args(args)
    assert (config.objectness_prior, config.box_loss, config.ciou_weight) == (0.01, "ciou", 2.0)
    assert config.iou_thresh == 0.213
    config.validate()


@pytest.mark.parametrize(
    "model, flag, expected",
    [
        ("yolov3-tiny", None, None),  # keras-yolo3: the best anchor only
        ("yolov3-tiny", 0.3, 0.3),
        ("yolov4", None, 0.213),  # yolov4.cfg's iou_thresh
        ("yolov4", 1.0, None),  # Darknet's "off"
        ("yolov4-tiny", None, None),  # yolov4-tiny.cfg sets none
    ],
)
def test_iou_thresh_defaults_to_the_models_cfg(model, flag, expected):
    from keras_yolo_mgpu.model.architectures import resolve_iou_thresh

    assert resolve_iou_thresh(flag, model) == expected


def test_a_run_saved_before_iou_thresh_resumes_with_the_best_anchor_only():
    import json

    from keras_yolo_mgpu.training.trainer import TrainConfig

    config = TrainConfig(annotations="a.txt", classes="c.txt", model="yolov4")
    assert TrainConfig.from_json(config.to_json()).iou_thresh is None  # saved: the model's default, kept
    older = json.loads(config.to_json())
    del older["iou_thresh"]
    assert TrainConfig.from_json(json.dumps(older)).iou_thresh == 1.0


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(monitor="val_map"), "monitor must be one of"),
        (dict(monitor="val_mAP", eval_every=0), "needs eval_every"),
        (dict(lr_schedule="step"), "lr_schedule must be one of"),
        (dict(ema=1.0), "EMA decay must be in"),
        (dict(warmup_epochs=20), "warmup_epochs must be in"),
        (dict(objectness_prior=1.0), "objectness_prior must be in"),
        (dict(box_loss="giou"), "box_loss must be one of"),
        (dict(ciou_weight=0.0), "ciou_weight must be > 0"),
        (dict(iou_thresh=0.0), "iou_thresh must be in"),
    ],
)
def test_bad_recipe_settings_are_refused_by_name(change, message):
    from keras_yolo_mgpu.training.trainer import TrainConfig

    config = TrainConfig(annotations="a.txt", classes="c.txt", epochs=10, freeze_epochs=5, **change)
    with pytest.raises(ValueError, match=message):
        config.validate()


def test_resume_restores_the_average_and_the_step_that_drives_the_schedule(tmp_path):
    """The run state --resume reads (training.run_state) brings back the EMA and the step count."""
    from keras_yolo_mgpu.training.run_state import RunStateCheckpoint, read_run_state, restore_fit_weights

    x, y = np.random.default_rng(1).random((8, 2)), np.ones((8, 1))

    def compiled():
        schedule = StageSchedule(0.1, first_epoch=0, steps_per_epoch=4, total_epochs=3, warmup_epochs=1)
        return _tiny_model(keras.optimizers.SGD(schedule, use_ema=True, ema_momentum=0.5))

    model = compiled()
    saver = RunStateCheckpoint(
        str(tmp_path), stage=1, initial_epoch=0, start_position=0, images_per_epoch=8, tracked=[]
    )
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[saver])
    # fit() ends by writing the averages into the weights; the saved state was taken before.
    saved_averages = [keras.ops.convert_to_numpy(a) for a in model.optimizer._model_variables_moving_average]

    resumed = compiled()
    restore_fit_weights(resumed, str(tmp_path / read_run_state(str(tmp_path)).weights))
    assert int(keras.ops.convert_to_numpy(resumed.optimizer.iterations)) == 4  # the schedule continues at step 4
    for saved, loaded in zip(saved_averages, resumed.optimizer._model_variables_moving_average):
        np.testing.assert_array_equal(saved, keras.ops.convert_to_numpy(loaded))


def _objectness_biases(weights_by_layer, num_classes):
    """{output layer: its objectness biases (one per anchor)}."""
    return {name: biases[4 :: num_classes + 5] for name, (_, biases) in weights_by_layer.items()}


def _output_layers(body):
    from keras_yolo_mgpu.model.yolo3 import OUTPUT_PREFIX

    return {layer.name: layer.get_weights() for layer in body.layers if layer.name.startswith(OUTPUT_PREFIX)}


def test_objectness_prior_sets_only_the_objectness_biases():
    from keras_yolo_mgpu.model.yolo3 import build_body, set_objectness_prior
    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors

    body = build_body(get_anchors(default_anchors_path(True)), 3)
    before = _output_layers(body)
    changed = set_objectness_prior(body, 3, 0.01, layer_names={"yolo_output_1"})
    after = _output_layers(body)
    assert changed == ["yolo_output_1"] and sorted(after) == ["yolo_output_0", "yolo_output_1"]
    np.testing.assert_array_equal(after["yolo_output_0"][1], before["yolo_output_0"][1])
    kernel, biases = after["yolo_output_1"]
    np.testing.assert_array_equal(kernel, before["yolo_output_1"][0])
    # 3 anchors x (5 + 3) channels; objectness is channel 4 of each anchor's block.
    objectness = np.zeros(24, bool)
    objectness[[4, 12, 20]] = True
    np.testing.assert_allclose(1 / (1 + np.exp(-biases[objectness])), 0.01, rtol=1e-5)
    np.testing.assert_array_equal(biases[~objectness], before["yolo_output_1"][1][~objectness])
    with pytest.raises(ValueError, match="objectness prior must be in"):
        set_objectness_prior(body, 3, 0.0)


def test_objectness_prior_leaves_loaded_output_convs_alone(tmp_path):
    """The prior applies to a fresh build and to the new output convs of another class count, not to loaded ones."""
    from keras_yolo_mgpu.model.yolo3 import build_body
    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors
    from keras_yolo_mgpu.training.model_settings import _initial_weights
    from keras_yolo_mgpu.training.trainer import TrainConfig

    anchors = get_anchors(default_anchors_path(True))
    keras.utils.set_random_seed(5)
    trained = build_body(anchors, 2)
    for layer in trained.layers:  # output biases that a prior would visibly change
        if layer.name.startswith("yolo_output_"):
            kernel, biases = layer.get_weights()
            layer.set_weights([kernel, np.full_like(biases, 0.25)])
    path = str(tmp_path / "trained.weights.h5")
    trained.save_weights(path)
    prior = float(np.log(0.01 / 0.99))

    def start(num_classes, weights):
        config = TrainConfig(annotations="a.txt", classes="c.txt", seed=3, objectness_prior=0.01, weights=weights)
        body = build_body(anchors, num_classes)
        body.set_weights(_initial_weights(config, anchors, num_classes))
        return _objectness_biases(_output_layers(body), num_classes)

    for biases in start(2, None).values():  # fresh build
        np.testing.assert_allclose(biases, prior, rtol=1e-6)
    for biases in start(2, path).values():  # loaded: what was learned stays
        np.testing.assert_array_equal(biases, 0.25)
    for biases in start(4, path).values():  # another class count: new output convs, prior
        np.testing.assert_allclose(biases, prior, rtol=1e-6)


def test_box_loss_option_reaches_the_loss_layer():
    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors
    from keras_yolo_mgpu.training.training_model import create_model

    anchors = get_anchors(default_anchors_path(True))
    cases = [
        (dict(), "yolov3", None),
        (dict(box_loss="ciou"), "ciou", 1.0),  # YOLOv3's CIoU weight: that of keras-yolo3's box terms
        (dict(box_loss="ciou", ciou_weight=0.5), "ciou", 0.5),
        (dict(model="yolov4-tiny"), "ciou", 0.07),  # yolov4.cfg's iou_normalizer
    ]
    for options, box_loss, weight in cases:
        _, train_model = create_model((64, 64), anchors, 2, freeze_body=0, **options)
        config = train_model.get_layer("yolo_loss").get_config()
        assert config["box_loss"] == box_loss, options
        if weight is not None:
            assert config["iou_normalizer"] == weight, options
    with pytest.raises(ValueError, match="CIoU box loss only"):
        create_model((64, 64), anchors, 2, freeze_body=0, ciou_weight=0.5)
