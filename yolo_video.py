#!/usr/bin/env python3
"""Detect objects in images or a video.

See `python yolo_video.py --help`; the command lives in keras_yolo_mgpu/cli/detect.py.
"""

import sys

from keras_yolo_mgpu.cli.detect import main

if __name__ == "__main__":
    sys.exit(main())
