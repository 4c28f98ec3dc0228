#!/usr/bin/env python3
"""Thin wrapper: see keras_yolo_mgpu/convert.py (`python convert.py --help`)."""

import sys

from keras_yolo_mgpu.weights.convert import main

if __name__ == "__main__":
    sys.exit(main())
