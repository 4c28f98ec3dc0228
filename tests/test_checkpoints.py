"""Checkpoints: every weight format loads into the Keras 3 networks, and saves are safe.

Keras 2 files are real ones, written with tf_keras by `keras2_reference`
(keras-yolo3's networks rebuilt in Keras 2); "loads" always means the Keras 3
network then predicts what the Keras 2 one predicted on the same image.
"""

import hashlib
import os
import subprocess
import sys
import textwrap
import types

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_yolo_mgpu.data.device_side import preprocess_true_boxes
from keras_yolo_mgpu.model.loss import totalloss
from keras_yolo_mgpu.model.yolo3 import build_body
from keras_yolo_mgpu.resources import default_anchors_path, get_anchors
from keras_yolo_mgpu.training.checkpoint import TemplateModelCheckpoint, checkpoint_write_path, save_weights_atomic
from keras_yolo_mgpu.training.training_model import create_model
from keras_yolo_mgpu.weights.loading import LoadReport, load_weights, weight_layers

TINY_ANCHORS = get_anchors(default_anchors_path(tiny=True))
FULL_ANCHORS = get_anchors(default_anchors_path(tiny=False))
SIZE = 64
ATOL = 1e-5


def predict(model, images):
    return [np.asarray(t) for t in model(images, training=False)]


def assert_outputs_close(actual, expected, atol=ATOL):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=0, atol=atol)


def sha256(path):
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


@pytest.fixture(scope="module")
def image():
    return np.random.default_rng(123).uniform(0, 1, (2, SIZE, SIZE, 3)).astype("float32")


@pytest.fixture(scope="module")
def keras2_tiny(tmp_path_factory, image):
    """keras-yolo3 tiny files (2 classes) as its users have them, and the Keras 2 outputs."""
    k2 = pytest.importorskip("keras2_reference")
    folder = tmp_path_factory.mktemp("keras2_tiny")
    body = k2.build_body(tiny=True, num_classes=2)
    expected = [t.numpy() for t in body(image, training=False)]
    files = {}
    files["body"] = str(folder / "body.h5")  # model_body.save_weights
    body.save_weights(files["body"])
    files["full_model"] = str(folder / "full_model.h5")  # convert.py: model.save
    body.save(files["full_model"])
    files["multi_gpu"] = str(folder / "multi_gpu.h5")  # multi_gpu_model(...).save_weights
    k2.build_multi_gpu_wrapper(body, gpus=2).save_weights(files["multi_gpu"])
    # train.py's stage-1 checkpoints: training model, all but the outputs frozen.
    files["train_model"] = str(folder / "train_model.h5")
    k2.build_training_model(body, (SIZE, SIZE), 2, freeze_body=2).save_weights(files["train_model"])
    # A frozen template nested in a multi_gpu_model lists its weights out of layer order.
    files["multi_gpu_frozen"] = str(folder / "multi_gpu_frozen.h5")
    k2.build_multi_gpu_wrapper(body, gpus=2).save_weights(files["multi_gpu_frozen"])
    three_classes = k2.build_body(tiny=True, num_classes=3, seed=1)
    files["three_classes"] = str(folder / "three_classes.h5")
    three_classes.save_weights(files["three_classes"])
    files["three_classes_multi_gpu_frozen"] = str(folder / "three_classes_multi_gpu_frozen.h5")
    k2.build_training_model(three_classes, (SIZE, SIZE), 3, freeze_body=2)  # freezes its layers
    k2.build_multi_gpu_wrapper(three_classes, gpus=2).save_weights(files["three_classes_multi_gpu_frozen"])
    return types.SimpleNamespace(files=files, expected=expected, body=body, three_classes=three_classes)


# ---- Keras 2 files ------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, fmt",
    [
        ("body", "keras2-weights"),
        ("full_model", "keras2-model"),
        ("train_model", "keras2-weights"),
        ("multi_gpu", "keras2-weights+nested"),
        ("multi_gpu_frozen", "keras2-weights+nested"),
    ],
)
def test_keras2_tiny_files_predict_like_keras2(keras2_tiny, image, kind, fmt):
    path = keras2_tiny.files[kind]
    before = sha256(path)
    body = build_body(TINY_ANCHORS, 2)
    report = load_weights(body, path)
    assert isinstance(report, LoadReport)
    assert (report.format, report.loaded, report.skipped) == (fmt, 24, [])
    assert_outputs_close(predict(body, image), keras2_tiny.expected)
    assert sha256(path) == before  # the file is only read


@pytest.fixture(scope="module")
def full_body():
    """One Keras 3 YOLOv3 (3 classes) for every test that needs it: building it takes seconds."""
    return build_body(FULL_ANCHORS, 3)


def reset(model):
    for weight in model.weights:
        weight.assign(np.zeros(weight.shape, weight.dtype))


@pytest.mark.slow
def test_keras2_full_yolo_body_loads_in_order(tmp_path, image, full_body):
    """The whole 252-layer graph: flat, and nested with keras-yolo3's two freeze patterns."""
    k2 = pytest.importorskip("keras2_reference")
    keras2_body = k2.build_body(tiny=False, num_classes=3)
    expected = [t.numpy() for t in keras2_body(image, training=False)]
    flat = str(tmp_path / "yolo.h5")
    keras2_body.save_weights(flat)
    wrapper = k2.build_multi_gpu_wrapper(keras2_body, gpus=2)
    nested = []
    # freeze_body=1 freezes Darknet (185 layers), 2 all but the output convs:
    # the nested file then lists the frozen layers after the trainable ones.
    for freeze_body, frozen in ((1, 185), (2, len(keras2_body.layers) - 3)):
        for index, layer in enumerate(keras2_body.layers):
            layer.trainable = index >= frozen
        nested.append(str(tmp_path / f"yolo_multi_gpu_freeze{freeze_body}.h5"))
        wrapper.save_weights(nested[-1])

    reset(full_body)
    report = load_weights(full_body, flat)
    assert (report.format, report.loaded) == ("keras2-weights", 147)
    assert_outputs_close(predict(full_body, image), expected)
    # The comparison is sensitive to the first layer: a 1 % change shows.
    first = weight_layers(full_body)[0]
    first.set_weights([w * 1.01 for w in first.get_weights()])
    assert max(np.abs(a - e).max() for a, e in zip(predict(full_body, image), expected)) > 100 * ATOL

    for path in nested:
        reset(full_body)
        report = load_weights(full_body, path)
        assert (report.format, report.loaded) == ("keras2-weights+nested", 147)
        assert_outputs_close(predict(full_body, image), expected)


def test_keras2_file_loads_into_training_model(keras2_tiny, image):
    body, train_model = create_model((SIZE, SIZE), TINY_ANCHORS, 2, freeze_body=2)
    assert load_weights(train_model, keras2_tiny.files["train_model"]).loaded == 24
    assert_outputs_close(predict(body, image), keras2_tiny.expected)


def test_class_mismatch_names_the_output_layer_and_both_shapes(keras2_tiny):
    body = build_body(TINY_ANCHORS, 2)
    before = [w.copy() for w in body.get_weights()]
    with pytest.raises(ValueError) as error:
        load_weights(body, keras2_tiny.files["three_classes"])
    message = str(error.value)
    assert "'yolo_output_0'" in message and "'yolo_output_1'" in message
    assert "(1, 1, 512, 21)" in message and "(1, 1, 512, 24)" in message
    assert keras2_tiny.files["three_classes"] in message and "allow_new_classes=True" in message
    # Nothing was assigned: a failed load leaves the model as it was.
    for a, b in zip(body.get_weights(), before):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("option", ["skip_mismatch", "allow_new_classes"])
@pytest.mark.parametrize("kind", ["three_classes", "three_classes_multi_gpu_frozen"])
def test_another_class_count_loads_all_but_the_output_convs(keras2_tiny, kind, option):
    body = build_body(TINY_ANCHORS, 2)
    outputs = ("yolo_output_0", "yolo_output_1")
    outputs_before = {n: [w.copy() for w in body.get_layer(n).get_weights()] for n in outputs}
    report = load_weights(body, keras2_tiny.files[kind], **{option: True})
    assert report.loaded == 22
    assert [s.layer for s in report.skipped] == ["yolo_output_0", "yolo_output_1"]
    assert "(1, 1, 512, 24)" in report.skipped[0].reason
    for name, weights in outputs_before.items():
        for a, b in zip(body.get_layer(name).get_weights(), weights):
            np.testing.assert_array_equal(a, b)
    keras2_layers = [layer for layer in keras2_tiny.three_classes.layers if layer.weights]
    for ours, theirs in zip(weight_layers(body), keras2_layers):
        if not ours.name.startswith("yolo_output_"):
            for a, b in zip(ours.get_weights(), theirs.get_weights()):
                np.testing.assert_array_equal(a, b)


def test_other_network_is_a_clear_error(keras2_tiny, full_body):
    with pytest.raises(ValueError, match=r"24 layers with weights = tiny YOLOv3.*147 = YOLOv3"):
        load_weights(full_body, keras2_tiny.files["body"])


def test_unknown_files_are_clear_errors(tmp_path):
    body = build_body(TINY_ANCHORS, 2)
    with pytest.raises(FileNotFoundError):
        load_weights(body, str(tmp_path / "missing.h5"))
    darknet = tmp_path / "yolov3.weights"
    darknet.write_bytes(np.zeros(16, np.int32).tobytes())
    with pytest.raises(ValueError, match="Darknet .weights file: convert it"):
        load_weights(body, str(darknet))
    other = str(tmp_path / "other.h5")
    with h5py.File(other, "w") as handle:
        handle["data"] = np.zeros(3)
    with pytest.raises(ValueError, match="not a Keras weights file"):
        load_weights(body, other)


# ---- Keras 3 files ------------------------------------------------------------


@pytest.fixture(scope="module")
def keras3_tiny(image):
    body, train_model = create_model((SIZE, SIZE), TINY_ANCHORS, 2, freeze_body=0)
    rng = np.random.default_rng(5)
    # Noise on every array (BN variances stay near 1, positive).
    body.set_weights([w + rng.normal(0, 0.1, w.shape).astype("float32") for w in body.get_weights()])
    return types.SimpleNamespace(body=body, train_model=train_model, expected=predict(body, image))


def test_keras3_weights_between_body_and_training_model(keras3_tiny, image, tmp_path):
    body_file = str(tmp_path / "body.weights.h5")
    keras3_tiny.body.save_weights(body_file)
    train_file = str(tmp_path / "train.weights.h5")
    keras3_tiny.train_model.save_weights(train_file)

    for path in (body_file, train_file):
        body = build_body(TINY_ANCHORS, 2)
        report = load_weights(body, path)
        assert (report.format, report.loaded) == ("keras3-weights", 24)
        assert_outputs_close(predict(body, image), keras3_tiny.expected, atol=0)
    body, train_model = create_model((SIZE, SIZE), TINY_ANCHORS, 2)
    load_weights(train_model, body_file)
    assert_outputs_close(predict(body, image), keras3_tiny.expected, atol=0)
    # Keras 3's legacy `model.save("x.h5")` writes Keras 2's layout.
    legacy = str(tmp_path / "legacy.h5")
    keras3_tiny.body.save(legacy)
    body = build_body(TINY_ANCHORS, 2)
    assert load_weights(body, legacy).format == "keras2-model"
    assert_outputs_close(predict(body, image), keras3_tiny.expected, atol=0)


def test_keras3_nested_template_loads(keras3_tiny, image, tmp_path, logical_cpus):
    """A wrapper holding the template as one layer: the Keras 3 "1 layers" file."""
    from keras_yolo_mgpu.backend.tensorflow.replica_model import multi_gpu_model

    inputs = keras.Input((None, None, 3), name="image")
    wrapper = keras.Model(inputs, keras3_tiny.body(inputs), name="wrapper")
    replicated = multi_gpu_model(keras3_tiny.body, devices=logical_cpus[:2])
    for model in (wrapper, replicated):
        path = str(tmp_path / f"{model.name}.weights.h5")
        model.save_weights(path)
        body = build_body(TINY_ANCHORS, 2)
        report = load_weights(body, path)
        assert (report.format, report.loaded) == ("keras3-weights+nested", 24)
        assert_outputs_close(predict(body, image), keras3_tiny.expected, atol=0)
    # And the other way round: a body checkpoint into the wrapper.
    body_file = str(tmp_path / "body.weights.h5")
    keras3_tiny.body.save_weights(body_file)
    fresh = build_body(TINY_ANCHORS, 2)
    inputs = keras.Input((None, None, 3))
    assert load_weights(keras.Model(inputs, fresh(inputs)), body_file).loaded == 24
    assert_outputs_close(predict(fresh, image), keras3_tiny.expected, atol=0)


def test_keras_archive_by_name_and_by_order(keras3_tiny, image, tmp_path):
    same_names = str(tmp_path / "body.keras")
    keras3_tiny.body.save(same_names)
    body = build_body(TINY_ANCHORS, 2)
    assert load_weights(body, same_names).format == "keras3-archive"
    assert_outputs_close(predict(body, image), keras3_tiny.expected, atol=0)

    # Saved from a model with other layer names: rebuilt by Keras, copied in order.
    def rename(layer):
        config = layer.get_config()
        config["name"] = "other_" + config["name"]
        return layer.__class__.from_config(config)

    renamed = keras.models.clone_model(keras3_tiny.body, clone_function=rename)
    renamed.set_weights(keras3_tiny.body.get_weights())
    other_names = str(tmp_path / "renamed.keras")
    renamed.save(other_names)
    body = build_body(TINY_ANCHORS, 2)
    assert load_weights(body, other_names).loaded == 24
    assert_outputs_close(predict(body, image), keras3_tiny.expected, atol=0)
    # A .weights.h5 of other names but the same layers: Keras's positional keys.
    renamed_weights = str(tmp_path / "renamed.weights.h5")
    renamed.save_weights(renamed_weights)
    body = build_body(TINY_ANCHORS, 2)
    assert load_weights(body, renamed_weights).loaded == 24
    assert_outputs_close(predict(body, image), keras3_tiny.expected, atol=0)
    # Another network altogether.
    dense = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    dense_weights = str(tmp_path / "dense.weights.h5")
    dense.save_weights(dense_weights)
    with pytest.raises(ValueError, match="saved from another network"):
        load_weights(build_body(TINY_ANCHORS, 2), dense_weights)


def test_keras3_class_mismatch(keras3_tiny, tmp_path):
    path = str(tmp_path / "two_classes.weights.h5")
    keras3_tiny.body.save_weights(path)
    body = build_body(TINY_ANCHORS, 3)
    with pytest.raises(ValueError, match=r"'yolo_output_1'.*\(1, 1, 256, 24\).*\(1, 1, 256, 21\)"):
        load_weights(body, path)
    report = load_weights(body, path, allow_new_classes=True)
    assert report.loaded == 22 and [s.layer for s in report.skipped] == ["yolo_output_0", "yolo_output_1"]


def test_full_yolov3_file_into_tiny_is_refused_naming_the_layers(full_body, tmp_path):
    """Layer names match (both networks name layers by role), shapes do not: only a partial load could take it."""
    path = str(tmp_path / "yolov3.weights.h5")
    full_body.save_weights(path)
    body = build_body(TINY_ANCHORS, 2)
    before = [w.copy() for w in body.get_weights()]
    with pytest.raises(ValueError) as error:
        load_weights(body, path, allow_new_classes=True)
    message = str(error.value)
    assert path in message and "21 layer(s) do not match" in message  # 3 of tiny's 24 happen to fit
    # The first one, with both shapes: tiny's first conv has 16 filters, YOLOv3's 32.
    assert "model layer 'darknet_conv2d_1' has weight shapes [(3, 3, 3, 16)]" in message
    assert "file's layer 'darknet_conv2d_1' has [(3, 3, 3, 32)]" in message
    assert "another network" in message
    for a, b in zip(body.get_weights(), before):
        np.testing.assert_array_equal(a, b)
    # Asked for explicitly, a partial load keeps what matches and reports the rest.
    report = load_weights(body, path, skip_mismatch=True)
    assert (report.loaded, len(report.skipped)) == (3, 21)


def test_new_classes_excuse_only_the_output_channel_count():
    from keras_yolo_mgpu.weights.loading import _differs_in_output_channels_only, _SourceLayer

    def source(*shapes):
        return _SourceLayer("file_layer", [np.zeros(s) for s in shapes])

    output = types.SimpleNamespace(name="yolo_output_0")
    model_shapes = [(1, 1, 512, 21), (21,)]
    assert _differs_in_output_channels_only(output, source((1, 1, 512, 24), (24,)), model_shapes)
    # Another input width is another network, not another class count.
    assert not _differs_in_output_channels_only(output, source((1, 1, 1024, 24), (24,)), model_shapes)
    assert not _differs_in_output_channels_only(output, source((3, 3, 512, 24), (24,)), model_shapes)
    other = types.SimpleNamespace(name="yolo_conv2d_3")
    assert not _differs_in_output_channels_only(other, source((1, 1, 512, 24), (24,)), model_shapes)


# ---- TemplateModelCheckpoint ----------------------------------------------------


@pytest.fixture
def toy():
    """A template and a wrapper around it, like a body inside a training model."""
    template = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="dense")], name="template")
    inputs = keras.Input((3,))
    wrapper = keras.Model(inputs, keras.layers.Dense(1, name="head")(template(inputs)))
    return template, wrapper


def set_marker(template, value):
    template.set_weights([np.full(w.shape, value, "float32") for w in template.get_weights()])


def marker(path, template):
    fresh = keras.models.clone_model(template)
    load_weights(fresh, path)
    return float(fresh.get_weights()[0].flat[0])


def run_epochs(callback, wrapper, template, val_losses):
    callback.set_model(wrapper)
    callback.on_train_begin()
    for epoch, val_loss in enumerate(val_losses):
        callback.on_epoch_begin(epoch)
        set_marker(template, epoch + 1)
        callback.on_epoch_end(epoch, {"loss": val_loss, "val_loss": val_loss})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(filepath="model.h5"), r"`filepath` must end in `.weights.h5`. Received: filepath=model.h5"),
        (dict(period=0), r"`period` must be a positive integer"),
        (dict(period=2, save_freq=10), r"cannot be combined with a batch-based `save_freq`"),
        (dict(save_weights_only=False), r"always saves weights only"),
        (dict(template_model="body"), r"`template_model` must be a keras.Model"),
    ],
)
def test_checkpoint_validates_arguments(toy, tmp_path, kwargs, match):
    kwargs = {"filepath": str(tmp_path / "x.weights.h5"), "template_model": toy[0], **kwargs}
    with pytest.raises(ValueError, match=match):
        TemplateModelCheckpoint(**kwargs)


def test_checkpoint_saves_the_template_not_the_wrapper(toy, tmp_path):
    template, wrapper = toy
    path = str(tmp_path / "ep{epoch:02d}.weights.h5")
    run_epochs(TemplateModelCheckpoint(path, template), wrapper, template, [1.0])
    saved = str(tmp_path / "ep01.weights.h5")
    with h5py.File(saved) as handle:
        assert sorted(handle["layers"]) == ["dense"]  # no `head`, not nested
    fresh = keras.models.clone_model(template)
    fresh.load_weights(saved)  # plain Keras reads it too
    assert float(fresh.get_weights()[0].flat[0]) == 1.0
    assert os.listdir(tmp_path) == ["ep01.weights.h5"]  # no temporary file left


def test_period_saves_every_n_epochs(toy, tmp_path):
    template, wrapper = toy
    callback = TemplateModelCheckpoint(str(tmp_path / "ep{epoch:02d}.weights.h5"), template, period=2)
    run_epochs(callback, wrapper, template, [5.0, 4.0, 3.0, 2.0, 1.0])
    assert sorted(os.listdir(tmp_path)) == ["ep02.weights.h5", "ep04.weights.h5"]
    assert marker(str(tmp_path / "ep04.weights.h5"), template) == 4.0


def test_save_best_only_keeps_the_best(toy, tmp_path):
    template, wrapper = toy
    path = str(tmp_path / "best.weights.h5")
    callback = TemplateModelCheckpoint(path, template, save_best_only=True)
    run_epochs(callback, wrapper, template, [3.0, 2.0, 4.0])
    assert marker(path, template) == 2.0  # epoch 3 was worse and did not overwrite
    callback.on_epoch_end(3, {"val_loss": 1.0})
    assert marker(path, template) == 3.0  # markers are set at epoch start; still epoch 3's weights


def test_interrupted_save_keeps_the_previous_checkpoint(toy, tmp_path, monkeypatch):
    template, wrapper = toy
    path = str(tmp_path / "last.weights.h5")
    callback = TemplateModelCheckpoint(path, template)
    run_epochs(callback, wrapper, template, [1.0])
    assert marker(path, template) == 1.0

    def crash_midway(filepath, overwrite=True):
        with open(filepath, "wb") as handle:
            handle.write(b"\x89HDF half-written garbage")
        raise OSError("disk full")

    monkeypatch.setattr(template, "save_weights", crash_midway)
    set_marker(template, 2.0)
    with pytest.raises(OSError, match="disk full"):
        callback.on_epoch_end(1, {"val_loss": 0.5})
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["last.weights.h5"]
    assert marker(path, template) == 1.0

    with pytest.raises(ValueError, match="must end in `.weights.h5`"):
        save_weights_atomic(template, str(tmp_path / "x.h5"))


def fake_strategy(chief, task_id=0):
    return types.SimpleNamespace(
        extended=types.SimpleNamespace(should_checkpoint=chief),
        cluster_resolver=types.SimpleNamespace(task_type="chief" if chief else "worker", task_id=task_id),
    )


def test_only_the_chief_writes_to_the_real_path(toy, tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.weights.h5")
    assert checkpoint_write_path(path, None) == (path, None)
    assert checkpoint_write_path(path, tf.distribute.MirroredStrategy(["/cpu:0"])) == (path, None)
    assert checkpoint_write_path(path, fake_strategy(chief=True)) == (path, None)
    temp_dir = str(tmp_path / "workertemp_3")
    assert checkpoint_write_path(path, fake_strategy(chief=False, task_id=3)) == (
        os.path.join(temp_dir, "ckpt.weights.h5"),
        temp_dir,
    )

    template, wrapper = toy
    callback = TemplateModelCheckpoint(path, template)
    monkeypatch.setattr(callback, "_strategy", lambda: fake_strategy(chief=False, task_id=3))
    run_epochs(callback, wrapper, template, [1.0])
    assert os.listdir(tmp_path) == []  # the worker wrote into its temp folder and removed it
    monkeypatch.setattr(callback, "_strategy", lambda: fake_strategy(chief=True))
    callback.on_epoch_end(1, {"val_loss": 1.0})
    assert os.listdir(tmp_path) == ["ckpt.weights.h5"]


# ---- Written by several replicas, read by one device ------------------------------


_PREDICT_IN_ONE_DEVICE = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf
    from keras_yolo_mgpu.weights.loading import load_weights
    from keras_yolo_mgpu.model.yolo3 import build_body
    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors

    weights, images, out = sys.argv[1:4]
    assert len(tf.config.list_logical_devices()) == 1, tf.config.list_logical_devices()
    body = build_body(get_anchors(default_anchors_path(tiny=True)), 2)
    report = load_weights(body, weights)
    assert report.loaded == 24, report
    plain = build_body(get_anchors(default_anchors_path(tiny=True)), 2)
    plain.load_weights(weights)  # plain Keras reads the checkpoint too
    x = np.load(images)
    a = [t.numpy() for t in body(x, training=False)]
    b = [t.numpy() for t in plain(x, training=False)]
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    np.savez(out, *a)
    """
)


@pytest.mark.slow
def test_mirrored_checkpoint_predicts_identically_on_one_device(tmp_path, logical_cpus, image):
    strategy = tf.distribute.MirroredStrategy(devices=logical_cpus[:2])
    with strategy.scope():
        body, train_model = create_model((SIZE, SIZE), TINY_ANCHORS, 2, freeze_body=0, sync_bn=True)
        train_model.compile(optimizer=keras.optimizers.SGD(0.01), loss=totalloss)
    rng = np.random.default_rng(0)
    batch = 8
    corners = rng.uniform(0, SIZE / 2, (batch, 3, 2))
    sizes = rng.uniform(8, SIZE / 2, (batch, 3, 2))
    boxes = np.concatenate([corners, corners + sizes, rng.integers(0, 2, (batch, 3, 1))], axis=-1)
    y_true = preprocess_true_boxes(boxes, (SIZE, SIZE), TINY_ANCHORS, 2)
    inputs = {"image": rng.uniform(0, 1, (batch, SIZE, SIZE, 3)).astype("float32")}
    inputs.update({f"y_true_{i}": y for i, y in enumerate(y_true)})
    before = body.get_weights()[0].copy()
    path = str(tmp_path / "ep{epoch:03d}.weights.h5")
    train_model.fit(
        inputs,
        np.zeros((batch, 1), "float32"),
        batch_size=4,
        epochs=1,
        verbose=0,
        callbacks=[TemplateModelCheckpoint(path, body, monitor="loss")],
    )
    assert not np.array_equal(body.get_weights()[0], before)  # it trained
    expected = predict(body, image)

    images = str(tmp_path / "images.npy")
    np.save(images, image)
    out = str(tmp_path / "predictions.npz")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    subprocess.run(
        [sys.executable, "-c", _PREDICT_IN_ONE_DEVICE, str(tmp_path / "ep001.weights.h5"), images, out],
        check=True,
        env=env,
        timeout=300,
    )
    with np.load(out) as saved:
        actual = [saved[f"arr_{i}"] for i in range(len(expected))]
    assert_outputs_close(actual, expected, atol=1e-6)
