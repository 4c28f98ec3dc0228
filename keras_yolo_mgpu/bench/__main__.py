"""`python -m keras_yolo_mgpu.bench`: alias of keras_yolo_mgpu.cli.bench."""

import sys

from keras_yolo_mgpu.cli.bench import main

if __name__ == "__main__":
    sys.exit(main())
