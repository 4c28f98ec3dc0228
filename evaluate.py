#!/usr/bin/env python3
"""mAP of weights (or saved detections) on an annotation file: `python evaluate.py --annotations val.txt --weights W`.

Thin wrapper: see keras_yolo_mgpu/evaluate.py (`python evaluate.py --help`).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads: its start-up chatter

from keras_yolo_mgpu.evaluation.mean_ap import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
