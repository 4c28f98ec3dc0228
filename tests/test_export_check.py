"""The export self-check fails on broken exports that a comparison on uniform noise passed."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from inference_helpers import CLASS_NAMES, TINY_ANCHORS, make_body

from keras_yolo_mgpu.inference import export
from keras_yolo_mgpu.inference.backends import open_runner
from keras_yolo_mgpu.inference.export_check import (
    ExportCheckError,
    check_export,
    run_keras,
    synthetic_check_images,
)
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
    former = export.compare_detections(reference, run(noise, shapes))
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
