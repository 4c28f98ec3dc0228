"""Darknet cfg/weights conversion against a literal numpy Darknet forward pass.

The reference below re-implements Darknet's layers from Darknet's sources
(symmetric conv padding, batch norm ``(x - mean) / (sqrt(var) + .000001f)
* scales + biases`` from pjreddie's ``normalize_cpu``, leaky 0.1, maxpool
padding of ``size - 1`` with offset ``-padding / 2``, nearest upsampling,
route = channel concat, shortcut = add) and reads the ``.weights`` bytes on
its own, so it checks the Keras layer choices (top-left padding for stride
2, 'same' max pooling), the batch-norm fold and the reader's float
bookkeeping. Nothing in it comes from our Keras code or Keras's epsilon.
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from darknet_files import file_arrays, load_darknet, random_weights, write_weights

from keras_yolo_mgpu.cli.convert import main
from keras_yolo_mgpu.weights import darknet
from keras_yolo_mgpu.weights.convert import build_matching_body, check_output_path, convert, load_converted
from keras_yolo_mgpu.weights.darknet import DarknetError, DarknetHeader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The official cfgs ship in model_data/ (`test_the_shipped_cfgs_are_the_official_files`).
OFFICIAL_CFGS = os.path.join(REPO, "model_data")

#: What each implementation divides ``x - rolling_mean`` by at inference,
#: transcribed from its source, not from ours.
BN_DENOMINATORS = {
    # pjreddie/darknet src/blas.c normalize_cpu: (sqrt(variance[f]) + .000001f)
    "pjreddie": lambda var: np.sqrt(var) + 1e-6,
    # AlexeyAB/darknet src/blas.c normalize_cpu: (sqrt(variance[f] + .00001f))
    "alexeyab": lambda var: np.sqrt(var + 1e-5),
    # keras-yolo3 convert.py copies the raw arrays into a Keras 2
    # BatchNormalization(), whose default epsilon is 1e-3 (checked below).
    "keras-yolo3": lambda var: np.sqrt(var + 1e-3),
}


#: sha256 of each official cfg, from the upstream repositories: qqwweee/keras-yolo3 (e6598d1, 2018-07-31)
#: ships darknet53, yolov3 and yolov3-tiny as pjreddie/darknet released them (yolov3: e84933bf, yolov3-tiny:
#: 481d9d98, before its mask became 0,1,2); AlexeyAB/darknet's cfg/ (59596d78) has yolov4 and yolov4-tiny.
OFFICIAL_SHA256 = {
    "darknet53.cfg": "69384b7efd5383222424cdce801f242f17a690cc57163625d785ee3b55bb8ad9",
    "yolov3.cfg": "39498ec1475dbe57b0308c272d0ce8bd4f3434f70b4a06f59e8a5d6194afdfc6",
    "yolov3-tiny.cfg": "f9bd093dcb1e594b36714a540b8668bd140f7439a7d53f36a00b1250dfa46920",
    "yolov4.cfg": "a6d0f8e5c62cc8378384f75a8159b95fa2964d4162e33351b00ac82e0fc46a34",
    "yolov4-tiny.cfg": "f858e3724962eedf3ac44e3b6cb3f0c3d9ed067c306bb831f539c578b924c90e",
}


def test_the_shipped_cfgs_are_the_official_files():
    """The tests below read the cfgs in model_data/ as Darknet's own: they must be the upstream files, byte for byte."""
    for name, digest in OFFICIAL_SHA256.items():
        with open(official_cfg(name), "rb") as handle:
            assert hashlib.sha256(handle.read()).hexdigest() == digest, name


def official_cfg(name: str) -> str:
    """The path of an official Darknet cfg that the repository ships (model_data/)."""
    return os.path.join(OFFICIAL_CFGS, name)


# ---------------------------------------------------------------------------
# Literal numpy Darknet
# ---------------------------------------------------------------------------


def _leaky(x):
    return np.where(x > 0, x, 0.1 * x)


def _mish(x):
    """AlexeyAB's activate_array_mish: x * tanh(softplus(x)), softplus with threshold 20."""
    softplus = np.where(x > 20, x, np.where(x < -20, np.exp(x), np.log1p(np.exp(np.minimum(x, 20)))))
    return x * np.tanh(softplus)


def _activate(x, name):
    return {
        "mish": _mish,
        "leaky": _leaky,
        "linear": lambda v: v,
        "relu": lambda v: np.maximum(v, 0),
        "logistic": lambda v: 1 / (1 + np.exp(-v)),
    }[name](x)


def _conv(x, kernel, stride, pad):
    """Darknet convolution: zero pad `pad` on every side. x (H, W, C), kernel (out, in, k, k)."""
    k = kernel.shape[-1]
    padded = np.pad(x, ((pad, pad), (pad, pad), (0, 0)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (k, k), axis=(0, 1))[::stride, ::stride]
    return np.tensordot(windows, kernel.astype(np.float64), axes=([2, 3, 4], [1, 2, 3]))


def _maxpool(x, size, stride, padding):
    """Darknet maxpool: out = (n + padding - size) / stride + 1, windows start at -padding / 2."""
    height, width = x.shape[:2]
    out_h = (height + padding - size) // stride + 1
    out_w = (width + padding - size) // stride + 1
    before = padding // 2
    after_h = max(0, (out_h - 1) * stride + size - height - before)
    after_w = max(0, (out_w - 1) * stride + size - width - before)
    padded = np.pad(x, ((before, after_h), (before, after_w), (0, 0)), constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (size, size), axis=(0, 1))[::stride, ::stride]
    return windows[:out_h, :out_w].max(axis=(-1, -2))


def darknet_forward(cfg_path, weights_path, image, bn="pjreddie"):
    """Runs Darknet's layers in float64.

    Args:
        image: (H, W, C) float array.
        bn: key of BN_DENOMINATORS.

    Returns:
        (outputs, header_bytes, floats_read): the inputs of the [yolo] layers
        (or the last layer's output), each (h, w, c).
    """
    with open(weights_path, "rb") as f:
        raw = f.read()
    major, minor = struct.unpack("<ii", raw[:8])
    header_bytes = 20 if major * 10 + minor >= 2 else 16
    values = np.frombuffer(raw[header_bytes:], "<f4")
    position = 0

    def take(shape):
        nonlocal position
        n = int(np.prod(shape))
        assert position + n <= values.size, "weights file too short"
        out = values[position : position + n].reshape(shape).astype(np.float64)
        position += n
        return out

    x = image.astype(np.float64)
    layer_outputs, yolo_inputs = [], []
    for section in darknet.parse_cfg(cfg_path):
        if section.index < 0:
            continue
        opt = section.options
        kind = section.kind
        if kind == "convolutional":
            filters, size = int(opt["filters"]), int(opt.get("size", 1))
            stride, pad = int(opt.get("stride", 1)), (size // 2 if int(opt.get("pad", 0)) else 0)
            if int(opt.get("batch_normalize", 0)):
                beta, gamma, mean, var = take((filters,)), take((filters,)), take((filters,)), take((filters,))
                kernel = take((filters, x.shape[-1], size, size))
                x = _conv(x, kernel, stride, pad)
                x = (x - mean) / BN_DENOMINATORS[bn](var) * gamma + beta
            else:
                bias = take((filters,))
                kernel = take((filters, x.shape[-1], size, size))
                x = _conv(x, kernel, stride, pad) + bias
            x = _activate(x, opt.get("activation", "logistic"))
        elif kind == "maxpool":
            size, stride = int(opt.get("size", opt.get("stride", 1))), int(opt.get("stride", 1))
            x = _maxpool(x, size, stride, int(opt.get("padding", size - 1)))
        elif kind == "route":
            refs = [int(v) for v in opt["layers"].split(",")]
            # AlexeyAB's route copies part `group_id` of `groups` of each input's (C, H, W) data.
            groups, group_id = int(opt.get("groups", 1)), int(opt.get("group_id", 0))
            parts = []
            for r in refs:
                source = layer_outputs[r if r >= 0 else section.index + r]
                size = source.shape[-1] // groups
                parts.append(source[..., group_id * size : (group_id + 1) * size])
            x = np.concatenate(parts, axis=-1)
        elif kind == "shortcut":
            x = x + layer_outputs[section.index + int(opt["from"])]
        elif kind == "upsample":
            stride = int(opt.get("stride", 2))
            x = x.repeat(stride, axis=0).repeat(stride, axis=1)
        elif kind == "yolo":
            yolo_inputs.append(x)
        elif kind == "avgpool":
            x = x.mean(axis=(0, 1), keepdims=True)
        elif kind == "softmax":
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            x = e / e.sum(axis=-1, keepdims=True)
        elif kind == "cost":
            pass
        else:
            raise AssertionError(f"reference does not know [{kind}]")
        layer_outputs.append(x)
    assert header_bytes + 4 * position == len(raw), "reference left floats unread"
    return (yolo_inputs or [x]), header_bytes, position


def keras_outputs(model, image):
    out = model(image[None].astype(np.float32), training=False)
    return [np.asarray(o)[0] for o in (out if isinstance(out, (list, tuple)) else [out])]


def relative_errors(model, reference):
    """Per output scale: max |model - reference| / max |reference|."""
    return [float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(model, reference)]


def random_weights_file(cfg_path, weights_path, seed=0, header=None):
    convs, _ = darknet.infer_layers(darknet.parse_cfg(cfg_path))
    return write_weights(weights_path, random_weights(convs, seed), header)


def random_image(size, seed=1, channels=3):
    return np.random.default_rng(seed).uniform(0, 1, (size, size, channels)).astype(np.float32)


# ---------------------------------------------------------------------------
# Generated cfgs
# ---------------------------------------------------------------------------


def conv(filters, size=3, stride=1, bn=True, activation="leaky", pad=1):
    lines = ["[convolutional]"]
    if bn:
        lines.append("batch_normalize=1")
    lines += [f"filters={filters}", f"size={size}", f"stride={stride}", f"pad={pad}", f"activation={activation}"]
    return "\n".join(lines)


def yolo(mask, classes=2):
    return textwrap.dedent(
        f"""\
        [yolo]
        mask = {mask}
        anchors = 10,13,  16,30,  33,23,  30,61,  62,45,  59,119
        classes={classes}
        num=6
        jitter=.3"""
    )


NET = "[net]\n# Testing\nbatch=1\nwidth=64\nheight=64\nchannels=3\ndecay=0.0005\n"

# Residual block, 3x3 and 5x5 stride-2 convs, relu/logistic, a biased linear
# head, route by relative and absolute index, upsample, two [yolo] outputs.
MINI_YOLO = "\n\n".join(
    [
        NET,
        conv(8),  # 0
        conv(16, stride=2),  # 1
        conv(8, size=1),  # 2
        conv(16),  # 3
        "[shortcut]\nfrom=-3\nactivation=linear",  # 4
        conv(24, size=5, stride=2, activation="relu"),  # 5
        conv(21, size=1, bn=False, activation="linear"),  # 6
        yolo("3,4,5"),  # 7
        "[route]\nlayers = -3",  # 8 -> 5
        conv(8, size=1, activation="logistic"),  # 9
        "[upsample]\nstride=2",  # 10
        "[route]\nlayers = -1, 4",  # 11
        conv(21, size=3, bn=False, activation="linear"),  # 12
        yolo("0,1,2"),  # 13
    ]
)

# yolov3-spp's block: stride-1 max pools of 5/9/13 concatenated with their input.
MINI_SPP = "\n\n".join(
    [
        NET,
        conv(8),  # 0
        conv(16, stride=2),  # 1
        conv(8, size=1),  # 2
        "[maxpool]\nstride=1\nsize=5",  # 3
        "[route]\nlayers=-2",  # 4
        "[maxpool]\nstride=1\nsize=9",  # 5
        "[route]\nlayers=-4",  # 6
        "[maxpool]\nstride=1\nsize=13",  # 7
        "[route]\nlayers=-1,-3,-5,-6",  # 8
        conv(16, size=1),  # 9
        conv(21, size=1, bn=False, activation="linear"),  # 10
        yolo("0,1,2"),  # 11
    ]
)

# yolov3-tiny's pools: size 2 stride 2, and size 2 stride 1 (pads bottom-right).
MINI_TINY = "\n\n".join(
    [
        NET,
        conv(8),
        "[maxpool]\nsize=2\nstride=2",
        conv(16),
        "[maxpool]\nsize=2\nstride=1",
        conv(16, size=1),
        conv(21, size=1, bn=False, activation="linear"),
        yolo("0,1,2"),
    ]
)

# Darknet classifier tail.
MINI_CLASSIFIER = "\n\n".join(
    [
        NET,
        conv(8),
        conv(16, stride=2),
        "[avgpool]",
        conv(10, size=1, bn=False, activation="linear"),
        "[softmax]\ngroups=1",
        "[cost]\ntype=sse",
    ]
)

GENERATED = {"mini_yolo": MINI_YOLO, "mini_spp": MINI_SPP, "mini_tiny": MINI_TINY, "mini_classifier": MINI_CLASSIFIER}


def write_cfg(tmp_path, name, text):
    path = tmp_path / f"{name}.cfg"
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


def test_parse_cfg_follows_darknet_conventions(tmp_path):
    cfg = write_cfg(
        tmp_path,
        "t",
        "# comment\n[net]\nwidth = 416\n\n[convolutional]\n; comment\nfilters=4\nfilters=8\n"
        "size = 3\n\n[yolo]\nanchors = 10,13,  16,30\n",
    )
    net, conv_, yolo_ = darknet.parse_cfg(cfg)
    assert (net.index, net.line, net.get_int("width")) == (-1, 2, 416)
    assert (conv_.index, conv_.line) == (0, 5)
    assert conv_.get_int("filters") == 4  # first occurrence wins, as in Darknet
    assert yolo_.get_ints("anchors") == [10, 13, 16, 30]
    spec = darknet.yolo_spec(yolo_)
    assert spec.mask == [0, 1] and spec.anchors == [(10, 13), (16, 30)]


def test_header_layout_and_seen_width(tmp_path):
    convs, _ = darknet.infer_layers(darknet.parse_cfg(write_cfg(tmp_path, "m", MINI_TINY)))
    weights = random_weights(convs)
    n = sum(c.num_floats for c in convs)
    for header, header_bytes in ((DarknetHeader(0, 2, 0, 2**40), 20), (DarknetHeader(0, 1, 0, 7), 16)):
        path = tmp_path / "w.weights"
        assert write_weights(path, weights, header) == n
        raw = path.read_bytes()
        assert len(raw) == header_bytes + 4 * n
        assert struct.unpack("<iii", raw[:12]) == (header.major, header.minor, header.revision)
        read_header, back = darknet.read_weights(path, convs)
        assert read_header == header
        for a, b in zip(weights, back):
            for x, y in zip(file_arrays(a), file_arrays(b)):
                np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_generated_cfg_matches_numpy_darknet(tmp_path, name):
    cfg = write_cfg(tmp_path, name, GENERATED[name])
    weights = str(tmp_path / f"{name}.weights")
    n = random_weights_file(cfg, weights, seed=3)
    model = load_darknet(cfg, weights)
    image = random_image(64)
    reference, header_bytes, floats_read = darknet_forward(cfg, weights, image)
    assert floats_read == n and header_bytes + 4 * n == os.path.getsize(weights)
    outputs = keras_outputs(model, image)
    assert [o.shape for o in outputs] == [r.shape for r in reference]
    assert max(relative_errors(outputs, reference)) <= 1e-4


def test_stride2_padding_is_keras_yolo3s_top_left():
    assert darknet._stride_padding(3, 2, 1) == (1, 0)
    assert darknet._stride_padding(5, 2, 2) == (2, 1)
    assert darknet._stride_padding(1, 2, 0) == (0, 0)


@pytest.mark.parametrize("name", ["yolov3-tiny.cfg", "darknet53.cfg"])
def test_real_cfg_matches_numpy_darknet(tmp_path, name):
    cfg = official_cfg(name)
    weights = str(tmp_path / "random.weights")
    n = random_weights_file(cfg, weights, seed=5)
    model = load_darknet(cfg, weights)
    assert model.count_params() == n  # both count BN's 4 vectors per channel
    image = random_image(64)
    reference, header_bytes, floats_read = darknet_forward(cfg, weights, image)
    assert header_bytes + 4 * floats_read == os.path.getsize(weights)
    errors = relative_errors(keras_outputs(model, image), reference)
    print(f"{name}: relative error per output scale vs numpy Darknet (pjreddie BN): {errors}")
    assert max(errors) <= 1e-4


@pytest.mark.parametrize("convention", ["alexeyab", "keras-yolo3"])
def test_other_bn_conventions_match_their_formula(tmp_path, convention):
    cfg = official_cfg("yolov3-tiny.cfg")
    weights = str(tmp_path / "random.weights")
    random_weights_file(cfg, weights, seed=5)
    model = load_darknet(cfg, weights, darknet_bn=convention)
    image = random_image(64)
    outputs = keras_outputs(model, image)
    own = relative_errors(outputs, darknet_forward(cfg, weights, image, bn=convention)[0])
    # The generated variances (1e-8..1e2, some zero) make the formulas
    # disagree by far more than the tolerance: the reference can tell them apart.
    pjreddie = relative_errors(outputs, darknet_forward(cfg, weights, image, bn="pjreddie")[0])
    print(f"darknet_bn={convention}: vs its formula {own}, vs pjreddie's {pjreddie}")
    assert max(own) <= 1e-4
    assert min(pjreddie) > 1e-2


def test_matches_opencv_darknet_importer(tmp_path):
    """OpenCV 4's own Darknet importer as a second, compiled reference (skipped without it).

    OpenCV 5 dropped ``readNetFromDarknet``, and installing opencv-python 4
    next to the project's opencv-python-headless 5 would overwrite its cv2
    package; run with an OpenCV 4 ``cv2`` first on PYTHONPATH to include it.
    OpenCV's batch norm is a third formula (``sqrt(var + 1e-6)``), so the
    variances here stay in 0.1..10, where all Darknet formulas agree to 1e-6.
    """
    cv2 = pytest.importorskip("cv2")
    if not hasattr(cv2, "dnn") or not hasattr(cv2.dnn, "readNetFromDarknet"):
        pytest.skip(f"OpenCV {cv2.__version__} has no cv2.dnn.readNetFromDarknet (removed in OpenCV 5)")
    cfg = official_cfg("yolov3-tiny.cfg")
    sections = darknet.parse_cfg(cfg)
    convs, _ = darknet.infer_layers(sections)
    rng = np.random.default_rng(21)
    weights = random_weights(convs, seed=21)
    for w in weights:
        if w.gamma is not None:
            w.variance = (10.0 ** rng.uniform(-1, 1, w.variance.size)).astype(np.float32)
            w.gamma = (rng.uniform(0.5, 1.0, w.gamma.size) * np.sqrt(w.variance)).astype(np.float32)
    weights_path = str(tmp_path / "tiny.weights")
    write_weights(weights_path, weights)
    image = random_image(64, seed=3)
    net = cv2.dnn.readNetFromDarknet(cfg, weights_path)
    net.setInput(np.ascontiguousarray(image.transpose(2, 0, 1)[None]))
    # OpenCV names each conv after its Darknet index; a [yolo] layer's input is the conv before it.
    heads = [f"conv_{s.index - 1}" for s in sections if s.kind == "yolo"]
    opencv = [o[0].transpose(1, 2, 0) for o in net.forward(heads)]
    model = load_darknet(cfg, weights_path)
    errors = relative_errors(keras_outputs(model, image), opencv)
    raw = load_darknet(cfg, weights_path, darknet_bn="keras-yolo3")
    raw_errors = relative_errors(keras_outputs(raw, image), opencv)
    print(f"OpenCV {cv2.__version__} readNetFromDarknet vs converted yolov3-tiny: relative error per scale {errors}")
    print(f"  and vs keras-yolo3's conversion: {raw_errors}")
    assert max(errors) <= 1e-4
    assert min(raw_errors) > 1e-4  # even these moderate variances separate the formulas


def test_keras_bn_weights_are_exact_for_tiny_and_zero_variances():
    import keras

    variance = np.array([0.0, 1e-12, 1e-8, 1e-6, 1e-5, 9.99e-4, 1e-3, 1.001e-3, 0.5, 1.0, 100.0, 1e4], np.float32)
    n = variance.size
    rng = np.random.default_rng(0)
    gamma, beta = (rng.uniform(0.5, 1.5, n).astype(np.float32) for _ in range(2))
    # Inputs a few deviations (std, at least 1e-3) from the mean, and means of
    # that order too: TF evaluates x * inv - mean * inv, which in float32 loses
    # ~6e-8 * |x| / |x - mean| whatever the weights, folded or not.
    spread = np.maximum(np.sqrt(variance), 1e-3)
    mean = (rng.uniform(-2, 2, n) * spread).astype(np.float32)
    x = (mean + rng.normal(0, 1, (64, n)) * spread).astype(np.float32)
    for convention in ("pjreddie", "alexeyab"):
        folded = darknet.keras_bn_weights(gamma, beta, mean, variance, convention)
        assert all(a.dtype == np.float32 for a in folded)
        assert np.all(folded[3] >= 0)  # a valid moving variance, also for fine-tuning
        layer = keras.layers.BatchNormalization(epsilon=1e-3)
        layer.build((None, n))
        layer.set_weights(folded)
        keras_out = np.asarray(layer(x, training=False), np.float64)
        darknet_out = (x.astype(np.float64) - mean) / BN_DENOMINATORS[convention](
            variance.astype(np.float64)
        ) * gamma + beta
        error = np.abs(keras_out - darknet_out) / np.max(np.abs(darknet_out), axis=0)
        assert float(error.max()) <= 1e-6, (convention, error.max(axis=0))
    # Channels with d**2 >= epsilon keep gamma, beta and mean bit for bit.
    folded = darknet.keras_bn_weights(gamma, beta, mean, variance, "pjreddie")
    wide = variance >= 1.001e-3
    np.testing.assert_array_equal(folded[0][wide], gamma[wide])
    np.testing.assert_array_equal(folded[1], beta)
    np.testing.assert_array_equal(folded[2], mean)


def test_keras_yolo3_compat_stores_the_raw_arrays(tmp_path):
    import keras
    import tf_keras

    from keras_yolo_mgpu.model.yolo3 import tiny_yolo_body

    # keras-yolo3's convert.py builds BatchNormalization() with Keras 2's default epsilon.
    assert tf_keras.layers.BatchNormalization().epsilon == 1e-3
    cfg = official_cfg("yolov3-tiny.cfg")
    weights = str(tmp_path / "tiny.weights")
    random_weights_file(cfg, weights, seed=9)
    convert(cfg, weights, tmp_path / "compat.weights.h5", darknet_bn="keras-yolo3")
    body = tiny_yolo_body(keras.Input((None, None, 3)), 3, 80)
    body.load_weights(str(tmp_path / "compat.weights.h5"))
    convs, _ = darknet.infer_layers(darknet.parse_cfg(cfg))
    _, raw = darknet.read_weights(weights, convs)
    bns = [layer for layer in body.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(bns) == sum(w.gamma is not None for w in raw) == 11
    # tiny_yolo_body's layer order is not the cfg's: pair layers by their (random, unique) gamma.
    by_gamma = {w.gamma.tobytes(): w for w in raw if w.gamma is not None}
    for layer in bns:
        assert layer.epsilon == 1e-3
        stored = layer.get_weights()
        w = by_gamma.pop(stored[0].tobytes())
        for array, original in zip(stored, (w.gamma, w.beta, w.mean, w.variance)):
            np.testing.assert_array_equal(array, original)
    assert not by_gamma
    image = random_image(64)
    errors = relative_errors(keras_outputs(body, image), darknet_forward(cfg, weights, image, bn="keras-yolo3")[0])
    assert max(errors) <= 1e-5


def test_bn_flags_conflict():
    with pytest.raises(SystemExit) as exit_info:
        main(["a.cfg", "b.weights", "out.keras", "--keras-yolo3-compat", "--darknet-bn", "alexeyab"])
    assert exit_info.value.code == 2


def test_parameter_counts_of_real_cfgs():
    # keras-yolo3's parameter counts for 80 classes (its yolo_body and tiny_yolo_body, model.count_params()).
    for name, expected in (("yolov3.cfg", 62_001_757), ("yolov3-tiny.cfg", 8_858_734)):
        convs, _ = darknet.infer_layers(darknet.parse_cfg(official_cfg(name)))
        assert sum(c.num_floats for c in convs) == expected


def test_tiny_converts_into_tiny_yolo_body(tmp_path):
    import keras

    from keras_yolo_mgpu.model.yolo3 import tiny_yolo_body

    cfg = official_cfg("yolov3-tiny.cfg")
    weights = str(tmp_path / "tiny.weights")
    random_weights_file(cfg, weights, seed=7)
    result = convert(cfg, weights, tmp_path / "out" / "tiny.weights.h5")
    assert result.architecture == "tiny_yolo_body"
    assert result.num_classes == 80 and result.masks == [[3, 4, 5], [1, 2, 3]]
    assert os.listdir(tmp_path / "out") == ["tiny.weights.h5"]  # no temp or cfg copy left

    body = tiny_yolo_body(keras.Input((None, None, 3)), 3, 80)
    body.load_weights(str(tmp_path / "out" / "tiny.weights.h5"))
    generic = load_darknet(cfg, weights)
    image = random_image(64, seed=2)
    reference, _, _ = darknet_forward(cfg, weights, image)
    from_body = keras_outputs(body, image)
    np.testing.assert_allclose(
        np.concatenate([o.ravel() for o in from_body]),
        np.concatenate([o.ravel() for o in keras_outputs(generic, image)]),
        atol=1e-5,
    )
    assert max(relative_errors(from_body, reference)) <= 1e-4

    # .keras holds the whole tiny_yolo_body; --generic keeps the cfg-built model.
    convert(cfg, weights, tmp_path / "tiny.keras")
    loaded = load_converted(tmp_path / "tiny.keras")
    assert loaded.name == "tiny_yolo_body"
    assert max(relative_errors(keras_outputs(loaded, image), reference)) <= 1e-4
    result = convert(cfg, weights, tmp_path / "generic.weights.h5", generic=True)
    assert result.architecture == "generic" and os.path.isfile(result.cfg_copy_path)


def test_same_weight_shapes_but_different_wiring_stays_generic(tmp_path):
    # Swapping the route's concat order keeps every weight shape of
    # tiny_yolo_body but changes the network: the output check must notice.
    text = open(official_cfg("yolov3-tiny.cfg")).read().replace("layers = -1, 8", "layers = 8, -1")
    cfg = write_cfg(tmp_path, "swapped", text)
    weights = str(tmp_path / "w.weights")
    random_weights_file(cfg, weights)
    sections = darknet.parse_cfg(cfg)
    convs, yolos = darknet.infer_layers(sections)
    model = darknet.build_model(sections, darknet.read_weights(weights, convs)[1])
    body, why = build_matching_body(model, yolos)
    assert body is None and "different outputs" in why


def test_generic_outputs_keras_and_weights_h5(tmp_path):
    cfg = write_cfg(tmp_path, "spp", MINI_SPP)
    weights = str(tmp_path / "spp.weights")
    random_weights_file(cfg, weights, seed=11)
    image = random_image(64, seed=4)
    reference, _, _ = darknet_forward(cfg, weights, image)

    result = convert(cfg, weights, tmp_path / "spp.keras")
    assert result.architecture == "generic" and result.cfg_copy_path is None
    loaded = load_converted(tmp_path / "spp.keras")
    assert max(relative_errors(keras_outputs(loaded, image), reference)) <= 1e-4

    result = convert(cfg, weights, tmp_path / "spp.weights.h5")
    assert result.cfg_copy_path == str(tmp_path / "spp.weights.h5") + ".cfg"
    assert open(result.cfg_copy_path).read() == MINI_SPP
    loaded = load_converted(tmp_path / "spp.weights.h5")
    assert max(relative_errors(keras_outputs(loaded, image), reference)) <= 1e-4


def test_short_file_names_the_layer_and_writes_nothing(tmp_path):
    cfg = write_cfg(tmp_path, "mini", MINI_YOLO)
    weights = tmp_path / "w.weights"
    random_weights_file(cfg, weights)
    raw = weights.read_bytes()
    weights.write_bytes(raw[: -4 * 30])  # the last conv (layer 12, line of its header) loses 30 floats
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DarknetError, match=r"layer 12 \[convolutional\] \(line \d+\)"):
        convert(cfg, weights, out / "m.weights.h5")
    weights.write_bytes(raw + b"\0" * 8)
    with pytest.raises(DarknetError, match="2 floats left over"):
        convert(cfg, weights, out / "m.keras")
    assert os.listdir(out) == []


def test_failed_save_leaves_no_partial_file(tmp_path, monkeypatch):
    import keras

    cfg = write_cfg(tmp_path, "mini", MINI_TINY)
    weights = tmp_path / "w.weights"
    random_weights_file(cfg, weights)

    def broken_save(self, path, *args, **kwargs):
        open(path, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(keras.Model, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        convert(cfg, weights, tmp_path / "out" / "m.keras")
    assert os.listdir(tmp_path / "out") == []


def test_unsupported_cfgs_are_named(tmp_path):
    cfg = write_cfg(tmp_path, "bad", NET + "\n" + conv(8) + "\n\n[dropout]\nprobability=.5\n")
    with pytest.raises(DarknetError, match=r"layer 1 \[dropout\] \(line 17\).*not supported"):
        darknet.infer_layers(darknet.parse_cfg(cfg))
    cfg = write_cfg(tmp_path, "bad2", NET + "\n" + conv(8) + "\n\n[route]\nlayers=-3\n")
    with pytest.raises(DarknetError, match=r"layer 1 \[route\].*not an earlier layer"):
        darknet.infer_layers(darknet.parse_cfg(cfg))
    cfg = write_cfg(tmp_path, "bad3", NET + "\n" + conv(8, activation="swish"))
    with pytest.raises(DarknetError, match="activation 'swish'"):
        darknet.infer_layers(darknet.parse_cfg(cfg))


def test_output_suffix_is_checked():
    check_output_path("model_data/yolo.h5")  # keras-yolo3's own output: Keras 2 HDF5
    with pytest.raises(ValueError, match=r"must end in `\.h5`.*Received: output_path=model_data/yolo\.txt"):
        check_output_path("model_data/yolo.txt")
    with pytest.raises(ValueError, match=r"a `\.keras` file holds the whole model"):
        check_output_path("model_data/yolo.keras", weights_only=True)
    with pytest.raises(SystemExit) as exit_info:
        main(["a.cfg", "b.weights", "model_data/yolo.txt"])
    assert exit_info.value.code == 2


def test_main_reports_mismatch_as_error(tmp_path, capsys):
    cfg = write_cfg(tmp_path, "mini", MINI_TINY)
    other = write_cfg(tmp_path, "other", MINI_SPP)
    weights = str(tmp_path / "w.weights")
    random_weights_file(other, weights)
    assert main([cfg, weights, str(tmp_path / "m.keras")]) == 1
    assert "do not match this cfg" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "m.keras")


def test_convert_script_runs(tmp_path):
    cfg = write_cfg(tmp_path, "mini", MINI_YOLO)
    weights = str(tmp_path / "w.weights")
    random_weights_file(cfg, weights)
    anchors = tmp_path / "anchors.txt"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "convert.py"),
            cfg,
            weights,
            str(tmp_path / "mini.keras"),
            "--anchors-output",
            str(anchors),
        ],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "as generic" in proc.stdout
    assert anchors.read_text() == "10,13,  16,30,  33,23,  30,61,  62,45,  59,119\n"
    image = random_image(64)
    reference, _, _ = darknet_forward(cfg, weights, image)
    assert max(relative_errors(keras_outputs(load_converted(tmp_path / "mini.keras"), image), reference)) <= 1e-4


@pytest.mark.slow
def test_yolov3_converts_into_yolo_body_and_matches_numpy(tmp_path):
    """The goal: yolov3.cfg + random weights reproduce numpy Darknet to 1e-4."""
    import keras

    from keras_yolo_mgpu.model.yolo3 import yolo_body

    cfg = official_cfg("yolov3.cfg")
    weights = str(tmp_path / "yolov3.weights")
    n = random_weights_file(cfg, weights, seed=13)
    start = time.perf_counter()
    result = convert(cfg, weights, tmp_path / "yolo.weights.h5")
    convert_s = time.perf_counter() - start
    assert result.architecture == "yolo_body" and result.num_floats == n == 62_001_757

    body = yolo_body(keras.Input((None, None, 3)), 3, 80)
    body.load_weights(str(tmp_path / "yolo.weights.h5"))
    image = random_image(64, seed=6)
    reference, header_bytes, floats_read = darknet_forward(cfg, weights, image)
    assert header_bytes + 4 * floats_read == os.path.getsize(weights)
    outputs = keras_outputs(body, image)
    assert [o.shape for o in outputs] == [(2, 2, 255), (4, 4, 255), (8, 8, 255)]
    errors = relative_errors(outputs, reference)
    print(f"yolov3.cfg conversion: relative error per output scale {errors}, convert {convert_s:.1f} s")
    assert max(errors) <= 1e-4


def _convert_v4(tmp_path, name, expected_bytes, seed):
    """Generated weights of the official file size, converted; (result, cfg, weights path)."""
    cfg = official_cfg(name)
    weights = str(tmp_path / f"{name}.weights")
    random_weights_file(cfg, weights, seed=seed)
    assert os.path.getsize(weights) == expected_bytes  # the official release's size (docs/training.md)
    return convert(cfg, weights, tmp_path / "out.weights.h5"), cfg, weights


def test_yolov4_tiny_converts_into_yolo4_tiny_body_and_matches_numpy(tmp_path):
    import keras

    from keras_yolo_mgpu.model.yolo4 import yolo4_tiny_body
    from keras_yolo_mgpu.weights.metadata import read_metadata

    result, cfg, weights = _convert_v4(tmp_path, "yolov4-tiny.cfg", 24_251_276, seed=17)
    assert result.architecture == "yolo4_tiny_body"
    assert read_metadata(result.output_path).kind == "yolov4-tiny"
    assert result.num_classes == 80 and result.masks == [[3, 4, 5], [1, 2, 3]]
    body = yolo4_tiny_body(keras.Input((None, None, 3)), 3, 80)
    body.load_weights(result.output_path)
    image = random_image(64, seed=8)
    # AlexeyAB/darknet is the only Darknet that runs this cfg: its batch norm is the default here.
    reference, _, floats_read = darknet_forward(cfg, weights, image, bn="alexeyab")
    assert floats_read == result.num_floats
    outputs = keras_outputs(body, image)
    assert [o.shape for o in outputs] == [(2, 2, 255), (4, 4, 255)]
    errors = relative_errors(outputs, reference)
    print(f"yolov4-tiny.cfg conversion: relative error per output scale {errors}")
    assert max(errors) <= 1e-4


@pytest.mark.slow
def test_yolov4_converts_into_yolo4_body_and_matches_numpy(tmp_path):
    import keras

    from keras_yolo_mgpu.model.yolo4 import yolo4_body

    result, cfg, weights = _convert_v4(tmp_path, "yolov4.cfg", 257_717_640, seed=19)
    assert result.architecture == "yolo4_body"
    # The cfg lists the fine scale first; the body and its masks are coarse first.
    assert result.masks == [[6, 7, 8], [3, 4, 5], [0, 1, 2]]
    body = yolo4_body(keras.Input((None, None, 3)), 3, 80)
    body.load_weights(result.output_path)
    image = random_image(64, seed=9)
    reference, _, _ = darknet_forward(cfg, weights, image, bn="alexeyab")
    outputs = keras_outputs(body, image)
    assert [o.shape for o in outputs] == [(2, 2, 255), (4, 4, 255), (8, 8, 255)]
    errors = relative_errors(outputs, reference[::-1])
    print(f"yolov4.cfg conversion: relative error per output scale {errors}")
    assert max(errors) <= 1e-4


NETWORK_CFGS = ("yolov3.cfg", "yolov3-tiny.cfg", "yolov4.cfg", "yolov4-tiny.cfg")


def test_v4_cfgs_use_alexeyab_features_and_v3_cfgs_do_not():
    features = {name: darknet.alexeyab_only_features(darknet.parse_cfg(official_cfg(name))) for name in NETWORK_CFGS}
    assert features["yolov4.cfg"] == ["mish", "scale_x_y"]
    assert features["yolov4-tiny.cfg"] == ["grouped route", "scale_x_y"]
    assert features["yolov3.cfg"] == features["yolov3-tiny.cfg"] == []


def test_tiny_masks_default_to_keras_yolo3s_with_a_warning(tmp_path, caplog):
    from keras_yolo_mgpu.weights.convert import choose_masks, parse_masks

    # pjreddie's later yolov3-tiny.cfg: mask 0,1,2 on the fine scale.
    text = open(official_cfg("yolov3-tiny.cfg")).read().replace("mask = 1,2,3", "mask = 0,1,2")
    cfg = write_cfg(tmp_path, "tiny012", text)
    weights = str(tmp_path / "w.weights")
    random_weights_file(cfg, weights)
    with caplog.at_level("WARNING"):
        result = convert(cfg, weights, tmp_path / "t.weights.h5")
    assert result.masks == [[3, 4, 5], [1, 2, 3]]
    assert "AlexeyAB/darknet#1341" in caplog.text and "--masks cfg" in caplog.text
    cfg_masks = [[3, 4, 5], [0, 1, 2]]
    assert choose_masks("cfg", cfg_masks, 6) == cfg_masks
    assert choose_masks("keras-yolo3", cfg_masks, 6) == [[3, 4, 5], [1, 2, 3]]
    assert choose_masks(parse_masks("3,4,5 0,1,2"), cfg_masks, 6) == cfg_masks
    assert choose_masks("auto", [[6, 7, 8], [3, 4, 5], [0, 1, 2]], 9) == [[6, 7, 8], [3, 4, 5], [0, 1, 2]]
    with pytest.raises(ValueError, match="2 masks of 3"):
        choose_masks(parse_masks("3,4,5"), cfg_masks, 6)
    with pytest.raises(ValueError, match="--masks must be"):
        parse_masks("three")
