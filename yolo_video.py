#!/usr/bin/env python3
"""Detect objects in images or a video: `python yolo_video.py --model W --input clip.mp4 --output out.mp4`.

Thin wrapper: see keras_yolo_mgpu/yolo_video.py (`python yolo_video.py --help`).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads: its start-up chatter

from keras_yolo_mgpu.inference.media import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
