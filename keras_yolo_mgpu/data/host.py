"""The host's part of the input pipeline: uint8 images, padded boxes and HSV draws, batch by batch.

One definition of what the host does, shared by every feed (tf.data in
`data.tf_dataset`, the `keras.utils.PyDataset` of `data.py_dataset`, worker
processes, grain), which all yield the same batches. The host does only what
needs the file or the whole image: it reads and decodes the image (a JPEG at
reduced scale when it will shrink anyway), resizes and places it on the
canvas, flips it, moves the boxes, and draws the HSV jitter's parameters. The
device does the rest in the train step (`data.device_side`), so the dense
target grids (116 MB per batch of 32 at 416 px with 80 classes, against 13 KB
of boxes) never cross the bus.

A batch, `HostBatch`:

- `images`: (B, h, w, 3) uint8, the canvas (augmented, or letterboxed);
- `boxes`: (B, max_boxes, 5) float32 x_min, y_min, x_max, y_max, class in
  input pixels, zero rows as padding;
- `hsv`: (B, 12) float32, (hue, saturation, value) for each quadrant of the
  image (top-left, top-right, bottom-left, bottom-right; a mosaic's tiles
  each have their own draw), `NEUTRAL_HSV` where nothing is to be jittered
  (validation, the letterbox);
- `weights`: (B,) float32 for validation, None for training.

Every random draw of a training element is keyed by the run's seed and the
element's position in the stream (TensorFlow's stateless generators, made in
numpy by `data.stateless_random`): element `p` is the same image, with the
same augmentation, on 1 or N devices, in any worker, after a resume. The
stream and its batches:

- training: an endless stream, reshuffled (seeded) on every pass over the
  data; batch `k` holds positions `k * B ... (k + 1) * B - 1` after
  `start_position`; one epoch is `steps_per_epoch(n, batch_size) =
  ceil(n / batch_size)` batches, so the last batch of an epoch borrows images
  from the next pass and no image is ever left out. With `num_shards`, batch
  `k` of shard `s` is the `s`-th of `num_shards` equal slices of global batch
  `k`: only those images are read.
- validation: letterboxed images in file order, one pass; the last batch is
  padded with grey, box-less images of weight 0, and the real images all
  weigh `num_batches * batch_size / n`, so Keras's mean over batches of
  `sum(weight * loss) / batch_size` is exactly the mean loss over the n real
  images.

An image that fails to decode (deleted, truncated beyond recovery, corrupt
since the dataset check) does not stop the run: a warning names the file
and its annotation line once, and the sample becomes a grey image with no
boxes (with weight 0 in validation).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from keras_yolo_mgpu.data import stateless_random
from keras_yolo_mgpu.data.annotations import Annotation
from keras_yolo_mgpu.data.augment import (
    augment_boxes,
    box_orders,
    pad_boxes,
    place_image,
    sample_augmentation,
)
from keras_yolo_mgpu.data.images import decode_image
from keras_yolo_mgpu.data.letterbox import (
    GREY,
    letterbox_boxes,
    letterbox_bytes,
    letterbox_geometry,
    paste_letterbox,
    resize_for_letterbox,
)
from keras_yolo_mgpu.data.mosaic import MosaicDraws, draw_mosaics, join_tile_boxes, tile_shape
from keras_yolo_mgpu.data.multiscale import check_size_range, rescale_batch, size_of_batch
from keras_yolo_mgpu.wording import counted

logger = logging.getLogger(__name__)

__all__ = [
    "HSV_PARAMS",
    "NEUTRAL_HSV",
    "HostBatch",
    "HostBatches",
    "ImageSource",
    "check_cache_fits",
    "element_seeds",
    "steps_per_epoch",
]

# (hue, saturation, value) per quadrant: 4 x 3 numbers per image.
HSV_PARAMS = 12
# The draw that leaves an image as it is (the device passes it through exactly).
NEUTRAL_HSV = (0.0, 1.0, 1.0)

_RAM_CACHE_NAMES = ("ram", "memory")
# The process's RAM cache (`ImageSource`): (image path, canvas (w, h)) -> (mtime, size, pixels, image size).
_ram_cache: dict[tuple[str, tuple[int, int]], tuple[int, int, np.ndarray, tuple[int, int]]] = {}
# Files already reported as unreadable: warn once per file, not once per use.
_warned_paths: set[str] = set()
_warned_lock = threading.Lock()
_CACHE_VERSION = "v4"  # in every disk cache entry's name: a new layout never reads an old entry
_CACHE_HEADER = 6  # int64: mtime_ns, file size, image w, h (as displayed), cached w, h


def steps_per_epoch(num_samples: int, batch_size: int) -> int:
    """Batches per epoch: `ceil(num_samples / batch_size)` (see the module docstring)."""
    if num_samples <= 0 or batch_size <= 0:
        raise ValueError(f"`num_samples` and `batch_size` must be positive. Received: {num_samples}, {batch_size}")
    return math.ceil(num_samples / batch_size)


def element_seeds(seed: int, positions) -> np.ndarray:
    """Stateless seeds of the training elements at `positions`: (..., 2) int64 (augmentation, box shuffle)."""
    augment_seed = stateless_random.fold_in(np.array([seed, 0], np.int64), 2, "int32")
    return stateless_random.fold_in(augment_seed, np.asarray(positions, np.int64))


# --- images ---------------------------------------------------------------------------


def _check_writable(folder: str) -> None:
    """ValueError naming `folder` unless a cache file can be written there."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as error:
        raise ValueError(
            f"the image cache folder {folder} cannot be written to ({type(error).__name__}: {error}). "
            "Pass `cache` (--cache) a writable folder, 'ram', or nothing."
        ) from error


def free_memory() -> int:
    """Bytes of memory available to a new allocation: Linux's MemAvailable, else the free pages."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _bytes_in(folder: str) -> int:
    """Bytes the cache entries already in `folder` hold (an entry rewritten reuses its room)."""
    try:
        return sum(entry.stat().st_size for entry in os.scandir(folder) if entry.name.endswith(".bin"))
    except OSError:
        return 0


def check_cache_fits(cache: str | None, annotations: list[Annotation], input_shape: tuple[int, int]) -> int:
    """Refuses at the start a `cache` (--cache) that cannot fit, instead of failing late in an epoch.

    Returns:
        The estimate in bytes (0 without a cache).

    Raises:
        ValueError: the estimate exceeds the free memory ('ram') or the free
            disk of the cache folder (plus what its entries already hold), giving both numbers.
    """
    if cache is None:
        return 0
    canvas = (int(input_shape[1]), int(input_shape[0]))
    sizes = {a.image_path: a.size for a in annotations}  # `Annotation.size`: read by the dataset check
    need, images = sum(letterbox_bytes(size, canvas) for size in sizes.values()), len(sizes)
    what = f"{images} images at their letterbox size in the {input_shape[1]}x{input_shape[0]} input, x 3 bytes"
    if cache in _RAM_CACHE_NAMES:
        free, where, instead = free_memory(), "memory available", "--cache DIR on a disk with room, or no --cache"
    else:
        folder = os.path.abspath(os.fspath(cache))
        existing = folder
        while not os.path.isdir(existing) and os.path.dirname(existing) != existing:
            existing = os.path.dirname(existing)
        free = shutil.disk_usage(existing).free + _bytes_in(folder)
        where, instead = f"disk free for {folder}", "a folder on a disk with room, 'ram', or no --cache"
    if need > free:
        raise ValueError(
            f"--cache {cache}: the decoded images need about {need / 1e9:.1f} GB ({what}), but only "
            f"{free / 1e9:.1f} GB of {where}; pass {instead}"
        )
    logger.info("--cache %s: about %.1f GB for %s (%.1f GB free)", cache, need / 1e9, what, free / 1e9)
    return need


class ImageSource:
    """Decodes a dataset's images by index, with an optional RAM or disk cache; thread-safe.

    Without a cache, an image is decoded from its file for every use. Cached
    images are stored resized to their letterbox size: validation pastes them
    unchanged, augmentation resamples them (a zoom beyond 1x is then a little
    softer than from the file). The RAM cache lives as long as the process
    and is shared by all its datasets; a disk cache folder may be reused
    between runs. An entry records its image's mtime and size: when either
    changed, the image is decoded again and the entry rewritten, never used.

    Raises:
        ValueError: `cache` is a folder that cannot be written to.
    """

    def __init__(self, annotations: list[Annotation], input_shape: tuple[int, int], cache: str | None):
        self.annotations = annotations
        self.canvas_size = (int(input_shape[1]), int(input_shape[0]))  # PIL order (w, h)
        self.ram = cache in _RAM_CACHE_NAMES
        self.cache_dir = None if cache is None or self.ram else os.fspath(cache)
        if self.cache_dir is not None:
            _check_writable(self.cache_dir)
        # The RAM cache of worker processes, set by the feed that starts them
        # (`data.shared_image_cache.SharedImageCache`): one for them all.
        self.shared = None

    @property
    def cached(self) -> bool:
        return self.ram or self.cache_dir is not None

    def _cache_file(self, path: str) -> str:
        key = f"{os.path.abspath(path)}|{self.canvas_size}|{_CACHE_VERSION}"
        return os.path.join(self.cache_dir, hashlib.sha1(key.encode()).hexdigest() + ".bin")

    def _from_cache(self, path: str, stat) -> tuple[np.ndarray, tuple[int, int]] | None:
        if self.ram:
            entry = _ram_cache.get((os.path.abspath(path), self.canvas_size))
            if entry is not None and entry[:2] == (stat.st_mtime_ns, stat.st_size):
                return entry[2], entry[3]
            return None
        try:
            with open(self._cache_file(path), "rb") as f:
                header = np.frombuffer(f.read(8 * _CACHE_HEADER), np.int64)
                if len(header) < _CACHE_HEADER or tuple(header[:2]) != (stat.st_mtime_ns, stat.st_size):
                    return None  # another version of the image: decode it again
                width, height = int(header[4]), int(header[5])
                pixels = np.frombuffer(f.read(), np.uint8)
        except FileNotFoundError:
            return None
        if pixels.size != width * height * 3:
            return None  # cut short (a full disk): decode it again
        return pixels.reshape(height, width, 3), (int(header[2]), int(header[3]))

    def _to_cache(self, path: str, stat, pixels: np.ndarray, size: tuple[int, int]) -> None:
        if self.ram:
            _ram_cache[(os.path.abspath(path), self.canvas_size)] = (stat.st_mtime_ns, stat.st_size, pixels, size)
            return
        cache_file = self._cache_file(path)
        temporary = f"{cache_file}.{os.getpid()}.{threading.get_ident()}.tmp"
        header = np.array([stat.st_mtime_ns, stat.st_size, *size, pixels.shape[1], pixels.shape[0]], np.int64)
        with open(temporary, "wb") as f:
            f.write(header.tobytes())
            f.write(np.ascontiguousarray(pixels).tobytes())
        os.replace(temporary, cache_file)  # atomic: readers never see half a file

    def cached_image(self, index: int) -> tuple[np.ndarray, tuple[int, int]]:
        """The cache's copy of image `index`, decoded and stored first if missing or stale.

        Returns:
            ((h', w', 3) uint8 RGB at its letterbox size, the image's (w, h) as displayed).
        """
        path = self.annotations[index].image_path
        stat = os.stat(path)
        found = self._from_cache(path, stat) if self.shared is None else self.shared.get(index, stat)
        if found is not None:
            return found
        pixels, _, size = decode_image(path)
        pixels = resize_for_letterbox(pixels, letterbox_geometry(size, self.canvas_size))
        if self.shared is None:
            self._to_cache(path, stat, pixels, size)
        else:
            self.shared.put(index, stat, pixels, size)
        return pixels, size

    def decode(self, index: int, reduce_to: tuple[int, int] | None = None):
        """Image `index` for augmentation, decoded at the smallest scale `reduce_to` allows.

        Args:
            reduce_to: (w, h) the whole image, as displayed, will be resized to.

        Returns:
            ((H, W, 3) uint8 RGB, the image's (w, h) as displayed, extent (w, h) float32 of the
            whole image in the returned pixels: its size over
            the JPEG reduction, or the cached copy's size).

        Raises:
            Whatever decoding raises (see `read`).
        """
        if self.cached:
            pixels, size = self.cached_image(index)
            return pixels, size, np.array([pixels.shape[1], pixels.shape[0]], np.float32)
        pixels, scale, size = decode_image(self.annotations[index].image_path, reduce_to)
        return pixels, size, np.array(size, np.float32) / np.float32(scale)

    def letterboxed(self, index: int, canvas_size: tuple[int, int] | None = None):
        """-> ((h, w, 3) uint8 letterboxed image (`letterbox.letterbox_array`'s pixels), the image's (w, h)).

        `canvas_size`: (w, h) of another canvas than the input's (a mosaic
        tile). Cached images are stored resized for the input's canvas; on
        another canvas they are resized again from that copy.
        """
        canvas = self.canvas_size if canvas_size is None else canvas_size
        if self.cached:
            pixels, size = self.cached_image(index)
        else:
            pixels, _, size = decode_image(self.annotations[index].image_path)
        geometry = letterbox_geometry(size, canvas)
        if not self.cached or canvas != self.canvas_size:  # cached images are stored resized
            pixels = resize_for_letterbox(pixels, geometry)
        return paste_letterbox(pixels, geometry), size

    def read(self, function, index: int, *args):
        """`function(index, *args)`, or None when the image cannot be read (warned once per file)."""
        try:
            return function(index, *args)
        except Exception as error:  # noqa: BLE001 - one bad file must not end the run
            annotation = self.annotations[index]
            with _warned_lock:
                first = annotation.image_path not in _warned_paths
                _warned_paths.add(annotation.image_path)
            if first:
                logger.warning(
                    "cannot read image %s (%s:%s; %s: %s); using a grey image with no boxes in its place",
                    annotation.image_path,
                    annotation.source,
                    annotation.line_number,
                    type(error).__name__,
                    error,
                )
            return None

    def warm(self, workers: int | None = None) -> int:
        """Decodes every image into the cache (in `workers` threads); returns how many are cached."""
        if not self.cached:
            return 0
        with ThreadPoolExecutor(workers or os.cpu_count()) as pool:
            done = pool.map(lambda i: self.read(self.cached_image, i) is not None, range(len(self.annotations)))
            return sum(done)


# --- batches --------------------------------------------------------------------------


class HostBatch(NamedTuple):
    """One batch as the host hands it over (see the module docstring for shapes)."""

    images: np.ndarray
    boxes: np.ndarray
    hsv: np.ndarray
    weights: np.ndarray | None = None


@dataclasses.dataclass(eq=False, repr=False)  # the repr would list every annotation
class HostBatches:
    """The stream of host batches of one dataset (see the module docstring).

    `batch(k)` makes batch `k` from scratch, a pure function of the
    arguments and `k`: any worker, thread or process may make any batch.
    The steps, each callable alone: `positions(k)` -> `indices_at` ->
    `element_seeds` -> `elements` (`sample_augmentation` and `box_orders`
    for all at once, then per image: decode -> `augment.place_image` +
    `augment.augment_boxes`, or the letterbox; or a `mosaic_of_four`) ->
    multi-scale `rescale_batch`.

    Attributes: `make_dataset`'s arguments (no anchors: the host makes no
    targets); `seed` is drawn at random when None.
    """

    annotations: list[Annotation]
    input_shape: tuple[int, int]
    num_classes: int
    batch_size: int
    _: dataclasses.KW_ONLY
    training: bool
    augment: bool = True
    seed: int | None = None
    max_boxes: int = 20
    cache: str | None = None
    start_position: int = 0
    num_shards: int = 1
    shard_index: int = 0
    multi_scale: tuple[int, int] | None = None
    mosaic: float = 0.0

    def __post_init__(self):
        self._check_arguments()
        self.input_shape = (int(self.input_shape[0]), int(self.input_shape[1]))
        if self.multi_scale is not None:
            # Images are made at the largest size, then each batch shrinks to its step's size.
            low, high = check_size_range(self.multi_scale)
            self.multi_scale = (low, high)
            self.input_shape = (high, high)
        if self.seed is None:
            self.seed = int.from_bytes(os.urandom(4), "little")
            logger.debug("input pipeline: random seed %d", self.seed)
        self.num_samples = len(self.annotations)
        self.source = ImageSource(self.annotations, self.input_shape, self.cache)
        self._boxes = [np.asarray(a.boxes, np.float32).reshape(-1, 5) for a in self.annotations]
        self._shuffle_seed = stateless_random.fold_in(np.array([self.seed, 0], np.int64), 1, "int32")
        self._permutations: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def __getstate__(self):  # for worker processes: the lock and the pass orders stay behind
        state = dict(self.__dict__)
        del state["_lock"], state["_permutations"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._permutations = {}
        self._lock = threading.Lock()

    def _check_arguments(self):
        """ValueError naming the first bad argument (or annotation line)."""
        input_shape, batch_size, max_boxes = self.input_shape, self.batch_size, self.max_boxes
        num_classes = self.num_classes
        if not self.annotations:
            raise ValueError("`annotations` is empty: no image to build a dataset from")
        if len(input_shape) != 2 or any(int(s) <= 0 or int(s) % 32 for s in input_shape):
            raise ValueError(
                f"`input_shape` must be (height, width), positive multiples of 32. Received: input_shape={input_shape}"
            )
        if batch_size <= 0 or max_boxes <= 0 or num_classes <= 0:
            raise ValueError(
                f"`batch_size`, `max_boxes` and `num_classes` must be positive. "
                f"Received: batch_size={batch_size}, max_boxes={max_boxes}, num_classes={num_classes}"
            )
        if (self.multi_scale is not None or self.mosaic) and not self.training:
            raise ValueError("multi-scale and mosaic are for training datasets; validation keeps one size")
        if not 0.0 <= self.mosaic <= 1.0:
            raise ValueError(f"`mosaic` is a probability in [0, 1]. Received: mosaic={self.mosaic}")
        if self.cache is not None and not isinstance(self.cache, (str, os.PathLike)):
            raise ValueError(f"`cache` must be None, 'ram' or a directory path. Received: cache={self.cache!r}")
        if self.start_position < 0 or (self.start_position and not self.training):
            raise ValueError(
                f"`start_position` must be >= 0, and is for training streams only. "
                f"Received: start_position={self.start_position}, training={self.training}"
            )
        if not 0 <= self.shard_index < self.num_shards or batch_size % self.num_shards:
            raise ValueError(
                f"`num_shards` must divide `batch_size` and 0 <= `shard_index` < `num_shards`. Received: "
                f"batch_size={batch_size}, num_shards={self.num_shards}, shard_index={self.shard_index}"
            )
        if self.num_shards > 1 and not self.training:
            raise ValueError("`num_shards` > 1 is for training streams only (validation is sharded by Keras)")
        for annotation in self.annotations:
            classes = annotation.boxes[:, 4]
            bad = classes[(classes < 0) | (classes >= num_classes)]
            if len(bad):
                raise ValueError(
                    f"{annotation.source}:{annotation.line_number}: class id {int(bad[0])} is out of range "
                    f"for {counted(num_classes, 'classes')} (run keras_yolo_mgpu.data.check)"
                )

    # --- 1. which images ------------------------------------------------------------

    @property
    def shard_batch_size(self) -> int:
        """Elements per batch this stream yields: the global batch over `num_shards`."""
        return self.batch_size // self.num_shards

    @property
    def num_batches(self) -> int | None:
        """Batches of one validation pass; None for the endless training stream."""
        return None if self.training else steps_per_epoch(self.num_samples, self.batch_size)

    def positions(self, k: int) -> np.ndarray:
        """(shard_batch_size,) int64 stream positions of this stream's batch `k` (training).

        Shard `s` takes the positions `p >= start_position` with
        `(p % batch_size) // shard_batch_size == s`, in order, a batch at a time.
        """
        size, shard = self.shard_batch_size, self.shard_index
        group, offset = divmod(self.start_position, self.batch_size)
        # The first of this shard's positions at or after start_position, counted among its own.
        first = group * size + min(max(offset - shard * size, 0), size)
        ordinals = first + k * size + np.arange(size, dtype=np.int64)
        return (ordinals // size) * self.batch_size + shard * size + ordinals % size

    def _permutation(self, epoch: int) -> np.ndarray:
        """The order of the images in pass `epoch` (`tf.argsort` of stateless uniforms)."""
        with self._lock:
            order = self._permutations.get(epoch)
        if order is None:
            seed = stateless_random.fold_in(self._shuffle_seed, epoch)
            order = np.argsort(stateless_random.uniform_float32(seed, self.num_samples), kind="stable")
            with self._lock:
                if len(self._permutations) >= 4:  # batches in flight span at most two passes
                    self._permutations.pop(min(self._permutations))
                self._permutations[epoch] = order
        return order

    def indices_at(self, positions: Iterable[int]) -> np.ndarray:
        """The image index at each stream position: a fresh permutation per pass over the data."""
        positions = np.asarray(positions, np.int64)
        indices = np.empty_like(positions)
        for i, position in enumerate(positions):
            epoch, offset = divmod(int(position), self.num_samples)
            indices[i] = self._permutation(epoch)[offset]
        return indices

    # --- 2. elements ------------------------------------------------------------------

    def boxes_of(self, index: int) -> np.ndarray:
        """(K, 5) float32 boxes of image `index`, in image pixels."""
        return self._boxes[index]

    def augmented(self, params: dict, index: int, out: np.ndarray, order) -> tuple[np.ndarray, tuple]:
        """Image `index` augmented with `params` into `out` (h, w, 3): its (max_boxes, 5) boxes, HSV draw.

        `order`: the shuffle of its boxes (`augment.box_orders`).
        """
        canvas = out.shape[:2]
        decoded = self.source.read(self.source.decode, int(index), (int(params["nw"]), int(params["nh"])))
        if decoded is None:
            out[...] = GREY
            boxes, size, order = np.zeros((0, 5), np.float32), (1, 1), []
        else:
            pixels, size, extent = decoded
            place_image(pixels, extent, params, out)
            boxes = self.boxes_of(index)
        boxes = augment_boxes(boxes, size, params, canvas, self.max_boxes, order)
        return boxes, (params["hue"], params["sat"], params["val"])

    def letterboxed(self, index: int, out: np.ndarray) -> tuple[np.ndarray, tuple, bool]:
        """Image `index` letterboxed into `out` (h, w, 3): its (max_boxes, 5) boxes, HSV (neutral), ok."""
        canvas = out.shape[:2]
        decoded = self.source.read(self.source.letterboxed, int(index), (canvas[1], canvas[0]))
        if decoded is None:
            out[...] = GREY
            return np.zeros((self.max_boxes, 5), np.float32), NEUTRAL_HSV, False
        out[...], size = decoded
        return pad_boxes(letterbox_boxes(self.boxes_of(index), size, canvas), self.max_boxes), NEUTRAL_HSV, True

    def elements(self, seeds, indices, images: list[np.ndarray], canvas: tuple[int, int]):
        """Images `indices` augmented with the draws of `seeds` (or letterboxed) into `images`.

        Args:
            seeds: (N, 2) int64 element (or tile) seeds.
            indices: N image indices.
            images: N (h, w, 3) uint8 canvases to fill (views into the batch).
            canvas: their (h, w).

        Returns:
            (N, max_boxes, 5) float32 boxes and (N, 3) HSV draws.
        """
        boxes = np.zeros((len(indices), self.max_boxes, 5), np.float32)
        hsv = np.empty((len(indices), 3), np.float64)
        if not self.augment:
            for i, index in enumerate(indices):
                boxes[i], hsv[i], _ = self.letterboxed(index, images[i])
            return boxes, hsv
        params = sample_augmentation(seeds, canvas)  # all at once: a few numpy calls
        orders = box_orders(seeds, [len(self.boxes_of(index)) for index in indices])
        for i, index in enumerate(indices):
            element_params = {key: value[i] for key, value in params.items()}
            boxes[i], hsv[i] = self.augmented(element_params, index, images[i], orders[i])
        return boxes, hsv

    def mosaic_of_four(self, draws: MosaicDraws, out: np.ndarray, hsv: np.ndarray) -> np.ndarray:
        """The element's image and three others in a 2 x 2 grid, into `out`; fills `hsv` (4, 3): its boxes."""
        tile = tile_shape(out.shape[:2])
        views = [
            out[row * tile[0] : (row + 1) * tile[0], column * tile[1] : (column + 1) * tile[1]]
            for row, column in (divmod(position, 2) for position in range(4))
        ]
        tile_boxes, hsv[...] = self.elements(draws.tile_seeds, draws.indices, views, tile)
        return join_tile_boxes(draws, list(tile_boxes), tile, self.max_boxes)

    # --- 3. batches -------------------------------------------------------------------

    @property
    def images_shape(self) -> tuple[int, int, int, int]:
        """(B, h, w, 3): the shape every batch's images are made in (multi-scale then resizes them)."""
        rows = self.shard_batch_size if self.training else self.batch_size
        return (rows, *self.input_shape, 3)

    def batch(self, k: int, images: np.ndarray | None = None) -> HostBatch:
        """Batch `k` of the stream (training: from `start_position`; validation: of the one pass).

        `images`: None, or a uint8 array of `images_shape` to make the images
        in (a worker process's shared block: no copy into it afterwards); the
        batch's images are then that array, unless multi-scale resized them.
        """
        if images is None:
            images = np.empty(self.images_shape, np.uint8)
        return self.training_batch(k, images) if self.training else self.validation_batch(k, images)

    def training_batch(self, k: int, images: np.ndarray) -> HostBatch:
        positions = self.positions(k)
        indices = self.indices_at(positions)
        seeds = element_seeds(self.seed, positions)
        size = len(positions)
        boxes = np.zeros((size, self.max_boxes, 5), np.float32)
        hsv = np.empty((size, 4, 3), np.float64)
        mosaics = draw_mosaics(seeds, indices, self.mosaic, self.num_samples) if self.mosaic else [None] * size
        plain = [i for i in range(size) if mosaics[i] is None]
        boxes[plain], draws = self.elements(seeds[plain], indices[plain], [images[i] for i in plain], self.input_shape)
        hsv[plain] = draws[:, None, :]  # one draw for the whole image
        for i in range(size):
            if mosaics[i] is not None:
                boxes[i] = self.mosaic_of_four(mosaics[i], images[i], hsv[i])
        if self.multi_scale is not None:
            step_size = size_of_batch(self.seed, int(positions[0]) // self.batch_size, self.multi_scale)
            images, boxes = rescale_batch(images, boxes, step_size)
        return HostBatch(images, boxes, hsv.reshape(size, HSV_PARAMS))

    def validation_batch(self, k: int, images: np.ndarray) -> HostBatch:
        indices = k * self.batch_size + np.arange(self.batch_size)
        boxes = np.zeros((self.batch_size, self.max_boxes, 5), np.float32)
        weights = np.zeros(self.batch_size, np.float32)
        real_weight = np.float32(self.num_batches * self.batch_size / self.num_samples)
        for i, index in enumerate(indices):
            if index >= self.num_samples:  # padding of the last batch
                images[i] = GREY
                continue
            boxes[i], _, ok = self.letterboxed(int(index), images[i])
            weights[i] = real_weight if ok else 0.0
        hsv = np.tile(np.array(NEUTRAL_HSV, np.float64), (self.batch_size, 4))
        return HostBatch(images, boxes, hsv, weights)
