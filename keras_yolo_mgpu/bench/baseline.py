"""keras-yolo3's own model and input generator, which the baseline rows time, from the checkout's tests/.

`tools/train_step_compare.py --reference keras-yolo3` times keras-yolo3's
model and loss in Keras 2 (`tests/keras_yolo3_model.py`), `bench pipeline
--generator reference` its input generator (`tests/keras_yolo3_generator.py`). Both are
the tests' references, transcribed from keras-yolo3, and are not installed
with the package: those two rows run from a checkout of the repository,
every other row runs anywhere.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parents[2] / "tests"


def load_reference(name: str):
    """The module `tests/<name>.py` of the checkout this package runs from (e.g. "keras_yolo3_model").

    Raises:
        FileNotFoundError: the package does not run from a checkout (an
            installed wheel has no tests/); the message names the file.
    """
    path = TESTS_DIR / f"{name}.py"
    if name not in sys.modules and not path.is_file():
        raise FileNotFoundError(
            f"keras-yolo3's baseline is a test reference of the repository, tests/{name}.py, which an "
            f"installed package does not have (looked for {path}): run the benchmark from a checkout"
        )
    if str(TESTS_DIR) not in sys.path:
        sys.path.append(str(TESTS_DIR))  # appended: nothing installed is shadowed
    return importlib.import_module(name)
