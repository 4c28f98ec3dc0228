"""The commands as Python functions: their flags as keywords, their defaults, their checks.

    import keras_yolo_mgpu as kym

    run = kym.train(data="my_dataset/data.yaml", weights="yolov3-tiny", epochs=50)
    report = kym.evaluate(weights=run.best_weights)
    kym.detect(model=run.best_weights, image=["photos/"], output="annotated")
    kym.export(weights=run.best_weights, format="onnx")

Each function takes its command's flags as keywords, dashes as underscores
(`input_size=416`, `batch_size=16`, `no_augment=True`), and turns them into
the command line the command itself parses: the defaults, the conversions
and the refusals are the command's own, so `train(**flags)` and `python
train.py --flags` resolve the same run (the same args.json). A keyword the
command does not know is a TypeError that names the closest one. Values:
True turns a switch on (False its opposite: `jit=False` is `--no-jit`), and
gives a flag whose value may be left out alone (`resume=True`, `image=True`);
a flag that needs a value refuses True and False (a TypeError);
a list gives a flag that takes several values (`image=["a.jpg", "b.jpg"]`);
a tuple gives one value of several parts (`input_size=(320, 416)`,
`multi_scale=(320, 608)`); None leaves the default.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import types
import warnings

from keras_yolo_mgpu.cli import check_dataset as check_dataset_command
from keras_yolo_mgpu.cli import detect as detect_command
from keras_yolo_mgpu.cli import evaluate as evaluate_command
from keras_yolo_mgpu.cli import export as export_command
from keras_yolo_mgpu.cli import quiet
from keras_yolo_mgpu.cli import train as train_command
from keras_yolo_mgpu.cli.runner import LOG_FORMAT, CommandError, UsageError
from keras_yolo_mgpu.inference.export import ExportError, keras_backend_in_use

logger = logging.getLogger(__name__)

__all__ = ["CommandModule", "check_dataset", "command_line", "detect", "evaluate", "export", "train"]

_SWITCHES = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)


def _by_keyword(parser: argparse.ArgumentParser) -> dict[str, list[argparse.Action]]:
    """Keyword -> the parser's actions it names: the flags' own names first, then the `dest`s no flag spells.

    Flags win: yolo_video.py's `--model` is keras-yolo3's weights file (its
    dest `weights`), so `model=` means that flag, not `--architecture`'s dest.
    """
    table: dict[str, list[argparse.Action]] = {}
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction) and a.dest != "verbose"]
    for action in actions:
        for option in action.option_strings:
            if option.startswith("--"):
                table.setdefault(option[2:].replace("-", "_"), []).append(action)
    spelled = set(table)
    for action in actions:
        if action.dest not in spelled and action not in table.get(action.dest, []):
            table.setdefault(action.dest, []).append(action)
    return table


def _tokens(value) -> list[str]:
    """One flag's value as command-line words: a list gives several, a tuple one of several parts."""
    if isinstance(value, list):
        return [_token(item) for item in value]
    return [_token(value)]


def _token(value) -> str:
    if isinstance(value, tuple):
        parts = [",".join(map(str, part)) if isinstance(part, (list, tuple)) else str(part) for part in value]
        return " ".join(parts) if any(isinstance(part, (list, tuple)) for part in value) else ",".join(parts)
    return str(value)


def command_line(parser: argparse.ArgumentParser, flags: dict) -> list[str]:
    """The command line (argv) that `flags` (keywords as in the module docstring) stand for.

    Raises:
        TypeError: a keyword the command does not take, or a switch given a value it cannot have.
    """
    table = _by_keyword(parser)
    options, positionals = [], {}
    for key, value in flags.items():
        if key not in table:
            close = difflib.get_close_matches(key, table, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{parser.prog}: unknown keyword {key!r}{hint}")
        if value is None:
            continue
        actions = table[key]
        if not actions[0].option_strings:
            positionals[actions[0].dest] = _tokens(value)
            continue
        action = actions[0]
        if isinstance(action, _SWITCHES):
            options += _switch(parser, action, key, value)
            continue
        if action.nargs in ("?", "*") and isinstance(value, bool):
            # `resume=True`, `image=True`: the flag alone; False leaves it off.
            options += [_option(action, key)] if value else []
            continue
        if isinstance(value, bool):  # `pr_curve=True` would write a file named "True"
            what = action.metavar or action.dest.upper()
            raise TypeError(
                f"{parser.prog}: {key}={value!r}: {_option(action, key)} takes a value ({what}), not a switch"
            )
        options += [_option(action, key), *_tokens(value)]
    ordered = [word for a in parser._actions if not a.option_strings for word in positionals.get(a.dest, [])]
    return [*ordered, *options]


def _switch(parser: argparse.ArgumentParser, action: argparse.Action, key: str, value) -> list[str]:
    """The switch of `action`'s dest that gives it `value` (`jit=False`: --no-jit), or none when that is the default.

    Raises:
        TypeError: no switch gives `value`, and leaving them off gives another value (`mixed_precision=False`:
            the default is the device's choice), naming the keywords that set that dest.
    """
    switches = [a for a in parser._actions if a.dest == action.dest and isinstance(a, _SWITCHES)]
    chosen = [a for a in switches if a.const == value]
    if chosen:
        return [_option(chosen[0], key)]
    if value is False and parser.get_default(action.dest) is False:
        return []  # a switch left off
    others = [
        option[2:].replace("-", "_")
        for a in parser._actions
        if a.dest == action.dest and not isinstance(a, _SWITCHES)
        for option in a.option_strings
        if option.startswith("--")
    ]
    hint = f"; set {' or '.join(others)} instead" if others else ""
    raise TypeError(f"{parser.prog}: {key}={value!r} is not one of {[a.const for a in switches]}{hint}")


def _option(action: argparse.Action, key: str) -> str:
    """The option string of `action` that `key` spells (`lr` -> `--lr`), else its last (the long one)."""
    spelled = "--" + key.replace("_", "-")
    return spelled if spelled in action.option_strings else action.option_strings[-1]


class _Refused(Exception):
    """What argparse would have printed before exiting."""


def _parse(build_parser, flags: dict) -> tuple[argparse.Namespace, list[str]]:
    parser = build_parser()

    def refuse(message):
        raise _Refused(f"{parser.prog}: {message}")

    parser.error = refuse  # an exception for the caller, never sys.exit
    argv = command_line(parser, flags)
    try:
        return parser.parse_args(argv), argv
    except _Refused as error:
        raise ValueError(str(error)) from None


def _refusals_as_value_errors(command_logger: str | None, function, *args):
    """`function(*args)`, a command's refusal (what it prints as `error: ...`) raised as a ValueError.

    As quiet as the command: TensorFlow's loader lines dropped when it is first imported (on JAX, Keras imports it
    mid-run) and its C++ log level the command's where the user set none, and the warnings the commands filter
    (`quiet.KNOWN_WARNINGS`) filtered for the call. As telling as the command: its log lines shown
    (`_log_lines_shown`), the package's and `command_logger`'s (the command's own).
    """
    quiet.configure_environment()
    quiet.quiet_tensorflow_import()
    try:
        with warnings.catch_warnings(), _log_lines_shown(command_logger):
            for message, category, _ in quiet.KNOWN_WARNINGS:
                warnings.filterwarnings("ignore", message=message, category=category)
            return function(*args)
    except (UsageError, CommandError) as error:
        raise ValueError(str(error)) from None


@contextlib.contextmanager
def _log_lines_shown(command_logger: str | None):
    """The project's INFO lines on stderr for the call, as the command prints them, where no logging is set up.

    Python shows only warnings from a program that set up no logging, so a
    notebook's `train()` would not say which files it took, where the run
    folder is or how to get keras-yolo3's behaviour. A program that set up its
    own logging (a handler on the root logger or on these) keeps it.
    """
    loggers = [logging.getLogger(name) for name in (__package__, command_logger) if name]
    if logging.getLogger().handlers or any(chosen.handlers for chosen in loggers):
        yield
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    levels = [chosen.level for chosen in loggers]
    for chosen in loggers:
        chosen.addHandler(handler)
        chosen.setLevel(logging.INFO)
    try:
        yield
    finally:
        for chosen, level in zip(loggers, levels):
            chosen.removeHandler(handler)
            chosen.setLevel(level)


def _train(args, argv):
    config = train_command.config_for(args, train_command.given_flags(argv) if args.resume else None)
    if config is None:
        raise UsageError(train_command.START_HELP)
    return train_command.run_training(config)


def train(**flags):
    """`python train.py` as a function; returns the run's `training.config.TrainResult`.

    Raises:
        ValueError: no dataset given and no keras-yolo3 folder here, or what
            train.py refuses (as its `error:` line says it).
    """
    args, argv = _parse(train_command.build_parser, flags)
    return _refusals_as_value_errors(train_command.logger.name, _train, args, argv)


def evaluate(**flags) -> dict:
    """`python evaluate.py` as a function; returns its report (what the command prints as JSON last)."""
    args, _ = _parse(evaluate_command.build_parser, flags)
    return _refusals_as_value_errors(evaluate_command.logger.name, evaluate_command.evaluation, args)


def detect(**flags) -> dict:
    """`python yolo_video.py` as a function (`model=`, `image=[...]` or `input=`); returns its counts."""
    args, _ = _parse(detect_command.build_parser, flags)
    return _refusals_as_value_errors(detect_command.logger.name, detect_command.detection, args)


def export(**flags) -> dict:
    """`python -m keras_yolo_mgpu.export` as a function; returns what it wrote, its check and `map` (--validation).

    Exports are written through TensorFlow: where this process's Keras runs
    on another backend (a JAX run's script or notebook), the export runs in a
    child Python on TensorFlow, its log lines shown here, its result or its
    error returned or raised here.
    """
    args, argv = _parse(export_command.build_parser, flags)
    backend = keras_backend_in_use() or quiet.keras_backend_name()
    if backend != "tensorflow":
        return _exported_by_tensorflow_child(argv, backend)
    return _refusals_as_value_errors(export_command.logger.name, export_command.exported, args)


# The child's program: the library reads no argv, this line hands it over.
_EXPORT_CHILD = "import sys; from keras_yolo_mgpu import api; api.export_to_file(sys.argv[1], sys.argv[2:])"


def _exported_by_tensorflow_child(argv: list[str], backend: str) -> dict:
    """`export` with the command line `argv` in a child Python whose Keras runs on TensorFlow."""
    with _log_lines_shown(export_command.logger.name):
        logger.info("Keras runs on %s here: the export runs on TensorFlow, in a child process", backend)
    # This copy of the package, wherever this process found it (a checkout beside a script, not installed).
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    search_path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": search_path}
    if environment.get("TF_CPP_MIN_LOG_LEVEL") == "1":
        # What JAX's import sets where it is unset; the child's TensorFlow is as quiet as the command's (cli.quiet).
        del environment["TF_CPP_MIN_LOG_LEVEL"]
    with tempfile.TemporaryDirectory(prefix="keras-yolo-mgpu-export-") as folder:
        outcome_path = os.path.join(folder, "outcome.pickle")
        child = subprocess.Popen(
            [sys.executable, "-c", _EXPORT_CHILD, outcome_path, *argv],
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for line in child.stderr:  # its log, here: a notebook shows this process's stderr, not the child's
            sys.stderr.write(line)
        status = child.wait()
        if not os.path.exists(outcome_path):
            raise ExportError(f"the export's process ended with status {status} before it finished (its log above)")
        with open(outcome_path, "rb") as handle:
            failed, value = pickle.load(handle)
    if failed:
        raise value
    return value


def export_to_file(outcome_path: str, argv: list[str]) -> None:
    """The export child's work: `export` of the command line `argv`, pickled to `outcome_path` as
    `(False, result)`, or `(True, error)` for an error of the function's own (ValueError, FileNotFoundError,
    ExportError)."""
    parser = export_command.build_parser()
    try:
        outcome = (False, _refusals_as_value_errors(export_command.logger.name, export_command.exported,
                                                    parser.parse_args(argv)))  # fmt: skip
    except (ValueError, OSError, ExportError) as error:
        outcome = (True, error)
    with open(outcome_path, "wb") as handle:
        pickle.dump(outcome, handle)


def check_dataset(**flags) -> bool:
    """`python -m keras_yolo_mgpu.check_dataset` as a function; True when it found no problem."""
    args, _ = _parse(check_dataset_command.build_parser, flags)
    return _refusals_as_value_errors(None, check_dataset_command.run, args) == 0


class CommandModule(types.ModuleType):
    """The class of a `python -m keras_yolo_mgpu.<command>` module, which is also the command's function.

    `keras_yolo_mgpu.export` and `keras_yolo_mgpu.check_dataset` are the modules
    `python -m` runs, so the package cannot also bind those names to the
    functions; called, such a module calls its `function` attribute
    (`kym.export(weights="best.weights.h5", format="onnx")` is `export(...)` above).
    """

    def __call__(self, **flags):
        return self.function(**flags)
