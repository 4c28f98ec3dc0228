"""`python -m keras_yolo_mgpu.copy_scripts [FOLDER]`: this project's scripts into a keras-yolo3 folder.

keras-yolo3's commands are its scripts in its folder (`python train.py`, `python yolo_video.py
--image`, ...). This command writes this project's scripts of the same names there, so those
command lines run this project, with the folder's data, `model_data/` and weights:

    python -m keras_yolo_mgpu.copy_scripts ~/keras-yolo3

A script of the folder's own (keras-yolo3's, or a user's) is moved into
`keras-yolo3-originals/`, never deleted or overwritten. The values a user edited in
keras-yolo3's `train.py` or `train_bottleneck.py` (its README: "Modify train.py and start
training") are carried into the new script's `SETTINGS` block (`cli.keras_yolo3_folder`). A
script that already runs this project is left as it is. The checkout's own top-level scripts
are this module's texts (`script_text`; tests/test_copy_scripts.py compares them).
"""

from __future__ import annotations

import ast
import logging
import os
import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli import args as cli
from keras_yolo_mgpu.cli.runner import CommandError, run_command
from keras_yolo_mgpu.fileio import atomic_write

logger = logging.getLogger("copy_scripts")

ORIGINALS = "keras-yolo3-originals"
# Each script: the command module it runs (`keras_yolo_mgpu.cli.<module>`) and its docstring's first line.
COMMANDS = {
    "train.py": ("train", "Train YOLOv3 on one or several GPUs."),
    "train_bottleneck.py": (
        "train_bottleneck",
        "keras-yolo3's train_bottleneck.py: train.py's two stages after the output convolutions train on cached "
        "features.",
    ),
    "yolo_video.py": ("detect", "Detect objects in images or a video."),
    "convert.py": ("convert", "Convert Darknet .cfg + .weights to a Keras 3 file."),
    "kmeans.py": ("kmeans", "Anchors by IoU k-means over the boxes of an annotation file."),
    "voc_annotation.py": ("voc", "Pascal VOC XML to keras-yolo3 annotation lines."),
    "coco_annotation.py": ("coco", "COCO instances JSON to keras-yolo3 annotation lines."),
    "evaluate.py": ("evaluate", "mAP of weights, or of saved detections, on an annotation file."),
}
YOLO_MODULE = '''"""keras-yolo3's yolo.py, for scripts written against it: `from yolo import YOLO, detect_video`.

`YOLO` takes keras-yolo3's arguments (model_path, anchors_path, classes_path, score, iou,
model_image_size, gpu_num, and its yolo_video.py's flags as `YOLO(**vars(FLAGS))` passes them),
has its `_defaults`, `get_defaults`, `detect_image` and `close_session`. The detector lives in
keras_yolo_mgpu/inference/detector.py, `detect_video` in inference/media.py.
"""

{import_line}
from keras_yolo_mgpu.inference.media import detect_video
{settings}
__all__ = ["YOLO", "detect_video"]
'''
_YOLO_SETTINGS = """
# keras-yolo3's `YOLO._defaults` as this folder's yolo.py set them ({originals}/yolo.py): the defaults of
# `YOLO(...)` here, and an argument given wins.
SETTINGS = dict(
{lines})
YOLO = Detector.with_defaults(**SETTINGS)
"""
SCRIPTS = (*COMMANDS, "yolo.py")
# Where keras-yolo3 keeps the values a script's `SETTINGS` take, when not in the script itself.
_SETTINGS_SOURCE = {"yolo_video.py": "yolo.py (YOLO._defaults)", "yolo.py": "yolo.py (YOLO._defaults)"}

# What keras-yolo3's train.py and train_bottleneck.py set, unedited: `SETTINGS` names -> values (weights_path:
# YOLOv3's, then tiny YOLOv3's), and what each line of the block says beside keras-yolo3's value.
KERAS_YOLO3_VALUES = {
    "train.py": {
        "annotation_path": "train.txt",
        "classes_path": "model_data/voc_classes.txt",
        "anchors_path": "model_data/yolo_anchors.txt",
        "weights_path": ("model_data/yolo_weights.h5", "model_data/tiny_yolo_weights.h5"),
        "log_dir": "logs/000/",
        "input_shape": (416, 416),
        "val_split": 0.1,
        "batch_size": 32,
        "batch_size2": 32,
        "freeze_epochs": 50,
        "epochs": 100,
    },
    "train_bottleneck.py": {
        "annotation_path": "train.txt",
        "classes_path": "model_data/coco_classes.txt",
        "anchors_path": "model_data/yolo_anchors.txt",
        "weights_path": ("model_data/yolo_weights.h5",),
        "log_dir": "logs/000/",
        "input_shape": (416, 416),
        "val_split": 0.1,
        "bottleneck_epochs": 30,
        "batch_size": 16,
        "batch_size2": 4,
        "freeze_epochs": 50,
        "epochs": 100,
    },
    # keras-yolo3's yolo.py `YOLO._defaults`, which its yolo_video.py takes as its flags' defaults.
    "yolo_video.py": {
        "model_path": "model_data/yolo.h5",
        "anchors_path": "model_data/yolo_anchors.txt",
        "classes_path": "model_data/coco_classes.txt",
        "score": 0.3,
        "iou": 0.45,
        "model_image_size": (416, 416),
        "gpu_num": 1,
    },
}
_BESIDE = {
    "log_dir": "; here the next free logs/NNN",
    "input_shape": ", multiples of 32, hw",
    "model_image_size": ", multiples of 32, hw",
    "bottleneck_epochs": ", in batches of 8",
    "batch_size": ", the first stage",
    "batch_size2": ", the second stage",
    "freeze_epochs": ", the first stage's, with the body frozen",
    "epochs": " in all",
}
_TRAIN_COMMENT = """\
# keras-yolo3's README: "Modify train.py and start training." This script's settings, under
# keras-yolo3's names; each stands for a flag, and that flag on the command line wins. None
# leaves the setting to its flag's default (`python {script} --help`) and to what this folder
# holds. A dataset flag (--data, --annotations) on the command line replaces annotation_path and
# classes_path.
"""
_SETTINGS_COMMENT = {
    "train.py": _TRAIN_COMMENT,
    "train_bottleneck.py": _TRAIN_COMMENT,
    "yolo_video.py": """\
# keras-yolo3's yolo.py `YOLO._defaults`, the defaults of its yolo_video.py's flags, under its
# names; each stands for a flag, and that flag on the command line wins. None leaves the setting
# to its flag's default (`python {script} --help`): the classes, anchors and input size the
# weights file records, else keras-yolo3's.
""",
}
# The assignments keras-yolo3's `_main()` makes that a user edits (batch_size: once per stage), and the keywords of
# its calls (epochs: one per fit, the last stage's last; weights_path: the start weights of create_model).
_UNREAD = object()  # a value that is an expression, not a literal
_ASSIGNED = ("annotation_path", "classes_path", "anchors_path", "log_dir", "input_shape", "val_split", "batch_size")
_FIT_EPOCHS = {
    "train.py": ("freeze_epochs", "epochs"),
    "train_bottleneck.py": ("bottleneck_epochs", "freeze_epochs", "epochs"),
}


def script_text(name: str, settings: dict | None = None) -> str:
    """The text of this project's script `name`; `settings`: values for its `SETTINGS` block (train scripts)."""
    if name == "yolo.py":
        return _yolo_module(settings)
    module, summary = COMMANDS[name]
    lines = [
        "#!/usr/bin/env python3",
        f'"""{summary}',
        "",
        f"See `python {name} --help`; the command lives in keras_yolo_mgpu/cli/{module}.py.",
        '"""',
        "",
        "import sys",
        "",
        f"from keras_yolo_mgpu.cli.{module} import main",
        "",
    ]
    call = "main()"
    if name in KERAS_YOLO3_VALUES:
        lines += [*_SETTINGS_COMMENT[name].format(script=name).splitlines(), "SETTINGS = dict("]
        for setting, original in KERAS_YOLO3_VALUES[name].items():
            value = (settings or {}).get(setting)
            lines.append(f"    {setting}={value!r},  # {_beside(setting, original)}")
        lines += [")", ""]
        call = "main(settings=SETTINGS)"
    lines += ['if __name__ == "__main__":', f"    sys.exit({call})", ""]
    return "\n".join(lines)


def _yolo_module(settings: dict | None) -> str:
    """yolo.py's text: the detector class, or one whose defaults are `settings` (keras-yolo3's edited `_defaults`)."""
    if not settings:
        return YOLO_MODULE.format(import_line="from keras_yolo_mgpu.inference.detector import YOLO", settings="")
    originals = KERAS_YOLO3_VALUES["yolo_video.py"]
    lines = "".join(
        f"    {setting}={value!r},  # keras-yolo3: {originals[setting]!r}\n" for setting, value in settings.items()
    )
    return YOLO_MODULE.format(
        import_line="from keras_yolo_mgpu.inference.detector import YOLO as Detector",
        settings=_YOLO_SETTINGS.format(originals=ORIGINALS, lines=lines),
    )


def _beside(setting: str, original) -> str:
    """The comment beside a `SETTINGS` line: keras-yolo3's value."""
    if setting == "weights_path" and len(original) == 2:
        return f"keras-yolo3: {original[0]!r} ({original[1]!r}: 6 anchors)"
    if setting == "weights_path":
        return f"keras-yolo3: {original[0]!r}"
    return f"keras-yolo3: {original!r}{_BESIDE.get(setting, '')}"


def edited_settings(source: str, script: str) -> tuple[dict, list[str]]:
    """The values a user changed in keras-yolo3's `script` (its `_main()`), and what could not be carried.

    Returns:
        (`SETTINGS` name -> value, for each value that differs from keras-yolo3's; notes naming what was left).
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return {}, [f"not read ({error.msg}, line {error.lineno}): nothing carried"]
    main = next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "_main"), None)
    if main is None:
        return {}, ["no _main() in it: nothing carried"]
    found: dict[str, list] = {}
    notes: list[str] = []
    for node in sorted(ast.walk(main), key=lambda node: getattr(node, "lineno", 0)):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in _ASSIGNED:
                _collect(found, notes, node.targets[0].id, node.value)
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "weights_path" or (keyword.arg == "epochs" and _is_fit(node)):
                    _collect(found, notes, keyword.arg, keyword.value)
    values = {name: found[name][0] for name in _ASSIGNED if name in found and name != "batch_size"}
    # The last two batch sizes are the two stages' (train_bottleneck.py's first ones, stage 0's, are fixed here).
    values.update(zip(("batch_size2", "batch_size"), reversed(found.get("batch_size", []))))
    values.update(zip(reversed(_FIT_EPOCHS[script]), reversed(found.get("epochs", []))))
    originals = KERAS_YOLO3_VALUES[script]
    weights = [path for path in found.get("weights_path", []) if path not in (*originals["weights_path"], _UNREAD)]
    if len(set(weights)) == 1:
        values["weights_path"] = weights[0]
    elif weights:
        notes.append(f"weights_path set to {len(set(weights))} different files: set it in SETTINGS")
    return _changed(values, originals), notes


def edited_defaults(source: str) -> tuple[dict, list[str]]:
    """The values a user changed in keras-yolo3's yolo.py (`YOLO._defaults`), for yolo_video.py's `SETTINGS`.

    Returns:
        (setting -> value, for each value that differs from keras-yolo3's; notes naming what was left).
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return {}, [f"yolo.py not read ({error.msg}, line {error.lineno}): nothing carried"]
    found: dict[str, list] = {}
    notes: list[str] = []
    for node in tree.body:
        if not (isinstance(node, ast.ClassDef) and node.name == "YOLO"):
            continue
        for statement in node.body:
            if (
                isinstance(statement, ast.Assign)
                and [getattr(target, "id", None) for target in statement.targets] == ["_defaults"]
                and isinstance(statement.value, ast.Dict)
            ):
                for key, value in zip(statement.value.keys, statement.value.values):
                    if isinstance(key, ast.Constant) and key.value in KERAS_YOLO3_VALUES["yolo_video.py"]:
                        _collect(found, notes, key.value, value)
    return _changed({name: found[name][-1] for name in found}, KERAS_YOLO3_VALUES["yolo_video.py"]), notes


def _changed(values: dict, originals: dict) -> dict:
    """The read values that differ from keras-yolo3's (a size as a tuple, as its setting is written)."""
    sizes = {name: tuple(value) for name, value in values.items() if isinstance(value, list)}
    values = {**values, **sizes}
    return {name: value for name, value in values.items() if value is not _UNREAD and value != originals.get(name)}


def _is_fit(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr in ("fit", "fit_generator")


def _collect(found: dict, notes: list, name: str, expression: ast.expr) -> None:
    """Appends the value `name` is given to `found[name]`; an expression holds its place unread (a note says so)."""
    try:
        value = ast.literal_eval(expression)
    except ValueError:
        value = _UNREAD
        notes.append(f"{name} = {ast.unparse(expression)} is no plain value: set it in SETTINGS")
    found.setdefault(name, []).append(value)


def copy_scripts(folder: str) -> list[str]:
    """Writes this project's scripts into `folder`; returns what was done, one line per script.

    Every check runs before the first file moves.

    Raises:
        CommandError: `folder` is missing, or `keras-yolo3-originals/` already holds another file of a name to keep.
    """
    if not os.path.isdir(folder):
        raise CommandError(f"no such folder: {folder}")
    plan = []
    for name in SCRIPTS:
        target, kept = os.path.join(folder, name), os.path.join(folder, ORIGINALS, name)
        source = _foreign_source(target)
        if source is None and os.path.exists(target):
            plan.append((name, "ours", {}, []))
            continue
        if source is not None and os.path.exists(kept) and not _same_bytes(kept, target):
            raise CommandError(f"{kept} already holds another {name}: move it away first (nothing was changed)")
        plan.append((name, kept if source is not None else None, *_carried(folder, name)))
    report = []
    for name, kept, settings, notes in plan:
        target = os.path.join(folder, name)
        if kept == "ours":
            report.append(f"{name}: already this project's, left as it is")
            continue
        line = f"{name}: written"
        if kept:
            os.makedirs(os.path.dirname(kept), exist_ok=True)
            os.replace(target, kept)
            line += f"; the folder's own moved to {os.path.join(ORIGINALS, name)}"
        atomic_write(target, lambda path, name=name, settings=settings: _write_text(path, script_text(name, settings)))
        if settings:
            carried = ", ".join(f"{key}={value!r}" for key, value in settings.items())
            line += f"; carried into SETTINGS from {_SETTINGS_SOURCE.get(name, name)}: {carried}"
        report.extend([line, *(f"{_SETTINGS_SOURCE.get(name, name)}: {note}" for note in notes)])
    return report


def _foreign_source(path: str) -> str | None:
    """The text of `path` when it is a file that does not run this project (keras-yolo3's, a user's); else None."""
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as handle:
        source = handle.read()
    return None if "keras_yolo_mgpu" in source else source


def _carried(folder: str, name: str) -> tuple[dict, list[str]]:
    """The values edited in the folder's keras-yolo3 file that script `name`'s `SETTINGS` take, and notes."""
    if name not in (*KERAS_YOLO3_VALUES, "yolo.py"):
        return {}, []
    reads_defaults = name in ("yolo_video.py", "yolo.py")
    source = _foreign_source(os.path.join(folder, "yolo.py" if reads_defaults else name))
    if source is None:
        return {}, []
    settings, notes = edited_defaults(source) if reads_defaults else edited_settings(source, name)
    # yolo_video.py reports what yolo.py's defaults could not carry; yolo.py does not repeat it.
    return settings, ([] if name == "yolo.py" else notes)


def _same_bytes(a: str, b: str) -> bool:
    with open(a, "rb") as first, open(b, "rb") as second:
        return first.read() == second.read()


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="python -m keras_yolo_mgpu.copy_scripts",
        description="write this project's scripts (train.py, yolo_video.py, ...) into a keras-yolo3 folder; the "
        "folder's own move to keras-yolo3-originals/, and the settings edited in its train.py come along",
    )
    parser.add_argument("folder", nargs="?", default=".", help="the keras-yolo3 folder (default: this one)")
    return parser


def run(args) -> int:
    for line in copy_scripts(args.folder):
        logger.info("%s", line)
    logger.info("next, in %s: python train.py (python train.py --help for the flags)", os.path.abspath(args.folder))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
