"""`python -m keras_yolo_mgpu.check_dataset`: alias of keras_yolo_mgpu.cli.check_dataset; called, `api.check_dataset`.

`kym.check_dataset(**flags)` calls the module itself (`api.CommandModule`): the function of the same name.
"""

import sys

from keras_yolo_mgpu.api import CommandModule
from keras_yolo_mgpu.api import check_dataset as function
from keras_yolo_mgpu.cli.check_dataset import main

__all__ = ["function", "main"]  # `function`: what calling the module calls

if __name__ == "__main__":
    sys.exit(main())
sys.modules[__name__].__class__ = CommandModule
