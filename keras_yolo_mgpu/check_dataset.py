"""`python -m keras_yolo_mgpu.check_dataset`: alias of keras_yolo_mgpu.data.check."""

import sys

from keras_yolo_mgpu.data.check import main

if __name__ == "__main__":
    sys.exit(main())
