"""Network shapes, parameter counts, layer roles and serialization."""

import keras
import numpy as np
import pytest

from keras_yolo_mgpu import create_model, freeze_layers, get_anchors, model_data_path, tiny_yolo_body, yolo_body
from keras_yolo_mgpu.model.yolo3 import build_body, check_input_shape

TINY_ANCHORS = get_anchors(model_data_path("tiny_yolo_anchors.txt"))
FULL_ANCHORS = get_anchors(model_data_path("yolo_anchors.txt"))


def test_parameter_counts_match_keras_yolo3():
    full = yolo_body(keras.Input((416, 416, 3)), 3, 80)
    tiny = tiny_yolo_body(keras.Input((416, 416, 3)), 3, 80)
    assert full.count_params() == 62_001_757
    assert tiny.count_params() == 8_858_734
    # The Keras 2 graph of keras-yolo3 has 252 layers (input included).
    assert len(full.layers) == 252


def test_full_weight_shape_sequence_follows_darknet_order():
    model = yolo_body(keras.Input((None, None, 3)), 3, 2)
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert len(convs) == 75
    # Darknet-53 first, in order: 32, then the stride-2 conv of each resblock.
    assert [c.filters for c in convs[:5]] == [32, 64, 32, 64, 128]
    kernels = [tuple(c.kernel.shape) for c in convs]
    assert kernels[0] == (3, 3, 3, 32)
    # The three output convs carry a bias, the rest feed a BatchNormalization.
    outputs = [c for c in convs if c.name.startswith("yolo_output_")]
    assert [c.name for c in outputs] == ["yolo_output_0", "yolo_output_1", "yolo_output_2"]
    assert all(c.use_bias for c in outputs)
    assert sum(c.use_bias for c in convs) == 3
    assert [tuple(c.kernel.shape) for c in outputs] == [(1, 1, 1024, 21), (1, 1, 512, 21), (1, 1, 256, 21)]


@pytest.mark.parametrize("size", [416, 320])
def test_full_output_shapes(size):
    model = yolo_body(keras.Input((size, size, 3)), 3, 80)
    assert [tuple(o.shape) for o in model.outputs] == [
        (None, size // 32, size // 32, 255),
        (None, size // 16, size // 16, 255),
        (None, size // 8, size // 8, 255),
    ]


def test_dynamic_input_runs_on_several_sizes():
    model = tiny_yolo_body(keras.Input((None, None, 3)), 3, 2)
    for height, width in [(64, 96), (128, 64)]:
        outputs = model.predict(np.zeros((1, height, width, 3), np.float32), verbose=0)
        assert [o.shape for o in outputs] == [(1, height // 32, width // 32, 21), (1, height // 16, width // 16, 21)]
    full = yolo_body(keras.Input((None, None, 3)), 3, 2)
    outputs = full.predict(np.zeros((1, 96, 64, 3), np.float32), verbose=0)
    assert [o.shape[1:3] for o in outputs] == [(3, 2), (6, 4), (12, 8)]


def test_two_builds_have_identical_layer_names():
    first = build_body(TINY_ANCHORS, 2)
    second = build_body(TINY_ANCHORS, 2)
    assert [layer.name for layer in first.layers] == [layer.name for layer in second.layers]


@pytest.mark.parametrize(
    "freeze_body, trainable_prefixes",
    [(0, ("darknet_", "yolo_")), (1, ("yolo_",)), (2, ("yolo_output_",))],
)
def test_freeze_by_role(freeze_body, trainable_prefixes):
    body = build_body(FULL_ANCHORS, 2)
    freeze_layers(body, freeze_body)
    weighted = [layer for layer in body.layers if layer.weights]
    for layer in weighted:
        assert layer.trainable == layer.name.startswith(trainable_prefixes), layer.name
    if freeze_body == 2:
        assert len(body.trainable_weights) == 6  # 3 output kernels + 3 biases
    if freeze_body == 1:
        # Darknet-53 has 52 convolutions, each with a BatchNormalization.
        frozen_convs = [layer for layer in weighted if isinstance(layer, keras.layers.Conv2D) and not layer.trainable]
        assert len(frozen_convs) == 52


def test_freeze_body_rejects_bad_value():
    with pytest.raises(ValueError, match="freeze_body must be 0, 1 or 2"):
        freeze_layers(build_body(TINY_ANCHORS, 2), 3)


@pytest.mark.parametrize("bad", [(100, 64), (64,), (0, 64), "64"])
def test_input_shape_must_be_multiple_of_32(bad):
    with pytest.raises(ValueError, match="input_shape"):
        check_input_shape(bad)


def test_create_model_inputs_and_output():
    body, train = create_model((64, 96), TINY_ANCHORS, 2, freeze_body=0)
    assert [t.name for t in train.inputs] == ["image", "y_true_0", "y_true_1"]
    assert tuple(train.inputs[1].shape) == (None, 2, 3, 3, 7)
    assert tuple(train.inputs[2].shape) == (None, 4, 6, 3, 7)
    assert tuple(train.output.shape) == (None, 1)
    # The training model shares the body's weights.
    assert {id(w) for w in body.weights} == {id(w) for w in train.weights}


def test_training_model_serialization_round_trip(tmp_path):
    body, train = create_model((64, 64), TINY_ANCHORS, 2, freeze_body=0)
    path = tmp_path / "train.keras"
    train.save(path)
    restored = keras.models.load_model(path)  # safe mode: no Lambda to refuse
    rng = np.random.default_rng(0)
    inputs = {
        "image": rng.random((2, 64, 64, 3), dtype=np.float32),
        "y_true_0": np.zeros((2, 2, 2, 3, 7), np.float32),
        "y_true_1": np.zeros((2, 4, 4, 3, 7), np.float32),
    }
    np.testing.assert_allclose(train.predict(inputs, verbose=0), restored.predict(inputs, verbose=0), rtol=1e-6)
