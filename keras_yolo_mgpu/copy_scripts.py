"""`python -m keras_yolo_mgpu.copy_scripts [FOLDER]`: alias of keras_yolo_mgpu.cli.copy_scripts."""

import sys

from keras_yolo_mgpu.cli.copy_scripts import main

if __name__ == "__main__":
    sys.exit(main())
