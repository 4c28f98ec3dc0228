"""A loader for every weight format this project and keras-yolo3 write.

`load_weights` loads this project's `.weights.h5` and `.keras` files and the
Keras 2 HDF5 files keras-yolo3 users have: `model_body.save_weights`, its
train.py checkpoints (the training model with the `yolo_loss` Lambda),
convert.py's full `model.save`, and files saved from a Keras 2
`multi_gpu_model`, where the template is nested as ONE layer (the "weight
file containing 1 layers into a model with N layers" error).

How files are matched to a model:

* Keras 3 files by layer name (recorded in the file; this project names
  every layer deterministically in `model/yolo3.py`), found wherever the
  template sits in the saved model (the body itself, a training model, a
  multi-device wrapper); files of models with other names but the same layers
  fall back to Keras's own positional keys (`conv2d_3`: the 4th Conv2D).
* Keras 2 files by order: keras-yolo3's layers have auto-generated names
  (`conv2d_57`) that say nothing about role, but `model/yolo3.py` builds the
  layers in keras-yolo3's order, so the file's weight-bearing layers in
  `layer_names` order correspond one to one to the model's weight-bearing
  layers in `model.layers` order. Every pair's array shapes are checked.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import zipfile
from collections import defaultdict

import h5py
import keras
import numpy as np

from keras_yolo_mgpu.keras_compat import child_layers
from keras_yolo_mgpu.weights.metadata import read_metadata
from keras_yolo_mgpu.wording import counted

logger = logging.getLogger(__name__)


class WeightsMismatchError(ValueError):
    """The file's layers do not fit the model (another network, other shapes); the message names them."""


_WEIGHTS_SUFFIX = ".weights.h5"
_OUTPUT_PREFIX = "yolo_output_"  # kept in sync with model.yolo3.OUTPUT_PREFIX
_BODY_PREFIX = "darknet_"  # model.yolo3.BODY_PREFIX: the backbone's layers
# Weight-bearing layer counts of keras-yolo3's networks, for error hints.
_KNOWN_LAYER_COUNTS = {147: "YOLOv3 (yolo_body)", 24: "tiny YOLOv3 (tiny_yolo_body)"}


@dataclasses.dataclass
class SkippedLayer:
    """A model layer `load_weights` left untouched, and why."""

    layer: str
    source: str
    reason: str


@dataclasses.dataclass
class LoadReport:
    """What `load_weights` did.

    Attributes:
        path: the file read.
        format: `"keras3-weights"` (`.weights.h5`), `"keras3-archive"`
            (`.keras`), `"keras2-weights"` (`save_weights` HDF5) or
            `"keras2-model"` (full `model.save` HDF5); `"+nested"` is appended
            when the template was a nested layer of the saved model.
        loaded: number of model layers whose weights were set.
        skipped: layers left as they were (`skip_mismatch`, `allow_new_classes`).
        metadata: the file's `weights.metadata.ModelMetadata` (model kind,
            anchors, masks, classes, input size), None for a legacy file.
    """

    path: str
    format: str
    loaded: int = 0
    skipped: list[SkippedLayer] = dataclasses.field(default_factory=list)
    metadata: object = None


@dataclasses.dataclass
class _SourceLayer:
    """One weight-bearing layer as stored in a file: its name and arrays in layer order."""

    name: str
    arrays: list[np.ndarray]

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [tuple(a.shape) for a in self.arrays]


def load_weights(
    model: keras.Model, path: str, skip_mismatch: bool = False, *, allow_new_classes: bool = False
) -> LoadReport:
    """Loads weights from any file this project or keras-yolo3 writes into `model`.

    Args:
        model: a `yolo_body` / `tiny_yolo_body`, or a model that contains
            one (the training model of `create_model`, a multi-device
            wrapper): weights go to its weight-bearing layers.
        path: a `.weights.h5` or `.keras` file of this project, or a Keras 2
            HDF5 file (`save_weights` or `model.save`, keras-yolo3's body,
            training model or `multi_gpu_model`). The format is detected
            from the content, not the extension. The file is only read.
        skip_mismatch: leave EVERY layer whose weight shapes differ from
            the file's at its current values instead of raising (a partial
            load the caller asked for). Each skip is logged as a warning.
        allow_new_classes: leave the output convolutions (`yolo_output_*`)
            at their current values when they differ from the file's in the
            output channel count only (`num_anchors * (5 + num_classes)`):
            transfer to another class count. Any other mismatch still
            raises.

    Returns:
        A `LoadReport`.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: unknown format; the file holds another network (layer
            counts differ); a layer's shapes differ (without
            `skip_mismatch`, and beyond the output channels with
            `allow_new_classes`), naming the file, the model layer, the file
            layer and both shapes, and what the file's metadata says it holds.
    """
    path = os.fspath(path)
    metadata = read_metadata(path) if os.path.isfile(path) else None
    try:
        report = _load_any_format(model, path, skip_mismatch, allow_new_classes)
    except ValueError as error:
        if metadata is None:
            raise
        raise type(error)(
            f"{error} (The file says it holds {metadata.kind} with {counted(metadata.num_classes, 'classes')}, "
            f"{len(metadata.anchors)} anchors, trained at {metadata.input_shape[0]}x{metadata.input_shape[1]}.)"
        ) from None
    report.metadata = metadata
    if metadata is not None:
        logger.info(
            "%s: %s, %d %s, masks %s (from the file's metadata)",
            path,
            metadata.kind,
            metadata.num_classes,
            "class" if metadata.num_classes == 1 else "classes",
            metadata.masks_list,
        )
    return report


def _load_any_format(model: keras.Model, path: str, skip_mismatch: bool, allow_new_classes: bool) -> LoadReport:
    """`load_weights` without the metadata: detects the format and assigns the arrays."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"weights file not found: {path}")
    policy = _MismatchPolicy(skip_all=bool(skip_mismatch), new_classes=bool(allow_new_classes))
    targets = weight_layers(model)
    if not targets:
        raise ValueError(f"model {model.name!r} has no weights to load (is it built?)")

    if zipfile.is_zipfile(path):
        return _load_keras_archive(targets, path, policy)
    if not h5py.is_hdf5(path):
        hint = ""
        if path.endswith(".weights") and not path.endswith(_WEIGHTS_SUFFIX):
            hint = " It looks like a Darknet .weights file: convert it with convert.py first."
        raise ValueError(f"{path} is neither an HDF5 weights file nor a .keras archive.{hint}")
    try:
        handle = h5py.File(path, "r")
    except OSError as error:  # h5py's message ("truncated file", "file signature not found") omits the path
        raise ValueError(f"{path}: unreadable HDF5 weights file ({error}); was it cut short or damaged?") from None
    with handle:
        if _attr_list(handle, "layer_names"):
            return _load_keras2(targets, handle, path, "keras2-weights", policy)
        if "model_weights" in handle and _attr_list(handle["model_weights"], "layer_names"):
            return _load_keras2(targets, handle["model_weights"], path, "keras2-model", policy)
        if "layers" in handle or "vars" in handle:
            return _load_keras3(targets, handle, path, "keras3-weights", policy)
        raise ValueError(
            f"{path} is an HDF5 file but not a Keras weights file "
            f"(top-level entries: {sorted(handle.keys())[:10]}, attributes: {sorted(handle.attrs.keys())[:10]})"
        )


def weight_layers(model) -> list:
    """The layers that own weights, in order, looking inside nested models.

    Models and wrapper layers that only contain other layers are descended
    into, so a training model or a multi-device wrapper yields its template's
    layers. Shared layers are listed once.
    """
    leaves, seen = [], set()

    def visit(layer):
        if id(layer) in seen:
            return
        seen.add(id(layer))
        children = child_layers(layer)
        if children:
            for child in children:
                visit(child)
        elif layer.weights:
            leaves.append(layer)

    visit(model)
    return leaves


# ---- Keras 2 HDF5 ---------------------------------------------------------


def _attr_list(group, name: str) -> list[str]:
    """A string-list attribute, also when Keras split it into `name0`, `name1`, ... chunks."""
    if name in group.attrs:
        values = group.attrs[name]
    else:
        values, chunk = [], 0
        while f"{name}{chunk}" in group.attrs:
            values.extend(group.attrs[f"{name}{chunk}"])
            chunk += 1
    if isinstance(values, (str, bytes)):  # an attribute that is one string, not a list
        values = [values]
    return [v.decode("utf8") if isinstance(v, bytes) else str(v) for v in values]


def _owner(weight_name: str) -> str:
    """`conv2d_3/kernel:0` (or `scope/conv2d_3/kernel:0`) -> `conv2d_3`."""
    parts = weight_name.split("/")
    return parts[-2] if len(parts) >= 2 else ""


def _keras2_entries(group) -> tuple[list[_SourceLayer], list[list[_SourceLayer]]]:
    """The weight-bearing layers of a Keras 2 weights group, in file order.

    A `layer_names` entry whose weights belong to other layers
    (`conv2d_1/kernel:0` under `model_1`) is a nested model, the template of
    a `multi_gpu_model`: it is expanded into its own layers.

    Returns:
        `(layers, nested_groups)`: the flattened layers, and each nested
        entry's layers.
    """
    layers, nested_groups = [], []
    for name in _attr_list(group, "layer_names"):
        layer_group = group[name]
        weight_names = _attr_list(layer_group, "weight_names")
        if not weight_names:
            continue
        owners = [_owner(w) for w in weight_names]
        if len(set(owners)) == 1 or not all(owners):
            layers.append(_SourceLayer(name, [np.asarray(layer_group[w]) for w in weight_names]))
            continue
        # A nested model lists model.trainable_weights + non_trainable_weights:
        # a layer's arrays keep their order, split across both halves.
        by_owner: dict[str, list[np.ndarray]] = defaultdict(list)
        for weight_name, owner in zip(weight_names, owners):
            by_owner[owner].append(np.asarray(layer_group[weight_name]))
        inner = [_SourceLayer(owner, arrays) for owner, arrays in by_owner.items()]
        nested_groups.append(inner)
        layers.extend(inner)
    return layers, nested_groups


def _load_keras2(targets, group, path, format_name, policy) -> LoadReport:
    sources, nested_groups = _keras2_entries(group)
    if nested_groups:
        format_name += "+nested"
    if _is_backbone(targets, sources):
        return _assign_backbone(targets, sources, path, format_name)
    if len(sources) != len(targets):
        raise WeightsMismatchError(_count_mismatch_message(path, targets, sources, bool(nested_groups)))
    if len(nested_groups) == 1 and len(nested_groups[0]) == len(sources):
        sources = _order_nested(targets, sources)
    return _assign_in_order(targets, sources, path, format_name, policy)


_AUTO_NAME = re.compile(r"^(?P<kind>.*?)(?:_(?P<n>\d+))?$")


def _order_nested(targets, sources: list[_SourceLayer]) -> list[_SourceLayer]:
    """Orders a nested template's layers like the model's.

    Keras 2 stored a nested model's weights as all trainable weights, then
    all non-trainable ones, each in layer order. With every layer trainable
    the order of first appearance is the layer order. A template saved with
    frozen layers (keras-yolo3's stage 1) lists them after the trainable
    ones; then layers are matched within groups of identical weight shapes,
    ranked by Keras 2's auto-name counters (the 12 of `conv2d_12` counts
    Conv2D layers in creation order). keras-yolo3 creates same-shaped layers
    in dependency order, so that rank is their topological order. (Creation
    order in general is not: tiny YOLOv3 creates `conv2d_8` before
    `conv2d_10`, but `conv2d_10` comes first in `model.layers`.) Custom
    names keep their order of first appearance.
    """
    target_shapes = [[tuple(w.shape) for w in layer.weights] for layer in targets]
    if [s.shapes for s in sources] == target_shapes:
        return sources
    by_shapes: dict[tuple, list[int]] = defaultdict(list)
    for index, source in enumerate(sources):
        by_shapes[tuple(source.shapes)].append(index)
    for shapes, members in by_shapes.items():
        names = [_AUTO_NAME.match(sources[i].name) for i in members]
        if len({m["kind"] for m in names}) == 1:  # auto names of one class: creation order
            by_shapes[shapes] = [i for _, i in sorted(zip((int(m["n"] or 0) for m in names), members))]
    ordered: list[_SourceLayer | None] = []
    for shapes in target_shapes:
        members = by_shapes.get(tuple(shapes))
        ordered.append(sources[members.pop(0)] if members else None)
    # Layers of the model with no same-shaped layer left in the file (the
    # output convs of another class count) get the leftover file layers in
    # file order, so the mismatch is reported against a concrete layer.
    leftovers = sorted(index for members in by_shapes.values() for index in members)
    resolved = [s if s is not None else sources[leftovers.pop(0)] for s in ordered]
    mismatches_first = sum(s.shapes != t for s, t in zip(sources, target_shapes))
    mismatches_matched = sum(s.shapes != t for s, t in zip(resolved, target_shapes))
    return resolved if mismatches_matched < mismatches_first else sources


def _is_backbone(targets, sources: list[_SourceLayer]) -> bool:
    """Whether `sources` are the model's whole backbone alone: its first layers (`darknet_*`), shape for shape.

    keras-yolo3's README starts YOLOv3 from Darknet-53 this way: `convert.py -w darknet53.cfg
    darknet53.weights model_data/darknet53_weights.h5`, loaded by name, the head left at its init.
    """
    count = len(sources)
    if not 0 < count < len(targets) or targets[count].name.startswith(_BODY_PREFIX):
        return False
    backbone = targets[:count]
    return all(t.name.startswith(_BODY_PREFIX) for t in backbone) and all(
        source.shapes == [tuple(w.shape) for w in layer.weights] for source, layer in zip(sources, backbone)
    )


def _assign_backbone(targets, sources, path, format_name) -> LoadReport:
    """Loads a backbone file (`_is_backbone`) into the model's first layers; the head keeps its values."""
    count = len(sources)
    report = _assign_in_order(targets[:count], sources, path, format_name, _MismatchPolicy())
    head = targets[count:]
    report.skipped.extend(
        SkippedLayer(layer.name, "", "not in the file: it holds the backbone alone") for layer in head
    )
    logger.info(
        "%s holds the backbone alone (%d of the model's %d layers with weights, as keras-yolo3's "
        "darknet53_weights.h5): the other %d (the head) keep their initial values",
        path,
        count,
        len(targets),
        len(head),
    )
    return report


def _count_mismatch_message(path, targets, sources, nested) -> str:
    def describe(count):
        return f" = {_KNOWN_LAYER_COUNTS[count]}" if count in _KNOWN_LAYER_COUNTS else ""

    where = " (inside its nested model)" if nested else ""
    return (
        f"Cannot load {path}: the file has {len(sources)} layers with weights{describe(len(sources))}{where}, "
        f"the model has {len(targets)}{describe(len(targets))}. The file holds another network "
        f"(YOLOv3 vs tiny YOLOv3, or not a YOLO model at all). "
        f"First file layers: {[s.name for s in sources[:3]]}; first model layers: {[t.name for t in targets[:3]]}."
    )


# ---- Keras 3 --------------------------------------------------------------


def _snake_case(name: str) -> str:
    """Keras's `naming.to_snake_case`: `BatchNormalization` -> `batch_normalization`."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def _keras3_layer_groups(handle) -> dict[str, dict[str, h5py.Group]]:
    """Every `<root>/layers/<key>/vars` group holding arrays, as {root: {key: vars}}.

    Keras 3 keys a model's layers by class and position (`conv2d`,
    `conv2d_1`, ...: the n-th Conv2D of that model's `layers`), and records
    the layer's own name in the `vars` group's `name` attribute.
    """
    found: dict[str, dict[str, h5py.Group]] = defaultdict(dict)

    def visit(name, obj):
        parts = name.split("/")
        if (
            isinstance(obj, h5py.Group)
            and len(parts) >= 3
            and parts[-1] == "vars"
            and parts[-3] == "layers"
            and len(obj.keys())
        ):
            found["/".join(parts[:-3])][parts[-2]] = obj

    handle.visititems(visit)
    return found


def _positional_keys(targets) -> list[str]:
    """The keys Keras 3 gives `targets` when they are one model's layers, in order."""
    counts: dict[str, int] = defaultdict(int)
    keys = []
    for layer in targets:
        base = _snake_case(layer.__class__.__name__)
        keys.append(base if counts[base] == 0 else f"{base}_{counts[base]}")
        counts[base] += 1
    return keys


def _load_keras3(targets, handle, path, format_name, policy) -> LoadReport:
    roots = _keras3_layer_groups(handle)
    if not roots:
        raise ValueError(f"{path}: a Keras 3 weights file without layer weights")
    names = [t.name for t in targets]
    positional = _positional_keys(targets)
    by_name = {
        root: {str(group.attrs["name"]): group for group in groups.values() if "name" in group.attrs}
        for root, groups in roots.items()
    }

    def coverage(root):
        # The sub-tree that holds the model's layers (module docstring), by
        # name, else by positional key; the shallowest on a tie.
        named = sum(n in by_name[root] for n in names)
        placed = sum(k in roots[root] for k in positional)
        return (named == len(names), placed == len(names), named, -root.count("/") - (root != ""))

    root = max(roots, key=coverage)
    if root:
        format_name += "+nested"
    if all(n in by_name[root] for n in names):
        groups, how = [by_name[root][n] for n in names], "by name"
    elif all(k in roots[root] for k in positional):
        groups, how = [roots[root][k] for k in positional], "by position"
    else:
        # A backbone file (`_is_backbone`) holds the keys of the model's first layers alone.
        first = [roots[root][k] for k in positional[: len(roots[root])] if k in roots[root]]
        backbone = [_keras3_source(group) for group in first]
        if len(first) == len(roots[root]) and _is_backbone(targets, backbone):
            return _assign_backbone(targets, backbone, path, format_name)
        missing = [n for n in names if n not in by_name[root]]
        raise ValueError(
            f"Cannot load {path}: {len(missing)} of the model's {len(names)} layers with weights are not in it "
            f"(missing e.g. {missing[:3]}; the file has e.g. {sorted(by_name[root])[:3]}), nor layers of the "
            f"same classes in the same order. It was saved from another network."
        )
    logger.debug("%s: Keras 3 layers under %r matched %s", path, root or "/", how)
    sources = [_keras3_source(group) for group in groups]
    return _assign_in_order(targets, sources, path, format_name, policy)


def _keras3_source(group) -> _SourceLayer:
    """A Keras 3 file's `vars` group as a `_SourceLayer` (its layer's recorded name, its arrays in order)."""
    name = str(group.attrs.get("name", group.name.rsplit("/", 2)[-2]))
    return _SourceLayer(name, [np.asarray(group[str(i)]) for i in range(len(group))])


def _load_keras_archive(targets, path, policy) -> LoadReport:
    with zipfile.ZipFile(path) as archive:
        if "model.weights.h5" not in archive.namelist():
            raise ValueError(f"{path} is a zip file but not a .keras archive with HDF5 weights")
        with archive.open("model.weights.h5") as weights, h5py.File(weights, "r") as handle:
            try:
                return _load_keras3(targets, handle, path, "keras3-archive", policy)
            except ValueError as error:
                if "saved from another network" not in str(error):
                    raise
    # Other layer names: rebuild the saved model with Keras's own loader and
    # copy its weight-bearing layers in order (the archive has the config).
    try:
        saved = keras.saving.load_model(path, compile=False)
    except ValueError as error:
        if "safe_mode" not in str(error):
            raise
        raise ValueError(
            f"Cannot load {path}: its layer names are not this project's, and rebuilding it to read its weights "
            f"needs code from the file, which Keras's safe mode refuses ({error}). If you trust the file, save "
            "its weights with model.save_weights('model.weights.h5') and pass that file instead."
        ) from None
    sources = [_SourceLayer(layer.name, [np.asarray(w) for w in layer.get_weights()]) for layer in weight_layers(saved)]
    if _is_backbone(targets, sources):
        return _assign_backbone(targets, sources, path, "keras3-archive")
    if len(sources) != len(targets):
        raise WeightsMismatchError(_count_mismatch_message(path, targets, sources, nested=False))
    return _assign_in_order(targets, sources, path, "keras3-archive", policy)


# ---- Shared ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _MismatchPolicy:
    """Which shape mismatches `load_weights` may skip instead of raising."""

    skip_all: bool = False
    new_classes: bool = False

    def allows(self, layer, source, expected) -> bool:
        return self.skip_all or (self.new_classes and _differs_in_output_channels_only(layer, source, expected))


def _differs_in_output_channels_only(layer, source, expected) -> bool:
    """An output conv of another class count: same arrays but for the last (channel) axis."""
    if not layer.name.startswith(_OUTPUT_PREFIX) or len(source.shapes) != len(expected):
        return False
    return all(len(a) == len(b) and a[:-1] == b[:-1] for a, b in zip(source.shapes, expected))


def _assign_in_order(targets, sources, path, format_name, policy) -> LoadReport:
    """Sets `targets[i]` from `sources[i]`, after checking every pair's shapes."""
    report = LoadReport(path=path, format=format_name)
    plan, mismatches = [], []
    for layer, source in zip(targets, sources):
        expected = [tuple(w.shape) for w in layer.weights]
        if source.shapes == expected:
            plan.append((layer, source))
        else:
            mismatches.append((layer, source, expected))
    refused = [m for m in mismatches if not policy.allows(*m)]
    if refused:
        raise WeightsMismatchError(_shape_mismatch_message(path, refused, policy))
    for layer, source, expected in mismatches:
        reason = f"file shapes {source.shapes} != model shapes {expected}"
        report.skipped.append(SkippedLayer(layer.name, source.name, reason))
        # Expected for the output convs when the class count changes; any
        # other skipped layer deserves a warning.
        new_classes = _differs_in_output_channels_only(layer, source, expected)
        log = logger.info if new_classes else logger.warning
        log("load_weights(%s): skipping layer %r (file layer %r): %s", path, layer.name, source.name, reason)
    if not plan:
        raise WeightsMismatchError(f"Cannot load {path}: no layer of the model matches the file's shapes")
    # Nothing is assigned before every layer was checked, so a failed load
    # leaves the model as it was.
    for layer, source in plan:
        layer.set_weights(source.arrays)
    report.loaded = len(plan)
    logger.info(
        "Loaded %d layers from %s (%s)%s",
        report.loaded,
        path,
        format_name,
        f", skipped {len(report.skipped)}" if report.skipped else "",
    )
    return report


def _shape_mismatch_message(path, mismatches, policy) -> str:
    lines = [
        f"model layer {layer.name!r} has weight shapes {expected}, "
        f"but the file's layer {source.name!r} has {source.shapes}"
        for layer, source, expected in mismatches[:5]
    ]
    if len(mismatches) > 5:
        lines.append(f"... and {len(mismatches) - 5} more")
    message = f"Cannot load {path}: {len(mismatches)} layer(s) do not match: " + "; ".join(lines) + "."
    if all(_differs_in_output_channels_only(*m) for m in mismatches):
        layer, source, expected = mismatches[0]
        message += (
            " The output convolutions have num_anchors * (5 + num_classes) channels: the file was trained "
            f"for another class or anchor count ({source.shapes[0][-1]} channels, the model has "
            f"{expected[0][-1]}). Pass allow_new_classes=True to load everything else and keep the model's "
            "own output convolutions (transfer to a new class count)."
        )
    elif policy.new_classes:
        message += (
            " Only the output convolutions may differ (in their channel count, for another class count); "
            "these layers differ elsewhere, so the file holds another network (e.g. YOLOv3 weights for a "
            "tiny YOLOv3 model) or another input layout."
        )
    return message
