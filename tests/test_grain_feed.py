"""The grain feed (data/grain_feed.py): `HostBatches`' own batches, bit for bit and in order, for any workers.

Batch `k` is a pure function of `k` and the stream's settings, so grain's
worker processes (each making every N-th batch) hand back the batches
`HostBatches.batch` makes in this process, with augmentation, mosaic,
multi-scale, the shared RAM cache and a resumed stream position.
"""

import itertools

import numpy as np
import pytest

pytest.importorskip("grain", reason="grain (google/grain) is not installed: the grain feed is optional")

from keras_yolo_mgpu.data.annotations import read_annotations  # noqa: E402
from keras_yolo_mgpu.data.grain_feed import GrainFeed  # noqa: E402
from keras_yolo_mgpu.data.host import HostBatches  # noqa: E402
from keras_yolo_mgpu.data.host_processes import batch_arrays  # noqa: E402
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset  # noqa: E402

TRAINING = {"seed": 3, "mosaic": 0.5, "multi_scale": (32, 96)}
COUNT = 5  # batches compared: more than one round over 2 workers, ending mid-round


@pytest.fixture(scope="module")
def annotations(tmp_path_factory):
    dataset = make_synthetic_dataset(tmp_path_factory.mktemp("grain"), num_train=12, num_val=4, image_size=64, seed=2)
    return read_annotations(dataset.train)


def _host(annotations, **options):
    return HostBatches(annotations, (64, 64), 4, 4, training=True, **{**TRAINING, **options})


def _flat(batch) -> list[np.ndarray]:
    x, *rest = batch
    return [np.asarray(x[key]) for key in ("image", "boxes", "hsv")] + [np.asarray(a) for a in rest]


def _assert_same(made, expected):
    assert len(made) == len(expected)
    for got, want in zip(made, expected, strict=True):
        got, want = _flat(got), _flat(want)
        assert len(got) == len(want) >= 4
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def _grain_batches(host, workers: int, count: int = COUNT):
    feed = GrainFeed(host, workers=workers)
    iterator = iter(feed)
    try:
        return [next(iterator) for _ in range(count)]
    finally:
        if hasattr(iterator, "close"):
            iterator.close()
        feed.close()


@pytest.mark.parametrize(("workers", "cache"), [(0, None), (1, None), (2, None), (0, "ram"), (2, "ram")])
def test_grain_makes_the_host_batches_in_order(annotations, workers, cache):
    host = _host(annotations, cache=cache)
    expected = [batch_arrays(_host(annotations, cache=cache), k) for k in range(COUNT)]
    _assert_same(_grain_batches(host, workers), expected)
    assert host.source.shared is None  # the feed freed the cache it shared with its workers


def test_a_resumed_feed_makes_the_uninterrupted_runs_batches(annotations):
    uninterrupted = [batch_arrays(_host(annotations), k) for k in range(3 + COUNT)]
    # A run resumed from its stream position, as the trainer resumes it.
    resumed = _grain_batches(_host(annotations, start_position=3 * 4), workers=2)
    _assert_same(resumed, uninterrupted[3:])
    # grain's own iterator position, saved after 3 batches and set on a new iterator.
    feed = GrainFeed(_host(annotations), workers=2)
    first, second = iter(feed), iter(feed)
    try:
        list(itertools.islice(first, 3))
        second.set_state(first.get_state())
        _assert_same([next(second) for _ in range(COUNT)], uninterrupted[3:])
    finally:
        first.close()
        second.close()
        feed.close()


def test_validation_pass_ends(annotations):
    host = HostBatches(annotations, (64, 64), 4, 4, training=False)
    expected = [batch_arrays(host, k) for k in range(host.num_batches)]
    _assert_same(list(GrainFeed(host, workers=0).dataset), expected)
    with pytest.raises(ValueError, match="workers"):
        GrainFeed(host, workers=-1)
