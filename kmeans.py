#!/usr/bin/env python3
"""Thin wrapper: see keras_yolo_mgpu/kmeans.py (`python kmeans.py --help`)."""

import sys

from keras_yolo_mgpu.data.kmeans import main

if __name__ == "__main__":
    sys.exit(main())
