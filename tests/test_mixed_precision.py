"""Mixed precision (`--mixed-precision`) runs, on the CPU too, and stays within a measured bound.

TensorFlow runs mixed_float16 on the CPU (float16 Conv2D, pooling and the
fused BatchNormalization kernel all have CPU kernels; it is slower than
float32 there, never faster), so the whole mixed-precision path is tested
here: the float16 network, the loss in float32, Keras's LossScaleOptimizer,
and MirroredStrategy over logical CPU devices with synchronized
BatchNormalization.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from isolation import jax_environment

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


# Two `fit` calls on one optimizer, as `bench train` times its rounds (`Side.fit`), then the EMA swap of train.py,
# on JAX under mixed_float16 (what T4 and V100 cards run: no native bfloat16). Keras wraps the EMA optimizer in a
# LossScaleOptimizer there, whose own `use_ema` is False; the second `fit` crashed on the donated averages.
JAX_FLOAT16_EMA = """
import itertools, json
import keras, numpy as np
from keras_yolo_mgpu.bench.train import Side, our_optimizer
from keras_yolo_mgpu.keras_compat import moving_averages
from keras_yolo_mgpu.training.ema import average_swap_callbacks

keras.mixed_precision.set_global_policy("mixed_float16")
rng = np.random.default_rng(0)
# Small values: the loss scale (2**15) then overflows no float16 gradient, so no step is skipped.
x, y = ((0.1 * rng.normal(size=shape)).astype("float32") for shape in ((4, 3), (4, 1)))


def tiny_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1, dtype="float32")])
    model.compile(optimizer=our_optimizer({"ema": 0.5, "optimizer": "sgd"}), loss="mse")
    return model


model = tiny_model()
side = Side("ours", model, ((x, y) for _ in itertools.count()), keras.callbacks.Callback, 4)
for _ in range(2):
    side.fit(3)
found = {"wrapper": type(model.optimizer).__name__, "steps": int(model.optimizer.iterations),
         "finite": all(bool(np.isfinite(w).all()) for w in model.get_weights())}

# What the end-of-epoch callbacks see: the averages between the two swap callbacks, the trained weights after.
model = tiny_model()
first, last = average_swap_callbacks()
seen = {}


def weights():
    return [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]


def look_inside(epoch, logs):
    seen.update(inside=weights(), averages=[
        keras.ops.convert_to_numpy(a) for _, a in moving_averages(model.optimizer.inner_optimizer)])


inside = keras.callbacks.LambdaCallback(on_epoch_end=look_inside)
after = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.update(after=weights()))
model.fit(x, y, batch_size=1, epochs=2, verbose=0, callbacks=[first, inside, last, after])
found["swapped_in"] = all(np.array_equal(w, a) for w, a in zip(seen["inside"], seen["averages"]))
found["swapped_out"] = any(not np.array_equal(w, a) for w, a in zip(seen["after"], seen["averages"]))
print(json.dumps(found))
"""


def test_jax_float16_with_ema_trains_through_two_fits_and_swaps_in_the_averages():
    run = subprocess.run(
        [sys.executable, "-c", JAX_FLOAT16_EMA],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ, **jax_environment(1)),
        cwd=REPO,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["wrapper"] == "LossScaleOptimizer"  # the float16 path, not the bfloat16 one
    assert found["steps"] == 6 and found["finite"]  # both rounds trained
    # The second epoch: the model holds the averages for the callbacks, and the trained weights (which
    # differ from them) afterwards.
    assert found["swapped_in"] and found["swapped_out"]
