#!/usr/bin/env python3
"""mAP of weights, or of saved detections, on an annotation file.

See `python evaluate.py --help`; the command lives in keras_yolo_mgpu/cli/evaluate.py.
"""

import sys

from keras_yolo_mgpu.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
