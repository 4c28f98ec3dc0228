"""Stage 0 (`--bottleneck-epochs`, keras-yolo3's train_bottleneck.py): the output convolutions alone, on features.

keras-yolo3's train_bottleneck.py starts fine-tuning fast: with the body
frozen, only the output convolutions (`freeze_body=2`) learn, so the body's
features of every image are computed once, without augmentation, and the
output convolutions train on those features (30 epochs, batch 8, Adam at
1e-3); its two stages then start from the result. Here:

- the features are those of the letterboxed images (the validation
  pipeline's), training and validation splits apart, kept in memory (refused
  at the start when they would not fit). keras-yolo3 cached them in
  `bottlenecks.npz` and read that file again in any later run, for whatever
  data it then had;
- the stage runs on the default device, outside the engine's strategy and
  before its model is built. Like the start weights, its result does not
  depend on the device count;
- batches are drawn in a seeded order per epoch, so a run repeats exactly.
"""

from __future__ import annotations

import logging
import math

import keras
import numpy as np

from keras_yolo_mgpu.data.device_side import BoxTargets, to_float
from keras_yolo_mgpu.data.host import HostBatches, free_memory
from keras_yolo_mgpu.model.boxes import MAX_BOXES
from keras_yolo_mgpu.model.loss import totalloss
from keras_yolo_mgpu.model.yolo3 import OUTPUT_PREFIX

logger = logging.getLogger(__name__)

STAGE0_WEIGHTS = "trained_weights_stage_0.weights.h5"
# keras-yolo3's train_bottleneck.py: `batch_size=8`, `optimizer='adam'` (Keras's default rate).
BATCH_SIZE = 8
LEARNING_RATE = 1e-3


def output_layers(body: keras.Model) -> list:
    """The body's output convolutions `yolo_output_<i>`, in the order of `body.outputs` (coarsest scale first)."""
    return [body.get_layer(f"{OUTPUT_PREFIX}{i}") for i in range(len(body.outputs))]


def _extractor(body: keras.Model) -> keras.Model:
    """Image (N, H, W, 3) -> the inputs of the output convolutions (the features the head trains on)."""
    return keras.Model(body.inputs, [layer.input for layer in output_layers(body)])


def feature_bytes(body: keras.Model, input_shape) -> int:
    """Bytes of one image's features at `input_shape` (height, width), kept in Keras's float type (`floatx`)."""
    shapes = _extractor(body).compute_output_shape((1, *input_shape, 3))
    return sum(math.prod(shape[1:]) for shape in shapes) * np.dtype(keras.config.floatx()).itemsize


def compute_features(body: keras.Model, annotations, input_shape, num_classes: int) -> dict:
    """The head's inputs for `annotations`: the features of each letterboxed image and its boxes.

    Returns:
        `{"features_<i>": (n, height / stride, width / stride, channels) per output conv (Keras's floatx),
        "boxes": (n, MAX_BOXES, 5) float32}`, n the images that decoded (a failed image is warned
        about by the host and left out).
    """
    extractor = _extractor(body)
    batches = HostBatches(annotations, input_shape, num_classes, BATCH_SIZE, training=False, max_boxes=MAX_BOXES)
    features, boxes = None, []
    for k in range(batches.num_batches):
        batch = batches.batch(k)
        real = batch.weights > 0  # the padding of the last batch, and images that failed to decode
        outputs = extractor.predict_on_batch(keras.ops.convert_to_numpy(to_float(batch.images)))
        if features is None:
            features = [[] for _ in outputs]
        for kept, output in zip(features, outputs, strict=True):
            kept.append(np.asarray(output, keras.config.floatx())[real])
        boxes.append(batch.boxes[real])
    inputs = {f"features_{i}": np.concatenate(kept) for i, kept in enumerate(features)}
    inputs["boxes"] = np.concatenate(boxes)
    return inputs


class _ShuffledBatches(keras.utils.PyDataset):
    """Full batches of arrays in a new order each epoch, a function of `seed` and the epoch alone.

    An epoch is `ceil(n / batch_size)` batches; the last one is filled from the
    start of the epoch's order (as keras-yolo3's generator cycles), so every
    step has one shape and compiles once.
    """

    def __init__(self, inputs: dict, batch_size: int, seed: int):
        super().__init__()
        self.inputs, self.batch_size, self.seed = inputs, batch_size, seed
        self.steps = math.ceil(len(inputs["boxes"]) / batch_size)
        self.epoch = 0
        self.order = self._order()

    def _order(self) -> np.ndarray:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.inputs["boxes"]))
        return np.resize(order, self.steps * self.batch_size)

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int):
        rows = self.order[index * self.batch_size : (index + 1) * self.batch_size]
        return {name: array[rows] for name, array in self.inputs.items()}, np.zeros((len(rows), 1), np.float32)

    def on_epoch_end(self) -> None:
        self.epoch += 1
        self.order = self._order()


def head_model(body: keras.Model, loss_layer, inputs: dict, input_shape, anchors, num_classes, masks, iou_thresh):
    """The output convolutions of `body` (shared, not copied) on feature inputs, with `loss_layer`: loss (N, 1)."""
    layers = output_layers(body)
    model_inputs = {
        name: keras.Input(shape=array.shape[1:], name=name) for name, array in inputs.items() if name != "boxes"
    }
    model_inputs["boxes"] = keras.Input(shape=(MAX_BOXES, 5), dtype="float32", name="boxes")
    y_true = BoxTargets(input_shape, anchors, num_classes, masks, iou_thresh)(model_inputs["boxes"])
    outputs = [layer(model_inputs[f"features_{i}"]) for i, layer in enumerate(layers)]
    return keras.Model(model_inputs, loss_layer([*outputs, *y_true]), name="yolo_bottleneck")


def train_output_layers(
    body: keras.Model,
    loss_layer,
    splits,
    *,
    input_shape,
    anchors,
    num_classes: int,
    masks,
    iou_thresh,
    epochs: int,
    seed: int,
    jit: bool,
    verbose: int,
) -> None:
    """Trains `body`'s output convolutions in place for `epochs` on the features of `splits` (train, val).

    Args:
        body: the single-device body, with the run's start weights.
        loss_layer: the run's `YoloLoss` layer.
        splits: (training annotations, validation annotations; empty for none).
        input_shape: (height, width) the images are letterboxed to.
        anchors, num_classes, masks, iou_thresh: the run's (the targets and the loss).
        epochs, seed, jit, verbose: the stage's epochs, the run's seed, XLA, `fit`'s verbosity.

    Raises:
        ValueError: the features would not fit in the memory available.
    """
    train_annotations, val_annotations = splits
    images = len(train_annotations) + len(val_annotations)
    need, free = images * feature_bytes(body, input_shape), free_memory()
    if need > free:
        raise ValueError(
            f"--bottleneck-epochs: the body's features of {images} images at {input_shape[1]}x{input_shape[0]} "
            f"need about {need / 1e9:.1f} GB of memory, but {free / 1e9:.1f} GB is available; train without "
            "stage 0 (--bottleneck-epochs 0: stage 1 trains the same layers on augmented images), or on fewer images"
        )
    logger.info(
        "stage 0: the output convolutions alone on the body's features of %d letterboxed images (%.1f MB in "
        "memory, computed once): %d epoch(s), batch %d, Adam at %g, on one device",
        images,
        need / 1e6,
        epochs,
        BATCH_SIZE,
        LEARNING_RATE,
    )
    train_inputs = compute_features(body, train_annotations, input_shape, num_classes)
    validation = None
    if val_annotations:
        val_inputs = compute_features(body, val_annotations, input_shape, num_classes)
        validation = (val_inputs, np.zeros((len(val_inputs["boxes"]), 1), np.float32))
    head = head_model(body, loss_layer, train_inputs, input_shape, anchors, num_classes, masks, iou_thresh)
    head.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE), loss=totalloss, jit_compile=jit)
    head.fit(
        _ShuffledBatches(train_inputs, BATCH_SIZE, seed),
        validation_data=validation,
        validation_batch_size=BATCH_SIZE,
        epochs=epochs,
        verbose=verbose,
    )
