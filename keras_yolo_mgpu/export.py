"""`python -m keras_yolo_mgpu.export`: alias of keras_yolo_mgpu.cli.export; called, `api.export`.

`kym.export(**flags)` calls the module itself (`api.CommandModule`): the function of the same name.
"""

import sys

from keras_yolo_mgpu.api import CommandModule
from keras_yolo_mgpu.api import export as function
from keras_yolo_mgpu.cli.export import main

__all__ = ["function", "main"]  # `function`: what calling the module calls

if __name__ == "__main__":
    sys.exit(main())
sys.modules[__name__].__class__ = CommandModule
