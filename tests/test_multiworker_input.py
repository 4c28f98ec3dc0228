"""Multi-worker input: each worker builds only its slice of every global batch, and the slices make the batch."""

import numpy as np
import pytest
import tensorflow as tf

from keras_yolo_mgpu import get_anchors, model_data_path
from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.host import HostBatches
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
from keras_yolo_mgpu.data.tf_dataset import distribute_training_dataset, make_dataset

ANCHORS = get_anchors(model_data_path("tiny_yolo_anchors.txt"))
BATCH = 4


@pytest.fixture(scope="module")
def annotations(tmp_path_factory):
    paths = make_synthetic_dataset(tmp_path_factory.mktemp("data"), num_train=6, num_val=0, image_size=64, seed=1)
    return read_annotations(paths.train)


def _batches(annotations, steps, **options):
    dataset = make_dataset(annotations, (64, 64), ANCHORS, 4, BATCH, training=True, seed=3, **options)
    return [tf.nest.map_structure(lambda t: t.numpy(), batch) for batch in dataset.take(steps)]


@pytest.mark.parametrize("options", [{}, {"mosaic": 0.5, "start_position": 8}], ids=["plain", "mosaic-resumed"])
def test_two_shards_make_the_single_worker_global_batches(annotations, options):
    """Shard w's k-th batch is the w-th half of global batch k: same images, same augmentation, same boxes."""
    whole = _batches(annotations, 3, **options)
    halves = [_batches(annotations, 3, num_shards=2, shard_index=w, **options) for w in (0, 1)]
    for step in range(3):
        x, y = whole[step]
        for key in x:
            joined = np.concatenate([halves[0][step][0][key], halves[1][step][0][key]])
            np.testing.assert_array_equal(joined, x[key], err_msg=f"step {step} {key}")
        assert halves[0][step][1].shape == (BATCH // 2, 1)


def test_a_shard_reads_only_its_positions(annotations):
    shard = {"num_shards": 2, "shard_index": 1}
    host = HostBatches(annotations, (64, 64), 4, BATCH, training=True, seed=3, **shard)
    positions = [p for k in range(3) for p in host.positions(k).tolist()]
    assert positions == [2, 3, 6, 7, 10, 11]  # second half of each global batch of 4, nothing else
    # Resumed mid-batch (start 5): its positions from there on, as the single stream's filter kept them.
    resumed = HostBatches(annotations, (64, 64), 4, BATCH, training=True, seed=3, start_position=5, **shard)
    assert [p for k in range(2) for p in resumed.positions(k).tolist()] == [6, 7, 10, 11]
    first_half = HostBatches(annotations, (64, 64), 4, BATCH, training=True, start_position=7, num_shards=2)
    assert first_half.positions(0).tolist() == [8, 9]


def test_bad_shards_are_refused(annotations):
    with pytest.raises(ValueError, match="num_shards"):
        HostBatches(annotations, (64, 64), 4, 6, training=True, num_shards=4)
    with pytest.raises(ValueError, match="training streams only"):
        HostBatches(annotations, (64, 64), 4, 4, training=False, num_shards=2, shard_index=0)


def test_single_machine_strategies_get_the_plain_dataset(annotations):
    dataset = distribute_training_dataset(tf.distribute.get_strategy(), annotations, (64, 64), ANCHORS, 4, BATCH)
    assert isinstance(dataset, tf.data.Dataset)
    x, y = next(iter(dataset))
    assert x["image"].shape == (BATCH, 64, 64, 3) and y.shape == (BATCH, 1)
