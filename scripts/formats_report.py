"""The same boxes through every dataset format `--data` reads, measured on a real VOC dataset.

Reads a Pascal VOC folder, writes its (checked) training records again as a
YOLO-format folder, a COCO instances JSON and a VOC folder in a temporary
folder (images linked, not copied; the writers of tests/dataset_writers.py,
which follow each format's own definition), opens each with
`data.dataset_source.open_dataset`, and prints, per format: the records
(equal boxes, as float32), the training targets of the validation pipeline
at --input-size (its batches finished by `DeviceInputs`, as training
finishes them; equal arrays), and the time to read and check the dataset.

    python scripts/formats_report.py /path/to/voc_dataset [--input-size 416]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))


def _targets(records, input_size, anchors, num_classes):
    from keras_yolo3_targets import dense_inputs

    from keras_yolo_mgpu.data.tf_dataset import make_dataset

    dataset = make_dataset(records, (input_size, input_size), anchors, num_classes, 8, training=False)
    batches = [list(dense_inputs(x, anchors, num_classes).values()) + [w] for x, _, w in dataset]
    return [np.concatenate(parts) for parts in zip(*batches)]  # images, targets per scale, weights


def _timed_records(path, num_classes, **options):
    from keras_yolo_mgpu.data.dataset_source import open_dataset

    start = time.perf_counter()
    dataset = open_dataset(path, **options)
    report = dataset.checked("train", num_classes)
    return dataset, report, time.perf_counter() - start


def main() -> int:
    from dataset_writers import write_coco, write_voc, write_yolo

    from keras_yolo_mgpu.resources import default_anchors_path, get_anchors

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("voc", help="a Pascal VOC dataset folder")
    parser.add_argument("--input-size", type=int, default=416)
    args = parser.parse_args()

    reference, report, seconds = _timed_records(args.voc, 1)
    names = reference.class_names
    records = report.annotations
    anchors = get_anchors(default_anchors_path(False))
    want = _targets(records, args.input_size, anchors, len(names))
    rows = [("voc (the original)", reference, report, seconds)]
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "yolo" / "images" / "train").mkdir(parents=True)
        for record in records:
            os.symlink(record.image_path, folder / "yolo" / "images" / "train" / os.path.basename(record.image_path))
        linked = [
            type(r)(str(folder / "yolo" / "images" / "train" / os.path.basename(r.image_path)), r.boxes)
            for r in records
        ]
        write_yolo(folder / "yolo", {"train": linked}, names)
        write_coco(folder / "yolo" / "images" / "train" / "instances.json", linked, names)
        write_voc(folder / "voc", linked, names)
        os.symlink(folder / "yolo" / "images" / "train", folder / "voc" / "JPEGImages")
        for label, path in (
            ("yolo (data.yaml)", folder / "yolo" / "data.yaml"),
            ("coco (instances.json)", folder / "yolo" / "images" / "train" / "instances.json"),
            ("voc (rewritten)", folder / "voc"),
        ):
            rows.append((label, *_timed_records(str(path), len(names))))
        print(f"{len(records)} images, {sum(len(r.boxes) for r in records)} boxes, classes {names}")
        print("| format | images | boxes equal | targets equal | read + check (s) |")
        print("|---|---|---|---|---|")
        for label, _, checked, seconds in rows:
            got = checked.annotations
            boxes_equal = len(got) == len(records) and all(
                np.array_equal(a.boxes, b.boxes) for a, b in zip(got, records)
            )
            targets_equal = all(
                np.array_equal(a, b) for a, b in zip(_targets(got, args.input_size, anchors, len(names)), want)
            )
            print(f"| {label} | {len(got)} | {boxes_equal} | {targets_equal} | {seconds:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
