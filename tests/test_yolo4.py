"""YOLOv4 / YOLOv4-tiny bodies, their layers, scale_x_y decoding and the CIoU box loss."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_yolo_mgpu import create_model, freeze_layers, get_anchors, model_data_path, preprocess_true_boxes
from keras_yolo_mgpu.model.architectures import get_architecture, model_name
from keras_yolo_mgpu.model.boxes import box_ciou, cell_offset, yolo_head
from keras_yolo_mgpu.model.loss import yolo_loss_terms
from keras_yolo_mgpu.model.yolo4 import ChannelGroup, Mish, yolo4_body, yolo4_tiny_body


def test_bodies_output_coarse_to_fine_with_role_names():
    tiny = yolo4_tiny_body(keras.Input((64, 96, 3)), 3, 2)
    assert [tuple(o.shape) for o in tiny.outputs] == [(None, 2, 3, 21), (None, 4, 6, 21)]
    full = yolo4_body(keras.Input((64, 64, 3)), 3, 2)
    assert [tuple(o.shape) for o in full.outputs] == [(None, 2, 2, 21), (None, 4, 4, 21), (None, 8, 8, 21)]
    for body, outputs in ((tiny, 2), (full, 3)):
        names = [layer.name for layer in body.layers[1:]]
        assert all(n.startswith(("darknet_", "yolo_")) for n in names), names
        assert {f"yolo_output_{i}" for i in range(outputs)} <= set(names)
    # Freezing by role works as for YOLOv3: 2 leaves only the output convs trainable.
    freeze_layers(full, 2)
    assert {layer.name for layer in full.layers if layer.trainable and layer.weights} == {
        "yolo_output_0",
        "yolo_output_1",
        "yolo_output_2",
    }
    freeze_layers(full, 1)
    assert not full.get_layer("darknet_conv2d_1").trainable and full.get_layer("yolo_conv2d_1").trainable


def test_mish_and_channel_group_compute_and_round_trip():
    x = np.array([[-30.0, -1.0, 0.0, 0.5, 3.0, 40.0]], np.float32)
    expected = x * np.tanh(np.log1p(np.exp(np.minimum(x, 30.0))))
    expected[0, -1] = 40.0  # softplus(40) = 40, tanh(40) = 1
    np.testing.assert_allclose(Mish()(x).numpy(), expected, rtol=1e-6, atol=1e-12)
    grouped = ChannelGroup(2, 1)(np.arange(8, dtype=np.float32).reshape(1, 1, 1, 8)).numpy()
    np.testing.assert_array_equal(grouped.ravel(), [4, 5, 6, 7])
    for layer in (Mish(name="m"), ChannelGroup(4, 2, name="g")):
        clone = layer.__class__.from_config(layer.get_config())
        assert clone.get_config() == layer.get_config()
    with pytest.raises(ValueError, match="group_id"):
        ChannelGroup(2, 2)


def test_tiny_model_round_trips_through_keras_file(tmp_path):
    body = yolo4_tiny_body(keras.Input((None, None, 3), name="image"), 3, 2)
    path = str(tmp_path / "tiny4.keras")
    body.save(path)
    loaded = keras.saving.load_model(path)
    image = np.random.default_rng(0).uniform(size=(1, 64, 64, 3)).astype(np.float32)
    for a, b in zip(body(image), loaded(image)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_architectures_and_tiny_alias():
    assert get_architecture(None, 9).name == "yolov3" and get_architecture(None, 6).name == "yolov3-tiny"
    v4 = get_architecture("yolov4")
    assert (v4.scale_x_y, v4.box_loss, v4.ignore_thresh) == ((1.05, 1.1, 1.2), "ciou", 0.7)
    assert get_anchors(model_data_path(v4.anchors_file)).shape == (9, 2)
    assert get_anchors(model_data_path(get_architecture("yolov4-tiny").anchors_file)).shape == (6, 2)
    with pytest.raises(ValueError, match="uses 6 anchors"):
        get_architecture("yolov4-tiny", 9)
    assert model_name(None, tiny=True) == "yolov3-tiny" and model_name("yolov4", tiny=False) == "yolov4"
    with pytest.raises(ValueError, match="contradicts"):
        model_name("yolov4", tiny=True)


def test_scale_x_y_decodes_darknets_formula():
    raw = np.array([-2.0, 0.0, 3.0], np.float32)
    sigmoid = 1 / (1 + np.exp(-raw))
    np.testing.assert_allclose(cell_offset(raw, 1.2).numpy(), sigmoid * 1.2 - 0.1, rtol=1e-6)
    np.testing.assert_array_equal(cell_offset(raw).numpy(), tf.sigmoid(raw).numpy())
    feats = np.zeros((1, 2, 2, 3 * 7), np.float32)  # sigmoid(0) = 0.5: centres stay mid-cell
    xy, _, _, _ = yolo_head(feats, np.ones((3, 2)), 2, (64, 64), scale_x_y=1.2)
    np.testing.assert_allclose(xy.numpy()[0, 1, 0, 0], [0.25, 0.75], rtol=1e-6)


def _ciou_by_hand(b1, b2):
    """Zheng et al.'s formula on (x, y, w, h) pixel boxes, step by step."""
    (x1, y1, w1, h1), (x2, y2, w2, h2) = b1, b2
    ix = max(0.0, min(x1 + w1 / 2, x2 + w2 / 2) - max(x1 - w1 / 2, x2 - w2 / 2))
    iy = max(0.0, min(y1 + h1 / 2, y2 + h2 / 2) - max(y1 - h1 / 2, y2 - h2 / 2))
    iou = ix * iy / (w1 * h1 + w2 * h2 - ix * iy)
    cw = max(x1 + w1 / 2, x2 + w2 / 2) - min(x1 - w1 / 2, x2 - w2 / 2)
    ch = max(y1 + h1 / 2, y2 + h2 / 2) - min(y1 - h1 / 2, y2 - h2 / 2)
    rho2 = (x1 - x2) ** 2 + (y1 - y2) ** 2
    v = 4 / math.pi**2 * (math.atan(w2 / h2) - math.atan(w1 / h1)) ** 2
    alpha = v / (1 - iou + v) if v > 0 else 0.0  # identical aspect ratios: no aspect term
    return iou - rho2 / (cw**2 + ch**2) - alpha * v


def test_ciou_matches_the_papers_formula():
    pairs = [((10, 10, 8, 6), (12, 11, 5, 9)), ((0, 0, 4, 4), (20, 0, 4, 4)), ((5, 5, 3, 7), (5, 5, 3, 7))]
    ours = box_ciou(tf.constant([p[0] for p in pairs], tf.float64), tf.constant([p[1] for p in pairs], tf.float64))
    np.testing.assert_allclose(ours.numpy(), [_ciou_by_hand(*p) for p in pairs], rtol=1e-7, atol=1e-8)
    assert ours.numpy()[2] == pytest.approx(1.0)


def test_ciou_loss_is_per_sample_and_zero_without_boxes():
    anchors = get_anchors(model_data_path("yolo4_tiny_anchors.txt"))
    boxes = np.zeros((2, 3, 5), np.float32)
    boxes[0, 0] = [8, 8, 40, 30, 1]  # sample 1 has no boxes
    y_true = preprocess_true_boxes(boxes, (64, 64), anchors, 2)
    rng = np.random.default_rng(0)
    outputs = [rng.normal(0, 0.5, (2, g, g, 21)).astype(np.float32) for g in (2, 4)]
    terms = yolo_loss_terms(
        [*outputs, *y_true], anchors, 2, 0.7, scale_x_y=(1.05, 1.05), box_loss="ciou", iou_normalizer=0.07
    )
    assert set(terms) == {"ciou", "confidence", "class"}
    ciou = terms["ciou"].numpy()
    assert ciou.shape == (2,) and ciou[1] == 0.0 and 0.0 < ciou[0] <= 0.07 * 2
    # The training model's output stays per sample, (N, 1).
    _, train_model = create_model((64, 64), anchors, 2, freeze_body=0, model="yolov4-tiny")
    loss = train_model({"image": np.zeros((2, 64, 64, 3), np.float32), "y_true_0": y_true[0], "y_true_1": y_true[1]})
    assert tuple(loss.shape) == (2, 1) and np.all(np.isfinite(loss.numpy()))
    assert train_model.get_layer("yolo_loss").get_config()["box_loss"] == "ciou"


def test_model_flag_picks_network_and_anchors_and_must_match_the_file(tmp_path):
    from keras_yolo_mgpu.weights.metadata import MetadataError, make_metadata, settings_for, write_metadata

    settings = settings_for(None, model="yolov4-tiny")
    assert settings.kind == "yolov4-tiny"
    np.testing.assert_array_equal(settings.anchors_array, get_anchors(model_data_path("yolo4_tiny_anchors.txt")))
    assert settings_for(None, model="yolov4").anchors_array[0].tolist() == [12, 16]
    assert settings_for(None, tiny=True).kind == "yolov3-tiny"
    with pytest.raises(MetadataError, match="contradicts --model yolov4"):
        settings_for(None, model="yolov4", tiny=True)
    path = str(tmp_path / "v4tiny.weights.h5")
    body = yolo4_tiny_body(keras.Input((None, None, 3), name="image"), 3, 2)
    body.save_weights(path)
    anchors = get_anchors(model_data_path("yolo4_tiny_anchors.txt"))
    write_metadata(path, make_metadata(anchors, ["a", "b"], (64, 64), kind="yolov4-tiny"))
    assert settings_for(path).kind == "yolov4-tiny"
    with pytest.raises(MetadataError, match="--model says yolov3-tiny but .* yolov4-tiny"):
        settings_for(path, model="yolov3-tiny")


@pytest.mark.slow
def test_yolov4_tiny_trains_detects_evaluates_and_exports(tmp_path):
    """--model yolov4-tiny end to end: train.py's trainer, then the file alone drives detection, mAP and export."""
    from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
    from keras_yolo_mgpu.evaluation.mean_ap import evaluate_weights
    from keras_yolo_mgpu.inference.detector import YOLO
    from keras_yolo_mgpu.inference.export import build_export_model
    from keras_yolo_mgpu.training.trainer import TrainConfig, train
    from keras_yolo_mgpu.weights.metadata import read_metadata

    data = make_synthetic_dataset(tmp_path / "data", num_train=8, num_val=4, image_size=64, seed=0)
    config = TrainConfig(
        annotations=data.train,
        val_annotations=data.val,
        classes=data.classes,
        model="yolov4-tiny",
        input_shape=(64, 64),
        batch_size=4,
        freeze_epochs=1,
        epochs=2,
        log_dir=str(tmp_path / "run"),
        verbose=0,
    )
    result = train(config)
    metadata = read_metadata(result.final_weights)
    assert metadata.kind == "yolov4-tiny" and metadata.anchors_array[0].tolist() == [10, 14]

    yolo = YOLO(result.final_weights)  # no flags: the file's metadata says yolov4-tiny
    assert yolo.kind == "yolov4-tiny" and yolo.body.name == "yolo4_tiny_body"
    decode = yolo.inference_model.get_layer("yolo_decode")
    assert decode.get_config()["scale_x_y"] == [1.05, 1.05]
    yolo.detect(np.zeros((64, 64, 3), np.uint8))
    scores = evaluate_weights(result.final_weights, data.val, progress=False)
    # Two epochs from scratch detect little; the evaluation must run and report.
    assert {"mAP", "mAP50"} <= set(scores)
    exported = build_export_model(
        result.final_weights,
        metadata.anchors_array,
        list(metadata.class_names),
        input_size=(64, 64),
        kind="yolov4-tiny",
    )
    assert exported.get_layer("yolo_decode").get_config()["scale_x_y"] == [1.05, 1.05]
