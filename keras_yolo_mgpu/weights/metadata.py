"""What a weights file is: model kind, input size, anchors, masks, class names.

Every weights file the project writes carries a :class:`ModelMetadata`, so
``yolo_video.py --model W`` needs no ``--anchors``/``--classes``/``--tiny``
(a mismatch there is keras-yolo3's most common complaint: "detects nothing",
wrong labels, shape errors).

Where it is stored:

- ``.weights.h5``: a JSON string in the HDF5 root attribute
  :data:`ATTRIBUTE`, written into the temporary file of the atomic save,
  before the rename (so the file and its metadata appear together).
- ``.keras``: a ``keras_yolo_mgpu_metadata.json`` entry in the zip archive
  (Keras ignores entries it does not know).
- Formats that hold no free text (a TFLite flatbuffer, a SavedModel folder
  read by other tools): a ``<path>.metadata.json`` sidecar, see
  :func:`sidecar_path`.

Files without metadata (keras-yolo3's, older ones of ours) read as ``None``
and keep working with explicit flags.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import zipfile
from collections.abc import Sequence

import h5py
import numpy as np

from keras_yolo_mgpu.fileio import write_text_atomic
from keras_yolo_mgpu.model.architectures import get_architecture, model_name
from keras_yolo_mgpu.resources import get_anchors, get_classes, resolve_resource
from keras_yolo_mgpu.wording import counted

logger = logging.getLogger(__name__)

#: HDF5 root attribute (and JSON entry name stem) holding the metadata.
ATTRIBUTE = "keras_yolo_mgpu_metadata"
_ARCHIVE_ENTRY = ATTRIBUTE + ".json"
FORMAT_VERSION = 1
#: Model kinds and their number of output scales. yolov4 kinds are listed
#: so files written by a v4 builder validate; the v3 builders take the first two.
MODEL_KINDS = {"yolov3": 3, "yolov3-tiny": 2, "yolov4": 3, "yolov4-tiny": 2}


class MetadataError(ValueError):
    """Metadata that is damaged, or that contradicts what the caller asked for."""


@dataclasses.dataclass(frozen=True)
class ModelMetadata:
    """What a weights file holds.

    Attributes:
        kind: one of :data:`MODEL_KINDS`.
        input_shape: ``(height, width)`` the model was trained or converted
            at, multiples of 32.
        anchors: ``((w, h), ...)`` in input pixels.
        masks: anchor indices per output scale, coarsest first.
        class_names: one name per class, in class-id order.
    """

    kind: str
    input_shape: tuple[int, int]
    anchors: tuple[tuple[float, float], ...]
    masks: tuple[tuple[int, ...], ...]
    class_names: tuple[str, ...]

    def __post_init__(self):
        # Normalise containers (lists from JSON, numpy arrays) to tuples so
        # instances compare and hash by value.
        object.__setattr__(self, "input_shape", tuple(int(v) for v in self.input_shape))
        anchors = np.asarray(self.anchors, dtype=np.float64).reshape(-1, 2)
        object.__setattr__(self, "anchors", tuple((float(w), float(h)) for w, h in anchors))
        object.__setattr__(self, "masks", tuple(tuple(int(i) for i in m) for m in self.masks))
        object.__setattr__(self, "class_names", tuple(str(c) for c in self.class_names))
        if self.kind not in MODEL_KINDS:
            raise MetadataError(f"model kind must be one of {sorted(MODEL_KINDS)}. Received: kind={self.kind!r}")
        if len(self.input_shape) != 2 or any(v <= 0 or v % 32 for v in self.input_shape):
            raise MetadataError(f"input_shape must be (height, width), multiples of 32. Received: {self.input_shape}")
        if len(self.masks) != MODEL_KINDS[self.kind]:
            raise MetadataError(
                f"{self.kind} has {MODEL_KINDS[self.kind]} output scales, so {MODEL_KINDS[self.kind]} masks. "
                f"Received: masks={self.masks_list}"
            )
        if any(not 0 <= i < len(self.anchors) for m in self.masks for i in m):
            raise MetadataError(f"masks {self.masks_list} refer to anchors outside the {len(self.anchors)} given")
        if not self.class_names:
            raise MetadataError("class_names is empty")

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def anchors_array(self) -> np.ndarray:
        """``(num_anchors, 2)`` float32 anchors."""
        return np.asarray(self.anchors, np.float32).reshape(-1, 2)

    @property
    def masks_list(self) -> list[list[int]]:
        return [list(m) for m in self.masks]

    def to_json(self) -> str:
        return json.dumps(
            {
                "format_version": FORMAT_VERSION,
                "kind": self.kind,
                "input_shape": list(self.input_shape),
                "anchors": [list(a) for a in self.anchors],
                "masks": self.masks_list,
                "class_names": list(self.class_names),
            }
        )

    @classmethod
    def from_json(cls, text: str, source: str = "<metadata>") -> ModelMetadata:
        try:
            data = json.loads(text)
            version = data.get("format_version", 1)
            if version > FORMAT_VERSION:
                raise MetadataError(
                    f"{source}: metadata format {version} is newer than this version understands ({FORMAT_VERSION})"
                )
            return cls(data["kind"], data["input_shape"], data["anchors"], data["masks"], data["class_names"])
        except MetadataError as error:
            raise MetadataError(f"{source}: {error}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise MetadataError(
                f"{source}: damaged keras_yolo_mgpu metadata ({type(error).__name__}: {error})"
            ) from None


def make_metadata(anchors, class_names: Sequence[str], input_shape, masks=None, kind: str | None = None):
    """A :class:`ModelMetadata` with the defaults filled in: keras-yolo3's masks, and the kind of the
    v3 builders' rule (``"yolov3"`` for 9 anchors, ``"yolov3-tiny"`` for 6)."""
    # The boxes' module imports Keras: importing this module (read by the commands' flags) starts no backend.
    from keras_yolo_mgpu.model.boxes import resolve_masks

    anchors = np.asarray(anchors, np.float32).reshape(-1, 2)
    kind = kind or {9: "yolov3", 6: "yolov3-tiny"}.get(len(anchors))
    if kind is None:
        raise MetadataError(f"expected 9 anchors (YOLOv3) or 6 (tiny YOLOv3); got {len(anchors)}")
    return ModelMetadata(kind, input_shape, anchors, resolve_masks(masks, len(anchors)), class_names)


# ---- Files ----------------------------------------------------------------


SIDECAR_ENDING = ".metadata.json"


def sidecar_path(path: str | os.PathLike) -> str:
    """``<path>.metadata.json``: the metadata of a file format with no room for it."""
    return str(path).rstrip("/" + os.sep) + SIDECAR_ENDING


def write_metadata(path: str | os.PathLike, metadata: ModelMetadata) -> None:
    """Stores ``metadata`` in an existing ``.weights.h5`` or ``.keras`` file.

    Call it on the temporary file of an atomic save, before the rename.
    """
    path = str(path)
    if path.endswith(".keras"):
        with zipfile.ZipFile(path, "a") as archive:
            if _ARCHIVE_ENTRY in archive.namelist():
                raise MetadataError(f"{path} already has metadata")
            archive.writestr(_ARCHIVE_ENTRY, metadata.to_json())
        return
    if not path.endswith(".h5"):
        raise MetadataError(f"metadata goes into .weights.h5 or .keras files (else a sidecar). Received: {path}")
    with h5py.File(path, "a") as handle:
        handle.attrs[ATTRIBUTE] = metadata.to_json()


def write_sidecar(path: str | os.PathLike, metadata: ModelMetadata) -> str:
    """Writes :func:`sidecar_path` of ``path`` atomically; returns its path."""
    return write_text_atomic(sidecar_path(path), metadata.to_json() + "\n")


def read_metadata(path: str | os.PathLike) -> ModelMetadata | None:
    """The metadata of a weights file, or ``None`` for a file without any.

    Looks in the file itself (``.weights.h5`` / ``.h5`` attribute, ``.keras``
    archive entry), then in its ``.metadata.json`` sidecar.

    Raises:
        MetadataError: the metadata is present but damaged.
        OSError: the file cannot be read.
    """
    path = str(path)
    text = None
    if os.path.isfile(path) and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            if _ARCHIVE_ENTRY in archive.namelist():
                text = archive.read(_ARCHIVE_ENTRY).decode("utf-8")
    elif os.path.isfile(path) and path.endswith(".h5"):
        try:
            with h5py.File(path, "r") as handle:
                value = handle.attrs.get(ATTRIBUTE)
        except OSError as error:  # h5py's message omits the path
            raise OSError(f"{path}: unreadable HDF5 weights file ({error}); was it cut short or damaged?") from None
        if value is not None:
            text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
    if text is None and os.path.isfile(sidecar_path(path)):
        with open(sidecar_path(path), encoding="utf-8") as f:
            text = f.read()
        return ModelMetadata.from_json(text, sidecar_path(path))
    return None if text is None else ModelMetadata.from_json(text, path)


# ---- Flags against the file -----------------------------------------------


def reconcile(
    metadata: ModelMetadata | None,
    source: str,
    *,
    class_names: Sequence[str] | None = None,
    anchors=None,
    masks=None,
    kind: str | None = None,
    input_shape=None,
    classes_label: str = "--classes",
    anchors_label: str = "--anchors",
) -> ModelMetadata | None:
    """Combines a file's metadata with explicitly given settings.

    Every argument left ``None`` takes the file's value. An explicit value
    that contradicts the file is an error naming both (a silent mismatch
    gives wrong labels, wrong boxes or shape errors). ``input_shape`` is the
    exception: running a model at another multiple of 32 is legitimate, so
    an explicit one replaces the file's.

    Args:
        metadata: from :func:`read_metadata`; ``None`` for a legacy file,
            which returns ``None`` (the caller falls back on its defaults).
        source: the weights path, for messages.

    Returns:
        The metadata to use, or ``None`` for a legacy file.

    Raises:
        MetadataError: an explicit value contradicts the file.
    """
    if metadata is None:
        return None

    def contradiction(label, given, stored):
        return MetadataError(
            f"{label} says {given} but {source} was saved with {stored}; drop {label} to use the file's, "
            "or pass the weights the flag belongs to"
        )

    if class_names is not None and tuple(class_names) != metadata.class_names:
        raise contradiction(
            classes_label,
            f"{counted(len(class_names), 'classes')} {_preview(class_names)}",
            f"{counted(metadata.num_classes, 'classes')} {_preview(metadata.class_names)}",
        )
    if anchors is not None:
        given = np.asarray(anchors, np.float32).reshape(-1, 2)
        if given.shape != metadata.anchors_array.shape or not np.allclose(given, metadata.anchors_array):
            raise contradiction(anchors_label, _format_anchors(given), _format_anchors(metadata.anchors_array))
    if masks is not None and [list(m) for m in masks] != metadata.masks_list:
        raise contradiction("--masks", [list(m) for m in masks], metadata.masks_list)
    if kind is not None and kind != metadata.kind:
        raise contradiction("the model kind", kind, metadata.kind)
    if input_shape is not None and tuple(int(v) for v in input_shape) != metadata.input_shape:
        logger.info(
            "Running %s at %s (it was saved at %s)", source, tuple(int(v) for v in input_shape), metadata.input_shape
        )
        metadata = dataclasses.replace(metadata, input_shape=tuple(int(v) for v in input_shape))
    return metadata


def _preview(names: Sequence[str], count: int = 3) -> str:
    names = list(names)
    return repr(names[:count])[:-1] + (", ...]" if len(names) > count else "]")


def _format_anchors(anchors: np.ndarray) -> str:
    return ", ".join(f"{w:g},{h:g}" for w, h in anchors)


def settings_for(
    weights_path: str | os.PathLike | None,
    *,
    class_names: Sequence[str] | None = None,
    classes_path: str | None = None,
    anchors=None,
    anchors_path: str | None = None,
    tiny: bool = False,
    masks=None,
    input_shape=None,
    model: str | None = None,
) -> ModelMetadata:
    """Everything needed to build and decode the model of ``weights_path``.

    With metadata in the file, its values are used and explicit arguments
    must agree (:func:`reconcile`). Without (a legacy file, or no file),
    explicit arguments or the project's defaults are used: COCO class names,
    YOLOv3's anchors (tiny YOLOv3's with ``tiny``), keras-yolo3's masks, 416.

    Args:
        weights_path: the weights file, or None.
        class_names / classes_path: class names, or a file of them (one per line).
        anchors / anchors_path: ``(N, 2)`` anchors, or an anchors file.
        tiny: the ``--tiny`` flag: tiny YOLOv3 (an error with a full
            YOLOv3 file).
        masks: anchor indices per scale.
        input_shape: ``(height, width)``; replaces the file's without error.
        model: the ``--model`` kind (``model.architectures.MODEL_NAMES``);
            an error when it contradicts the file's; without a file it picks
            the network and its default anchors.

    Raises:
        MetadataError: an explicit value contradicts the file.
    """
    if class_names is None and classes_path:
        class_names = get_classes(classes_path)
    if anchors is None and anchors_path:
        anchors = get_anchors(anchors_path)
    if anchors is not None:
        anchors = np.asarray(anchors, np.float32).reshape(-1, 2)
    stored = read_metadata(weights_path) if weights_path and os.path.exists(weights_path) else None
    if stored is not None:
        if tiny and stored.kind not in ("yolov3-tiny", "yolov4-tiny"):
            raise MetadataError(f"--tiny says yolov3-tiny but {weights_path} was saved with {stored.kind}")
        if model is not None and model != stored.kind:
            raise MetadataError(f"--model says {model} but {weights_path} was saved with {stored.kind}")
        labels = {"anchors_label": f"--anchors ({anchors_path})" if anchors_path else "anchors"}
        if classes_path:
            labels["classes_label"] = f"--classes ({classes_path})"
        return reconcile(
            stored,
            str(weights_path),
            class_names=class_names,
            anchors=anchors,
            masks=masks,
            input_shape=input_shape,
            **labels,
        )
    try:
        kind = model_name(model, tiny)
    except ValueError as error:
        raise MetadataError(str(error)) from None
    if class_names is None:
        class_names = get_classes(resolve_resource(None, "classes"))
    if anchors is None:
        anchors = get_anchors(resolve_resource(None, "anchors", tiny=tiny, model=kind))
    try:
        kind = get_architecture(kind, len(anchors)).name
    except ValueError as error:
        raise MetadataError(str(error)) from None
    return make_metadata(anchors, class_names, input_shape or (416, 416), masks, kind=kind)
