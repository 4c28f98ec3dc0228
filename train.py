#!/usr/bin/env python3
"""Train YOLOv3 on one or several GPUs.

See `python train.py --help`; the command lives in keras_yolo_mgpu/cli/train.py.
"""

import sys

from keras_yolo_mgpu.cli.train import main

# keras-yolo3's README: "Modify train.py and start training." This script's settings, under
# keras-yolo3's names; each stands for a flag, and that flag on the command line wins. None
# leaves the setting to its flag's default (`python train.py --help`) and to what this folder
# holds. A dataset flag (--data, --annotations) on the command line replaces annotation_path and
# classes_path.
SETTINGS = dict(
    annotation_path=None,  # keras-yolo3: 'train.txt'
    classes_path=None,  # keras-yolo3: 'model_data/voc_classes.txt'
    anchors_path=None,  # keras-yolo3: 'model_data/yolo_anchors.txt'
    weights_path=None,  # keras-yolo3: 'model_data/yolo_weights.h5' ('model_data/tiny_yolo_weights.h5': 6 anchors)
    log_dir=None,  # keras-yolo3: 'logs/000/'; here the next free logs/NNN
    input_shape=None,  # keras-yolo3: (416, 416), multiples of 32, hw
    val_split=None,  # keras-yolo3: 0.1
    batch_size=None,  # keras-yolo3: 32, the first stage
    batch_size2=None,  # keras-yolo3: 32, the second stage
    freeze_epochs=None,  # keras-yolo3: 50, the first stage's, with the body frozen
    epochs=None,  # keras-yolo3: 100 in all
)

if __name__ == "__main__":
    sys.exit(main(settings=SETTINGS))
