"""Stage 0's pieces (training/bottleneck.py): the features it trains on and the order it reads them in.

The stage itself runs through train_bottleneck.py (test_keras_yolo3_train.py) and, on 1 and 4
devices of both backends, through train.py (test_recipe_equivalence.py, every option together).
"""

import keras
import numpy as np

from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
from keras_yolo_mgpu.model.yolo3 import tiny_yolo_body
from keras_yolo_mgpu.training import bottleneck


def test_features_are_the_output_convolutions_inputs_for_each_image_and_nothing_else(tmp_path):
    paths = make_synthetic_dataset(tmp_path, num_train=11, num_val=0, image_size=64, seed=0)
    annotations = read_annotations(paths.train)
    body = tiny_yolo_body(keras.Input((None, None, 3)), 3, 4)
    inputs = bottleneck.compute_features(body, annotations, (64, 64), 4)
    # 11 images in batches of 8: the second batch's 5 grey padding images are left out.
    assert inputs["features_0"].shape == (11, 2, 2, 512) and inputs["features_1"].shape == (11, 4, 4, 256)
    assert sum(inputs[f"features_{i}"].nbytes for i in (0, 1)) == 11 * bottleneck.feature_bytes(body, (64, 64))
    # The output convolutions on the features give the body's outputs on the same (letterboxed) image.
    image = np.asarray(keras.utils.load_img(annotations[3].image_path), np.float32)[None] / 255.0
    for i, layer in enumerate(bottleneck.output_layers(body)):
        expected = keras.ops.convert_to_numpy(body(image)[i])
        np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(inputs[f"features_{i}"][3:4])), expected, atol=1e-5)
    boxes = inputs["boxes"][3]
    np.testing.assert_array_equal(boxes[: len(annotations[3].boxes)], annotations[3].boxes)


def test_each_epoch_reads_every_image_in_full_batches_in_an_order_the_seed_fixes():
    inputs = {"boxes": np.arange(11, dtype=np.float32).reshape(11, 1)}
    batches = bottleneck._ShuffledBatches(inputs, 4, seed=5)
    epochs = []
    for _ in range(2):
        rows = [batches[k][0]["boxes"][:, 0] for k in range(len(batches))]
        assert len(rows) == 3 and all(len(r) == 4 for r in rows)  # 11 images: 3 full batches
        epochs.append(np.concatenate(rows).astype(int))
        batches.on_epoch_end()
    for order in epochs:
        assert set(order) == set(range(11))  # every image, one borrowed again to fill the last batch
    assert not np.array_equal(epochs[0], epochs[1])  # a new order each epoch
    again = bottleneck._ShuffledBatches(inputs, 4, seed=5)
    assert np.array_equal(np.concatenate([again[k][0]["boxes"][:, 0] for k in range(3)]).astype(int), epochs[0])
