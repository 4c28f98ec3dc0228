#!/usr/bin/env python3
"""Detect objects in images or a video.

See `python yolo_video.py --help`; the command lives in keras_yolo_mgpu/cli/detect.py.
"""

import sys

from keras_yolo_mgpu.cli.detect import main

# keras-yolo3's yolo.py `YOLO._defaults`, the defaults of its yolo_video.py's flags, under its
# names; each stands for a flag, and that flag on the command line wins. None leaves the setting
# to its flag's default (`python yolo_video.py --help`): the classes, anchors and input size the
# weights file records, else keras-yolo3's.
SETTINGS = dict(
    model_path=None,  # keras-yolo3: 'model_data/yolo.h5'
    anchors_path=None,  # keras-yolo3: 'model_data/yolo_anchors.txt'
    classes_path=None,  # keras-yolo3: 'model_data/coco_classes.txt'
    score=None,  # keras-yolo3: 0.3
    iou=None,  # keras-yolo3: 0.45
    model_image_size=None,  # keras-yolo3: (416, 416), multiples of 32, hw
    gpu_num=None,  # keras-yolo3: 1
)

if __name__ == "__main__":
    sys.exit(main(settings=SETTINGS))
