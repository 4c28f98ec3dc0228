"""`python -m keras_yolo_mgpu.export`: alias of keras_yolo_mgpu.inference.export."""

import sys

from keras_yolo_mgpu.inference.export import main

if __name__ == "__main__":
    sys.exit(main())
