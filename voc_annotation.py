#!/usr/bin/env python3
"""Pascal VOC XML to keras-yolo3 annotation lines.

See `python voc_annotation.py --help`; the command lives in keras_yolo_mgpu/cli/voc.py.
"""

import sys

from keras_yolo_mgpu.cli.voc import main

if __name__ == "__main__":
    sys.exit(main())
