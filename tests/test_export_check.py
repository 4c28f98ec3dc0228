"""The export self-check fails on broken exports that a comparison on uniform noise passed."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from inference_helpers import CLASS_NAMES, TINY_ANCHORS, compare_detections, make_body

from keras_yolo_mgpu.inference import export
from keras_yolo_mgpu.inference.export_check import (
    FLOAT_TOLERANCES,
    INT8_TOLERANCES,
    ExportCheckError,
    check_export,
    compare_detection_lists,
    format_check,
    judge_outputs,
    run_keras,
    synthetic_check_images,
)
from keras_yolo_mgpu.inference.export_formats import open_runner
from keras_yolo_mgpu.inference.layers import build_inference_model

INPUT = (64, 64)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export_check")
    weights = str(folder / "tiny.weights.h5")
    make_body(seed=1).save_weights(weights)
    noise = np.random.default_rng(0).random((4, *INPUT, 3), dtype=np.float32)
    shapes = np.array([[64, 64], [128, 64], [64, 128], [40, 64]], np.float32)
    # The export's score: above everything the network finds in noise, as a
    # trained detector finds nothing there.
    probe = export.build_export_model(weights, TINY_ANCHORS, CLASS_NAMES, input_size=INPUT)
    score = float(run_keras(probe, noise, shapes)["decoded_scores"].max()) + 1e-3
    assert score < 1.0
    good = export.build_export_model(weights, TINY_ANCHORS, CLASS_NAMES, input_size=INPUT, score=score)
    scenes = synthetic_check_images(INPUT)
    return {
        "folder": folder,
        "weights": weights,
        "good": good,
        "score": score,
        "noise": (noise, shapes),
        "scenes": scenes,
    }


def _wrong_anchor(setup):
    anchors = np.array(TINY_ANCHORS, np.float32)
    anchors[4] *= 1.5  # one anchor of the coarse scale
    return export.build_export_model(setup["weights"], anchors, CLASS_NAMES, input_size=INPUT, score=setup["score"])


def _swapped_channels(setup):
    image, image_shape = keras.Input((*INPUT, 3), name="image"), keras.Input((2,), name="image_shape")
    return keras.Model([image, image_shape], setup["good"]([keras.ops.flip(image, axis=-1), image_shape]))


def test_the_real_export_passes_with_detections_compared(setup):
    """The Keras model against itself, as a perfect export (test_export.py runs the real files)."""
    result = check_export(
        setup["good"], lambda *inputs: run_keras(setup["good"], *inputs), *setup["scenes"], source="x"
    )
    assert result["detections_compared"] >= result["images"] == 4  # every image yields boxes at the floor
    assert result["at_floor"]["exact"] and result["at_floor"]["found"] == result["at_floor"]["compared"]
    assert result["decoded"]["scored_boxes"] > 0


@pytest.mark.parametrize("make_broken", [_wrong_anchor, _swapped_channels], ids=["wrong_anchor", "swapped_channels"])
def test_a_broken_export_fails_the_check_that_noise_passed(setup, make_broken):
    path = export.export_savedmodel(make_broken(setup), str(setup["folder"] / make_broken.__name__))
    run = open_runner(path)
    # The former check: detections on uniform noise. Both lists are empty, so it passed.
    noise, shapes = setup["noise"]
    reference = run_keras(setup["good"], noise, shapes)
    former = compare_detections(reference, run(noise, shapes))
    assert int(reference["valid_detections"].sum()) == 0
    assert former["valid_equal"] and former["max_box_diff"] == 0 and former["max_score_diff"] == 0
    with pytest.raises(ExportCheckError, match="does not match the Keras model"):
        check_export(setup["good"], run, *setup["scenes"], source="generated scenes")


def test_nothing_to_compare_fails(setup):
    """A network that scores nothing anywhere gives the check nothing to compare: that is a failure."""
    body = make_body(seed=1)
    for name in ("yolo_output_0", "yolo_output_1"):
        layer = body.get_layer(name)
        kernel, bias = layer.get_weights()
        layer.set_weights([kernel * 0.0, np.full_like(bias, -30.0)])  # every objectness ~ 1e-13
    model = build_inference_model(body, TINY_ANCHORS, len(CLASS_NAMES), input_shape=INPUT, decoded_outputs=True)
    with pytest.raises(ExportCheckError, match="nothing was compared"):
        check_export(model, lambda image, shape: run_keras(model, image, shape), *setup["scenes"], source="scenes")


def _decoded_scene(rng, images=4, boxes=3000, classes=2):
    """Keras-model-like outputs: faint background boxes and 3 confident objects per image, apart.

    Returns `decoded_boxes` (N, K, 4) pixels of a 64 px input, `decoded_scores` (N, K, C).
    """
    corner = rng.uniform(0, 48, (images, boxes, 2))
    decoded_boxes = np.concatenate([corner, corner + rng.uniform(4, 16, (images, boxes, 2))], axis=-1)
    decoded_scores = rng.uniform(0, 0.02, (images, boxes, classes))
    for i in range(images):
        for j, (x, y) in enumerate([(2, 2), (40, 2), (20, 40)]):
            decoded_boxes[i, j] = [x, y, x + 20, y + 20]
            decoded_scores[i, j, j % classes] = rng.uniform(0.7, 0.9)
    return {"decoded_boxes": decoded_boxes.astype(np.float32), "decoded_scores": decoded_scores.astype(np.float32)}


def _with_own_nms(decoded):
    """The outputs of an export with decoding and NMS inside at the export's score 0.3."""
    from keras_yolo_mgpu.inference.export_formats import host_nms

    return {**decoded, **host_nms(decoded, score=0.3, iou=0.45, max_boxes=20, max_detections=100)}


def _judge(reference, decoded, tolerance):
    return judge_outputs(reference, _with_own_nms(decoded), score=0.3, iou=0.45, source="arrays", tolerance=tolerance)


@pytest.fixture(scope="module")
def int8_outputs():
    """(Keras outputs, a healthy INT8 export's): 8-bit noise on every score, 5 background boxes off by 0.12."""
    rng = np.random.default_rng(0)
    reference = _decoded_scene(rng)
    scores = reference["decoded_scores"] + rng.normal(0, 0.01, reference["decoded_scores"].shape)
    scores[:2, 100:105, 0] += 0.12  # 5 background boxes of 2 images
    boxes = reference["decoded_boxes"] + rng.uniform(-1, 1, reference["decoded_boxes"].shape)
    good = {"decoded_boxes": boxes.astype(np.float32), "decoded_scores": np.clip(scores, 0, 1).astype(np.float32)}
    return _with_own_nms(reference), good


def test_a_good_int8_export_whose_largest_score_difference_exceeds_the_bound_passes(int8_outputs):
    reference, good = int8_outputs
    result = _judge(reference, good, INT8_TOLERANCES)
    decoded = result["decoded"]
    # The former check (the largest of all differences) refused it; the judged figures are well inside.
    assert decoded["max_score_diff"] > INT8_TOLERANCES.score
    assert decoded["score_diff_at_percentile"] < 0.05 and decoded["scored_mean_score_diff"] < 0.02
    assert result["at_floor"]["found"] == result["at_floor"]["compared"] == 12
    assert result["own_nms"]["found"] == result["own_nms"]["compared"] == 12
    line = format_check(result)
    assert "99th percentile" in line and "mean score difference of the scored boxes" in line
    with pytest.raises(ExportCheckError, match="at the largest of 12000 boxes"):
        _judge(reference, good, FLOAT_TOLERANCES)  # a float32 export must match everywhere


def _wrong_scale(good):
    return {**good, "decoded_scores": good["decoded_scores"] * 0.5}


def _swapped_classes(good):
    return {**good, "decoded_scores": good["decoded_scores"][..., ::-1]}


def _no_detections(good):
    return {**good, "decoded_scores": np.zeros_like(good["decoded_scores"])}


@pytest.mark.parametrize(
    "break_export, says",
    [
        (_wrong_scale, r"differ in score by 0\.[34]"),  # still detects every object (at >= 0.35), at the wrong score
        (_swapped_classes, "finds 0 of the Keras model's 12 detections"),
        (_no_detections, "finds 0 of the Keras model's 12 detections"),
    ],
    ids=["wrong_score_scale", "swapped_class_outputs", "zero_detections"],
)
def test_a_broken_int8_export_fails(int8_outputs, break_export, says):
    reference, good = int8_outputs
    with pytest.raises(ExportCheckError, match=says):
        _judge(reference, break_export(good), INT8_TOLERANCES)


def _tied_scene():
    """Keras-model-like outputs: image 0 with objects, image 1 as a barely trained network scores it."""
    rng = np.random.default_rng(1)
    reference = _decoded_scene(rng, images=2, boxes=200)
    scores = reference["decoded_scores"]
    scores[0, 0, 0], scores[0, 1, 1] = 0.8, 0.8 + 1e-7  # two of image 0's 3 objects tie to rounding
    scores[1] = 0.01 + rng.uniform(0, 1e-7, scores[1].shape)  # image 1 like a barely trained network's: all alike
    return reference


def test_a_float32_export_whose_tied_scores_round_the_other_way_passes():
    """Scores equal to rounding sort and suppress either way: a correct export is not refused for that."""
    reference = _with_own_nms(_tied_scene())
    export_side = {key: value.copy() for key, value in reference.items()}
    rounding = np.random.default_rng(2).random(export_side["decoded_scores"].shape, dtype=np.float32)
    export_side["decoded_scores"] += np.float32(1e-7) * rounding  # against the tolerance's 1e-4
    # Its own NMS output: the same detections, two of them (scores apart by rounding) in the other order.
    for key in ("boxes", "scores", "classes"):
        export_side[key][0, [0, 1]] = export_side[key][0, [1, 0]]
    export_side["scores"][0, 0] += np.float32(1e-8)
    # The row-by-row comparison of before refused both: at the floor, the NMS of the export's scores keeps
    # other boxes than the Keras model's (rounding chooses among overlapping boxes), and its own list is reordered.
    from keras_yolo_mgpu.inference.export_formats import host_nms

    at_floor = dict(score=0.005, iou=0.45, max_boxes=20, max_detections=100)
    assert not compare_detection_lists(host_nms(reference, **at_floor), host_nms(export_side, **at_floor))["exact"]
    assert not compare_detection_lists(reference, export_side)["exact"]

    def judge(other):  # the export's own NMS output as given
        return judge_outputs(reference, other, score=0.3, iou=0.45, source="arrays", tolerance=FLOAT_TOLERANCES)

    result = judge(export_side)
    assert result["at_floor"]["compared"] > 50 and result["at_floor"]["exact"]
    own = result["own_nms"]
    assert own["compared"] == 3 and own["paired"] and own["found"] == 3 and not own["exact"]
    assert own["paired_max_box_diff"] == 0.0 and own["paired_max_score_diff"] < 2e-7
    # A detection box the export's own NMS moves by 1 px is still refused, as is a detection of another class.
    moved = {**export_side, "boxes": export_side["boxes"].copy()}
    moved["boxes"][0, 1] += 1.0
    with pytest.raises(ExportCheckError, match=r"own_nms: detection boxes differ by up to 1 px"):
        judge(moved)
    relabelled = {**export_side, "classes": export_side["classes"].copy()}
    relabelled["classes"][0, 2] = 1 - relabelled["classes"][0, 2]
    with pytest.raises(ExportCheckError, match=r"own_nms: detections differ in count or class"):
        judge(relabelled)
