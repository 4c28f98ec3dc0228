"""GPU defaults: mixed precision and XLA on for GPUs, off for the CPU, each checked at start-up.

The device decision is a function of the device kind, so the GPU branch is
tested here on the CPU. The checks run for real on a tiny YOLOv3's first
synthetic batch: float16 and XLA both run on the CPU. Their fallbacks are
forced through the real code path: a batch whose pixels overflow float16
(but not float32), and a step that passes through NumPy on the host, which
XLA cannot compile.
"""

import logging

import keras
import pytest
import tensorflow as tf
from keras_yolo3_targets import dense_inputs

from keras_yolo_mgpu.cli.train import build_parser, config_from_args
from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
from keras_yolo_mgpu.data.tf_dataset import make_dataset
from keras_yolo_mgpu.resources import default_anchors_path, get_anchors
from keras_yolo_mgpu.training import precision
from keras_yolo_mgpu.training.training_model import create_model

NUM_CLASSES = 4  # the synthetic dataset's


@pytest.fixture(scope="module")
def first_batch(tmp_path_factory):
    data = make_synthetic_dataset(tmp_path_factory.mktemp("data"), num_train=4, num_val=0, image_size=64, seed=0)
    anchors = get_anchors(default_anchors_path(True))
    dataset = make_dataset(read_annotations(data.train), (64, 64), anchors, NUM_CLASSES, 2, training=True, seed=0)
    return anchors, dense_inputs(next(iter(dataset))[0], anchors, NUM_CLASSES)  # the dense model's inputs


class _HostRoundTrip(keras.layers.Layer):
    """The identity through NumPy on the host (`tf.numpy_function`), gradient included: a step XLA cannot compile."""

    def __init__(self):
        super().__init__(dtype="float32", autocast=False)

    def call(self, inputs):
        @tf.custom_gradient
        def through_host(x):
            y = tf.numpy_function(lambda value: value, [x], x.dtype)
            y.set_shape(x.shape)
            return y, lambda upstream: upstream

        return through_host(inputs)


def _builder(anchors, compilable=True):
    """Builds the training model from the same seeded weights each call, under the current dtype policy."""

    def build():
        keras.utils.set_random_seed(0)
        train_model = create_model((64, 64), anchors, NUM_CLASSES, freeze_body=0)[1]
        if compilable:
            return train_model
        return keras.Model(train_model.inputs, _HostRoundTrip()(train_model.output))

    return build


def test_device_kind_is_gpu_only_when_every_device_is_one():
    assert precision.training_device_kind(["/gpu:0", "/gpu:1"]) == "GPU"
    assert precision.training_device_kind(["/job:localhost/replica:0/task:0/device:GPU:0"]) == "GPU"
    assert precision.training_device_kind(["/cpu:0"]) == "CPU"
    assert precision.training_device_kind(["/gpu:0", "/cpu:0"]) == "CPU"


def test_defaults_on_gpus_and_cpu_and_explicit_choices():
    gpu = precision.plan_settings("GPU", mixed_precision=None, jit=None, multi_scale=None)
    assert (gpu.mixed_precision, gpu.jit, gpu.check_mixed_precision, gpu.check_jit) == (True, True, True, True)
    cpu = precision.plan_settings("CPU", mixed_precision=None, jit=None, multi_scale=None)
    assert (cpu.mixed_precision, cpu.jit, cpu.check_mixed_precision, cpu.check_jit) == (False, False, False, False)
    # Opt-outs win on GPUs; an explicit choice is used as asked, unchecked.
    opted_out = precision.plan_settings("GPU", mixed_precision=False, jit=False, multi_scale=None)
    assert (opted_out.mixed_precision, opted_out.jit) == (False, False)
    asked = precision.plan_settings("CPU", mixed_precision=True, jit=True, multi_scale=None)
    assert (asked.mixed_precision, asked.jit, asked.check_mixed_precision, asked.check_jit) == (
        True,
        True,
        False,
        False,
    )
    # XLA compiles one input size: multi-scale keeps the default off.
    multi_scale = precision.plan_settings("GPU", mixed_precision=None, jit=None, multi_scale=(320, 608))
    assert (multi_scale.mixed_precision, multi_scale.jit) == (True, False)


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], (None, None)),
        (["--precision", "float32", "--no-jit"], (False, False)),
        (["--precision", "mixed", "--jit"], (True, True)),
        (["--mixed-precision"], (True, None)),  # the older spelling
    ],
)
def test_train_py_flags(flags, expected):
    args = build_parser().parse_args(["--annotations", "a.txt", "--classes", "c.txt", "--log-dir", "x", *flags])
    config = config_from_args(args)
    assert (config.mixed_precision, config.jit) == expected


def test_train_py_refuses_an_unknown_precision(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--precision", "float16"])
    assert "expected float32 or mixed" in capsys.readouterr().err


def test_checks_pass_on_a_sound_model(first_batch):
    anchors, inputs = first_batch
    assert precision.check_mixed_precision(_builder(anchors), inputs) is None
    assert keras.config.dtype_policy().name == "float32"  # the check leaves the policy as it found it
    assert precision.check_xla(_builder(anchors)(), inputs) is None


def test_gpu_defaults_fall_back_with_warnings_when_the_checks_fail(first_batch, caplog):
    anchors, inputs = first_batch
    # 1e6 x the pixels: the first convolution overflows float16 (max 65504), float32 copes.
    overflowing = {**inputs, "image": inputs["image"] * 1e6}
    gpu = precision.plan_settings("GPU", mixed_precision=None, jit=None, multi_scale=None)
    with caplog.at_level(logging.WARNING, logger=precision.__name__):
        # A step through NumPy on the host has no XLA kernel: compiling fails.
        settings = precision.run_checks(gpu, _builder(anchors, compilable=False), lambda: overflowing)
    assert settings == (False, False)
    messages = " ".join(record.getMessage() for record in caplog.records)
    assert "training in float32: the loss or a gradient is not finite under mixed_float16" in messages
    assert "training without XLA: XLA cannot compile the training step" in messages
    assert "PyFunc" in messages


@pytest.mark.parametrize("scale, stops", [(1.0, False), (float("nan"), True)], ids=["finite", "nan"])
def test_bfloat16_first_step_check_stops_a_run_whose_first_loss_is_not_finite(scale, stops):
    """The check runs in Keras's callback threads (async_safe) and still stops `fit`, loudly, on a NaN loss."""
    import numpy as np

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((8, 3), np.float32) * scale, np.zeros((8, 1), np.float32)
    check = precision.first_step_check("mixed_bfloat16")
    assert check.async_safe
    if stops:
        with pytest.raises(precision.MixedPrecisionError, match="--precision float32"):
            model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[check])
    else:
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[check])
        assert check.checked
