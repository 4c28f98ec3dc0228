"""`python -m keras_yolo_mgpu.align`: alias of keras_yolo_mgpu.cli.align."""

import sys

from keras_yolo_mgpu.cli.align import main

if __name__ == "__main__":
    sys.exit(main())
