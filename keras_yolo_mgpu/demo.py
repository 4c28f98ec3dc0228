"""`python -m keras_yolo_mgpu.demo`: alias of keras_yolo_mgpu.cli.demo."""

import sys

from keras_yolo_mgpu.cli.demo import main

if __name__ == "__main__":
    sys.exit(main())
