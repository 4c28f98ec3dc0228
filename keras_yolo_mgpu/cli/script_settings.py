"""The settings keras-yolo3's users edit in its scripts, held by this project's scripts under the same names.

keras-yolo3's README says "Modify train.py and start training": its users set the values its
`_main()` assigns, and, for detection, its yolo.py's `YOLO._defaults`. This project's
train.py, train_bottleneck.py and yolo_video.py open with a `SETTINGS` block of the same
names and pass it to their command (`ScriptSettings`): each setting stands for a flag and
becomes its default, so a flag on the command line wins and args.json records the run as
the flag would.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence

from keras_yolo_mgpu.cli.runner import CommandError, run_command

logger = logging.getLogger(__name__)

# The values keras-yolo3's `_main()` sets and its users edit, under their names (with the epoch counts its fit
# calls hard-code), and the flag (parser dest) each stands for.
TRAIN_SETTINGS = {
    "annotation_path": "annotations",
    "classes_path": "classes",
    "anchors_path": "anchors",
    "weights_path": "weights",
    "log_dir": "log_dir",
    "input_shape": "input_size",
    "val_split": "val_split",
    "batch_size": "batch_size",
    "batch_size2": "batch_size2",
    "epochs": "epochs",
    "freeze_epochs": "freeze_epochs",
    "bottleneck_epochs": "bottleneck_epochs",
}
# keras-yolo3's yolo.py `YOLO._defaults`, which its yolo_video.py takes as its flags' defaults.
DETECT_SETTINGS = {
    "model_path": "weights",
    "anchors_path": "anchors",
    "classes_path": "classes",
    "score": "score",
    "iou": "iou",
    "model_image_size": "input_size",
    "gpu_num": "gpu_num",
}
# The training dataset's own files: used where no dataset flag (--data, --annotations) is on the command line,
# which names another dataset; the others become the flags' defaults.
DATASET_SETTINGS = ("annotation_path", "classes_path")


@dataclasses.dataclass(frozen=True)
class ScriptSettings:
    """The settings a script (train.py, train_bottleneck.py, yolo_video.py) sets in its file; None: not set.

    `values`: setting -> value, as the script passes them; `names`: its
    settings and the flag (parser dest) each stands for; `dataset`: the
    settings that name the training data (`DATASET_SETTINGS`). A name the
    script does not have, or a value its flag refuses, is a problem `check`
    reports: a typo in train.py never trains with a default.
    """

    script: str = "train.py"
    values: Mapping[str, object] = dataclasses.field(default_factory=dict)
    names: Mapping[str, str] = dataclasses.field(default_factory=lambda: TRAIN_SETTINGS)
    dataset: tuple[str, ...] = DATASET_SETTINGS

    def given(self) -> dict[str, object]:
        """The settings the script sets (name -> value), in `names` order."""
        return {name: self.values[name] for name in self.names if self.values.get(name) is not None}

    def dataset_path(self, name: str) -> str | None:
        """`annotation_path` or `classes_path` as the script sets it (None: not set)."""
        value = self.values.get(name)
        return None if value is None else os.fspath(value)

    def problems(self, parser: argparse.ArgumentParser) -> list[str]:
        """What the script sets that is no setting, or that its flag refuses."""
        problems = [f"{name} is not one of its settings" for name in self.values if name not in self.names]
        for name, (_, value) in self._flag_defaults(parser).items():
            if isinstance(value, Exception):
                problems.append(f"{name} = {self.values[name]!r}: {value}")
        return problems

    def check(self, parser: argparse.ArgumentParser) -> None:
        """Raises CommandError naming each problem and the settings there are."""
        problems = self.problems(parser)
        if problems:
            raise CommandError(
                f"{self.script}'s settings: " + "; ".join(problems) + f" (the settings: {', '.join(self.names)})"
            )

    def apply_defaults(self, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Makes each setting but the dataset's files its flag's default (a flag given wins); returns `parser`.

        The parser's --help then ends with the settings' names and what the script sets.
        """
        for dest, value in self._flag_defaults(parser).values():
            if not isinstance(value, Exception):  # `check` reports it before anything runs
                parser.set_defaults(**{dest: value})
        given = ", ".join(f"{name}={value!r}" for name, value in self.given().items()) or "none"
        names = [name for name in self.values if name in self.names] or list(self.names)
        settings = (
            f"{self.script} opens with a SETTINGS block of keras-yolo3's names ({', '.join(names)}), each its "
            f"flag's default; a flag given wins. Set there now: {given}."
        )
        parser.epilog = f"{parser.epilog} {settings}" if parser.epilog else settings
        return parser

    def log(self, args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
        """Says which settings the script set, and which a flag on the command line or a dataset flag replaced."""
        defaults = self._flag_defaults(parser)
        parts = []
        for name, value in self.given().items():
            dest = self.names[name]
            if name in self.dataset:
                replaced = args.data or args.annotations
                parts.append(f"{name} = {value!r}" + (" (not used: a dataset flag names the data)" if replaced else ""))
            elif getattr(args, dest) != defaults[name][1]:
                parts.append(f"{name} = {value!r} (--{dest.replace('_', '-')} {getattr(args, dest)} given wins)")
            else:
                parts.append(f"{name} = {value!r}")
        if parts:
            logger.info("%s sets %s", self.script, ", ".join(parts))

    def _flag_defaults(self, parser: argparse.ArgumentParser) -> dict[str, tuple[str, object]]:
        """name -> (dest, the value as its flag parses it, or the error it raised), dataset files left out."""
        actions = {action.dest: action for action in parser._actions}
        defaults = {}
        for name, value in self.given().items():
            dest = self.names[name]
            if name in self.dataset or dest not in actions:
                continue
            text, convert = _flag_text(value), actions[dest].type
            try:
                defaults[name] = (dest, convert(text) if convert else text)
            except (ValueError, TypeError, argparse.ArgumentTypeError) as error:
                defaults[name] = (dest, error)
        return defaults


def _flag_text(value) -> str:
    """A setting as its flag is written: (416, 416) -> "416x416"."""
    if isinstance(value, (tuple, list)):
        return "x".join(str(part) for part in value)
    return os.fspath(value) if isinstance(value, os.PathLike) else str(value)


def run_with_settings(
    build_parser: Callable[[], argparse.ArgumentParser],
    body: Callable[[argparse.Namespace], int | None],
    settings: ScriptSettings,
    argv: Sequence[str] | None,
    *,
    log: Callable[[argparse.Namespace], bool] = lambda args: True,
    **run_options,
) -> int:
    """`runner.run_command` of a script whose file sets `settings`: they are the flags' defaults, checked before
    `body` runs, and said in the log where `log(args)` is true."""

    def body_with_settings(args):
        parser = build_parser()
        settings.check(parser)
        if log(args):
            settings.log(args, parser)
        return body(args)

    return run_command(lambda: settings.apply_defaults(build_parser()), body_with_settings, argv, **run_options)
