"""The input pipeline on Keras's JAX backend, in a process where `import tensorflow` fails.

Run by tests/test_host_pipeline.py as `python tests/jax_input_checks.py DATA_FOLDER OUT.pickle`
with `KERAS_BACKEND=jax` and 4 CPU devices (`isolation.jax_environment`). One
process does every JAX check (starting JAX and compiling costs more than the
checks themselves) and pickles what it found; the test compares that with
TensorFlow's side and keras-yolo3's numpy.

1. `make_py_dataset`'s batches (training with mosaic and multi-scale from a
   resumed position; validation), for comparison with tf.data's;
2. `device_side.build_targets` under `jax.jit` against `preprocess_true_boxes`,
   and with the batch split over the devices (no collective in the program);
3. `device_side.distort_hsv` against OpenCV, neutral draws, `to_float`;
4. `DeviceInputs` in a model trained by `fit` from the PyDataset's worker
   threads, and its outputs on 1 and on 4 devices (`DataParallel`);
5. that no `tensorflow` module was imported.
"""

from __future__ import annotations

import pickle
import sys

from keras_yolo_mgpu.cli.without_tensorflow import block_tensorflow

TRAINING = {"seed": 4, "mosaic": 0.5, "multi_scale": (32, 96), "start_position": 12}


def random_boxes(rng, batch, num_boxes, shape, num_classes, min_size=0.5):
    """Padded boxes as the pipeline makes them: integers and floats, collisions, cell borders."""
    import numpy as np

    h, w = shape
    x1 = rng.uniform(0, w - 2, (batch, num_boxes))
    y1 = rng.uniform(0, h - 2, (batch, num_boxes))
    x2 = np.minimum(x1 + rng.uniform(min_size, w, (batch, num_boxes)), w)
    y2 = np.minimum(y1 + rng.uniform(min_size, h, (batch, num_boxes)), h)
    boxes = np.stack([x1, y1, x2, y2, rng.integers(0, num_classes, (batch, num_boxes))], -1).astype(np.float32)
    boxes[: batch // 2, :, :4] = np.round(boxes[: batch // 2, :, :4])
    # Centres on every cell border of the finest grid (where a float32 floor goes wrong).
    boxes[1, :, 0] = np.arange(num_boxes) * 8 % (w - 16)
    boxes[1, :, 2] = boxes[1, :, 0] + 16
    boxes[1, :, 3] = np.maximum(boxes[1, :, 3], boxes[1, :, 1] + 1)
    boxes[0, 1] = boxes[0, 0] + [0.2, 0.2, 0.2, 0.2, 0]  # a later box in the same cell, another class
    boxes[0, 1, 4] = (boxes[0, 0, 4] + 1) % num_classes
    for b in range(2, batch):  # padding rows at the end
        boxes[b, rng.integers(0, num_boxes + 1) :] = 0
    return boxes


def _targets(found: dict) -> None:
    import jax
    import numpy as np
    from keras_yolo3_targets import preprocess_true_boxes

    from keras_yolo_mgpu.data.device_side import _floor_of_product, build_targets
    from keras_yolo_mgpu.resources import get_anchors, model_data_path

    mismatches, cases = [], 0
    # Which part differs where a case does: box values (xywh), objectness (which slots), class bits.
    parts_wrong = {"xywh": 0, "objectness": 0, "classes": 0}
    for anchors_file in ("yolo_anchors.txt", "tiny_yolo_anchors.txt"):
        anchors = get_anchors(model_data_path(anchors_file))
        for shape in ((416, 416), (320, 480), (64, 96)):
            for iou_thresh in (None, 0.213):
                rng = np.random.default_rng(sum(shape) + len(anchors))
                boxes = random_boxes(rng, 8, 40, shape, 5)
                expected = preprocess_true_boxes(boxes, shape, anchors, 5, iou_thresh=iou_thresh)
                got = jax.jit(lambda b: build_targets(b, shape, anchors, 5, iou_thresh=iou_thresh))(boxes)
                cases += 1
                for layer, (e, g) in enumerate(zip(expected, got, strict=True)):
                    if e.shape != g.shape or not np.array_equal(e, np.asarray(g)):
                        mismatches.append((anchors_file, shape, iou_thresh, layer))
                        if e.shape == g.shape:
                            g = np.asarray(g)
                            for part, where in (("xywh", np.s_[..., :4]), ("objectness", np.s_[..., 4])):
                                parts_wrong[part] += int((e[where] != g[where]).sum())
                            parts_wrong["classes"] += int((e[..., 5:] != g[..., 5:]).sum())
    found["target_mismatches"], found["target_cases"] = mismatches, cases
    found["target_parts_wrong"] = parts_wrong
    # The cell index on every centre of every size: exact where a float32 product is not.
    wrong, naive_wrong = 0, 0
    floor = jax.jit(_floor_of_product)
    for width in range(32, 1024 + 1, 32):
        x = np.arange(width + 1, dtype=np.float32) / np.float32(width)
        for stride in (8, 16, 32):
            grid = width // stride
            expected = np.floor(x * np.int32(grid))  # numpy: float32 * int32 in float64, exact
            wrong += int((np.asarray(floor(x, np.float32(grid))) != expected).sum())
            naive_wrong += int((np.floor(x * np.float32(grid)) != expected).sum())
    found["floor_wrong"], found["floor_naive_wrong"] = wrong, naive_wrong
    # The device's own division of the centres, which `_quotients` does not rely on: how often it is
    # not numpy's correctly rounded quotient (0 on the CPU; a GPU may divide approximately).
    divide = jax.jit(lambda x, size: x / size)
    found["division_wrong"] = 0
    for width in range(32, 1024 + 1, 32):
        centres = np.arange(width + 1, dtype=np.float32)
        quotients = np.asarray(divide(centres, np.full_like(centres, width)))
        found["division_wrong"] += int((quotients != centres / np.float32(width)).sum())
    # With the batch split over the 4 devices, every image's targets are made on its device alone.
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), PartitionSpec("batch"))
    anchors = get_anchors(model_data_path("yolo_anchors.txt"))
    boxes = jax.device_put(random_boxes(np.random.default_rng(0), 8, 20, (416, 416), 80), sharding)
    sharded = jax.jit(lambda b: build_targets(b, (416, 416), anchors, 80), in_shardings=sharding)
    compiled = sharded.lower(boxes).compile().as_text()
    found["target_collectives"] = sum(
        compiled.count(f"{op}(") + compiled.count(f"{op}-start(")
        for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute")
    )


def _hsv(found: dict) -> None:
    import jax
    import numpy as np
    from hsv_reference import opencv_hsv

    from keras_yolo_mgpu.data.device_side import distort_hsv, to_float

    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (4, 32, 48, 3), dtype=np.uint8)
    images[0, 0, :3] = [[0, 0, 0], [255, 255, 255], [128, 128, 128]]  # hue-less pixels
    draws = np.array([[0.1, 1.5, 1.5], [-0.1, 1 / 1.5, 1 / 1.5], [-0.03, 1.2, 0.7], [0.05, 0.8, 1.3]], np.float32)
    hsv = np.repeat(draws[:, None], 4, axis=1)
    hsv[3, 1] = [0.0, 1.0, 1.0]  # a neutral top-right quadrant
    got = np.asarray(jax.jit(distort_hsv)(images, hsv.reshape(4, 12)))
    errors = []
    for image, draw, result in zip(images[:3], draws[:3], got[:3]):
        errors.append(float(np.abs(result - opencv_hsv(image, *draw.astype(np.float64))).max()))
    expected = opencv_hsv(images[3], *draws[3].astype(np.float64))
    expected[:16, 24:] = images[3, :16, 24:] / np.float32(255)
    errors.append(float(np.abs(got[3] - expected).max()))
    found["hsv_errors"] = errors
    found["neutral_exact"] = bool(np.array_equal(got[3, :16, 24:], images[3, :16, 24:] / np.float32(255)))
    levels = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1).repeat(3, axis=-1)
    found["to_float_exact"] = bool(np.array_equal(np.asarray(jax.jit(to_float)(levels)), levels / np.float32(255)))


def _model(anchors, num_classes):
    import keras

    from keras_yolo_mgpu.data.device_side import DeviceInputs

    inputs = {
        "image": keras.Input((None, None, 3), dtype="uint8", name="image"),
        "boxes": keras.Input((20, 5), name="boxes"),
        "hsv": keras.Input((12,), name="hsv"),
    }
    image, y_true = DeviceInputs(anchors, num_classes, name="device_inputs")(inputs)
    features = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(2, 3, name="conv")(image))
    objects = keras.ops.stack([keras.ops.sum(t[..., 4], axis=(1, 2, 3)) for t in y_true], axis=-1)
    return keras.Model(inputs, [features, objects, image, *y_true])


def _device_inputs(data_folder: str, found: dict) -> None:
    import jax
    import keras
    import numpy as np

    from keras_yolo_mgpu.data.annotations import read_annotations
    from keras_yolo_mgpu.data.device_side import DeviceInputs
    from keras_yolo_mgpu.data.py_dataset import make_py_dataset
    from keras_yolo_mgpu.resources import get_anchors, model_data_path

    anchors = get_anchors(model_data_path("tiny_yolo_anchors.txt"))
    annotations = read_annotations(f"{data_folder}/train.txt")
    # Trained by fit from the PyDataset's worker threads (multi-scale: a new input size every 10 steps).
    model = _model(anchors, 4)
    train = make_py_dataset(annotations, (64, 64), 4, 4, training=True, workers=2, seed=1, multi_scale=(32, 64))

    def loss(y_true, y_pred):  # the features' size; the targets are computed in the step, not scored
        return keras.ops.mean(keras.ops.square(y_pred[:, :2])) + 0.0 * keras.ops.sum(y_pred[:, 2:])

    trainer = keras.Model(model.inputs, keras.ops.concatenate(model.outputs[:2], axis=-1))
    trainer.compile(optimizer="sgd", loss=loss, jit_compile=True)
    losses = trainer.fit(train, steps_per_epoch=6, epochs=2, verbose=0).history["loss"]
    found["fit_losses"] = [float(value) for value in losses]
    # One fixed batch through the layer: on 1 device, and sharded over 4.
    validation = make_py_dataset(annotations, (64, 64), 4, 4, training=False, workers=1)
    batch = make_py_dataset(annotations, (64, 64), 4, 4, training=True, seed=2, mosaic=0.5)[0][0]
    found["layer_batch"] = batch
    found["layer_outputs"] = [np.asarray(t) for t in model.predict(batch, verbose=0)[2:]]
    found["validation_image_exact"] = bool(
        np.array_equal(model.predict(validation[0][0], verbose=0)[2], validation[0][0]["image"] / np.float32(255))
    )
    distribution = keras.distribution.DataParallel(devices=jax.devices())
    keras.distribution.set_distribution(distribution)
    try:
        sharded = _model(anchors, 4)
        found["num_devices"] = len(jax.devices())
        found["sharded_outputs"] = [np.asarray(t) for t in sharded.predict(batch, batch_size=4, verbose=0)[2:]]
        # fit over 4 devices, batches placed on them by the PyDataset's workers (ahead of the step):
        # the same losses as from host arrays.
        sharding = distribution.get_data_layout((4,)).backend_layout  # batch axis only: fits every rank

        def fit_losses(to_device):
            keras.utils.set_random_seed(0)
            model = _model(anchors, 4)
            trainer = keras.Model(model.inputs, keras.ops.concatenate(model.outputs[:2], axis=-1))
            trainer.compile(optimizer="sgd", loss=loss, jit_compile=True)
            data = make_py_dataset(annotations, (64, 64), 4, 4, training=True, seed=1, workers=2, to_device=to_device)
            return trainer.fit(data, steps_per_epoch=3, epochs=1, verbose=0).history["loss"]

        placed = {}

        def to_device(batch):
            batch = jax.device_put(batch, sharding)
            placed["sharding"] = batch[0]["image"].sharding.is_equivalent_to(sharding, 4)
            return batch

        found["placed_losses"], found["host_losses"] = fit_losses(to_device), fit_losses(None)
        found["placed_sharding"] = placed["sharding"]
    finally:
        keras.distribution.set_distribution(None)
    # Serialization round trip of the layer.
    layer = model.get_layer("device_inputs")
    again = DeviceInputs.from_config(layer.get_config())
    found["config_round_trip"] = again.get_config() == layer.get_config()
    rebuilt = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    found["deserialized_type"] = type(rebuilt).__name__
    # Mixed precision: the image in bfloat16, the targets float32 and unchanged.
    mixed = DeviceInputs(anchors, 4, dtype="mixed_bfloat16")
    image, y_true = mixed({key: keras.ops.convert_to_tensor(value) for key, value in batch.items()})
    found["mixed_dtypes"] = [str(image.dtype), *(str(t.dtype) for t in y_true)]
    found["mixed_targets_equal"] = all(
        np.array_equal(np.asarray(t), e) for t, e in zip(y_true, found["layer_outputs"][1:], strict=True)
    )


def main(data_folder: str, out_path: str) -> None:
    block_tensorflow("blocked by tests/jax_input_checks.py")
    import numpy as np

    from keras_yolo_mgpu.data.annotations import read_annotations
    from keras_yolo_mgpu.data.py_dataset import make_py_dataset

    found = {}
    annotations = read_annotations(f"{data_folder}/train.txt")
    train = make_py_dataset(annotations, (64, 64), 4, 4, training=True, workers=2, **TRAINING)
    found["training_batches"] = [train[k] for k in range(3)]
    validation = make_py_dataset(annotations, (64, 64), 4, 4, training=False)
    found["validation_batches"] = [validation[k] for k in range(validation.num_batches)]
    _targets(found)
    _hsv(found)
    _device_inputs(data_folder, found)
    found["tensorflow_modules"] = sorted(name for name in sys.modules if name.split(".")[0] == "tensorflow")
    found["numpy"] = np.__version__
    with open(out_path, "wb") as handle:
        pickle.dump(found, handle)


if __name__ == "__main__":
    main(*sys.argv[1:])
