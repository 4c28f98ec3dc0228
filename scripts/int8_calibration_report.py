"""INT8 TFLite calibrated with and without the images' mirrors: mAP@0.5 of each against the Keras weights.

    python scripts/int8_calibration_report.py --weights best.weights.h5 --images train.txt \
        --annotations val.txt --out /tmp/int8_report

Both exports calibrate on the same images of `--images` (letterboxed as at
inference); one adds each image's left-right mirror, as `export --int8`
does (`quantize.calibration_batches`). mAP by `evaluate.py`'s code on
`--annotations` (docs/inference.md, "Measured").
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", required=True, help="trained weights with metadata (.weights.h5)")
    parser.add_argument("--images", required=True, help="training images (annotation file or folder)")
    parser.add_argument("--annotations", required=True, help="validation annotation file")
    parser.add_argument("--out", required=True, help="folder for the two exports")
    args = parser.parse_args(argv)

    from keras_yolo_mgpu.evaluation.mean_ap import evaluate_weights
    from keras_yolo_mgpu.inference import quantize
    from keras_yolo_mgpu.inference.export import export_model

    Path(args.out).mkdir(parents=True, exist_ok=True)
    keras_map = evaluate_weights(args.weights, args.annotations, progress=False)["mAP50"]
    print(f"keras: mAP@0.5 {keras_map:.4f}")
    calibration = quantize.calibration_batches
    for mirrored in (False, True):
        quantize.calibration_batches = functools.partial(calibration, mirrored=mirrored)
        try:
            path = str(Path(args.out) / f"int8_mirrored_{mirrored}.tflite")
            export_model(args.weights, "tflite", path, precision="int8", images=args.images, overwrite=True)
        finally:
            quantize.calibration_batches = calibration
        result = evaluate_weights(path, args.annotations, progress=False)
        print(f"int8, mirrors {mirrored}: mAP@0.5 {result['mAP50']:.4f} (drop {keras_map - result['mAP50']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
