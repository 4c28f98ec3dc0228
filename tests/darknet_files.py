"""Darknet ``.weights`` files for the tests: random weights, written in Darknet's layout.

The package only reads ``.weights`` files (``weights.darknet.read_weights``);
the tests write their own to convert.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np

from keras_yolo_mgpu.weights import darknet


def file_arrays(w: darknet.ConvWeights) -> list[np.ndarray]:
    """A conv's arrays in ``.weights`` file order."""
    if w.bias is not None:
        return [w.bias, w.kernel]
    return [w.beta, w.gamma, w.mean, w.variance, w.kernel]


def write_weights(
    path: str | os.PathLike, weights: Iterable[darknet.ConvWeights], header: darknet.DarknetHeader | None = None
) -> int:
    """Writes conv weights in Darknet's ``.weights`` layout; returns the float count."""
    header = header or darknet.DarknetHeader()
    count = 0
    with open(path, "wb") as f:
        f.write(np.array([header.major, header.minor, header.revision], "<i4").tobytes())
        f.write(np.array([header.seen], "<i8" if header.seen_is_int64 else "<i4").tobytes())
        for w in weights:
            for a in file_arrays(w):
                a = np.ascontiguousarray(a, "<f4")
                f.write(a.tobytes())
                count += a.size
    return count


def random_weights(convs: Sequence[darknet.ConvSpec], seed: int = 0) -> list[darknet.ConvWeights]:
    """Random weights that keep activations of order 1 through a deep network.

    Kernels are scaled by ``1 / sqrt(fan_in)``. BN variances span 1e-8 to
    1e2 (log-uniform) with about one channel in 16 exactly zero, as dead
    channels of trained networks are, which is where Darknet's and Keras's
    batch-norm formulas differ most; ``gamma`` is ``U(0.5, 1) *
    sqrt(variance)`` (plus 1e-6) so that every channel's overall gain stays
    below 1 under either Darknet formula.
    """
    rng = np.random.default_rng(seed)
    out = []
    for spec in convs:
        fan_in = spec.in_channels * spec.size * spec.size
        kernel = rng.normal(0.0, 1.0 / np.sqrt(fan_in), spec.kernel_shape).astype(np.float32)
        n = spec.filters
        if spec.batch_normalize:
            variance = 10.0 ** rng.uniform(-8.0, 2.0, n)
            variance[rng.uniform(size=n) < 1 / 16] = 0.0
            gain = rng.uniform(0.5, 1.0, n)
            out.append(
                darknet.ConvWeights(
                    kernel,
                    beta=rng.uniform(-0.2, 0.2, n).astype(np.float32),
                    gamma=(gain * (np.sqrt(variance) + 1e-6)).astype(np.float32),
                    mean=rng.uniform(-0.2, 0.2, n).astype(np.float32),
                    variance=variance.astype(np.float32),
                )
            )
        else:
            out.append(darknet.ConvWeights(kernel, bias=rng.uniform(-0.2, 0.2, n).astype(np.float32)))
    return out


def load_darknet(cfg_path: str | os.PathLike, weights_path: str | os.PathLike, **kwargs):
    """Parses ``cfg_path``, reads ``weights_path`` and builds the Keras model (``build_model``'s ``kwargs``)."""
    sections = darknet.parse_cfg(cfg_path)
    _, weights = darknet.read_weights(weights_path, darknet.infer_layers(sections)[0])
    return darknet.build_model(sections, weights, **kwargs)
