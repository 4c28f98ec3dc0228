"""Class-name and anchor files in keras-yolo3's format, and where they live.

`model_data/` sits at the repository root (where keras-yolo3 users look for
it) and is also installed as package data, so installed commands find the
default files without a checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

_PACKAGE_DIR = Path(__file__).resolve().parent
# Installed wheel: keras_yolo_mgpu/model_data; checkout or editable install:
# the repository's model_data/ next to the package.
_MODEL_DATA_DIRS = (_PACKAGE_DIR / "model_data", _PACKAGE_DIR.parent / "model_data")


def model_data_path(name: str) -> str:
    """Path of a file shipped in `model_data/`, e.g. `"coco_classes.txt"`.

    Raises:
        FileNotFoundError: when no `model_data/` folder holds `name`.
    """
    for folder in _MODEL_DATA_DIRS:
        candidate = folder / name
        if candidate.is_file():
            return str(candidate)
    raise FileNotFoundError(f"{name} is not in model_data/ (looked in {', '.join(map(str, _MODEL_DATA_DIRS))})")


# The default anchors of each network `--model` names (`model.architectures.MODEL_NAMES`).
MODEL_ANCHORS_FILES = {
    "yolov3": "yolo_anchors.txt",
    "yolov3-tiny": "tiny_yolo_anchors.txt",
    "yolov4": "yolo4_anchors.txt",
    "yolov4-tiny": "yolo4_tiny_anchors.txt",
}

# The shipped file each kind of resource falls back to.
DEFAULT_FILES = {
    "classes": "coco_classes.txt",
    "voc_classes": "voc_classes.txt",
    "anchors": MODEL_ANCHORS_FILES["yolov3"],
    "tiny_anchors": MODEL_ANCHORS_FILES["yolov3-tiny"],
}

# keras-yolo3's detection weights, relative to the folder a command runs in (its yolo.py's `model_path`).
DEFAULT_MODEL_PATH = os.path.join("model_data", "yolo.h5")


def missing_model_message(model_path: str, option: str) -> str:
    """The error for detection weights that are not there; for keras-yolo3's default file, how to make it.

    `option`: how the caller sets the weights, with `{}` for the value (`--model {}`, `model_path="{}"`).
    """
    message = f"model weights not found: {model_path}"
    if os.path.normpath(model_path) != DEFAULT_MODEL_PATH:
        return message
    return (
        f"{message}, the default. Make it as keras-yolo3's README does: "
        "python convert.py yolov3.cfg yolov3.weights model_data/yolo.h5 (the official weights are downloaded when "
        f"missing); or pass {option.format('FILE')}, or {option.format('yolov3')} for the official weights by name"
    )


def resolve_resource(path: str | os.PathLike | None, kind: str, *, tiny: bool = False, model: str | None = None) -> str:
    """`path` when given, else the shipped default of `kind` in `model_data/`.

    The one place every command and library entry point picks its default
    class or anchor file.

    Args:
        path: the user's file, or None (or "") for the default.
        kind: "classes" (COCO's 80), "voc_classes" (VOC's 20) or "anchors".
        tiny: with kind "anchors": tiny YOLOv3's 6 anchors instead of 9.
        model: with kind "anchors": the default anchors of this network
            (`model.architectures.MODEL_NAMES`), e.g. yolo4_anchors.txt.

    Raises:
        ValueError: unknown `kind` or `model`.
    """
    if path:
        return os.fspath(path)
    if kind == "anchors" and model is not None:
        if model not in MODEL_ANCHORS_FILES:
            raise ValueError(f"model must be one of {tuple(MODEL_ANCHORS_FILES)}. Received: model={model!r}")
        return model_data_path(MODEL_ANCHORS_FILES[model])
    if kind == "anchors" and tiny:
        kind = "tiny_anchors"
    if kind not in DEFAULT_FILES:
        raise ValueError(f"kind must be one of {sorted(DEFAULT_FILES)}. Received: kind={kind!r}")
    return model_data_path(DEFAULT_FILES[kind])


def default_anchors_path(tiny: bool = False, model: str | None = None) -> str:
    """The standard anchors of `model` (`model.architectures.MODEL_NAMES`), else of tiny YOLOv3 or YOLOv3."""
    return resolve_resource(None, "anchors", tiny=tiny, model=model)


def get_classes(classes_path: str | os.PathLike) -> list[str]:
    """Reads class names, one per line; class id = the line's position. Blank lines at the end are ignored.

    A blank line before the last name is refused: keras-yolo3 reads it as a
    class named "", skipping it would shift every later class id, and either
    way the labels would name the wrong classes.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file names no class, has a blank line among the
            names (its line number given), or names one class twice.
    """
    path = Path(classes_path)
    if not path.is_file():
        raise FileNotFoundError(f"classes file not found: {path}")
    names = [line.strip() for line in path.read_text(encoding="utf-8-sig").splitlines()]
    while names and not names[-1]:
        names.pop()
    if "" in names:
        raise ValueError(
            f"{path}, line {names.index('') + 1}: blank line among the class names; class ids are line positions, "
            "so remove the line (the classes after it then move up one id) or write the class's name on it"
        )
    if not names:
        raise ValueError(f"{path}: no class names (expected one name per line)")
    seen: dict[str, int] = {}
    for index, name in enumerate(names):
        if name in seen:
            raise ValueError(f"{path}: class {name!r} is listed twice (entries {seen[name] + 1} and {index + 1})")
        seen[name] = index
    return names


def parse_anchors(text: str, source: str = "<string>") -> np.ndarray:
    """Parses `"10,13,  16,30, ..."` into a float32 array of shape (num_anchors, 2).

    Anchors are (width, height) in pixels of the network input.
    """
    tokens = [token.strip() for token in text.replace("\n", ",").split(",") if token.strip()]
    try:
        values = [float(token) for token in tokens]
    except ValueError as error:
        raise ValueError(f"{source}: anchors must be comma-separated numbers ({error})") from None
    if len(values) % 2:
        raise ValueError(f"{source}: anchors need an even count of numbers (width,height pairs); got {len(values)}")
    anchors = np.array(values, dtype=np.float32).reshape(-1, 2)
    if len(anchors) not in (6, 9):
        raise ValueError(f"{source}: expected 9 anchors (YOLOv3) or 6 (tiny YOLOv3); got {len(anchors)}")
    if (anchors <= 0).any():
        raise ValueError(f"{source}: anchor widths and heights must be positive")
    return anchors


def get_anchors(anchors_path: str | os.PathLike) -> np.ndarray:
    """Reads an anchors file; returns float32 (num_anchors, 2) as (width, height)."""
    path = Path(anchors_path)
    if not path.is_file():
        raise FileNotFoundError(f"anchors file not found: {path}")
    return parse_anchors(path.read_text(encoding="utf-8-sig"), source=str(path))


def format_anchors(anchors: np.ndarray) -> str:
    """Inverse of `parse_anchors`: one line, keras-yolo3 spacing."""
    return ",  ".join(f"{int(round(w))},{int(round(h))}" for w, h in np.asarray(anchors).reshape(-1, 2))
