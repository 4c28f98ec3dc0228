"""Quiet start-up: TensorFlow's C++ log lines and known harmless warnings, hidden unless `-v`.

TensorFlow prints lines such as `Could not find cuda drivers` or
`meta_optimizer.cc] layout failed` that read as failures to a user. Hidden by:
`TF_CPP_MIN_LOG_LEVEL=3` (unless the user set it), dropping the lines its
libraries log while they load (before that setting is read), filtering
`KNOWN_WARNINGS` and keeping TensorFlow's Python logger at WARNING.
"""

from __future__ import annotations

import importlib.util
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


def configure(verbose: bool = False) -> None:
    """Python-side quiet: known warnings filtered, TensorFlow's logger at WARNING."""
    if verbose:
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


def import_tensorflow(verbose: bool = False, *, any_backend: bool = False) -> None:
    """Imports TensorFlow, dropping the log lines its libraries print while loading.

    File descriptor 2 (where C++ logs go) is captured during the import;
    lines that match `_LOAD_NOISE` are dropped, the others written back.
    No-op when TensorFlow is already imported or Keras runs on another backend;
    with `any_backend`, on JAX too where TensorFlow is installed (Keras's
    TensorBoard callback would import it in the middle of the first epoch).
    """
    if "tensorflow" in sys.modules:
        return
    if keras_backend_name() != "tensorflow" and not (any_backend and _installed("tensorflow")):
        return
    if verbose:
        # Here, the one place it is imported for the commands: after configure_environment set its log level.
        import tensorflow  # noqa: F401

        return
    sys.stderr.flush()
    saved_fd = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            # Here: the lines its libraries print while loading land in the capture.
            import tensorflow  # noqa: F401
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            capture.seek(0)
            text = capture.read().decode("utf-8", errors="replace")
            kept = _without_load_noise(text)
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")
                sys.stderr.flush()


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as none
        return False
