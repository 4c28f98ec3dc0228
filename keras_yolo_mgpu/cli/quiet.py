"""Quiet start-up: TensorFlow's C++ log lines and known harmless warnings, hidden unless `-v`.

TensorFlow prints lines such as `Could not find cuda drivers` or
`meta_optimizer.cc] layout failed` that read as failures to a user. Hidden by:
`TF_CPP_MIN_LOG_LEVEL=3` (unless the user set it), dropping the lines its
libraries log while they load (before that setting is read), filtering
`KNOWN_WARNINGS` and keeping TensorFlow's Python logger at WARNING.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import json
import logging
import os
import re
import sys
import tempfile
import warnings

# (message regex, category, why it is harmless here)
KNOWN_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    (
        r"`shuffle=True` was passed, but will be ignored",
        UserWarning,
        "Keras's default shuffle=True with a tf.data input; our datasets shuffle themselves",
    ),
)

# Loader-time lines: absl's notice, and INFO/WARNING lines (`I0000 00:00:1795418012.604492   10224 port.cc:153] ...`).
_LOAD_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\] .*)$"
)
# The start of any absl log entry (any level).
_LOG_HEADER = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\] ")


def _without_load_noise(text: str) -> list[str]:
    """The lines of `text` that are not loader noise; a noise entry's continuation lines go with it.

    (`cpu_feature_guard.cc` logs one entry over two lines.)
    """
    kept, in_noise = [], False
    for line in text.splitlines():
        if _LOAD_NOISE.match(line):
            in_noise = True
        elif _LOG_HEADER.match(line):
            in_noise = False
            kept.append(line)
        elif line.strip() and not in_noise:
            kept.append(line)
    return kept


def configure_environment(verbose: bool = False) -> None:
    """Sets TensorFlow's C++ log level (a value the user set wins); must run before TensorFlow is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "3")


# Libraries whose debug lines would bury the project's under -v (font lookups, compilation cache keys, a line per
# PNG chunk, file locks: BENCHMARKS.md, "Log lines under -v"); they keep INFO and above.
CHATTY_LIBRARIES = ("matplotlib", "jax", "PIL", "filelock", "faster_coco_eval", "h5py", "urllib3", "asyncio")


def configure(verbose: bool = False) -> None:
    """Python-side quiet: known warnings filtered, TensorFlow's logger at WARNING; with `verbose`, only
    `CHATTY_LIBRARIES` kept at INFO."""
    if verbose:
        for name in CHATTY_LIBRARIES:
            logging.getLogger(name).setLevel(logging.INFO)
        return
    for message, category, _ in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    # TensorFlow's logger would inherit the root's INFO and log every MirroredStrategy all-reduce; JAX's, that a
    # machine has no TPU ("Unable to initialize backend 'tpu'"), which reads as a failure.
    for name in ("tensorflow", "absl", "jax"):
        logging.getLogger(name).setLevel(logging.WARNING)


def keras_backend_name() -> str:
    """The backend Keras will run on, read as Keras reads it, without importing Keras (which imports it).

    `KERAS_BACKEND` wins; else `"backend"` in `$KERAS_HOME/keras.json` (default
    `~/.keras/keras.json`); else TensorFlow.
    """
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json"), encoding="utf-8") as handle:
            return str(json.load(handle).get("backend", "tensorflow"))
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def import_tensorflow(verbose: bool = False) -> None:
    """Imports TensorFlow quietly (`quiet_tensorflow_import`); no-op once imported, or where Keras runs on JAX."""
    if "tensorflow" in sys.modules or keras_backend_name() != "tensorflow":
        return
    quiet_tensorflow_import(verbose)
    # Here, the one place it is imported for the commands on TensorFlow: after configure_environment set its log level.
    import tensorflow  # noqa: F401


def quiet_tensorflow_import(verbose: bool = False) -> None:
    """Makes this process's first `import tensorflow`, whoever asks for it, drop the lines its libraries print.

    On JAX, Keras imports TensorFlow where it is installed, in the middle of a run: its serializer (a model's
    `get_config`). No-op with `verbose`, or once TensorFlow is imported.
    """
    if verbose or "tensorflow" in sys.modules or any(isinstance(f, _QuietTensorFlowImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _QuietTensorFlowImport())


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` with the other finders and wraps its loading in `_load_noise_dropped`; gone once it loaded.

    It stays until TensorFlow is loaded, not until it is first looked for: `importlib.util.find_spec("tensorflow")`,
    asked whether it is installed, finds a spec that nothing loads.
    """

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        others = (finder for finder in sys.meta_path if finder is not self and hasattr(finder, "find_spec"))
        spec = next((s for s in (finder.find_spec(name, path, target) for finder in others) if s is not None), None)
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def exec_module(module):
                with _load_noise_dropped():
                    load(module)
                if self in sys.meta_path:
                    sys.meta_path.remove(self)

            spec.loader.exec_module = exec_module  # this spec's own loader
        return spec


@contextlib.contextmanager
def _load_noise_dropped():
    """Captures file descriptor 2 (where C++ logs go); writes back the lines that are not `_LOAD_NOISE`."""
    sys.stderr.flush()
    saved_fd = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            capture.seek(0)
            kept = _without_load_noise(capture.read().decode("utf-8", errors="replace"))
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")
                sys.stderr.flush()
