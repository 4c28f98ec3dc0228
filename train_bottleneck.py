#!/usr/bin/env python3
"""keras-yolo3's train_bottleneck.py: train.py's two stages after the output convolutions train on cached features.

See `python train_bottleneck.py --help`; the command lives in keras_yolo_mgpu/cli/train_bottleneck.py.
"""

import sys

from keras_yolo_mgpu.cli.train_bottleneck import main

# keras-yolo3's README: "Modify train.py and start training." This script's settings, under
# keras-yolo3's names; each stands for a flag, and that flag on the command line wins. None
# leaves the setting to its flag's default (`python train_bottleneck.py --help`) and to what this folder
# holds. A dataset flag (--data, --annotations) on the command line replaces annotation_path and
# classes_path.
SETTINGS = dict(
    annotation_path=None,  # keras-yolo3: 'train.txt'
    classes_path=None,  # keras-yolo3: 'model_data/coco_classes.txt'
    anchors_path=None,  # keras-yolo3: 'model_data/yolo_anchors.txt'
    weights_path=None,  # keras-yolo3: 'model_data/yolo_weights.h5'
    log_dir=None,  # keras-yolo3: 'logs/000/'; here the next free logs/NNN
    input_shape=None,  # keras-yolo3: (416, 416), multiples of 32, hw
    val_split=None,  # keras-yolo3: 0.1
    bottleneck_epochs=None,  # keras-yolo3: 30, in batches of 8
    batch_size=None,  # keras-yolo3: 16, the first stage
    batch_size2=None,  # keras-yolo3: 4, the second stage
    freeze_epochs=None,  # keras-yolo3: 50, the first stage's, with the body frozen
    epochs=None,  # keras-yolo3: 100 in all
)

if __name__ == "__main__":
    sys.exit(main(settings=SETTINGS))
