#!/usr/bin/env python3
"""Anchors by IoU k-means over the boxes of an annotation file.

See `python kmeans.py --help`; the command lives in keras_yolo_mgpu/cli/kmeans.py.
"""

import sys

from keras_yolo_mgpu.cli.kmeans import main

if __name__ == "__main__":
    sys.exit(main())
