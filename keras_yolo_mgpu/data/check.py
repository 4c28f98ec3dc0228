"""Dataset checker: every annotation line, every image, every box.

    python -m keras_yolo_mgpu.check_dataset train.txt --classes model_data/voc_classes.txt

prints one line per problem, `FILE:LINE: message` (1-based, as editors and
compilers do), then a summary, and exits with status 1 when there is any
problem (2 when the command itself is wrong). It only reads: no file is ever
modified. Problem kinds:

    malformed           a token that is not x_min,y_min,x_max,y_max,class_id
    missing-file        the image does not exist
    unreadable-image    its header is unreadable (empty, not an image, cut inside the header); with a full
                        decode (`--full`), anything PIL cannot decode
    box-outside-image   a coordinate below 0 or beyond the image's width/height
    degenerate-box      zero or negative width or height, or under 1 px once clipped to the image
    class-out-of-range  class id not in [0, num_classes)
    duplicate-box       the same box twice on one line
    label-without-image a YOLO-format label file whose image does not exist
    size-mismatch       the annotation gives the image another width and height than the file's (COCO, VOC):
                        its boxes cannot be placed, and the image is left out (a photo turned by its EXIF
                        orientation whose annotation records the stored size has its boxes turned with it)

Datasets in other formats (`data.dataset_source`) are checked by
`check_records`: their readers report what is wrong with the file itself and
hand the images they could read to the same image and box checks.

Training uses `report.annotations`: the lines without any problem, plus those
whose only problems are `REPAIRABLE`, repaired as keras-yolo3's generator
clipped them. Whether labels were found at all is judged here too, for every
format (`CheckReport.no_boxes_message`, `unlabelled_warning`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import Counter
from dataclasses import dataclass

import numpy as np

from keras_yolo_mgpu.data.annotations import Annotation, drawn_on_stored_pixels
from keras_yolo_mgpu.data.formats.keras_yolo3 import read_annotation_file
from keras_yolo_mgpu.data.formats.records import Problem, SplitRecords
from keras_yolo_mgpu.data.images import ORIENTATION_NAMES, displayed_size, stored_to_displayed
from keras_yolo_mgpu.data.scan import record_path, scan_images
from keras_yolo_mgpu.wording import counted

logger = logging.getLogger(__name__)

__all__ = ["KINDS", "CheckReport", "check_annotations", "check_records", "degenerate_box_reason"]

KINDS = (
    "malformed",
    "missing-file",
    "unreadable-image",
    "box-outside-image",
    "degenerate-box",
    "class-out-of-range",
    "duplicate-box",
    "label-without-image",
    "size-mismatch",
)


@dataclass
class CheckReport:
    """What `check_annotations` found.

    Attributes:
        annotations: the lines without any problem, in file order.
        problems: every problem, by line.
        num_lines: non-blank lines read.
        num_images: lines that name an image (all but the malformed ones).
        num_boxes: boxes on those lines.
        num_backgrounds: lines with no box.
        source: the annotation file.
        num_unlabelled: images for which the reader found no labels at all
            (see `SplitRecords.num_unlabelled`).
        labels_looked_for: where the reader looked for labels, with an
            example path (see `SplitRecords.labels_looked_for`).
    """

    annotations: list[Annotation]
    problems: list[Problem]
    num_lines: int = 0
    num_images: int = 0
    num_boxes: int = 0
    num_backgrounds: int = 0
    source: str = ""
    images_checked: bool = True
    # What `num_lines` counts: annotation lines, or the images a dataset lists.
    entry_word: str = "lines"
    num_unlabelled: int = 0
    labels_looked_for: str = ""

    @property
    def num_usable_boxes(self) -> int:
        """Boxes training gets: those of `annotations`, after the repairs."""
        return sum(len(a.boxes) for a in self.annotations)

    @property
    def num_bad_lines(self) -> int:
        return len({(p.source, p.line_number) for p in self.problems})

    @property
    def problems_by_kind(self) -> dict[str, int]:
        counts = Counter(p.kind for p in self.problems)
        return {kind: counts[kind] for kind in KINDS if counts[kind]}

    def summary_text(self) -> str:
        """One line, e.g. `train.txt: 120 lines, 118 usable; 118 images, ...`."""
        text = (
            f"{self.source}: {counted(self.num_lines, self.entry_word)}, {len(self.annotations)} usable; "
            f"{counted(self.num_images, 'images')}, {counted(self.num_boxes, 'boxes')}, "
            f"{counted(self.num_backgrounds, 'backgrounds')}"
        )
        if not self.images_checked:
            text += " (images not decoded)"
        if not self.problems:
            return text + "; no problems"
        kinds = ", ".join(f"{kind} {count}" for kind, count in self.problems_by_kind.items())
        return f"{text}; {counted(len(self.problems), 'problems')} on {counted(self.num_bad_lines, 'lines')} ({kinds})"

    def no_boxes_message(self, split: str = "training") -> str | None:
        """Why the split gives no box to learn from, where labels were looked for; None when it gives some.

        Args:
            split: the split's name in the message ("training", "validation").
        """
        if self.num_usable_boxes or not self.num_lines:
            return None
        if self.num_unlabelled >= self.num_lines:
            text = f"{self.source}: no labels found for any of the {self.num_lines} {split} images"
        else:
            found = [f"{self.num_unlabelled} without labels"] if self.num_unlabelled else []
            if self.problems:
                found.append(f"{self.num_bad_lines} with problems, the first: {self.problems[0]}")
            backgrounds = self.num_lines - self.num_unlabelled - self.num_bad_lines
            if backgrounds > 0:
                found.append(counted(backgrounds, "backgrounds"))
            text = f"{self.source}: no box left in the {self.num_lines} {split} images read ({'; '.join(found)})"
        if self.labels_looked_for:
            text += f"; labels are looked for {self.labels_looked_for}"
        return text

    def unlabelled_warning(self, split: str = "training") -> str | None:
        """A warning when more than half of the images have no labels at all; None otherwise."""
        if self.num_unlabelled * 2 <= self.num_lines:
            return None
        text = f"{self.source}: {self.num_unlabelled} of the {self.num_lines} {split} images have no labels"
        if self.labels_looked_for:
            text += f"; labels are looked for {self.labels_looked_for}"
        return text + ". They count as backgrounds (no object): if they hold objects, put their labels there"

    def class_list_mismatch(self, class_list: str) -> str | None:
        """An error when more than half of the entries have class ids beyond `class_list` (the names' source, as
        the message names it): that list is not the one these labels index; None otherwise."""
        # An entry: a line of this annotation file, else a file of its own (a YOLO label file, a VOC XML, ...).
        lines = {
            (p.source, p.line_number) if p.source == self.source else p.source
            for p in self.problems
            if p.kind == "class-out-of-range"
        }
        if len(lines) * 2 <= self.num_lines:
            return None
        first = next(p for p in self.problems if p.kind == "class-out-of-range")
        return (
            f"{self.source}: {len(lines)} of the {counted(self.num_lines, self.entry_word)} have class ids beyond "
            f"{class_list} (first: {first}): those names are not the ones these labels count. Give this dataset's "
            "class names (--classes FILE)"
        )

    def write_problems(self, path: str) -> None:
        """Writes every problem, one `FILE:LINE: message` per line, then the summary."""
        with open(path, "w", encoding="utf-8") as f:
            for problem in self.problems:
                f.write(f"{problem}\n")
            f.write(self.summary_text() + "\n")


# Problems training can repair: clip boxes to the image, drop repeats and
# degenerate boxes (the image and its other boxes stay), as keras-yolo3's
# generator did. The checker still reports them.
REPAIRABLE = frozenset({"box-outside-image", "duplicate-box", "degenerate-box"})

# keras-yolo3's generator drops a box 1 px or less wide or high once clipped
# and resized to the input (the pipeline still does); the checker drops, in
# the image's own pixels, a box under 1 px once clipped, and only that box.
MIN_BOX_SIZE = 1.0
# The end of every degenerate-box message, in every format.
DROPPED = "the box is dropped, the image and its other boxes kept"


def degenerate_box_reason(box, size: tuple[int, int] | None = None) -> str | None:
    """Why the box is dropped, or None when it is kept.

    Args:
        box: x_min, y_min, x_max, y_max (more values, such as the class id, are ignored), pixels.
        size: (width, height) of the image the box is clipped to; None clips at 0 only.

    Returns:
        e.g. "zero width (x_max == x_min)" or "under 1 px once clipped to the 64x48 image (0.5 x 20 px)".
    """
    x1, y1, x2, y2 = (float(v) for v in box[:4])
    for name, low, high, axis in (("width", x1, x2, "x"), ("height", y1, y2, "y")):
        if high == low:
            return f"zero {name} ({axis}_max == {axis}_min)"
        if high < low:
            return f"negative {name} ({axis}_max < {axis}_min)"
    width = (min(x2, size[0]) if size else x2) - max(x1, 0.0)
    height = (min(y2, size[1]) if size else y2) - max(y1, 0.0)
    if width < MIN_BOX_SIZE or height < MIN_BOX_SIZE:
        where = f"clipped to the {size[0]}x{size[1]} image" if size else "clipped at 0"
        if width <= 0 or height <= 0:
            return f"nothing left once {where}"
        return f"under {MIN_BOX_SIZE:g} px once {where} ({width:g} x {height:g} px)"
    return None


def repair_boxes(annotation: Annotation, size: tuple[int, int] | None) -> Annotation:
    """Boxes clipped to the (width, height) image; repeats and degenerate boxes dropped."""
    boxes = annotation.boxes.copy()
    if len(boxes):
        keep = [degenerate_box_reason(box, size) is None for box in boxes]
        boxes = boxes[np.array(keep, bool)]
        boxes[:, 0:2] = np.maximum(boxes[:, 0:2], 0)
        if size is not None:
            boxes[:, 2] = np.minimum(boxes[:, 2], size[0])
            boxes[:, 3] = np.minimum(boxes[:, 3], size[1])
        _, first = np.unique(boxes, axis=0, return_index=True)
        boxes = boxes[np.sort(first)]
    return dataclasses.replace(annotation, boxes=boxes.reshape(-1, 5).astype(np.float32))


def _box_text(box) -> str:
    return ",".join(f"{v:g}" for v in box)


def _box_problems(annotation: Annotation, num_classes: int, size: tuple[int, int] | None) -> list[tuple[str, str]]:
    problems = []
    seen: dict[tuple, int] = {}
    for number, box in enumerate(annotation.boxes.tolist(), start=1):
        x1, y1, x2, y2, class_id = box
        text = f"box {number} ({_box_text(box)})"
        reason = degenerate_box_reason(box, size)
        if reason:
            problems.append(("degenerate-box", f"{text}: {reason}; {DROPPED}"))
        if x1 < 0 or y1 < 0 or (size is not None and (x2 > size[0] or y2 > size[1])):
            where = f"the {size[0]}x{size[1]} image" if size is not None else "the image (negative coordinate)"
            problems.append(("box-outside-image", f"{text} extends outside {where}"))
        if not 0 <= class_id < num_classes:
            problems.append(("class-out-of-range", f"{text}: class id {int(class_id)} not in [0, {num_classes})"))
        key = tuple(box)
        if key in seen:
            problems.append(("duplicate-box", f"{text} duplicates box {seen[key]}"))
        else:
            seen[key] = number
    return problems


def check_annotations(
    path: str,
    num_classes: int,
    root: str | None = None,
    **options,
) -> CheckReport:
    """Checks an annotation file and its images; never modifies anything.

    Args:
        path: keras-yolo3 annotation file.
        num_classes: valid class ids are [0, num_classes).
        root: folder for relative image paths (see `annotations.resolve_image_path`).
        **options: `check_records`' keyword arguments (`check_images`,
            `workers`, `progress`, `full_decode`, `record_dir`, `write_record`).

    Returns:
        A `CheckReport`; `report.annotations` holds the lines with no problem.

    Raises:
        OSError: the annotation file cannot be read.
    """
    return check_records(read_annotation_file(path, root), num_classes, **options)


def _match_recorded_sizes(
    records: list[Annotation], sizes: np.ndarray, orientations: np.ndarray, source: str
) -> tuple[list[Annotation], dict[int, str]]:
    """Puts every record's boxes on its image as displayed; returns (records, {record index: mismatch message}).

    Images are read upright (EXIF orientation applied, `data.images`). Boxes
    drawn on the stored pixels are turned with them: those of keras-yolo3's
    files (which record no size; keras-yolo3 read images as stored), and
    those of a COCO or VOC file that records the stored size of a photo
    turned 90 degrees. A recorded size that is neither the displayed nor the
    stored one (an image resized or replaced after labelling) is a mismatch.

    Args:
        records: N records; `recorded_size` None where the format records no size.
        sizes: (N, 2) (width, height) of each record's image as displayed, -1 when unknown.
        orientations: (N,) the EXIF orientation of each record's image, 1 when unknown.
    """
    recorded = np.array([a.recorded_size or (-1, -1) for a in records], np.int64).reshape(-1, 2)
    known = sizes[:, 0] > 0
    stored_grid = known & (recorded[:, 0] < 0) & (orientations != 1)
    differs = known & (recorded[:, 0] > 0) & (recorded != sizes).any(axis=1)
    candidates = np.flatnonzero(stored_grid | differs).tolist()
    if not candidates:
        return records, {}
    records, mismatched, turned = list(records), {}, []
    for index in candidates:
        annotation, orientation = records[index], int(orientations[index])
        shown = (int(sizes[index, 0]), int(sizes[index, 1]))
        stored = displayed_size(shown, orientation)  # the swap is its own inverse
        if drawn_on_stored_pixels(annotation.recorded_size, stored, orientation):
            boxes = stored_to_displayed(annotation.boxes, orientation, stored).astype(np.float32)
            records[index] = dataclasses.replace(annotation, boxes=boxes, recorded_size=shown)
            turned.append((annotation.image_path, orientation))
            continue
        width, height = annotation.recorded_size
        mismatched[index] = (
            f"the annotation gives the image as {width}x{height} pixels, and {annotation.image_path} is "
            f"{shown[0]}x{shown[1]} (resized or replaced after labelling?): its boxes cannot be placed; "
            "the image is left out"
        )
    if turned:
        logger.info(
            "%s: %d image(s) carry an EXIF orientation and were labelled on their stored pixels (first %s: %s): "
            "their boxes are turned with them, since every command reads images as displayed",
            source,
            len(turned),
            turned[0][0],
            ORIENTATION_NAMES[turned[0][1]],
        )
    return records, mismatched


def _screen_boxes(records: list[Annotation], sizes: np.ndarray, num_classes: int) -> np.ndarray:
    """(N,) bool: the records with a box `_box_problems` may report, found with array operations.

    Only those go through the per-box Python checks (which word the
    messages). The tests are `degenerate_box_reason`'s and `_box_problems`'
    own, in float64 as Python floats compute them.

    Args:
        records: N records.
        sizes: (N, 2) stored (width, height) of each record's image, -1 when unknown.
    """
    counts = np.fromiter((len(a.boxes) for a in records), np.int64, len(records))
    flagged = np.zeros(len(records), bool)
    if not counts.sum():
        return flagged
    boxes = np.concatenate([a.boxes for a in records if len(a.boxes)]).astype(np.float64)
    owner = np.repeat(np.arange(len(records)), counts)
    x1, y1, x2, y2, class_id = boxes.T
    width, height = sizes[owner, 0].astype(np.float64), sizes[owner, 1].astype(np.float64)
    known = width > 0
    clipped_w = np.where(known, np.minimum(x2, width), x2) - np.maximum(x1, 0.0)
    clipped_h = np.where(known, np.minimum(y2, height), y2) - np.maximum(y1, 0.0)
    bad = (x2 <= x1) | (y2 <= y1) | (clipped_w < MIN_BOX_SIZE) | (clipped_h < MIN_BOX_SIZE)
    bad |= (x1 < 0) | (y1 < 0) | (known & ((x2 > width) | (y2 > height)))
    bad |= ~((class_id >= 0) & (class_id < num_classes))
    # A repeated box: equal rows of one record are neighbours once sorted by record, then by value.
    order = np.lexsort((*boxes.T[::-1], owner))
    rows = np.column_stack([owner, boxes])[order]
    repeat = np.zeros(len(boxes), bool)
    repeat[order[1:]] = (rows[1:] == rows[:-1]).all(axis=1)
    flagged[owner[bad | repeat]] = True
    return flagged


def check_records(
    split: SplitRecords,
    num_classes: int,
    *,
    check_images: bool = True,
    workers: int | None = None,
    progress: bool = False,
    full_decode: bool = False,
    record_dir: str | None = None,
    write_record: bool = True,
) -> CheckReport:
    """Checks a split of any format and its images; never modifies anything.

    Args:
        split: what a reader made of the dataset's entries (`SplitRecords`).
        num_classes: valid class ids are [0, num_classes).
        check_images: read every image's header (finds unreadable files and
            gives the size that boxes are checked against; `data.scan`). When
            False only the existence of each image is checked.
        workers: threads reading images (default: CPU count, at most 8).
        progress: show the progress (`progress.progress_bar`).
        full_decode: with `check_images`, decode every image in full instead
            of reading its header (`check_dataset --full`).
        record_dir, write_record: the folder of scan records (`data.scan.cache_dir`;
            None: no record) and whether to write the record back (the chief does).

    Returns:
        A `CheckReport`; `report.annotations` holds the records with no
        problem, and those whose only problems training repairs.
    """
    records, source = split.records, split.source
    mode = "full" if check_images and full_decode else "header" if check_images else "none"
    scan = scan_images(
        [a.image_path for a in records],
        mode,
        record=record_path(record_dir, f"scan-{mode}", {"source": os.path.abspath(source)}) if record_dir else None,
        write_record=write_record,
        workers=workers,
        progress=progress,
    )
    position = {path: index for index, path in enumerate(scan.paths)}
    at = np.fromiter((position[a.image_path] for a in records), np.int64, len(records))
    sizes = scan.sizes[at] if len(records) else np.zeros((0, 2), np.int32)
    orientations = scan.orientations[at] if len(records) else np.ones(0, np.int8)
    records, mismatched = _match_recorded_sizes(records, sizes, orientations, source)
    screened = _screen_boxes(records, sizes, num_classes)
    # Records are keyed by position: a COCO JSON's records share one source and line 0.
    found_by_record: dict[int, list[Problem]] = {}
    good = []
    for index, annotation in enumerate(records):
        size, kind, message = scan.result(at[index])
        if not kind and not screened[index] and index not in mismatched:  # the common case: nothing to word
            good.append(Annotation(annotation.image_path, annotation.boxes, annotation.source,
                                   annotation.line_number, size, size or annotation.recorded_size))  # fmt: skip
            continue
        found = [(kind, message)] if kind else []
        if index in mismatched:  # its boxes are in another image's pixels: checking them says nothing more
            found.append(("size-mismatch", mismatched[index]))
        else:
            found += _box_problems(annotation, num_classes, size)
        if found:
            found_by_record[index] = [Problem(annotation.source, annotation.line_number, k, m) for k, m in found]
            if all(k in REPAIRABLE for k, _ in found):
                repaired = repair_boxes(annotation, size)
                good.append(dataclasses.replace(repaired, size=size, recorded_size=size or annotation.recorded_size))
        else:
            good.append(dataclasses.replace(annotation, size=size, recorded_size=size or annotation.recorded_size))
    problems = list(split.problems) + [p for index in sorted(found_by_record) for p in found_by_record[index]]
    problems.sort(key=lambda p: (p.source, p.line_number))  # stable: a line's problems keep their order
    return CheckReport(
        annotations=good,
        problems=problems,
        num_lines=split.num_entries,
        num_images=len(records),
        num_boxes=sum(len(a.boxes) for a in records),
        num_backgrounds=sum(len(a.boxes) == 0 for a in records),
        source=source,
        images_checked=check_images,
        num_unlabelled=split.num_unlabelled,
        labels_looked_for=split.labels_looked_for,
    )
