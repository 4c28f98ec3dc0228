"""Darknet ``.cfg`` / ``.weights`` files: parse, read, write, build a Keras 3 model.

This module holds everything that knows Darknet's file formats; the
``convert`` module puts it together into the ``convert.py`` command.

Darknet conventions this module follows (and the tests check against a
literal numpy re-implementation of Darknet's layers):

- ``.weights`` layout: int32 ``major, minor, revision``, then ``seen`` as
  int64 when ``major * 10 + minor >= 2`` (int32 before), then for each
  ``[convolutional]`` section in cfg order: BN ``beta, gamma, mean,
  variance`` (or a ``bias`` without BN), then the kernel in
  ``(out, in, h, w)`` order, all float32 little-endian.
- Layer indices are Darknet's: the ``[net]`` section has none, the first
  layer after it is layer 0. ``[route]`` / ``[shortcut]`` negative indices
  are relative to the current layer, non-negative ones absolute.
- Stride-2 convs: Darknet pads ``size // 2`` on every side, keras-yolo3 (and
  our ``yolo_body``) top-left only; for inputs divisible by the stride the
  bottom/right padding is never read, and the builder pads only what is read
  (:func:`_stride_padding`), which for 3x3/2 is exactly keras-yolo3's.
- Batch norm: Darknet's two forks and Keras divide by different denominators
  (:data:`_DARKNET_BN_DENOMINATORS`, Keras's ``epsilon`` 1e-3);
  :func:`keras_bn_weights` rewrites the four BN arrays so that Keras's formula
  gives Darknet's numbers; ``darknet_bn="keras-yolo3"`` keeps the raw arrays
  (keras-yolo3's own conversion, 0.5-0.9 % off Darknet on the official tiny
  weights).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Sequence

import numpy as np

logger = logging.getLogger(__name__)

#: Keras ``BatchNormalization`` epsilon; the Keras default, as in keras-yolo3
#: and ``model.yolo_body``.
BN_EPSILON = 1e-3
#: Slope of Darknet's ``leaky`` activation.
LEAKY_SLOPE = 0.1

#: Batch-norm conventions :func:`keras_bn_weights` knows: Darknet's two
#: inference formulas, and keras-yolo3's conversion (raw arrays, Keras's
#: ``sqrt(var + 1e-3)``). A ``.weights`` file does not say which Darknet
#: trained it (both forks write the same header), hence a choice.
DARKNET_BN_CONVENTIONS = ("pjreddie", "alexeyab", "keras-yolo3")
#: The default: the original Darknet that trained the official YOLOv3 weights.
DEFAULT_DARKNET_BN = "pjreddie"

_SUPPORTED_ACTIVATIONS = ("leaky", "linear", "relu", "logistic", "mish")


class DarknetError(ValueError):
    """A cfg or weights file that cannot be converted (the message names the layer)."""


# ---- cfg parsing ----------------------------------------------------------


@dataclasses.dataclass
class CfgSection:
    """One ``[section]`` of a Darknet cfg.

    Attributes:
        kind: section name without brackets, e.g. ``"convolutional"``.
        options: ``key -> value`` strings, whitespace removed as Darknet does.
        line: 1-based line number of the ``[section]`` header.
        index: Darknet layer index (``-1`` for ``[net]``).
    """

    kind: str
    options: dict
    line: int
    index: int

    def describe(self) -> str:
        if self.index < 0:
            return f"[{self.kind}] (line {self.line})"
        return f"layer {self.index} [{self.kind}] (line {self.line})"

    def get_int(self, key: str, default: int | None = None) -> int:
        return self._get(key, default, int)

    def get_float(self, key: str, default: float | None = None) -> float:
        return self._get(key, default, float)

    def get_str(self, key: str, default: str | None = None) -> str:
        return self._get(key, default, str)

    def get_ints(self, key: str) -> list[int]:
        return self._get(key, None, lambda v: [int(x) for x in v.split(",") if x != ""])

    def _get(self, key, default, convert):
        if key not in self.options:
            if default is None:
                raise DarknetError(f"{self.describe()}: missing required option '{key}'")
            return default
        value = self.options[key]
        try:
            return convert(value)
        except ValueError:
            raise DarknetError(f"{self.describe()}: bad value {key}={value!r}") from None


def parse_cfg(path: str | os.PathLike) -> list[CfgSection]:
    """Parses a Darknet cfg file into its sections, in file order.

    Like Darknet: ``#`` and ``;`` start comment lines, all whitespace inside
    a line is dropped (``anchors = 10,13,  16,30`` reads as
    ``10,13,16,30``), and the first occurrence of a repeated key wins.
    """
    source = str(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    sections: list[CfgSection] = []
    index = 0
    for line_number, raw in enumerate(text.splitlines(), start=1):
        line = re.sub(r"\s+", "", raw)
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise DarknetError(f"{source}:{line_number}: malformed section header {raw.strip()!r}")
            kind = line[1:-1].lower()
            is_net = kind in ("net", "network")
            if is_net and sections:
                raise DarknetError(f"{source}:{line_number}: [{kind}] must be the first section")
            sections.append(CfgSection(kind, {}, line_number, -1 if is_net else index))
            if not is_net:
                index += 1
            continue
        if not sections:
            raise DarknetError(f"{source}:{line_number}: option outside any section: {raw.strip()!r}")
        if "=" not in line:
            raise DarknetError(f"{source}:{line_number}: expected key=value, got {raw.strip()!r}")
        key, value = line.split("=", 1)
        sections[-1].options.setdefault(key, value)
    if not sections:
        raise DarknetError(f"{source}: no sections found")
    return sections


def net_section(sections: Sequence[CfgSection]) -> CfgSection:
    """The ``[net]`` section; an empty one (every option at its default) when the cfg has none."""
    return sections[0] if sections and sections[0].index < 0 else CfgSection("net", {}, 0, -1)


def layer_sections(sections: Sequence[CfgSection]) -> list[CfgSection]:
    """The sections that are Darknet layers (everything but ``[net]``)."""
    return [s for s in sections if s.index >= 0]


def _resolve(section: CfgSection, offset: int) -> int:
    """Darknet layer index referenced by a route/shortcut entry."""
    target = section.index + offset if offset < 0 else offset
    if not 0 <= target < section.index:
        raise DarknetError(
            f"{section.describe()}: refers to layer {offset}, i.e. layer {target}, which is not an earlier layer"
        )
    return target


# ---- Per-layer geometry (no Keras needed) ---------------------------------


@dataclasses.dataclass
class ConvSpec:
    """Shape information of one ``[convolutional]`` layer.

    ``pad`` is Darknet's symmetric padding (``size // 2`` when ``pad=1``).
    """

    section: CfgSection
    filters: int
    in_channels: int
    size: int
    stride: int
    pad: int
    batch_normalize: bool
    activation: str

    @property
    def kernel_shape(self) -> tuple[int, int, int, int]:
        """Darknet kernel layout ``(out, in, h, w)``."""
        return (self.filters, self.in_channels, self.size, self.size)

    @property
    def num_floats(self) -> int:
        per_filter = 4 if self.batch_normalize else 1
        return self.filters * per_filter + int(np.prod(self.kernel_shape))


@dataclasses.dataclass
class YoloSpec:
    """One ``[yolo]`` section: anchors used at this scale and class count."""

    section: CfgSection
    mask: list[int]
    anchors: list[tuple[int, int]]
    classes: int
    scale_x_y: float = 1.0


def conv_spec(section: CfgSection, in_channels: int) -> ConvSpec:
    """Reads and validates one ``[convolutional]`` section."""
    size = section.get_int("size", 1)
    stride = section.get_int("stride", 1)
    pad = size // 2 if section.get_int("pad", 0) else section.get_int("padding", 0)
    activation = section.get_str("activation", "logistic")
    for key, default in (("groups", 1), ("dilation", 1), ("stride_x", stride), ("stride_y", stride)):
        if section.get_int(key, default) != default:
            raise DarknetError(f"{section.describe()}: '{key}' is not supported")
    if section.get_int("binary", 0) or section.get_int("xnor", 0):
        raise DarknetError(f"{section.describe()}: binary/xnor convolutions are not supported")
    if activation not in _SUPPORTED_ACTIVATIONS:
        raise DarknetError(
            f"{section.describe()}: activation '{activation}' is not supported "
            f"(supported: {', '.join(_SUPPORTED_ACTIVATIONS)})"
        )
    return ConvSpec(
        section=section,
        filters=section.get_int("filters", 1),
        in_channels=in_channels,
        size=size,
        stride=stride,
        pad=pad,
        batch_normalize=bool(section.get_int("batch_normalize", 0)),
        activation=activation,
    )


def yolo_spec(section: CfgSection) -> YoloSpec:
    """Reads one ``[yolo]`` section (``mask`` defaults to all anchors, as in Darknet)."""
    values = section.get_ints("anchors") if "anchors" in section.options else []
    if len(values) % 2:
        raise DarknetError(f"{section.describe()}: odd number of anchor values")
    anchors = [(values[i], values[i + 1]) for i in range(0, len(values), 2)]
    mask = section.get_ints("mask") if "mask" in section.options else list(range(len(anchors)))
    for m in mask:
        if not 0 <= m < len(anchors):
            raise DarknetError(f"{section.describe()}: mask index {m} outside the {len(anchors)} anchors")
    return YoloSpec(section, mask, anchors, section.get_int("classes", 20), section.get_float("scale_x_y", 1.0))


def route_groups(section: CfgSection) -> tuple[int, int]:
    """``(groups, group_id)`` of a ``[route]``: each input contributes channel slice ``group_id`` of ``groups``."""
    groups = section.get_int("groups", 1)
    group_id = section.get_int("group_id", 0)
    if groups < 1 or not 0 <= group_id < groups:
        raise DarknetError(
            f"{section.describe()}: need 0 <= group_id < groups, got groups={groups} group_id={group_id}"
        )
    return groups, group_id


def _maxpool_geometry(section: CfgSection) -> tuple[int, int]:
    size = section.get_int("size", section.get_int("stride", 1))
    stride = section.get_int("stride", 1)
    padding = section.get_int("padding", size - 1)
    # Keras 'same' max pooling puts (k - s) // 2 rows before the data for
    # inputs divisible by the stride; Darknet puts padding // 2. Accept only
    # the combinations where the two agree (covers yolov3-tiny and SPP).
    if padding != size - 1 or (size - 1) // 2 != max(size - stride, 0) // 2:
        raise DarknetError(
            f"{section.describe()}: maxpool size={size} stride={stride} padding={padding} has no exact Keras equivalent"
        )
    return size, stride


def infer_layers(sections: Sequence[CfgSection]) -> tuple[list[ConvSpec], list[YoloSpec]]:
    """Walks the cfg tracking channel counts; returns conv and yolo specs.

    Needs no Keras and no weights; used to size ``.weights`` files and to
    validate a cfg before building anything.

    Raises:
        DarknetError: unsupported section, bad reference or bad option,
            naming the offending layer.
    """
    out_channels: list[int | None] = []  # per Darknet layer; None after [yolo]
    convs: list[ConvSpec] = []
    yolos: list[YoloSpec] = []
    prev = net_section(sections).get_int("channels", 3)
    for section in layer_sections(sections):
        kind = section.kind
        if kind != "route" and prev is None:
            raise DarknetError(f"{section.describe()}: follows a [yolo] layer, whose output cannot be used")
        if kind == "convolutional":
            spec = conv_spec(section, prev)
            convs.append(spec)
            prev = spec.filters
        elif kind == "route":
            refs = [_resolve(section, i) for i in section.get_ints("layers")]
            if not refs:
                raise DarknetError(f"{section.describe()}: empty 'layers'")
            groups, _ = route_groups(section)
            if any(out_channels[r] is None for r in refs):
                raise DarknetError(f"{section.describe()}: cannot route from a [yolo] layer")
            if any(out_channels[r] % groups for r in refs):
                raise DarknetError(
                    f"{section.describe()}: input channels {[out_channels[r] for r in refs]} "
                    f"do not split into {groups} groups"
                )
            prev = sum(out_channels[r] // groups for r in refs)
        elif kind == "shortcut":
            ref = _resolve(section, section.get_int("from"))
            if section.get_str("activation", "linear") != "linear":
                raise DarknetError(f"{section.describe()}: only activation=linear is supported")
            if out_channels[ref] != prev:
                raise DarknetError(
                    f"{section.describe()}: adds {out_channels[ref]} channels to {prev}; "
                    "only equal channel counts are supported"
                )
        elif kind == "maxpool":
            _maxpool_geometry(section)
        elif kind == "upsample":
            if section.get_float("scale", 1.0) != 1.0 or section.get_int("stride", 2) < 1:
                raise DarknetError(f"{section.describe()}: only scale=1 and a positive stride are supported")
        elif kind == "yolo":
            yolos.append(yolo_spec(section))
            prev = None
        elif kind in ("avgpool", "softmax", "cost"):
            if kind == "softmax" and section.get_int("groups", 1) != 1:
                raise DarknetError(f"{section.describe()}: softmax groups are not supported")
        else:
            raise DarknetError(f"{section.describe()}: section type [{kind}] is not supported")
        out_channels.append(prev)
    return convs, yolos


def alexeyab_only_features(sections: Sequence[CfgSection]) -> list[str]:
    """Features of the cfg that only AlexeyAB/darknet runs (so it trained the weights).

    Returns:
        Sorted feature names among ``"mish"``, ``"grouped route"`` and
        ``"scale_x_y"``; empty for a cfg the original Darknet runs.
    """
    found = set()
    for section in layer_sections(sections):
        if section.kind == "convolutional" and section.options.get("activation") == "mish":
            found.add("mish")
        elif section.kind == "route" and section.get_int("groups", 1) > 1:
            found.add("grouped route")
        elif section.kind == "yolo" and section.get_float("scale_x_y", 1.0) != 1.0:
            found.add("scale_x_y")
    return sorted(found)


# ---- Batch normalisation: Darknet's formula expressed in Keras's ----------


#: What Darknet divides ``x - mean`` by at inference, from the float64 rolling variance.
_DARKNET_BN_DENOMINATORS = {
    "pjreddie": lambda variance: np.sqrt(variance) + 1e-6,  # pjreddie/darknet's normalize_cpu
    "alexeyab": lambda variance: np.sqrt(variance + 1e-5),  # AlexeyAB/darknet, and pjreddie's CUDA kernel
}


def keras_bn_weights(
    gamma: np.ndarray,
    beta: np.ndarray,
    mean: np.ndarray,
    variance: np.ndarray,
    convention: str = DEFAULT_DARKNET_BN,
    epsilon: float = BN_EPSILON,
) -> list[np.ndarray]:
    """Keras ``BatchNormalization`` weights that compute Darknet's batch norm.

    Keras computes ``(x - mean') / sqrt(var' + epsilon) * gamma' + beta'``;
    Darknet ``(x - mean) / d * gamma + beta`` with ``d`` its convention's
    (:data:`_DARKNET_BN_DENOMINATORS`). Per channel:

    - ``d**2 >= epsilon`` (every channel of a trained network but dead or
      near-constant ones): ``var' = d**2 - epsilon``, the other three arrays
      unchanged, so ``sqrt(var' + epsilon) == d``.
    - ``d**2 < epsilon`` (variance below ~1e-3): ``var' - epsilon`` would be
      negative, and ``var' + epsilon`` would lose ``d`` to float32
      cancellation (``d = 1e-6`` for a zero variance). There ``var' = 0`` and
      ``gamma' = gamma * sqrt(epsilon) / d``: the same product, with no
      subtraction anywhere.

    Both branches meet at ``d**2 == epsilon`` and keep the variance
    non-negative, so Keras training can start from the result. Only float32
    rounding of the stored values separates the two forward passes.

    Args:
        gamma, beta, mean, variance: ``(channels,)`` arrays in Darknet's
            meaning (``gamma`` = Darknet's ``scales``, ``beta`` = ``biases``).
        convention: one of :data:`DARKNET_BN_CONVENTIONS`; ``"keras-yolo3"``
            returns the arrays unchanged.
        epsilon: the Keras layer's epsilon.

    Returns:
        ``[gamma', beta', mean', var']`` float32, in ``BatchNormalization``'s
        ``set_weights`` order.
    """
    if convention == "keras-yolo3":
        if epsilon != BN_EPSILON:
            raise ValueError(f"keras-yolo3's conversion uses epsilon {BN_EPSILON}. Received: epsilon={epsilon}")
        return [np.asarray(a, np.float32) for a in (gamma, beta, mean, variance)]
    if convention not in _DARKNET_BN_DENOMINATORS:
        raise ValueError(f"`convention` must be one of {DARKNET_BN_CONVENTIONS}. Received: convention={convention!r}")
    d = _DARKNET_BN_DENOMINATORS[convention](np.asarray(variance, np.float64))
    d2 = d * d
    wide = d2 >= epsilon
    folded_variance = np.where(wide, d2 - epsilon, 0.0)
    folded_gamma = np.where(wide, np.asarray(gamma, np.float64), np.asarray(gamma, np.float64) * np.sqrt(epsilon) / d)
    return [
        folded_gamma.astype(np.float32),
        np.asarray(beta, np.float32),
        np.asarray(mean, np.float32),
        folded_variance.astype(np.float32),
    ]


# ---- .weights files -------------------------------------------------------


@dataclasses.dataclass
class DarknetHeader:
    major: int = 0
    minor: int = 2
    revision: int = 0
    seen: int = 0

    @property
    def seen_is_int64(self) -> bool:
        return self.major * 10 + self.minor >= 2


@dataclasses.dataclass
class ConvWeights:
    """Weights of one conv in Darknet layout; BN arrays are ``None`` without BN."""

    kernel: np.ndarray  # (out, in, h, w)
    bias: np.ndarray | None = None
    beta: np.ndarray | None = None
    gamma: np.ndarray | None = None
    mean: np.ndarray | None = None
    variance: np.ndarray | None = None


def read_weights(path: str | os.PathLike, convs: Sequence[ConvSpec]) -> tuple[DarknetHeader, list[ConvWeights]]:
    """Reads a ``.weights`` file for the given conv layers.

    Args:
        path: the ``.weights`` file.
        convs: conv specs from :func:`infer_layers`, in cfg order.

    Returns:
        The header and one :class:`ConvWeights` per conv.

    Raises:
        DarknetError: when the file is too short for the cfg (naming the
            layer where it ran out) or has floats left over after the last
            conv (the cfg and weights do not belong together).
    """
    source = str(path)
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 12:
        raise DarknetError(f"{source}: too short for a Darknet weights header ({len(raw)} bytes)")
    header = DarknetHeader(*(int(v) for v in np.frombuffer(raw, "<i4", 3)))
    seen = np.dtype("<i8" if header.seen_is_int64 else "<i4")
    start = 12 + seen.itemsize
    if len(raw) < start:
        raise DarknetError(f"{source}: file ends inside the header")
    header.seen = int(np.frombuffer(raw, seen, 1, 12)[0])
    if (len(raw) - start) % 4:
        raise DarknetError(f"{source}: {len(raw) - start} bytes after the header is not a whole number of float32")
    values = np.frombuffer(raw, "<f4", offset=start)
    total = sum(c.num_floats for c in convs)
    offset = 0

    def take(n: int, shape=None) -> np.ndarray:
        nonlocal offset
        out = values[offset : offset + n].astype(np.float32)
        offset += n
        return out if shape is None else out.reshape(shape)

    weights = []
    for spec in convs:
        if offset + spec.num_floats > values.size:
            raise DarknetError(
                f"{source}: file ends in {spec.section.describe()}: it needs {spec.num_floats} floats "
                f"but only {values.size - offset} are left ({values.size} in the file, "
                f"{total} needed by the cfg); the weights do not match this cfg"
            )
        names = ("beta", "gamma", "mean", "variance") if spec.batch_normalize else ("bias",)
        arrays = {name: take(spec.filters) for name in names}  # in file order, before the kernel
        weights.append(ConvWeights(take(int(np.prod(spec.kernel_shape)), spec.kernel_shape), **arrays))
    if offset != values.size:
        raise DarknetError(
            f"{source}: {values.size - offset} floats left over after the last conv "
            f"(the cfg uses {offset} of {values.size}); the weights do not match this cfg"
        )
    logger.info("Read %d of %d floats from %s (header %s)", offset, values.size, source, header)
    return header, weights


# ---- Keras model ----------------------------------------------------------


def _stride_padding(size: int, stride: int, pad: int) -> tuple[int, int]:
    """(before, after) zero padding that reproduces Darknet's symmetric
    ``pad`` for inputs divisible by ``stride`` with the least padding after.

    3x3 stride 2 gives (1, 0): keras-yolo3's top-left padding.
    """
    return pad, max(0, pad - (2 * pad - size) % stride)


def build_model(
    sections: Sequence[CfgSection],
    weights: Sequence[ConvWeights] | None = None,
    *,
    weight_decay: float | None = None,
    darknet_bn: str = DEFAULT_DARKNET_BN,
    name: str = "darknet",
):
    """Builds the Keras 3 functional model described by a parsed cfg.

    Layers are named after Darknet layer indices (``conv_12``, ``bn_12``,
    ``leaky_12``, ``pad_12``, ``route_13``, ``shortcut_14``, ...), so a
    Keras layer can be traced back to the cfg.

    Args:
        sections: output of :func:`parse_cfg`.
        weights: one :class:`ConvWeights` per conv (from :func:`read_weights`);
            ``None`` keeps Keras's initial values.
        weight_decay: L2 factor for conv kernels; default the ``decay`` of
            ``[net]`` (``5e-4`` when absent), as keras-yolo3 did.
        darknet_bn: whose batch-norm formula the Keras layers reproduce, one
            of :data:`DARKNET_BN_CONVENTIONS` (see :func:`keras_bn_weights`).
        name: model name.

    Returns:
        A ``keras.Model`` with input ``(batch, height, width, channels)``
        (any height/width divisible by the network's total stride). Its
        outputs are the inputs of the ``[yolo]`` sections (the raw head
        convs, like ``yolo_body``), or the last layer when there are none.
    """
    # Keras when the network is built: importing this module (the convert command's) starts no backend.
    import keras

    from keras_yolo_mgpu.model.yolo4 import ChannelGroup, Mish

    if darknet_bn not in DARKNET_BN_CONVENTIONS:
        raise ValueError(f"`darknet_bn` must be one of {DARKNET_BN_CONVENTIONS}. Received: darknet_bn={darknet_bn!r}")
    convs, _ = infer_layers(sections)
    if weights is not None and len(weights) != len(convs):
        raise DarknetError(f"{len(weights)} conv weights given for {len(convs)} conv layers")
    net = net_section(sections)
    if weight_decay is None:
        weight_decay = net.get_float("decay", 5e-4)
    L = keras.layers

    inputs = keras.Input(shape=(None, None, net.get_int("channels", 3)), name="image")
    x = inputs
    outputs_by_layer: list = []
    yolo_outputs = []
    conv_iter = iter(range(len(convs)))
    for section in layer_sections(sections):
        i = section.index
        kind = section.kind
        if kind == "convolutional":
            k = next(conv_iter)
            spec = convs[k]
            if spec.stride == 1 and spec.size % 2 == 1 and spec.pad == spec.size // 2:
                padding = "same"
            else:
                before, after = _stride_padding(spec.size, spec.stride, spec.pad)
                if before or after:
                    # Darknet pads every side; for stride 2 the bottom/right
                    # rows are never read, so pad only what is used
                    # (keras-yolo3's "left and top padding").
                    x = L.ZeroPadding2D(((before, after), (before, after)), name=f"pad_{i}")(x)
                padding = "valid"
            conv = L.Conv2D(
                spec.filters,
                spec.size,
                strides=spec.stride,
                padding=padding,
                use_bias=not spec.batch_normalize,
                kernel_regularizer=keras.regularizers.L2(weight_decay) if weight_decay else None,
                name=f"conv_{i}",
            )
            x = conv(x)
            if weights is not None:
                kernel = np.transpose(weights[k].kernel, (2, 3, 1, 0))  # Keras's (h, w, in, out)
                conv.set_weights([kernel] if weights[k].bias is None else [kernel, weights[k].bias])
            if spec.batch_normalize:
                bn = L.BatchNormalization(epsilon=BN_EPSILON, name=f"bn_{i}")
                x = bn(x)
                if weights is not None:
                    if np.any(weights[k].variance < 0) or not np.all(np.isfinite(weights[k].variance)):
                        raise DarknetError(
                            f"{section.describe()}: batch-norm variance has negative or non-finite values; "
                            "the weights file is damaged or does not match this cfg"
                        )
                    w = weights[k]
                    bn.set_weights(keras_bn_weights(w.gamma, w.beta, w.mean, w.variance, darknet_bn))
            if spec.activation == "leaky":
                x = L.LeakyReLU(negative_slope=LEAKY_SLOPE, name=f"leaky_{i}")(x)
            elif spec.activation == "mish":
                x = Mish(name=f"mish_{i}")(x)
            elif spec.activation == "relu":
                x = L.ReLU(name=f"relu_{i}")(x)
            elif spec.activation == "logistic":
                x = L.Activation("sigmoid", name=f"logistic_{i}")(x)
        elif kind == "route":
            refs = [outputs_by_layer[_resolve(section, r)] for r in section.get_ints("layers")]
            groups, group_id = route_groups(section)
            if groups > 1:
                refs = [ChannelGroup(groups, group_id, name=f"group_{i}_{n}")(r) for n, r in enumerate(refs)]
            x = refs[0] if len(refs) == 1 else L.Concatenate(axis=-1, name=f"route_{i}")(refs)
        elif kind == "shortcut":
            ref = outputs_by_layer[_resolve(section, section.get_int("from"))]
            x = L.Add(name=f"shortcut_{i}")([ref, x])
        elif kind == "maxpool":
            size, stride = _maxpool_geometry(section)
            x = L.MaxPooling2D(size, strides=stride, padding="same", name=f"maxpool_{i}")(x)
        elif kind == "upsample":
            stride = section.get_int("stride", 2)
            x = L.UpSampling2D(stride, interpolation="nearest", name=f"upsample_{i}")(x)
        elif kind == "avgpool":
            x = L.GlobalAveragePooling2D(keepdims=True, name=f"avgpool_{i}")(x)
        elif kind == "softmax":
            x = L.Softmax(axis=-1, name=f"softmax_{i}")(x)
        elif kind == "yolo":
            yolo_outputs.append(x)
            x = None
        elif kind == "cost":
            pass  # training-only in Darknet; passes its input through
        outputs_by_layer.append(x)
    outputs = yolo_outputs or [x]
    return keras.Model(inputs, outputs if len(outputs) > 1 else outputs[0], name=name)
