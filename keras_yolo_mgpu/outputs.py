"""The one rule for a command's output files: what may be replaced, and what never.

1. An output that is one of the command's inputs is refused, before anything
   is read, `--overwrite` or not (`yolo_video.py --input a.avi --output a.avi`
   would otherwise destroy its own source).
2. An existing file is replaced only when this project wrote it and nobody
   changed it since (its size and modification time are as recorded when it
   was written), or when the user passes `--overwrite`. A replaced file is
   said in the log. So keras-yolo3's commands re-run in the same folder
   (`python kmeans.py`, `python convert.py ...`) replace their own earlier
   outputs, and never a file the user made or edited.

What this project wrote is recorded per folder under the cache folder
(`data.scan.cache_dir`: `$KERAS_YOLO_MGPU_CACHE`, else
`~/.cache/keras-yolo-mgpu`), in `written/<hash of the folder>.json`, name ->
(size, mtime_ns). Weights files that carry this project's metadata, and
the `.metadata.json` files beside exports, count as written here too,
wherever they came from. With the cache turned off
(`KERAS_YOLO_MGPU_CACHE=none`) nothing is recorded: rule 2 then asks for
`--overwrite` for any other existing file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Iterable

from keras_yolo_mgpu.data.scan import cache_dir
from keras_yolo_mgpu.fileio import write_text_atomic
from keras_yolo_mgpu.weights.metadata import SIDECAR_ENDING, ModelMetadata, read_metadata

logger = logging.getLogger(__name__)

_WEIGHTS_ENDINGS = (".h5", ".keras")


class OutputIsInputError(ValueError):
    """An output path names one of the command's inputs."""


class OutputExistsError(FileExistsError):
    """An output exists, was not written by this project, and `--overwrite` was not given."""


def _same_file(a: str, b: str) -> bool:
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def _record_file(folder: str) -> str | None:
    root = cache_dir()
    if root is None:
        return None
    digest = hashlib.sha1(os.path.realpath(folder).encode()).hexdigest()[:20]
    return os.path.join(root, "written", f"{digest}.json")


@contextlib.contextmanager
def _locked_records(folder: str, *, write: bool):
    """The folder's records as a dict (name -> [size, mtime_ns]); saved on exit when `write`."""
    path = _record_file(folder)
    if path is None:
        yield {}
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if write else fcntl.LOCK_SH)
        records = {}
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as handle:
                    records = json.load(handle).get("files", {})
            except (OSError, ValueError):
                records = {}  # a damaged record only costs an --overwrite later
        yield records
        if write:
            write_text_atomic(path, json.dumps({"folder": os.path.realpath(folder), "files": records}))


def _signature(path: str) -> list[int]:
    stat = os.stat(path)
    return [stat.st_size, stat.st_mtime_ns]


def _has_project_metadata(path: str) -> bool:
    """A weights file with this project's metadata, or a `.metadata.json` sidecar of it (an export's)."""
    try:
        if path.endswith(SIDECAR_ENDING):
            with open(path, encoding="utf-8") as handle:
                ModelMetadata.from_json(handle.read(), path)
            return True
        return path.endswith(_WEIGHTS_ENDINGS) and read_metadata(path) is not None
    except (OSError, ValueError):
        return False


def written_here(path: str | os.PathLike) -> bool:
    """True when `path` is a file this project wrote and that is unchanged since (see the module's rule 2)."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        return False
    try:
        with _locked_records(os.path.dirname(path), write=False) as records:
            if records.get(os.path.basename(path)) == _signature(path):
                return True
    except OSError as error:  # an unusable cache folder: nothing is known to be ours
        logger.debug("could not read the records of %s: %s", os.path.dirname(path), error)
    return _has_project_metadata(path)


def record_written(paths: Iterable[str | os.PathLike]) -> None:
    """Records `paths` (files just written) as this project's, one update per folder."""
    by_folder: dict[str, list[str]] = {}
    for path in paths:
        path = os.path.abspath(os.fspath(path))
        by_folder.setdefault(os.path.dirname(path), []).append(path)
    for folder, files in by_folder.items():
        try:
            with _locked_records(folder, write=True) as records:
                for name in [n for n in records if not os.path.isfile(os.path.join(folder, n))]:
                    del records[name]
                for path in files:
                    if os.path.isfile(path):
                        records[os.path.basename(path)] = _signature(path)
        except OSError as error:  # a read-only cache costs an --overwrite later, not the output
            logger.debug("could not record %s as written here: %s", folder, error)


def check_output(
    path: str | os.PathLike,
    *,
    inputs: Iterable[str | os.PathLike | None] = (),
    overwrite: bool = False,
    flag: str = "--output",
) -> None:
    """Raises unless `path` may be written under the module's rule; logs a replacement.

    Args:
        path: the output file.
        inputs: the command's input files (None entries are skipped).
        overwrite: the user's `--overwrite`.
        flag: the flag or argument that named `path`, for the messages.

    Raises:
        OutputIsInputError: `path` is one of `inputs`.
        OutputExistsError: `path` exists, is not this project's unchanged
            output, and `overwrite` is False.
    """
    path = os.fspath(path)
    for source in inputs:
        if source is not None and _same_file(path, os.fspath(source)):
            raise OutputIsInputError(
                f"{flag} {path} is also an input of this command ({os.fspath(source)}): "
                "writing it would destroy the input; choose another output path"
            )
    if not os.path.lexists(path):
        return
    if os.path.isdir(path):
        raise OutputExistsError(f"{flag} {path} is a folder; give a file path")
    if overwrite:
        logger.warning("replacing %s (--overwrite)", path)
    elif written_here(path):
        logger.info("replacing %s, an earlier output of keras-yolo-mgpu", path)
    else:
        raise OutputExistsError(
            f"{flag} {path} already exists and was not written by keras-yolo-mgpu (or was changed since): "
            "pass --overwrite to replace it, or choose another path"
        )
