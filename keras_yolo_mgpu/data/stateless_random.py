"""TensorFlow's stateless random numbers in numpy, bit for bit, without TensorFlow.

Every random draw of the training stream (`data.host`) is one of these, so the
pipeline runs where TensorFlow is not installed and yields the same images and
boxes for the same seed and position (tests/test_stateless_random.py compares
every function with TensorFlow's).

What TensorFlow 2.21 does on the CPU and GPU (`alg="auto_select"` is Philox):

- the (2,) int64 seed becomes a Philox-4x32-10 key and counter by one
  scrambling round (`GenerateKey`: key (0x3ec8f720, 0x02461e29), counter the
  seed's four 32-bit halves; the output's first two words are the key, its
  last two the counter's high half);
- block `j` of the output is Philox of counter + j; each block gives four
  uint32, i.e. four float32, two float64 or two int64 values, in order;
- float32: 23 random mantissa bits, `[1, 2) - 1`; float64: 52 bits from the
  low 20 bits of the first word and the whole second word; int32 in [lo, hi):
  `lo + word % (hi - lo)`; int64 in [lo, hi): `lo + (w0 | w1 << 32) % range`;
- `stateless_fold_in(seed, data)` is `[full-range integer of seed, data]` in
  `data`'s dtype: int64 (two words, the first the low half) for an int64
  `data`, the first word as an int32 for an int32 one, which a Python int
  becomes. An int32 seed means the same as the int64 seed of equal values.

Every function takes seeds of shape (..., 2) int64 and draws for all of them
at once (vectorised over the leading axes).
"""

from __future__ import annotations

import numpy as np

__all__ = ["fold_in", "uniform_float32", "uniform_float64", "uniform_int32", "uniform_int64"]

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_LOW32 = np.uint64(0xFFFFFFFF)
_SCRAMBLE_KEY = (0x3EC8F720, 0x02461E29)


def _philox(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Philox-4x32-10: counter (..., 4) uint32, key (..., 2) uint32 -> (..., 4) uint32."""
    c0, c1, c2, c3 = (counter[..., i].astype(np.uint64) for i in range(4))
    k0, k1 = key[..., 0].astype(np.uint64), key[..., 1].astype(np.uint64)
    for _ in range(10):
        p0, p1 = _M0 * c0, _M1 * c2  # 64-bit products of 32-bit words: exact
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & _LOW32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _LOW32)
        k0, k1 = (k0 + _W0) & _LOW32, (k1 + _W1) & _LOW32  # uint32 wrap-around, as in C
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def _words(seed, num_blocks: int) -> np.ndarray:
    """The first `num_blocks` Philox outputs of `seed` (..., 2): (..., num_blocks * 4) uint32."""
    seed = np.asarray(seed, dtype=np.int64).view(np.uint64)
    halves = np.stack([seed & _LOW32, seed >> np.uint64(32)], axis=-1).reshape(*seed.shape[:-1], 4)
    scramble_key = np.broadcast_to(np.array(_SCRAMBLE_KEY, np.uint32), (*seed.shape[:-1], 2))
    mix = _philox(halves.astype(np.uint32), scramble_key)
    key = mix[..., :2]
    blocks = np.arange(num_blocks, dtype=np.uint32)
    # Counter of block j: (j, 0, mix[2], mix[3]) (the low 64 bits start at 0).
    counter = np.stack(np.broadcast_arrays(blocks, np.uint32(0), mix[..., 2:3], mix[..., 3:4]), axis=-1)
    words = _philox(counter, key[..., None, :])  # (..., num_blocks, 4)
    return words.reshape(*words.shape[:-2], num_blocks * 4)


def uniform_float32(seed, count: int) -> np.ndarray:
    """`tf.random.stateless_uniform([count], seed)`: (..., count) float32 in [0, 1)."""
    words = _words(seed, -(-count // 4))[..., :count]
    return ((words & np.uint32(0x7FFFFF)) | np.uint32(127 << 23)).view(np.float32) - np.float32(1.0)


def _word_pairs(seed, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(first, second) uint32 words of `count` 64-bit draws: (..., count) each."""
    words = _words(seed, -(-count // 2))[..., : 2 * count]
    return words[..., 0::2], words[..., 1::2]


def uniform_float64(seed, count: int) -> np.ndarray:
    """`tf.random.stateless_uniform([count], seed, dtype=tf.float64)`: (..., count) in [0, 1)."""
    first, second = _word_pairs(seed, count)
    mantissa = ((first & np.uint32(0xFFFFF)).astype(np.uint64) << np.uint64(32)) | second.astype(np.uint64)
    return (mantissa | np.uint64(1023 << 52)).view(np.float64) - 1.0


def uniform_int32(seed, count: int, low: int, high: int) -> np.ndarray:
    """`tf.random.stateless_uniform([count], seed, low, high, dtype=tf.int32)`: (..., count) int32."""
    words = _words(seed, -(-count // 4))[..., :count]
    return (np.int64(low) + words.astype(np.int64) % np.int64(high - low)).astype(np.int32)


def uniform_int64(seed, count: int, low: int, high: int) -> np.ndarray:
    """`tf.random.stateless_uniform([count], seed, low, high, dtype=tf.int64)`: (..., count) int64."""
    first, second = _word_pairs(seed, count)
    bits = first.astype(np.uint64) | (second.astype(np.uint64) << np.uint64(32))
    return (np.uint64(low) + bits % np.uint64(high - low)).view(np.int64)


def fold_in(seed, data, dtype: str = "int64") -> np.ndarray:
    """`tf.random.experimental.stateless_fold_in(seed, data)`: (..., 2) int64.

    Args:
        seed: (..., 2) int64 (an int32 seed: the same values).
        data: (...) integers; broadcast against the seed's leading axes.
        dtype: `data`'s dtype in TensorFlow's call: "int64", or "int32"
            where the call passed a Python int (TensorFlow makes it int32,
            and the folded seed's first element is then one 32-bit word).
    """
    first, second = _word_pairs(seed, 1)
    if dtype == "int32":
        full = first[..., 0].view(np.int32).astype(np.int64)
    elif dtype == "int64":
        full = (first[..., 0].astype(np.uint64) | (second[..., 0].astype(np.uint64) << np.uint64(32))).view(np.int64)
    else:
        raise ValueError(f"`dtype` must be 'int32' or 'int64'. Received: dtype={dtype!r}")
    full, data = np.broadcast_arrays(full, np.asarray(data, dtype=np.int64))
    return np.stack([full, data], axis=-1)
