"""Mixed precision (`--mixed-precision`) runs, on the CPU too, and stays within a measured bound.

TensorFlow runs mixed_float16 on the CPU (float16 Conv2D, pooling and the
fused BatchNormalization kernel all have CPU kernels; it is slower than
float32 there, never faster), so the whole mixed-precision path is tested
here: the float16 network, the loss in float32, Keras's LossScaleOptimizer,
and MirroredStrategy over logical CPU devices with synchronized
BatchNormalization.
"""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_yolo_mgpu import create_model, get_anchors, model_data_path, preprocess_true_boxes, totalloss
from keras_yolo_mgpu.backend.tensorflow.distribution import make_strategy
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ANCHORS = get_anchors(model_data_path("tiny_yolo_anchors.txt"))
INPUT_SHAPE = (64, 64)
NUM_CLASSES = 2
GLOBAL_BATCH = 8
STEPS = 2


@pytest.fixture
def mixed_float16():
    previous = keras.config.dtype_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.config.set_dtype_policy(previous)


def _batches():
    rng = np.random.default_rng(0)
    images = rng.random((GLOBAL_BATCH * STEPS, *INPUT_SHAPE, 3), dtype=np.float32)
    boxes = np.zeros((len(images), 4, 5), np.float32)
    for b in range(len(images)):
        for t in range(rng.integers(1, 5)):
            w, h = rng.uniform(18, 60, 2)
            x, y = rng.uniform(0, 64 - w), rng.uniform(0, 64 - h)
            boxes[b, t] = [x, y, x + w, y + h, rng.integers(NUM_CLASSES)]
    y_true = preprocess_true_boxes(boxes, INPUT_SHAPE, ANCHORS, NUM_CLASSES)
    return {"image": images, "y_true_0": y_true[0], "y_true_1": y_true[1]}


def _build(devices):
    """(body, compiled training model) on `devices`, synchronized BN over several."""
    strategy = make_strategy(devices)
    with strategy.scope():
        body, model = create_model(INPUT_SHAPE, ANCHORS, NUM_CLASSES, freeze_body=0, sync_bn=len(devices) > 1)
        # Keras wraps the optimizer in a LossScaleOptimizer itself (the
        # train.py test checks that path); a start scale of 2**8 instead of
        # 2**15 applies these few steps instead of skipping them as overflows.
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(learning_rate=1e-3), initial_scale=2**8)
        model.compile(optimizer=optimizer, loss=totalloss)
    return body, model


def _max_difference(first, second):
    return max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) for a, b in zip(first, second))


@pytest.mark.slow
def test_mixed_precision_replica_steps_match_one_device_within_bound(mixed_float16, logical_cpus):
    """Each step on 2 replicas against the step one device takes from the same weights.

    The bound is mixed precision's own error: how far the one-device float16
    step lands from the float32 step. Replication must add no more than that.
    """
    one_body, one_model = _build(logical_cpus[:1])
    two_body, two_model = _build(logical_cpus[:2])
    keras.config.set_dtype_policy("float32")
    float32_body, float32_model = _build(logical_cpus[:1])
    keras.mixed_precision.set_global_policy("mixed_float16")
    assert one_body.outputs[0].dtype == "float16"  # the network computes in float16
    for model in (one_model, two_model):
        assert model.outputs[0].dtype == "float32"  # the loss stays float32
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        assert all(v.dtype == "float32" for v in model.trainable_variables)

    x = _batches()
    for step in range(STEPS):
        before = one_body.get_weights()
        two_body.set_weights(before)
        float32_body.set_weights(before)
        batch = {k: v[step * GLOBAL_BATCH : (step + 1) * GLOBAL_BATCH] for k, v in x.items()}
        dataset = tf.data.Dataset.from_tensors((batch, np.zeros((GLOBAL_BATCH, 1), np.float32)))
        losses = [m.fit(dataset, epochs=1, verbose=0).history["loss"][0] for m in (one_model, two_model, float32_model)]
        assert np.isfinite(losses).all()
        # float16 keeps 11 significant bits (relative spacing 2**-10 ~ 9.8e-4),
        # and CPU float16 kernels accumulate in float16: measured 1.3e-3 on a
        # loss of ~52, so 5e-3 leaves rounding room and still catches a wrong
        # loss scale or a float16 loss (which would be off by far more).
        np.testing.assert_allclose(losses[:2], losses[2], rtol=5e-3)

        step_size = _max_difference(float32_body.get_weights(), before)
        mixed_error = _max_difference(one_body.get_weights(), float32_body.get_weights())
        difference = _max_difference(two_body.get_weights(), one_body.get_weights())
        print(f"step {step}: size {step_size:.3g}, float16 vs float32 {mixed_error:.3g}, 2 vs 1 {difference:.3g}")
        # Measured on the 2-core CPU: steps of 0.022, float16 vs float32
        # 0.0021 (CPU float16 kernels accumulate in float16), 2 replicas vs
        # 1 device 0.0014. A wrong gradient scale would move a whole step.
        assert mixed_error <= 0.25 * step_size, (step, mixed_error, step_size)
        assert difference <= 2 * mixed_error, (step, difference, mixed_error)
    # No step overflowed and was skipped (that would have halved the scale).
    for model in (one_model, two_model):
        assert float(model.optimizer.dynamic_scale.value.numpy()) == 2**8


@pytest.mark.slow
def test_train_py_mixed_precision_on_two_simulated_devices(tmp_path):
    """`train.py --mixed-precision` as users run it, MirroredStrategy over 2 logical devices."""
    data = make_synthetic_dataset(tmp_path / "data", num_train=8, num_val=0, image_size=64, seed=0)
    args = ["--annotations", data.train, "--classes", data.classes, "--tiny", "--input-size", "64"]
    args += ["--recipe", "keras-yolo3"]  # no validation set: keras-yolo3's recipe monitors val_loss
    args += ["--batch-size", "4", "--gpus", "2", "--simulate-devices", "--mixed-precision", "--epochs", "1"]
    args += ["--freeze-epochs", "0", "--steps-per-epoch", "2", "--log-dir", str(tmp_path / "run"), "--quiet"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    run = subprocess.run(
        [sys.executable, os.path.join(REPO, "train.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    assert "mixed precision: float16 compute" in output
    assert "2 replica(s)" in output
    num_classes = len(open(data.classes).read().split())
    body, _ = create_model(INPUT_SHAPE, ANCHORS, num_classes, freeze_body=0)
    body.load_weights(str(tmp_path / "run" / "trained_weights_final.weights.h5"))
    assert all(np.isfinite(w).all() for w in body.get_weights())
