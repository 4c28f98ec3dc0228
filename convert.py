#!/usr/bin/env python3
"""Convert Darknet .cfg + .weights to a Keras 3 file.

See `python convert.py --help`; the command lives in keras_yolo_mgpu/cli/convert.py.
"""

import sys

from keras_yolo_mgpu.cli.convert import main

if __name__ == "__main__":
    sys.exit(main())
