"""The optional dependencies, imported at their first use: one place that names them and what installs them.

Keras's own pattern (`keras.src.utils.module_utils.LazyModule`): a module
imports `from keras_yolo_mgpu.optional import onnxruntime` at its top, and the
package is imported only when an attribute of it is first read, so a
machine without it runs every other path, and one that calls it gets an
ImportError that says what to install. TensorFlow is one of them: the JAX
engine runs where it is not installed, and the import-layer tests keep the
JAX path from reading it.
"""

from __future__ import annotations

import importlib
import importlib.util


class LazyModule:
    """A module imported when one of its attributes is first read.

    Args:
        name: the module's import name (`"matplotlib.pyplot"`).
        install: what to run or do to get it, for the ImportError.
    """

    def __init__(self, name: str, install: str):
        self._name = name
        self._install = install
        self._module = None

    @property
    def available(self) -> bool:
        """Whether it can be imported, without importing it."""
        top = self._name.split(".")[0]
        return self._module is not None or importlib.util.find_spec(top) is not None

    def module(self):
        """The imported module (imports it on the first call)."""
        if self._module is None:
            try:
                self._module = importlib.import_module(self._name)
            except ImportError as error:
                raise ImportError(f"{self._name} is needed here and is not installed: {self._install}") from error
        return self._module

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return getattr(self.module(), attribute)

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<LazyModule {self._name} ({state})>"


tensorflow = LazyModule("tensorflow", "pip install tensorflow, or run on JAX: KERAS_BACKEND=jax")
onnx = LazyModule("onnx", "pip install onnx")
onnxruntime = LazyModule("onnxruntime", "pip install onnxruntime")
tf2onnx = LazyModule("tf2onnx", "pip install tf2onnx")
psutil = LazyModule("psutil", "pip install psutil")
pyplot = LazyModule("matplotlib.pyplot", "pip install matplotlib")
faster_coco_eval = LazyModule("faster_coco_eval", "pip install faster-coco-eval")
grain = LazyModule("grain", "pip install grain (Python 3.11 or later)")
# TensorBoard's event protos and record framing: its event files written without TensorFlow.
event_pb2 = LazyModule("tensorboard.compat.proto.event_pb2", "pip install tensorboard")
summary_pb2 = LazyModule("tensorboard.compat.proto.summary_pb2", "pip install tensorboard")
record_writer = LazyModule("tensorboard.summary.writer.record_writer", "pip install tensorboard")
tensor_util = LazyModule("tensorboard.util.tensor_util", "pip install tensorboard")
