"""`import tensorflow` made to fail in this process, as on a JAX machine where it is not installed.

For `bench pipeline --without-tensorflow` and the tests that prove a JAX path needs no TensorFlow:
a later TensorFlow import raises `ModuleNotFoundError`, which Keras's optional imports handle.
"""

import importlib.abc
import sys


class _NoTensorFlow(importlib.abc.MetaPathFinder):
    def __init__(self, reason: str):
        self.reason = reason

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("tensorflow", "tf_keras"):
            raise ModuleNotFoundError(f"No module named {name!r} ({self.reason})")
        return None


def block_tensorflow(reason: str) -> None:
    """Makes every later `import tensorflow` (and `tf_keras`) fail; `reason` ends the error message."""
    sys.meta_path.insert(0, _NoTensorFlow(reason))
