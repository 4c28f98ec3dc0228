"""`python train_bottleneck.py`: keras-yolo3's train_bottleneck.py, which is train.py with that script's settings.

keras-yolo3's train_bottleneck.py trains its two stages after a stage 0: the
output convolutions alone, on the frozen body's features of the un-augmented
images, computed once (`training.bottleneck`). Its batches are 8 in stage 0,
16 in stage 1 and 4 in stage 2. In a keras-yolo3 folder it reads
`model_data/coco_classes.txt` where train.py reads `voc_classes.txt`. Every
train.py flag works here, and a flag given wins over these settings.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from keras_yolo_mgpu.cli import train
from keras_yolo_mgpu.cli.script_settings import ScriptSettings

SCRIPT = "train_bottleneck.py"
# keras-yolo3's train_bottleneck.py: 30 bottleneck epochs, `batch_size = 16` in stage 1, `4` in stage 2.
KERAS_YOLO3_SETTINGS = dict(recipe="keras-yolo3", bottleneck_epochs=30, batch_size=16, batch_size2=4)


def build_parser():
    """train.py's flags with train_bottleneck.py's defaults."""
    parser = train.build_parser()
    parser.prog = SCRIPT
    parser.description = (
        "keras-yolo3's train_bottleneck.py: its two stages (--recipe keras-yolo3) after 30 epochs of the output "
        "convolutions alone on the body's features (--bottleneck-epochs), batches of 16 and 4 (keras-yolo-mgpu)"
    )
    parser.set_defaults(**KERAS_YOLO3_SETTINGS)
    return parser


def main(argv: Sequence[str] | None = None, settings: Mapping[str, object] | None = None) -> int:
    """`python train_bottleneck.py`; `settings`: what the script sets in its file (see train.main)."""
    return train.run_script(build_parser, ScriptSettings(SCRIPT, settings or {}), argv)


if __name__ == "__main__":
    sys.exit(main())
