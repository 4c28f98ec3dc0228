"""Writers of YOLO-format, COCO and VOC datasets from keras-yolo3 records, for tests.

They follow the ORIGINAL definitions: YOLO labels are `class cx cy w h`
divided by the image size (ultralytics' convert_coco), COCO bboxes
`[x, y, width, height]` with category ids from 1, VOC `<bndbox>` corners.
"""

from __future__ import annotations

import json
import os

import numpy as np

from keras_yolo_mgpu.data.images import image_size

CLASSES = ["circle", "square"]


def write_yolo(folder, splits, class_names=CLASSES):
    for split, records in splits.items():
        for record in records:
            width, height = image_size(record.image_path)
            label = folder / "labels" / split / (os.path.splitext(os.path.basename(record.image_path))[0] + ".txt")
            label.parent.mkdir(parents=True, exist_ok=True)
            lines = [
                f"{int(c)} {(x1 + x2) / 2 / width!r} {(y1 + y2) / 2 / height!r} {(x2 - x1) / width!r} "
                f"{(y2 - y1) / height!r}"
                for x1, y1, x2, y2, c in record.boxes.astype(np.float64).tolist()
            ]
            label.write_text("\n".join(lines) + ("\n" if lines else ""))
    names = "".join(f"  {index}: {name}\n" for index, name in enumerate(class_names))
    (folder / "data.yaml").write_text(
        "path: .\ntrain: images/train\n" + ("val: images/val\n" if "val" in splits else "") + f"names:\n{names}",
        encoding="utf-8",
    )


def write_coco(path, records, class_names=CLASSES):
    images, objects = [], []
    for image_id, record in enumerate(records, start=1):
        width, height = image_size(record.image_path)
        images.append(
            {"id": image_id, "file_name": os.path.basename(record.image_path), "width": width, "height": height}
        )
        for x1, y1, x2, y2, c in record.boxes.astype(np.float64).tolist():
            objects.append(
                {"id": len(objects) + 1, "image_id": image_id, "category_id": int(c) + 1,
                 "bbox": [x1, y1, x2 - x1, y2 - y1], "iscrowd": 0, "area": (x2 - x1) * (y2 - y1)}
            )  # fmt: skip
    categories = [{"id": i + 1, "name": name} for i, name in enumerate(class_names)]
    path.write_text(json.dumps({"images": images, "annotations": objects, "categories": categories}))


def write_voc(folder, records, class_names=CLASSES):
    (folder / "Annotations").mkdir(parents=True)
    for record in records:
        stem = os.path.splitext(os.path.basename(record.image_path))[0]
        objects = "".join(
            f"<object><name>{class_names[int(c)]}</name><difficult>0</difficult><bndbox><xmin>{x1:g}</xmin>"
            f"<ymin>{y1:g}</ymin><xmax>{x2:g}</xmax><ymax>{y2:g}</ymax></bndbox></object>"
            for x1, y1, x2, y2, c in record.boxes.tolist()
        )
        width, height = image_size(record.image_path)
        size = f"<size><width>{width}</width><height>{height}</height><depth>3</depth></size>"
        xml = f"<annotation><filename>{os.path.basename(record.image_path)}</filename>{size}{objects}</annotation>"
        (folder / "Annotations" / f"{stem}.xml").write_text(xml)
