#!/usr/bin/env python3
"""Thin wrapper: see keras_yolo_mgpu/voc_annotation.py (`python voc_annotation.py --help`)."""

import sys

from keras_yolo_mgpu.data.voc import main

if __name__ == "__main__":
    sys.exit(main())
