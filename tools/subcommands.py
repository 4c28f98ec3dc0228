"""The command line of a tool with subcommands (`python tools/reports.py NAME [flags]`), or the list of NAMEs."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable


def run_subcommand(prog: str, subcommands: dict[str, Callable], argv: list[str] | None = None) -> int:
    """Runs the subcommand named by the first argument with the rest; without one, lists them."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in subcommands:
        return subcommands[argv[0]](argv[1:]) or 0
    asked = argv[:1] in (["-h"], ["--help"])
    lines = [f"  {name:<18}{inspect.getdoc(run).splitlines()[0]}" for name, run in subcommands.items()]
    print(f"usage: {prog} {{{','.join(subcommands)}}} [flags]  (NAME --help: its flags)", *lines,
          sep="\n", file=sys.stdout if asked else sys.stderr)  # fmt: skip
    return 0 if asked else 2
