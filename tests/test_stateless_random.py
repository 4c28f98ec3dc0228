"""TensorFlow's stateless random numbers made in numpy: bit for bit, for every function the pipeline draws with."""

import numpy as np
import pytest
import tensorflow as tf

from keras_yolo_mgpu.data import stateless_random

# Small, large, negative seeds: all 64 bits of both words matter.
SEEDS = [[0, 0], [3, 0], [-1, 7], [2**62 + 5, -(2**40)], [123456789, 987654321]]


@pytest.mark.parametrize("seed", SEEDS)
def test_uniform_draws_equal_tensorflows(seed):
    tf_seed = tf.constant(seed, tf.int64)
    for count in (1, 3, 4, 5, 11, 17):  # whole and partial Philox blocks
        np.testing.assert_array_equal(
            stateless_random.uniform_float32(np.array(seed), count), tf.random.stateless_uniform([count], tf_seed)
        )
        np.testing.assert_array_equal(
            stateless_random.uniform_float64(np.array(seed), count),
            tf.random.stateless_uniform([count], tf_seed, dtype=tf.float64),
        )
        np.testing.assert_array_equal(
            stateless_random.uniform_int32(np.array(seed), count, 2, 7),
            tf.random.stateless_uniform([count], tf_seed, 2, 7, dtype=tf.int32),
        )
        np.testing.assert_array_equal(
            stateless_random.uniform_int64(np.array(seed), count, 0, 1_000_003),
            tf.random.stateless_uniform([count], tf_seed, 0, 1_000_003, dtype=tf.int64),
        )


@pytest.mark.parametrize("seed", SEEDS)
def test_fold_in_equals_tensorflows_for_int64_and_python_int_data(seed):
    tf_seed = tf.constant(seed, tf.int64)
    for data in (0, 1, 2, 99, -5, 2**31 - 1):
        # A Python int becomes an int32 tensor: the folded seed's first element is one word.
        np.testing.assert_array_equal(
            stateless_random.fold_in(np.array(seed), data, "int32"),
            tf.random.experimental.stateless_fold_in(tf_seed, data),
        )
        np.testing.assert_array_equal(
            stateless_random.fold_in(np.array(seed), data),
            tf.random.experimental.stateless_fold_in(tf_seed, tf.constant(data, tf.int64)),
        )
    # The two really differ (the pipeline must say which one TensorFlow used).
    assert not np.array_equal(stateless_random.fold_in(np.array(seed), 2, "int32"), stateless_random.fold_in(seed, 2))
    # An int32-folded seed draws like TensorFlow's int32 seed.
    int32_seed = tf.random.experimental.stateless_fold_in(tf_seed, 2)
    np.testing.assert_array_equal(
        stateless_random.uniform_float64(stateless_random.fold_in(np.array(seed), 2, "int32"), 11),
        tf.random.stateless_uniform([11], int32_seed, dtype=tf.float64),
    )
    with pytest.raises(ValueError, match="dtype"):
        stateless_random.fold_in(np.array(seed), 2, "int16")


def test_draws_for_many_seeds_at_once_equal_one_at_a_time():
    seeds = np.array(SEEDS)
    batch = stateless_random.uniform_float64(seeds, 11)
    folded = stateless_random.fold_in(seeds, np.arange(len(SEEDS)))
    assert batch.shape == (len(SEEDS), 11) and folded.shape == (len(SEEDS), 2)
    for row, seed in enumerate(SEEDS):
        np.testing.assert_array_equal(batch[row], stateless_random.uniform_float64(np.array(seed), 11))
        np.testing.assert_array_equal(folded[row], stateless_random.fold_in(np.array(seed), row))
