"""Named recipes (--recipe), checkpoints kept, anchor fit and Darknet start weights.

`keras-yolo3`'s recipe must be today's defaults exactly: the resolved
configuration (below) and the weights of a run (bit for bit against the
same run with those values spelled out as flags). The float64 1-vs-N runs
of both recipes are in test_recipe_equivalence.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OFFICIAL_CFGS = os.path.join(REPO, "model_data")  # the official Darknet cfgs the repository ships
# The values train.py used before recipes existed (its argparse defaults and
# config_from_args's rules), written out: epochs 100, stage 1 the first half
# with all but the output convs frozen, Adam 1e-3 then 1e-4, val_loss
# monitored with no mAP, no EMA, zero output bias, the model's anchor
# assignment, a file per improving epoch.
KERAS_YOLO3_VALUES = dict(
    epochs=100,
    freeze_epochs=50,
    freeze_body=2,
    optimizer="adam",
    lr1=1e-3,
    lr2=1e-4,
    eval_every=0,
    monitor="val_loss",
    lr_schedule="plateau",
    warmup_epochs=0.0,
    ema=0.0,
    objectness_prior=0.0,
    iou_thresh=None,
    save_period=None,
    batch_size=32,
)


def _config(*flags):
    from keras_yolo_mgpu.cli.train import build_parser, config_from_args

    return config_from_args(build_parser().parse_args(["--annotations", "a.txt", "--log-dir", "x", *flags]))


def test_keras_yolo3_recipe_resolves_to_the_old_defaults():
    from keras_yolo_mgpu.training.trainer import TrainConfig

    config = _config("--recipe", "keras-yolo3")
    assert {key: getattr(config, key) for key in KERAS_YOLO3_VALUES} == KERAS_YOLO3_VALUES
    # Every other setting too: TrainConfig's own defaults are keras-yolo3's.
    plain = TrainConfig(annotations="a.txt", classes=None, log_dir="x")
    assert dataclasses.asdict(config) == dataclasses.asdict(plain)
    assert _config("--recipe", "keras-yolo3", "--epochs", "16").freeze_epochs == 8  # half, as before


def test_default_recipe_and_explicit_flags_override_only_their_part():
    config = _config()
    assert config.recipe == "default"
    assert (config.epochs, config.freeze_epochs, config.freeze_body, config.lr1) == (100, 100, 0, 3e-3)
    assert (config.eval_every, config.monitor, config.ema, config.objectness_prior) == (1, "val_mAP50", 0.99, 0.01)
    assert (config.iou_thresh, config.save_period, config.patience) == (0.213, 0, 30)
    config = _config("--epochs", "16", "--ema", "0", "--save-period", "4")
    assert (config.epochs, config.freeze_epochs, config.ema, config.save_period) == (16, 16, 0.0, 4)
    assert (config.monitor, config.objectness_prior) == ("val_mAP50", 0.01)  # untouched parts stay the recipe's
    config = _config("--recipe", "keras-yolo3", "--monitor", "val_mAP")
    assert (config.monitor, config.eval_every, config.ema) == ("val_mAP", 1, 0.0)


def test_default_recipe_fine_tunes_at_a_lower_rate():
    # From scratch 3e-3, from --weights 1e-3 (PRETRAINED_VALUES); a given --lr still wins,
    # and keras-yolo3's rates do not depend on the start weights.
    assert (_config().lr1, _config().lr2) == (3e-3, 3e-4)
    assert (_config("--weights", "w.h5").lr1, _config("--weights", "w.h5").lr2) == (1e-3, 1e-4)
    assert _config("--weights", "w.h5", "--lr", "3e-3").lr1 == 3e-3
    assert _config("--weights", "w.h5", "--recipe", "keras-yolo3").lr1 == 1e-3
    assert _config("--weights", "w.h5", "--recipe", "keras-yolo3").lr2 == 1e-4
    assert _config("--weights", "w.h5").ema == _config().ema  # only the rates change


def test_args_json_from_before_recipes_resumes_as_keras_yolo3():
    from keras_yolo_mgpu.training.trainer import TrainConfig

    saved = json.loads(_config("--recipe", "keras-yolo3").to_json())
    for key in ("recipe", "save_period", "cfg"):  # settings an older args.json lacks
        del saved[key]
    config = TrainConfig.from_json(json.dumps(saved))
    assert (config.recipe, config.save_period, config.cfg) == ("keras-yolo3", None, None)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_synthetic_dataset(tmp_path_factory.mktemp("data"), num_train=8, num_val=4, image_size=64, seed=0)


def _run(dataset, log_dir, *flags):
    """train.py's main on 64 px tiny YOLOv3, 2 steps per epoch; returns the run folder's files."""
    from keras_yolo_mgpu.cli.train import main

    argv = [
        *("--annotations", dataset.train, "--val-annotations", dataset.val, "--classes", dataset.classes),
        *("--tiny", "--input-size", "64", "--batch-size", "4", "--steps-per-epoch", "2", "--seed", "0"),
        *("--log-dir", str(log_dir), "--quiet", *flags),
    ]
    assert main(argv) == 0
    return sorted(os.listdir(log_dir))


def _arrays(path):
    import h5py

    arrays = {}
    with h5py.File(path, "r") as handle:
        handle.visititems(lambda name, item: arrays.update({name: np.array(item)}) if hasattr(item, "dtype") else None)
    return arrays


def test_keras_yolo3_recipe_gives_the_weights_of_the_old_defaults_spelled_out(dataset, tmp_path):
    final = "trained_weights_final.weights.h5"
    named = _run(dataset, tmp_path / "named", "--recipe", "keras-yolo3", "--epochs", "2")
    spelled = [
        *("--epochs", "2", "--freeze-epochs", "1", "--freeze-body", "2", "--optimizer", "adam"),
        *("--lr", "1e-3", "--lr2", "1e-4", "--monitor", "val_loss", "--eval-every", "0"),
        *("--ema", "0", "--objectness-prior", "0", "--iou-thresh", "1", "--save-period", "1"),
    ]
    _run(dataset, tmp_path / "spelled", *spelled)  # under the default recipe
    first, second = _arrays(tmp_path / "named" / final), _arrays(tmp_path / "spelled" / final)
    assert first.keys() == second.keys()
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    # keras-yolo3's recipe keeps its file per improving epoch.
    assert any(name.startswith("ep001-") for name in named)


def test_default_recipe_keeps_best_last_and_periodic_files_only(dataset, tmp_path):
    # Epoch 1 is the first evaluated epoch, an improvement: keras-yolo3 would write ep001-*.
    files = _run(dataset, tmp_path / "periodic", "--epochs", "2", "--save-period", "2")
    assert {"best.weights.h5", "last.weights.h5", "trained_weights_final.weights.h5"} <= set(files)
    assert [name for name in files if name.startswith("ep")] == [f for f in files if f.startswith("ep002-")]
    assert len([name for name in files if name.startswith("ep")]) == 1


def _stop_epoch(values, patience):
    """Keras EarlyStopping's rule (mode max, min_delta 0): the epoch (1-based) it ends after, or None."""
    best, wait = -np.inf, 0
    for epoch, value in enumerate(values, 1):
        if value > best:
            best, wait = value, 0
        else:
            wait += 1
            if wait >= patience:
                return epoch
    return None


class _Killed(Exception):
    pass


def _kill_at(monkeypatch, where: str):
    """Raises `_Killed` instead of writing stage 1's end (`stage1_end`) or the final weights (`final`)."""
    from keras_yolo_mgpu.training import run_state
    from keras_yolo_mgpu.training.trainer import _TrainingRun

    def killed(*args, **kwargs):
        raise _Killed

    if where == "final":
        monkeypatch.setattr(_TrainingRun, "save_final_weights", killed)
        return
    write = run_state.write_run_state

    def write_until_stage1_end(run_dir, state):
        if state.weights_kind == "body":
            raise _Killed
        write(run_dir, state)

    monkeypatch.setattr(run_state, "write_run_state", write_until_stage1_end)


@pytest.mark.parametrize("where", ["stage1_end", "final"])
def test_patience_ends_the_one_stage_run_and_a_stopped_run_killed_resumes_to_its_weights(
    dataset, tmp_path, monkeypatch, where
):
    from keras_yolo_mgpu.cli.train import main
    from keras_yolo_mgpu.training.callbacks import read_history

    # The default recipe's one stage (EMA on); --lr 0: val mAP@0.5 does not
    # improve after epoch 1 (seed 0), so --patience 1 ends the run at epoch 2.
    run = tmp_path / "run"
    _kill_at(monkeypatch, where)
    with pytest.raises(_Killed):
        _run(dataset, run, "--epochs", "6", "--patience", "1", "--lr", "0")
    monkeypatch.undo()
    state = json.loads((run / "run_state.json").read_text())
    history = read_history(str(run / "history.csv"))
    stop = _stop_epoch(history["val_mAP50"], 1)
    assert stop is not None and stop < 6, history["val_mAP50"]
    assert (state["stopped"], state["epoch"], len(history["loss"])) == (True, stop, stop)
    assert state["weights_kind"] == {"stage1_end": "fit", "final": "body"}[where]
    assert main(["--resume", str(run), "--quiet"]) == 0  # the run folder as --resume's value
    # The final weights are the last epoch's EMA weights (last.weights.h5), not the start's.
    final, last = _arrays(run / "trained_weights_final.weights.h5"), _arrays(run / "last.weights.h5")
    assert final.keys() == last.keys()
    for name in final:
        np.testing.assert_array_equal(final[name], last[name], err_msg=name)
    assert len(read_history(str(run / "history.csv"))["loss"]) == stop  # nothing trained again


def test_a_frozen_stage_never_stops_early(dataset, tmp_path):
    from keras_yolo_mgpu.training.callbacks import read_history

    flags = ["--recipe", "keras-yolo3", "--epochs", "3", "--freeze-epochs", "3", "--patience", "1", "--lr", "0"]
    _run(dataset, tmp_path / "frozen", *flags, "--eval-every", "1", "--monitor", "val_mAP50", "--save-period", "0")
    assert len(read_history(str(tmp_path / "frozen" / "history.csv"))["loss"]) == 3


# --- anchor fit -------------------------------------------------------------
# Hand-computed with YOLOv5 AutoAnchor's definitions: r = min(w/aw, aw/w, h/ah, ah/h),
# best r per box, BPR = share of boxes with best r > 1/4; IoU of centred boxes.
#   box (10,10):  anchor (10,10) r 1                       IoU 1
#   box (40,10):  (10,10) r min(4,.25,1,1)=.25; (50,50) .2  IoU max(100/400, 400/2500) = .25
#   box (100,100): (50,50) r .5                             IoU 2500/10000 = .25
# BPR: .25 is not > .25, so 2 of 3; mean best IoU (1 + .25 + .25) / 3 = .5.
SIZES = np.array([[10, 10], [40, 10], [100, 100]], float)
ANCHORS = np.array([[10, 10], [50, 50]], float)


def test_best_possible_recall_and_mean_iou_match_the_hand_computed_reference():
    from keras_yolo_mgpu.data.kmeans import mean_iou
    from keras_yolo_mgpu.training.anchor_fit import best_possible_recall, best_ratio

    np.testing.assert_allclose(best_ratio(SIZES, ANCHORS), [1.0, 0.25, 0.5])
    assert best_possible_recall(SIZES, ANCHORS) == pytest.approx(2 / 3)
    assert best_possible_recall(SIZES, ANCHORS, threshold=4.01) == 1.0
    assert mean_iou(SIZES, ANCHORS) == pytest.approx(0.5)


def test_report_counts_used_anchors_only_and_warns(caplog):
    from keras_yolo_mgpu.training.anchor_fit import fit_anchors, report_anchor_fit

    anchors = np.array([[100, 100], [10, 10], [50, 50]], float)  # anchor 0 unused by the masks
    with caplog.at_level("INFO"):
        bpr, iou = report_anchor_fit(SIZES, anchors, [[1, 2]], (416, 416))
    assert (bpr, iou) == (pytest.approx(2 / 3), pytest.approx(0.5))
    assert "fit this dataset badly" in caplog.text and "--anchors auto" in caplog.text
    fitted = fit_anchors(SIZES, 3, [[1, 2]])
    assert (fitted[0] == [2, 2]).all()  # a quarter of the smallest box: never a box's best
    assert report_anchor_fit(SIZES, fitted, [[1, 2]], (416, 416))[0] == 1.0


@pytest.mark.parametrize("iou_thresh", [None, 0.213])
def test_boxes_without_target_are_those_keras_yolo3s_targets_leave_out_and_are_warned_of(iou_thresh, caplog):
    """The count the run warns of is the reference targets' (keras-yolo3's `preprocess_true_boxes`, with Darknet's
    `iou_thresh`): a box alone in an image, and nothing set in any scale's targets."""
    from keras_yolo3_targets import preprocess_true_boxes

    from keras_yolo_mgpu.model.boxes import anchor_masks
    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors
    from keras_yolo_mgpu.training.anchor_fit import boxes_without_target, report_anchor_fit

    anchors, masks = get_anchors(default_anchors_path(True)), anchor_masks(2)  # tiny YOLOv3: anchor 0 unused
    sizes = np.random.default_rng(0).uniform(2, 120, size=(200, 2)).round()
    expected = []
    for width, height in sizes:
        box = np.array([[[100, 100, 100 + width, 100 + height, 0]]], np.float32)
        targets = preprocess_true_boxes(box, (416, 416), anchors, 1, masks, iou_thresh)
        expected.append(not any(t[..., 4].any() for t in targets))
    missing = boxes_without_target(sizes, anchors, masks, iou_thresh)
    np.testing.assert_array_equal(missing, expected)
    assert 0 < missing.sum() < len(sizes)  # some boxes of each kind: the comparison can fail
    with caplog.at_level("WARNING"):
        report_anchor_fit(sizes, anchors, masks, (416, 416), iou_thresh)
    assert f"{missing.sum()} of 200 training boxes" in caplog.text and "is anchor 0, which no output" in caplog.text


# --- Darknet start weights ---------------------------------------------------


def _tiny_darknet(tmp_path, name="net.weights"):
    from darknet_files import random_weights, write_weights

    from keras_yolo_mgpu.weights import darknet

    cfg = os.path.join(OFFICIAL_CFGS, "yolov3-tiny.cfg")
    convs, _ = darknet.infer_layers(darknet.parse_cfg(cfg))
    weights = tmp_path / name
    write_weights(weights, random_weights(convs, seed=3))
    return cfg, str(weights)


def test_darknet_cfg_found_beside_or_by_official_size(tmp_path):
    from keras_yolo_mgpu.resources import model_data_path
    from keras_yolo_mgpu.weights.start_weights import find_cfg

    cfg, weights = _tiny_darknet(tmp_path)
    # Generated with the official cfg: the official file's size, 35,434,956 bytes.
    assert os.path.getsize(weights) == 35_434_956
    assert find_cfg(weights) == model_data_path("yolov3-tiny.cfg")  # none beside it: the shipped official cfg
    shutil.copy(cfg, tmp_path / "yolov3-tiny.cfg")
    assert find_cfg(weights) == str(tmp_path / "yolov3-tiny.cfg")
    shutil.copy(cfg, tmp_path / "net.cfg")
    assert find_cfg(weights) == str(tmp_path / "net.cfg")
    with pytest.raises(FileNotFoundError, match="--cfg"):
        find_cfg(weights, str(tmp_path / "missing.cfg"))


def test_train_from_darknet_weights_converts_as_convert_py(dataset, tmp_path):
    from keras_yolo_mgpu.cli.convert import main as convert_main

    cfg, weights = _tiny_darknet(tmp_path)
    assert convert_main([cfg, weights, str(tmp_path / "by_convert_py.weights.h5")]) == 0
    run = tmp_path / "run"
    _run(dataset, run, "--recipe", "keras-yolo3", "--weights", weights, "--cfg", cfg, "--epochs", "1")
    ours, reference = _arrays(run / "start_weights.weights.h5"), _arrays(tmp_path / "by_convert_py.weights.h5")
    assert ours.keys() == reference.keys()
    for name in ours:
        np.testing.assert_array_equal(ours[name], reference[name], err_msg=name)
    record = json.loads((run / "start_weights.json").read_text())
    assert record["source"] == os.path.abspath(weights) and record["official_net"] == "yolov3-tiny"
    assert json.loads((run / "args.json").read_text())["weights"] == weights  # the source, for --resume
