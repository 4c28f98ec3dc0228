#!/usr/bin/env python3
"""Thin wrapper: see keras_yolo_mgpu/coco_annotation.py (`python coco_annotation.py --help`)."""

import sys

from keras_yolo_mgpu.data.coco import main

if __name__ == "__main__":
    sys.exit(main())
