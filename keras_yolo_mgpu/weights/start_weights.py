"""Darknet `.weights` as a run's start weights (`train.py --weights yolov3-tiny.weights`).

The file is converted exactly as `convert.py` converts it (`weights.convert`,
default masks and batch-norm convention) into the run folder, and the run
trains from the converted file. Its cfg is `--cfg`, else a `.cfg` of the
same name beside the file, else, when the file's size is one of the four
official nets', that net's cfg (`yolov3-tiny.cfg`, ...) beside the file,
else the copy of that cfg shipped in `model_data/`.
`start_weights.json` in the run folder records where the weights came from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile

from keras_yolo_mgpu.data.scan import cache_dir
from keras_yolo_mgpu.resources import model_data_path
from keras_yolo_mgpu.weights.convert import convert
from keras_yolo_mgpu.weights.download import DARKNET_SUFFIX, OFFICIAL_WEIGHTS

logger = logging.getLogger(__name__)

CONVERTED = "start_weights.weights.h5"
SOURCE_RECORD = "start_weights.json"
# Bytes of the official Darknet files, header included (docs/training.md) -> the net's name.
OFFICIAL_SIZES = {entry.size: name for name, entry in OFFICIAL_WEIGHTS.items()}


def find_cfg(weights_path: str, cfg_path: str | None = None) -> str:
    """The Darknet cfg of `weights_path`: `cfg_path`, a same-named `.cfg`, or the official net's by file size.

    The official net's cfg is looked for beside the file first (a user's
    edited copy wins), then in the shipped `model_data/`; the shipped one is
    logged, as nothing on the command line named it.

    Raises:
        FileNotFoundError: no cfg found; the message says where it looked
            and which official net the size matches, if any.
    """
    if cfg_path:
        if not os.path.isfile(cfg_path):
            raise FileNotFoundError(f"--cfg: file not found: {cfg_path}")
        return cfg_path
    folder = os.path.dirname(os.path.abspath(weights_path))
    candidates = [weights_path[: -len(DARKNET_SUFFIX)] + ".cfg"]
    official = OFFICIAL_SIZES.get(os.path.getsize(weights_path))
    if official:
        candidates.append(os.path.join(folder, official + ".cfg"))
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    if official:
        try:
            shipped = model_data_path(official + ".cfg")
        except FileNotFoundError as error:  # an install without the cfgs: say so with the rest
            candidates.append(str(error))
        else:
            logger.info(
                "%s: no cfg beside it; its size is the official %s's, so it takes the shipped %s",
                weights_path,
                official,
                shipped,
            )
            return shipped
    recognised = f"; its size is the official {official}'s" if official else ""
    raise FileNotFoundError(
        f"{weights_path} is Darknet weights: its network needs a cfg{recognised}. Looked for "
        f"{' and '.join(candidates)}; pass --cfg path/to/net.cfg"
    )


def _md5(path: str) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def resolve_start_weights(config, run_dir: str) -> str | None:
    """The Keras file a run starts from: `config.weights`, Darknet weights converted into `run_dir` first.

    A resumed run reuses its converted file. Leaves a `.weights.h5` /
    `.keras` / `.h5` path as it is. `args.json` keeps the Darknet path
    (written before this runs); `run_dir/start_weights.json` records the
    source file, its cfg, size and md5.
    """
    if not (config.weights or "").endswith(DARKNET_SUFFIX):  # a Keras `.weights.h5` does not
        return config.weights
    converted = os.path.join(run_dir, CONVERTED)
    if not (config.resume and os.path.isfile(converted)):
        cfg = find_cfg(config.weights, config.cfg)
        logger.info("--weights %s: Darknet weights, converting with %s (as convert.py)", config.weights, cfg)
        result = convert(cfg, config.weights, converted)
        record = {
            "source": os.path.abspath(config.weights),
            "cfg": os.path.abspath(cfg),
            "bytes": os.path.getsize(config.weights),
            "md5": _md5(config.weights),
            "official_net": OFFICIAL_SIZES.get(os.path.getsize(config.weights)),
            "architecture": result.architecture,
            "converted": converted,
        }
        with open(os.path.join(run_dir, SOURCE_RECORD), "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=2)
    return converted


def darknet_as_keras(weights_path: str | None, cfg_path: str | None = None) -> str | None:
    """A Darknet `.weights` file as a Keras weights file the detector loads; any other path as it is.

    The conversion (`weights.convert`, as convert.py makes it) is made once and
    kept in the cache folder (`data.scan.cache_dir()`/weights/converted),
    named by the source file's path, size, time and cfg, so `yolo_video.py
    --model yolov3-tiny` converts on its first run only. With the cache turned
    off it goes to a temporary folder for this process.
    """
    if not weights_path or not weights_path.endswith(DARKNET_SUFFIX) or not os.path.isfile(weights_path):
        return weights_path
    cfg = find_cfg(weights_path, cfg_path)
    stat = os.stat(weights_path)
    key = f"{os.path.abspath(weights_path)}|{stat.st_size}|{stat.st_mtime_ns}|{os.path.abspath(cfg)}"
    name = os.path.basename(weights_path)[: -len(DARKNET_SUFFIX)]
    root = cache_dir()
    folder = os.path.join(root, "weights", "converted") if root else tempfile.mkdtemp(prefix="converted_weights_")
    converted = os.path.join(folder, f"{name}-{hashlib.sha1(key.encode()).hexdigest()[:12]}.weights.h5")
    if os.path.isfile(converted):
        logger.info("%s: Darknet weights, converted earlier: %s", weights_path, converted)
        return converted
    logger.info("%s: Darknet weights, converting with %s (as convert.py) into %s", weights_path, cfg, converted)
    convert(cfg, weights_path, converted)
    return converted
