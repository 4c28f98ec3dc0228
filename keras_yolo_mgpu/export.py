"""`python -m keras_yolo_mgpu.export`: alias of keras_yolo_mgpu.cli.export."""

import sys

from keras_yolo_mgpu.cli.export import main

if __name__ == "__main__":
    sys.exit(main())
