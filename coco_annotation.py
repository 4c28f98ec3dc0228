#!/usr/bin/env python3
"""COCO instances JSON to keras-yolo3 annotation lines.

See `python coco_annotation.py --help`; the command lives in keras_yolo_mgpu/cli/coco.py.
"""

import sys

from keras_yolo_mgpu.cli.coco import main

if __name__ == "__main__":
    sys.exit(main())
