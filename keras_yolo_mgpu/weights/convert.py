"""Convert a Darknet ``.cfg`` + ``.weights`` pair into a Keras file.

    python convert.py yolov3.cfg yolov3.weights model_data/yolo.weights.h5
    python convert.py yolov3-tiny.cfg yolov3-tiny.weights model_data/tiny_yolo.weights.h5
    python convert.py darknet53.cfg darknet53.conv.74 model_data/darknet53.keras
    python convert.py yolov3.cfg yolov3.weights model_data/yolo.h5            # keras-yolo3's line
    python convert.py -w yolov3.cfg yolov3.weights model_data/yolo_weights.h5

The output's ending picks the format (:func:`output_format`); every output carries the
project's metadata (``weights.metadata``) and loads with ``weights.loading.load_weights``.
When the cfg is one of our bodies (``yolo_body``, ``tiny_yolo_body``, the YOLOv4 ones: same
weights and the same outputs on a test image, :func:`build_matching_body`), *that* model is
saved; any other cfg (``darknet53.cfg``, an SPP variant) is saved as the generic cfg-built
model (layers ``conv_<darknet index>``, ``bn_<i>``, ...), best as ``.keras``; a weights-only
file of it gets a copy of the cfg beside it for :func:`load_converted`.

Outputs are written atomically and recorded as this project's; whether an existing file may
be replaced is the caller's check (``outputs.check_output``). Keras is imported inside the
functions that build, so convert.py answers usage errors before Keras loads.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Sequence

import h5py
import numpy as np

from keras_yolo_mgpu.fileio import atomic_write
from keras_yolo_mgpu.outputs import record_written
from keras_yolo_mgpu.resources import format_anchors, get_classes, resolve_resource
from keras_yolo_mgpu.weights import darknet
from keras_yolo_mgpu.weights.metadata import ModelMetadata, write_metadata

logger = logging.getLogger(__name__)

#: What each output ending is written as (see :func:`output_format`).
OUTPUT_FORMATS = {
    "keras3-weights": "Keras 3 weights (.weights.h5)",
    "keras3-archive": "Keras 3 whole model (.keras)",
    "keras2-weights": "Keras 2 HDF5 weights, as keras-yolo3's convert.py -w",
    "keras2-model": "Keras 2 HDF5 whole model, as keras-yolo3's convert.py",
}


@dataclasses.dataclass
class ConversionResult:
    """What :func:`convert` did.

    Attributes:
        model: the saved Keras model (a ``yolo_body`` / ``tiny_yolo_body``
            or the generic cfg-built model).
        architecture: ``"yolo_body"``, ``"tiny_yolo_body"`` or ``"generic"``.
        output_path: the written file.
        cfg_copy_path: ``<output>.cfg`` for a generic ``.weights.h5``, else None.
        header: the ``.weights`` header.
        num_floats: float32 values read (all of them, by construction).
        anchors: ``(N, 2)`` anchors of the ``[yolo]`` sections, or None.
        masks: anchor indices per output, coarsest first, or None.
        num_classes: classes of the ``[yolo]`` sections, or None.
        metadata: what was stored in the file (``yolo_body`` kinds), or None.
    """

    model: object
    architecture: str
    output_path: str
    cfg_copy_path: str | None
    header: darknet.DarknetHeader
    num_floats: int
    anchors: np.ndarray | None
    masks: list | None
    num_classes: int | None
    metadata: object = None


def output_format(output_path: str | os.PathLike, weights_only: bool = False) -> str:
    """The format :func:`convert` writes to ``output_path``: a key of :data:`OUTPUT_FORMATS`.

    ``.weights.h5``: Keras 3 weights; ``.keras``: Keras 3 archive; any other
    ``.h5``: keras-yolo3's Keras 2 HDF5, weights only with ``weights_only``
    (keras-yolo3's ``-w``), else the whole model.

    Raises:
        ValueError: another ending, or ``.keras`` with ``weights_only``.
    """
    path = str(output_path)
    if path.endswith(".weights.h5"):
        return "keras3-weights"
    if path.endswith(".keras"):
        if weights_only:
            raise ValueError(
                "`weights_only` (-w) writes weights, but a `.keras` file holds the whole model: end the output "
                f"in .weights.h5 (Keras 3) or .h5 (Keras 2, as keras-yolo3's -w). Received: output_path={path}"
            )
        return "keras3-archive"
    if path.endswith(".h5"):
        return "keras2-weights" if weights_only else "keras2-model"
    raise ValueError(
        "`output_path` must end in `.h5` (Keras 2 HDF5, as keras-yolo3's convert.py), `.weights.h5` (Keras 3 "
        f"weights) or `.keras` (Keras 3 whole model). Received: output_path={path}"
    )


def check_output_path(output_path: str | os.PathLike, weights_only: bool = False) -> None:
    """Raises ``ValueError`` unless :func:`output_format` knows the path's ending."""
    output_format(output_path, weights_only)


def _save(model, path: str, file_format: str) -> None:
    """Writes ``model`` to ``path`` in ``file_format`` (a key of :data:`OUTPUT_FORMATS`)."""
    from keras_yolo_mgpu import keras_compat

    if file_format == "keras3-weights":
        model.save_weights(path)
    elif file_format == "keras3-archive":
        model.save(path)
    elif file_format == "keras2-weights":
        keras_compat.save_keras2_weights(model, path)
    else:
        keras_compat.save_keras2_model(model, path)


def _yolo_heads(yolos: Sequence[darknet.YoloSpec]):
    """(anchors, masks, num_classes, anchors_per_scale) of consistent [yolo] sections, else None."""
    if not yolos:
        return None
    classes = {y.classes for y in yolos}
    per_scale = {len(y.mask) for y in yolos}
    anchor_sets = {tuple(y.anchors) for y in yolos}
    if len(classes) != 1 or len(per_scale) != 1 or len(anchor_sets) != 1:
        logger.warning(
            "[yolo] sections disagree on classes, mask length or anchors "
            "(classes %s, mask lengths %s); not a yolo_body",
            sorted(classes),
            sorted(per_scale),
        )
        return None
    anchors = np.array(yolos[0].anchors, dtype=np.float32).reshape(-1, 2)
    return anchors, [list(y.mask) for y in yolos], classes.pop(), per_scale.pop()


def _compare_outputs(a, b, size: int = 64, seed: int = 0) -> float:
    """Max abs difference of two models' outputs on one random image, relative to the output scale."""
    import keras

    rng = np.random.default_rng(seed)
    image = rng.uniform(0.0, 1.0, (1, size, size, a.inputs[0].shape[-1])).astype(np.float32)

    def coarse_first(model) -> list[np.ndarray]:
        # Sorted by grid size, smallest first (stable): yolov4.cfg lists its fine scale first, the bodies do not.
        outputs = [np.asarray(o) for o in keras.tree.flatten(model(image, training=False))]
        return sorted(outputs, key=lambda o: int(np.prod(o.shape[1:3])))

    out_a, out_b = coarse_first(a), coarse_first(b)
    if [x.shape for x in out_a] != [y.shape for y in out_b]:
        return float("inf")
    return max(float(np.max(np.abs(x - y))) / max(1.0, float(np.max(np.abs(x)))) for x, y in zip(out_a, out_b))


def _copy_in_darknet_order(generic, body, order) -> str | None:
    """Copies conv/BN weights by cfg position; returns why not when the layers do not correspond."""
    # (conv, batch norm or None) layer names of the generic cfg-built model, in cfg order.
    names = {layer.name for layer in generic.layers}
    indices = sorted(int(n[len("conv_") :]) for n in names if n.startswith("conv_") and n[len("conv_") :].isdigit())
    source = [(f"conv_{i}", f"bn_{i}" if f"bn_{i}" in names else None) for i in indices]
    if len(source) != len(order):
        return f"{len(source)} convolutions in the cfg, {len(order)} in the body"
    pairs = []
    for (src_conv, src_bn), (dst_conv, dst_bn) in zip(source, order):
        for src, dst in ((src_conv, dst_conv), (src_bn, dst_bn)):
            if (src is None) != (dst is None):
                return f"{src_conv}: batch normalisation differs from {dst_conv}"
            if src is None:
                continue
            a, b = generic.get_layer(src), body.get_layer(dst)
            if [tuple(w.shape) for w in a.weights] != [tuple(w.shape) for w in b.weights]:
                return f"{src} and {dst} have different weight shapes"
            pairs.append((a, b))
    for a, b in pairs:
        b.set_weights(a.get_weights())
    return None


def build_matching_body(generic, yolos: Sequence[darknet.YoloSpec], *, check: bool = True):
    """Copies the generic model's weights into one of our bodies when it is the same network.

    The bodies tried are ``yolo_body`` / ``yolo4_body`` for 3 ``[yolo]``
    sections and ``tiny_yolo_body`` / ``yolo4_tiny_body`` for 2. YOLOv3's
    are matched by their sequence of weight shapes (built in keras-yolo3's
    order), YOLOv4's conv by conv in cfg order
    (``model.yolo4.build_with_darknet_order``).

    Args:
        generic: model from :func:`darknet.build_model`, with weights.
        yolos: the cfg's ``[yolo]`` specs.
        check: also require equal outputs on a random 64x64 image (guards
            against a network with the same weight shapes wired differently).

    Returns:
        ``(model, architecture name)``, or ``(None, reason)`` when the cfg is
        not one of those networks.
    """
    import keras

    from keras_yolo_mgpu.model.yolo3 import tiny_yolo_body, yolo_body
    from keras_yolo_mgpu.model.yolo4 import build_with_darknet_order

    heads = _yolo_heads(yolos)
    if heads is None:
        return None, "no consistent [yolo] sections"
    _, _, num_classes, per_scale = heads
    builders = {3: ("yolo_body", yolo_body, "yolo4_body"), 2: ("tiny_yolo_body", tiny_yolo_body, "yolo4_tiny_body")}
    if len(yolos) not in builders or generic.inputs[0].shape[-1] != 3:
        return None, f"{len(yolos)} [yolo] sections on {generic.inputs[0].shape[-1]} input channels"
    name, builder, v4_name = builders[len(yolos)]
    body = builder(keras.Input(shape=(None, None, 3), name="image"), per_scale, num_classes)
    shapes = [tuple(w.shape) for w in generic.weights]
    if shapes == [tuple(w.shape) for w in body.weights]:
        body.set_weights(generic.get_weights())
    else:
        body, order = build_with_darknet_order(len(yolos) == 2, per_scale, num_classes)
        why_not = _copy_in_darknet_order(generic, body, order)
        if why_not is not None:
            return None, (
                f"weight shapes differ from {name} and {v4_name} ({per_scale} anchors, {num_classes} classes): "
                f"{why_not}"
            )
        name = v4_name
    if check:
        diff = _compare_outputs(generic, body)
        if not diff <= 1e-4:
            logger.warning(
                "%s has the cfg's weight shapes but different outputs (relative difference %.3g); "
                "saving the generic model instead",
                name,
                diff,
            )
            return None, f"same weight shapes as {name} but different outputs"
    return body, name


def convert(
    cfg_path: str | os.PathLike,
    weights_path: str | os.PathLike,
    output_path: str | os.PathLike,
    *,
    generic: bool = False,
    check: bool = True,
    darknet_bn: str | None = None,
    masks="auto",
    class_names: Sequence[str] | None = None,
    weights_only: bool = False,
) -> ConversionResult:
    """Converts Darknet ``cfg_path`` + ``weights_path`` into ``output_path``.

    Args:
        cfg_path: Darknet ``.cfg``.
        weights_path: Darknet ``.weights`` (every float must be used).
        output_path: ``.weights.h5``, ``.keras`` or ``.h5`` (see
            :func:`output_format`); its folder is created. An existing file
            is replaced: check first (``outputs.check_output``).
        generic: always save the generic cfg-built model, even when the cfg
            is a ``yolo_body``.
        check: verify the ``yolo_body`` copy on a test image (see
            :func:`build_matching_body`).
        darknet_bn: whose batch norm the converted model reproduces
            (:func:`darknet.keras_bn_weights`): ``"pjreddie"`` (the default for cfgs
            the original Darknet runs: it trained the official YOLOv3 weights),
            ``"alexeyab"`` (the default for cfgs only AlexeyAB/darknet runs, such as
            yolov4.cfg, :func:`darknet.alexeyab_only_features`) or ``"keras-yolo3"``
            (raw arrays with Keras's epsilon: keras-yolo3's own conversion, bit for bit).
        masks: the anchor masks the converted model decodes with:
            ``"cfg"`` (the ``[yolo] mask`` lines), ``"keras-yolo3"``
            (``[[6,7,8],[3,4,5],[0,1,2]]`` / tiny ``[[3,4,5],[1,2,3]]``),
            explicit lists (coarsest scale first), or ``"auto"``: the cfg's,
            except for a 2-scale (tiny) cfg whose masks differ from
            keras-yolo3's, which gets keras-yolo3's with a warning (see
            :func:`choose_masks`).
        class_names: names stored in the file's metadata, one per class of
            the cfg; default the COCO names for an 80-class cfg, else
            ``class_0``, ``class_1``, ... with a warning.
        weights_only: for a plain ``.h5`` output, keras-yolo3's ``-w``:
            the weights only (Keras 2 ``save_weights``), not the whole model.

    Returns:
        A :class:`ConversionResult`.

    Raises:
        ValueError: bad output suffix (or ``.keras`` with ``weights_only``).
        DarknetError: unsupported cfg, or weights that do not match the cfg
            (too few floats, naming the layer; or floats left over).
    """
    output_path = str(output_path)
    file_format = output_format(output_path, weights_only)
    sections = darknet.parse_cfg(cfg_path)
    convs, yolos = darknet.infer_layers(sections)
    header, weights = darknet.read_weights(weights_path, convs)
    num_floats = sum(c.num_floats for c in convs)
    if darknet_bn is None:
        features = darknet.alexeyab_only_features(sections)
        darknet_bn = "alexeyab" if features else darknet.DEFAULT_DARKNET_BN
        if features:
            logger.info("%s uses %s (AlexeyAB/darknet only): its batch norm formula", cfg_path, ", ".join(features))
    model = darknet.build_model(
        sections, weights, darknet_bn=darknet_bn, name=os.path.splitext(os.path.basename(str(cfg_path)))[0]
    )
    logger.info(
        "Built %s: %d layers, %d parameters; batch norm as %s",
        cfg_path,
        len(model.layers),
        model.count_params(),
        darknet_bn,
    )

    heads = _yolo_heads(yolos)
    architecture = "generic"
    if not generic:
        body, why = build_matching_body(model, yolos, check=check)
        if body is not None:
            model, architecture = body, why
        else:
            logger.info("Not a yolo_body/tiny_yolo_body (%s): saving the generic cfg-built model", why)
    if heads is not None:
        anchors, cfg_masks, num_classes, _ = heads
        if architecture == "yolo4_body":
            # yolov4.cfg lists the fine scale first; the body's outputs are coarse first.
            cfg_masks, yolos = cfg_masks[::-1], list(yolos)[::-1]
        _check_scale_x_y(architecture, yolos)
        # Masks matter to the yolo_body kinds, whose decoding uses them; a
        # generic model just reports the cfg's.
        masks = cfg_masks if architecture == "generic" else choose_masks(masks, cfg_masks, len(anchors))
    else:
        anchors, masks, num_classes = None, None, None

    metadata = None
    if architecture != "generic":
        metadata = _conversion_metadata(
            sections, anchors, masks, num_classes, class_names, cfg_path, MODEL_KINDS_BY_BODY[architecture]
        )

    cfg_copy_path = None
    if architecture == "generic" and file_format in ("keras3-weights", "keras2-weights"):
        cfg_copy_path = output_path + ".cfg"
        logger.warning(
            "%s holds weights of the generic cfg-built model, not of yolo_body. A backbone (Darknet-53) starts "
            "YOLOv3 as train.py --weights; to rebuild the model itself, load it with "
            "keras_yolo_mgpu.weights.convert.load_converted(%r) (which rebuilds it from %s), or convert to .keras",
            output_path,
            output_path,
            cfg_copy_path,
        )
        atomic_write(cfg_copy_path, lambda temp_path: shutil.copyfile(cfg_path, temp_path))
        record_written([cfg_copy_path])

    def write(temp_path):
        _save(model, temp_path, file_format)
        if metadata is not None:
            write_metadata(temp_path, metadata)

    atomic_write(output_path, write)
    record_written([output_path])
    logger.info("Saved %s (%s) to %s: %s", model.name, architecture, output_path, OUTPUT_FORMATS[file_format])
    if anchors is not None:
        logger.info("Anchors of the cfg: %s; masks %s; %d classes", format_anchors(anchors), masks, num_classes)
    return ConversionResult(
        model, architecture, output_path, cfg_copy_path, header, num_floats, anchors, masks, num_classes, metadata
    )


def _check_scale_x_y(architecture: str, yolos: Sequence[darknet.YoloSpec]) -> None:
    """Warns when the cfg's ``scale_x_y`` (output order) differs from what decoding the body uses."""
    from keras_yolo_mgpu.model.yolo4 import YOLO4_SCALE_X_Y, YOLO4_TINY_SCALE_X_Y

    if architecture == "generic":
        return
    expected = {"yolo4_body": YOLO4_SCALE_X_Y, "yolo4_tiny_body": YOLO4_TINY_SCALE_X_Y}.get(architecture)
    found = tuple(y.scale_x_y for y in yolos)
    if found != (expected or (1.0,) * len(yolos)):
        logger.warning(
            "The cfg's scale_x_y %s differ from the %s that %s decodes with; boxes will be slightly off",
            found,
            expected or "1.0 per scale",
            architecture,
        )


#: The `--model` kind recorded in the metadata of each body the converter saves.
MODEL_KINDS_BY_BODY = {
    "yolo_body": "yolov3",
    "tiny_yolo_body": "yolov3-tiny",
    "yolo4_body": "yolov4",
    "yolo4_tiny_body": "yolov4-tiny",
}


def _conversion_metadata(sections, anchors, masks, num_classes, class_names, cfg_path, kind):
    """The :class:`ModelMetadata` of a converted ``yolo_body`` / ``tiny_yolo_body``."""
    if class_names is None:
        if num_classes == 80:
            class_names = get_classes(resolve_resource(None, "classes"))
        else:
            logger.warning(
                "%s has %d classes and no --classes was given: storing the names class_0..class_%d",
                cfg_path,
                num_classes,
                num_classes - 1,
            )
            class_names = [f"class_{i}" for i in range(num_classes)]
    if len(class_names) != num_classes:
        raise ValueError(f"--classes has {len(class_names)} names but {cfg_path} has {num_classes} classes")
    net = darknet.net_section(sections)
    input_shape = (net.get_int("height", 416), net.get_int("width", 416))
    if any(v <= 0 or v % 32 for v in input_shape):
        logger.warning("[net] size %s is not a multiple of 32; storing 416x416 as the input size", input_shape)
        input_shape = (416, 416)
    return ModelMetadata(kind, input_shape, anchors, masks, class_names)


#: Why the official yolov3-tiny weights keep keras-yolo3's masks by default.
TINY_MASKS_WARNING = (
    "The cfg's anchor masks are %s but this converter keeps keras-yolo3's %s for a tiny cfg: the official "
    "yolov3-tiny.weights were trained with 3,4,5 / 1,2,3 although the later cfg says 0,1,2 "
    "(AlexeyAB/darknet#1341); with 0,1,2 the fine scale's boxes come out about half size, and on hand-drawn "
    "boxes 1,2,3 fits the official weights better. If YOUR weights were trained "
    "with the cfg's masks, convert with --masks cfg."
)


def choose_masks(masks, cfg_masks: list, num_anchors: int) -> list:
    """The masks a converted model decodes with (see :func:`convert`'s ``masks``).

    Raises:
        ValueError: unknown keyword or masks that do not fit the anchors.
    """
    from keras_yolo_mgpu.model.boxes import anchor_masks, resolve_masks

    default = anchor_masks(len(cfg_masks)) if len(cfg_masks) in (2, 3) else None
    if masks == "auto":
        if len(cfg_masks) == 2 and cfg_masks != default:
            logger.warning(TINY_MASKS_WARNING, cfg_masks, default)
            return default
        return cfg_masks
    if masks == "cfg":
        return cfg_masks
    if masks == "keras-yolo3":
        if default is None:
            raise ValueError(f"keras-yolo3 has no masks for {len(cfg_masks)} output scales")
        return default
    if isinstance(masks, str):
        raise ValueError(f"masks must be 'auto', 'cfg', 'keras-yolo3' or lists of indices. Received: masks={masks!r}")
    return resolve_masks(masks, num_anchors)


def load_converted(path: str | os.PathLike):
    """Loads a file written by :func:`convert` without knowing which kind it is.

    ``.keras`` and a whole-model ``.h5`` load as whole models. A weights-only
    file (``.weights.h5``, or ``.h5`` written with ``weights_only``) with a
    ``<path>.cfg`` beside it is a generic model: rebuilt from that cfg, then
    its weights loaded. One without holds ``yolo_body`` / ``tiny_yolo_body``
    weights: build that network with your class count and call
    ``weights.loading.load_weights`` (this function raises, saying so).
    """
    import keras

    path = str(path)
    check_output_path(path)
    if path.endswith(".keras"):
        return keras.saving.load_model(path)
    if not path.endswith(".weights.h5"):
        with h5py.File(path, "r") as handle:
            whole_model = "model_config" in handle.attrs
        if whole_model:
            return keras.saving.load_model(path, compile=False)
    cfg_copy = path + ".cfg"
    if not os.path.isfile(cfg_copy):
        raise ValueError(
            f"{path} has no {os.path.basename(cfg_copy)} beside it, so it holds yolo_body/tiny_yolo_body "
            "weights: build the network (keras_yolo_mgpu.model.yolo3.yolo_body) and call "
            "keras_yolo_mgpu.weights.loading.load_weights"
        )
    model = darknet.build_model(darknet.parse_cfg(cfg_copy))
    model.load_weights(path)
    return model


def parse_masks(text: str):
    """``"cfg"``/``"keras-yolo3"``/``"auto"`` as they are; ``"3,4,5 1,2,3"`` -> ``[[3, 4, 5], [1, 2, 3]]``."""
    text = text.strip()
    if text in ("auto", "cfg", "keras-yolo3"):
        return text
    try:
        return [[int(i) for i in group.split(",") if i] for group in text.replace(";", " ").split()]
    except ValueError:
        raise ValueError(
            f"--masks must be cfg, keras-yolo3 or anchor indices per scale like '6,7,8 3,4,5 0,1,2'. Received: {text!r}"
        ) from None
