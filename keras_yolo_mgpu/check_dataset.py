"""`python -m keras_yolo_mgpu.check_dataset`: alias of keras_yolo_mgpu.cli.check_dataset."""

import sys

from keras_yolo_mgpu.cli.check_dataset import main

if __name__ == "__main__":
    sys.exit(main())
