#!/usr/bin/env python3
"""Train YOLOv3 on one or several GPUs.

See `python train.py --help`; the command lives in keras_yolo_mgpu/cli/train.py.
"""

import sys

from keras_yolo_mgpu.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
