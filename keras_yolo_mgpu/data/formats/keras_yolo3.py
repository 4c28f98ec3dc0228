"""keras-yolo3 annotation files (`path x1,y1,x2,y2,class ...` per line; see `data.annotations`)."""

from __future__ import annotations

from keras_yolo_mgpu.data.annotations import AnnotationError, iter_annotation_lines, parse_annotation_line
from keras_yolo_mgpu.data.formats.records import Problem, SplitRecords

__all__ = ["read_annotation_file"]


def read_annotation_file(path: str, root: str | None = None) -> SplitRecords:
    """Every line of `path` that parses as a record; the others as `malformed` problems."""
    split = SplitRecords(source=path)
    for line_number, line in iter_annotation_lines(path):
        split.num_entries += 1
        try:
            split.records.append(parse_annotation_line(line, source=path, line_number=line_number, root=root))
        except AnnotationError as error:
            split.problems.append(Problem(path, line_number, "malformed", error.problem))
    # A line without a box is how this format writes a background: it counts
    # as unlabelled, since nothing else could tell the two apart.
    without = [r for r in split.records if not len(r.boxes)]
    split.num_unlabelled = len(without)
    example = f", e.g. line {without[0].line_number} ({without[0].image_path}) has none" if without else ""
    split.labels_looked_for = f"on each line of {path} after the image path (x_min,y_min,x_max,y_max,class_id){example}"
    return split
