#!/usr/bin/env python3
"""keras-yolo3's train_bottleneck.py: train.py's two stages after the output convolutions train on cached features.

See `python train_bottleneck.py --help`; the command lives in keras_yolo_mgpu/cli/train_bottleneck.py.
"""

import sys

from keras_yolo_mgpu.cli.train_bottleneck import main

if __name__ == "__main__":
    sys.exit(main())
