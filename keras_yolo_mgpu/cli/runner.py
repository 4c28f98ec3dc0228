"""What every command shares: the parser, `-v`, quiet start-up, and the error epilogue.

Each command module defines `build_parser()` and a body `run(args) -> int`;
its `main(argv=None)` is one call to `run_command`. So every command refuses
abbreviated flags and suggests the flag a misspelt one meant, takes `-v`
(debug logging, TensorFlow's logs, tracebacks), reports an expected error as
one `error: ...` line, and starts quietly (`quiet.py`).

Command modules import Keras only inside their functions: `--help` and flag
errors stay instant, and TensorFlow's logging is set before it loads.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import sys
import traceback
from collections.abc import Callable, Sequence

from keras_yolo_mgpu.cli import quiet

logger = logging.getLogger(__name__)

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"

# Expected failures: bad input the user can fix. Anything else is a bug and keeps its traceback.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError)


class CommandError(Exception):
    """A command refuses its input; reported as `error: <message>`, exit status 1."""


class UsageError(Exception):
    """Flags that parse but do not fit together; reported like argparse's own errors (exit status 2)."""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, unless the help text already states one or there is none to show (None, off)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default:" in text or "(default" in text or action.default in (None, False):
            return text
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with `-v/--verbose`, no abbreviations, and a suggestion for a misspelt flag."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)
        self.add_argument(
            "-v", "--verbose", action="store_true", help="debug logging, TensorFlow's logs and tracebacks on errors"
        )

    def _known_options(self) -> list[str]:
        return [option for action in self._actions for option in action.option_strings]

    def parse_known_args(self, args=None, namespace=None):
        # Unknown flags first: argparse would otherwise report a missing required argument and hide the typo.
        tokens = list(sys.argv[1:] if args is None else args)
        known = set(self._known_options())
        unknown = []
        for token in tokens:
            if token == "--":
                break
            flag = token.split("=", 1)[0]
            if flag.startswith("--") or (flag.startswith("-") and flag[1:2].isalpha()):
                if flag not in known:
                    unknown.append(token)
        if unknown and not self._subparsers:
            self.error("unrecognized arguments: " + " ".join(unknown))
        return super().parse_known_args(args, namespace)

    def error(self, message):
        if message.startswith("unrecognized arguments:"):
            known = self._known_options()
            hints = []
            for token in message.split(":", 1)[1].split():
                flag = token.split("=", 1)[0]
                if flag.startswith("-"):
                    close = difflib.get_close_matches(flag, known, n=1)
                    if close:
                        hints.append(f"{flag} -> did you mean {close[0]}?")
            if hints:
                message += " (" + "; ".join(hints) + ")"
        super().error(message)


def setup_logging(verbose: bool = False) -> None:
    """The project's log lines on stderr: INFO by default, DEBUG with `-v` (the libraries': `quiet.configure`)."""
    level = logging.DEBUG if verbose else logging.INFO
    # A no-op where logging is already set up (an embedding program, pytest); only -v lowers the level.
    logging.basicConfig(level=level, format=LOG_FORMAT)
    if verbose:
        logging.getLogger().setLevel(level)
    quiet.configure(verbose)


def run_command(
    build_parser: Callable[[], ArgumentParser],
    body: Callable[[argparse.Namespace], int | None],
    argv: Sequence[str] | None = None,
    *,
    expected_errors: tuple[type[BaseException], ...] = (),
    error_status: int = 1,
    tensorflow: bool = False,
) -> int:
    """Parses `argv`, runs `body(args)`, and turns expected errors into `error: ...`.

    Args:
        build_parser: returns the command's `ArgumentParser`.
        body: the command; returns its exit status (None means 0).
        argv: the arguments (default: `sys.argv[1:]`).
        expected_errors: the command's own error kinds, added to
            `OSError`, `ValueError` and `CommandError`.
        error_status: exit status of an expected error (1; the dataset
            checker keeps 2 there, as 1 means "problems found").
        tensorflow: the command uses TensorFlow: import it quietly once the
            arguments parse, so `--help` and flag errors stay instant.

    Returns:
        The exit status: the body's, 2 for a usage error (argparse, or `UsageError`: the parser exits),
        `error_status` for an expected error, 130 on Ctrl-C, 143 on SIGTERM during training.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    verbose = bool(getattr(args, "verbose", False))
    quiet.configure_environment(verbose)  # before anything imports TensorFlow
    quiet.quiet_tensorflow_import(verbose)
    setup_logging(verbose)
    try:
        if tensorflow:
            quiet.import_tensorflow(verbose)
        status = body(args)
    except UsageError as error:
        parser.error(str(error))  # exits with status 2
    except KeyboardInterrupt as error:
        # Ctrl-C; or SIGTERM during training (`training.callbacks.Terminated`), which says so and has its own status.
        print(str(error) or "interrupted", file=sys.stderr)
        return getattr(error, "exit_status", 130)
    except (*EXPECTED_ERRORS, CommandError, *expected_errors) as error:
        if verbose:
            traceback.print_exc(file=sys.stderr)
        hint = "" if verbose else " (run with -v for details)"
        print(f"error: {error}{hint}", file=sys.stderr)
        return error_status
    return 0 if status is None else int(status)
