"""Writing files so that an interrupted write never destroys the previous one.

Every output of the project (weights, checkpoints, converted models, exports,
anchor and annotation files) is written to a temporary name beside its
destination and renamed over it at the end: `os.replace` is atomic on POSIX
and Windows, so a reader sees the old file or the new one, never half of one,
and a failure (an error, Ctrl-C, a full disk) leaves the old file in place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable

# Endings that Keras checks: the temporary file must keep them whole.
_COMPOUND_SUFFIXES = (".weights.h5",)


def _suffix(name: str) -> str:
    for suffix in _COMPOUND_SUFFIXES:
        if name.endswith(suffix):
            return suffix
    return os.path.splitext(name)[1]


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> str:
    """Calls `write(temporary_path)`, then moves the result onto `path` in one step.

    The temporary file sits in `path`'s folder (created if missing) and keeps
    its ending (`.weights.h5`, `.keras`, ...), because writers such as Keras
    check it. It is flushed to disk before the rename, gets the permissions
    a plain `open()` would give, and is removed if anything fails, in which
    case `path` is untouched.

    Args:
        path: the destination file.
        write: writes the complete file to the path it is given.

    Returns:
        `path`, as a string.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    name = os.path.basename(path)
    suffix = _suffix(name)
    fd, temporary = tempfile.mkstemp(prefix=f".{name[: len(name) - len(suffix)]}.", suffix=f".tmp{suffix}", dir=folder)
    os.close(fd)
    try:
        write(temporary)
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        # mkstemp creates the file 0600; give it what a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        # BaseException: a KeyboardInterrupt mid-write must not leave the
        # temporary file behind either.
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> str:
    """Writes `text` (UTF-8) to `path` atomically; see `atomic_write`."""

    def write(temporary: str) -> None:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)

    return atomic_write(path, write)


def write_lines_atomic(path: str | os.PathLike, lines: Iterable[str]) -> str:
    """Writes one line per item (each followed by a newline) atomically."""
    return write_text_atomic(path, "".join(f"{line}\n" for line in lines))


def replace_directory(path: str | os.PathLike, write: Callable[[str], object]) -> str:
    """Like `atomic_write` for a folder (e.g. a SavedModel): the old folder survives a failed write.

    `write(temporary_folder)` fills a new folder beside `path`; only then is
    the old folder moved aside, the new one renamed to `path`, and the old one
    deleted. (Two renames, not one: a crash between them leaves the old folder
    as `.<name>.old.*` beside `path`, never a half-written `path`.)
    """
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    name = os.path.basename(os.path.normpath(path))
    temporary = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
    os.rmdir(temporary)  # writers such as SavedModel want to create the folder themselves
    try:
        write(temporary)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    old = None
    if os.path.exists(path):
        old = tempfile.mkdtemp(prefix=f".{name}.old.", dir=parent)
        os.rmdir(old)
        os.replace(path, old)
    os.replace(temporary, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path
