"""mAP of trained weights, or of saved detections, on an annotation file.

The COCO protocol (mAP@[.5:.95], mAP@.5, 101-point interpolated precision,
at most 100 detections per image) is computed by faster-coco-eval, a
pycocotools-compatible implementation; this module only converts the
annotation file and the detections to COCO's format and reports:

* COCO mAP@[.5:.95], mAP@.5 and mAP@.75, and AP / AP50 per class;
* precision and recall at the chosen score threshold: detections scoring at
  least `score` matched greedily, best first, to unmatched ground truth of
  the same class with IoU >= 0.5 (what a user of `yolo_video.py --score`
  gets);
* a PNG of the precision-recall curve at IoU 0.5, per class and averaged;
* for an export, its mAP against that of the Keras weights it came from
  (`compare_map`, `export.py --validation`).

Detections in COCO results format: `image_id` is the 0-based index of the
image's line among the annotation file's non-blank lines, `category_id` the
class index, `bbox` `[x, y, width, height]` in pixels, `score`.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from collections.abc import Iterable, Sequence

import numpy as np

from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.images import image_size, read_image
from keras_yolo_mgpu.fileio import write_text_atomic
from keras_yolo_mgpu.model.box_matching import MATCH_IOU, greedy_matches, iou_matrix
from keras_yolo_mgpu.optional import faster_coco_eval
from keras_yolo_mgpu.optional import pyplot as plt
from keras_yolo_mgpu.outputs import record_written
from keras_yolo_mgpu.plots.evaluation import evaluation_picture_paths, write_evaluation_pictures
from keras_yolo_mgpu.progress import progress_bar
from keras_yolo_mgpu.resources import get_classes, resolve_resource
from keras_yolo_mgpu.weights.metadata import settings_for
from keras_yolo_mgpu.wording import counted

logger = logging.getLogger(__name__)

# Scores below this are dropped before COCO evaluation when running a model:
# the COCO protocol ranks detections down to very low scores.
EVAL_MIN_SCORE = 0.001
EVAL_MAX_DETECTIONS = 100  # COCO's maxDets
DEFAULT_MAX_MAP_DROP = 0.02  # mAP@0.5 an export may lose against the Keras weights without a warning


# ---- COCO conversion ------------------------------------------------------


def _image_size(annotation) -> tuple[int, int]:
    """(width, height) from the image header, or from the boxes when it is missing."""
    try:
        return image_size(annotation.image_path)
    except (OSError, ValueError):
        boxes = annotation.boxes
        if len(boxes):
            return int(np.ceil(boxes[:, 2].max())), int(np.ceil(boxes[:, 3].max()))
        return 0, 0


def coco_ground_truth(annotations, class_names: Sequence[str], image_sizes: Sequence[tuple[int, int]]) -> dict:
    """COCO ground-truth dict: image id = line index, category id = class index."""
    images, objects = [], []
    for image_id, (annotation, (width, height)) in enumerate(zip(annotations, image_sizes)):
        images.append({"id": image_id, "width": int(width), "height": int(height), "file_name": annotation.image_path})
        for x1, y1, x2, y2, cls in np.asarray(annotation.boxes, dtype=np.float64).reshape(-1, 5):
            cls = int(cls)
            if not 0 <= cls < len(class_names):
                raise ValueError(
                    f"{annotation.source}:{annotation.line_number}: class id {cls} is not in the "
                    f"{counted(len(class_names), 'classes')} of the classes file"
                )
            w, h = x2 - x1, y2 - y1
            # Ids from 1: pycocotools treats a matched ground-truth id of 0 as unmatched.
            objects.append(
                {
                    "id": len(objects) + 1,
                    "image_id": image_id,
                    "category_id": cls,
                    "bbox": [x1, y1, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
    categories = [{"id": i, "name": name} for i, name in enumerate(class_names)]
    return {"images": images, "annotations": objects, "categories": categories}


def check_detections(detections, num_images: int, num_classes: int, source: str = "detections") -> list[dict]:
    """Validates COCO results entries; returns them with float bboxes and scores.

    Raises:
        ValueError: naming the entry and what is wrong with it.
    """
    if isinstance(detections, dict) and "annotations" in detections:
        detections = detections["annotations"]
    if not isinstance(detections, list):
        raise ValueError(f"{source}: expected a JSON list of detections (COCO results format)")
    checked = []
    for index, entry in enumerate(detections):
        where = f"{source}: detection {index}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object with image_id, category_id, bbox, score")
        missing = [k for k in ("image_id", "category_id", "bbox", "score") if k not in entry]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        image_id, category_id = entry["image_id"], entry["category_id"]
        if not isinstance(image_id, int) or not 0 <= image_id < num_images:
            raise ValueError(
                f"{where}: image_id {image_id!r} is not an image index (0..{num_images - 1}: the 0-based index "
                "of the image's line among the annotation file's non-blank lines)"
            )
        if not isinstance(category_id, int) or not 0 <= category_id < num_classes:
            raise ValueError(f"{where}: category_id {category_id!r} is not a class index (0..{num_classes - 1})")
        bbox = entry["bbox"]
        if not isinstance(bbox, (list, tuple)) or len(bbox) != 4:
            raise ValueError(f"{where}: bbox must be [x, y, width, height]; got {bbox!r}")
        try:
            bbox = [float(v) for v in bbox]
            score = float(entry["score"])
        except (TypeError, ValueError):
            raise ValueError(f"{where}: bbox and score must be numbers") from None
        checked.append({"image_id": image_id, "category_id": category_id, "bbox": bbox, "score": score})
    return checked


def _run_coco(ground_truth: dict, detections: list[dict]):
    coco_gt = faster_coco_eval.COCO(ground_truth)
    coco_dt = coco_gt.loadRes(detections) if detections else coco_gt.loadRes([])
    evaluator = faster_coco_eval.COCOeval_faster(coco_gt, coco_dt, "bbox", print_function=logger.debug)
    evaluator.params.maxDets = [1, 10, EVAL_MAX_DETECTIONS]
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return evaluator


def _mean_valid(values: np.ndarray) -> float | None:
    values = values[values > -1]
    return float(values.mean()) if values.size else None


# ---- Precision and recall at one threshold --------------------------------


def precision_recall_at(
    annotations, detections: list[dict], score: float, num_classes: int, iou: float = MATCH_IOU
) -> dict:
    """TP, FP, FN, precision and recall of detections scoring >= `score`."""
    by_image: dict[int, list[dict]] = {}
    for d in detections:
        if d["score"] >= score:
            by_image.setdefault(d["image_id"], []).append(d)
    tp = fp = 0
    total_gt = 0
    for image_id, annotation in enumerate(annotations):
        gt = np.asarray(annotation.boxes, dtype=np.float64).reshape(-1, 5)
        total_gt += len(gt)
        found = sorted(by_image.get(image_id, []), key=lambda d: -d["score"])
        for cls in range(num_classes):
            gt_boxes = gt[gt[:, 4] == cls, :4]
            dets = [d for d in found if d["category_id"] == cls]
            if not dets:
                continue
            det_boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (d["bbox"] for d in dets)], dtype=np.float64)
            if not len(gt_boxes):
                fp += len(dets)
                continue
            matched = greedy_matches(iou_matrix(det_boxes, gt_boxes), iou)  # dets are best score first
            tp += matched
            fp += len(dets) - matched
    fn = total_gt - tp
    return {
        "precision": tp / (tp + fp) if tp + fp else 0.0,
        "recall": tp / total_gt if total_gt else 0.0,
        "tp": tp,
        "fp": fp,
        "fn": fn,
    }


# ---- The PR curve ---------------------------------------------------------


def plot_pr_curve(evaluator, class_names: Sequence[str], path: str, point: tuple[float, float] | None = None) -> str:
    """Precision-recall curves at IoU 0.5 (area all, 100 detections) as a PNG."""
    plt.matplotlib.use("Agg")  # files, no display; a no-op once set

    precision = evaluator.eval["precision"][0, :, :, 0, -1]  # (101 recall points, classes)
    recall = evaluator.params.recThrs
    fig, ax = plt.subplots(figsize=(7, 6), dpi=100)
    show_classes = len(class_names) <= 20
    for k, name in enumerate(class_names):
        curve = precision[:, k]
        if (curve < 0).all():
            continue  # no ground truth of this class
        curve = np.clip(curve, 0, None)
        ax.plot(
            recall, curve, linewidth=1, alpha=0.6, label=f"{name} (AP50 {curve.mean():.3f})" if show_classes else None
        )
    valid = precision[:, (precision > -1).any(axis=0)]
    if valid.size:
        mean_curve = np.clip(valid, 0, None).mean(axis=1)
        ax.plot(recall, mean_curve, color="black", linewidth=2.5, label=f"all classes (mAP50 {mean_curve.mean():.3f})")
    if point is not None:
        ax.plot(
            point[1],
            point[0],
            "o",
            color="red",
            markersize=8,
            label=f"score threshold: P {point[0]:.2f}, R {point[1]:.2f}",
        )
    ax.set(xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02), title="Precision-recall at IoU 0.5")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


# ---- Public entry points --------------------------------------------------


def load_annotations(annotations, root: str | None = None) -> list:
    """The records of a keras-yolo3 annotation file (image paths resolved against `root`), or `annotations` as a list.

    Raises:
        FileNotFoundError: the file does not exist.
    """
    if isinstance(annotations, (str, os.PathLike)):
        path = os.fspath(annotations)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"annotation file not found: {path}")
        return read_annotations(path, root=root)
    return list(annotations)


def _class_names(class_names):
    if class_names is None:
        return get_classes(resolve_resource(None, "classes"))
    if isinstance(class_names, (str, os.PathLike)):
        return get_classes(class_names)
    return list(class_names)


def evaluate_detections(
    detections,
    annotations,
    class_names,
    *,
    score: float = 0.3,
    root: str | None = None,
    pr_curve: str | None = None,
    image_sizes: Sequence[tuple[int, int]] | None = None,
) -> dict:
    """Scores detections in COCO results format against an annotation file.

    Args:
        detections: COCO results: a JSON file path or a list of dicts
            (`image_id` = line index, `category_id` = class index, `bbox` =
            [x, y, w, h] pixels, `score`).
        annotations: annotation file path, or a list of `Annotation`.
        class_names: classes file path or list of names.
        score: threshold for the precision and recall figures.
        root: folder for relative image paths in the annotation file.
        pr_curve: PNG file for the precision-recall curve (None: no plot).

    Returns:
        A dict: `mAP` (COCO @[.5:.95]), `mAP50`, `mAP75`, `per_class`
        ({name: {"AP", "AP50", "ground_truth", "detections"}}; AP is None for
        a class without ground truth), `precision`, `recall`, `tp`, `fp`,
        `fn`, `score_threshold`, `num_images`, `num_detections`, `pr_curve`.
    """
    annotations = load_annotations(annotations, root)
    class_names = _class_names(class_names)
    if isinstance(detections, (str, os.PathLike)):
        source = os.fspath(detections)
        if not os.path.isfile(source):
            raise FileNotFoundError(f"detections file not found: {source}")
        try:
            with open(source, encoding="utf-8") as f:
                detections = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{source}: not valid JSON ({error})") from None
    else:
        source = "detections"
    detections = check_detections(detections, len(annotations), len(class_names), source)
    if image_sizes is None:
        image_sizes = [_image_size(a) for a in annotations]
    evaluator = _run_coco(coco_ground_truth(annotations, class_names, image_sizes), detections)

    stats = [float(s) for s in evaluator.stats]
    precision = evaluator.eval["precision"]  # (iou, recall, class, area, maxDets)
    gt_counts = np.zeros(len(class_names), int)
    for a in annotations:
        classes = np.asarray(a.boxes).reshape(-1, 5)[:, 4].astype(int)
        np.add.at(gt_counts, classes, 1)
    det_counts = np.bincount([d["category_id"] for d in detections], minlength=len(class_names))
    per_class = {}
    for k, name in enumerate(class_names):
        per_class[name] = {
            "AP": _mean_valid(precision[:, :, k, 0, -1]),
            "AP50": _mean_valid(precision[0, :, k, 0, -1]),
            "ground_truth": int(gt_counts[k]),
            "detections": int(det_counts[k]),
        }
    at_threshold = precision_recall_at(annotations, detections, score, len(class_names))
    result = {
        "mAP": stats[0] if stats[0] > -1 else None,
        "mAP50": stats[1] if stats[1] > -1 else None,
        "mAP75": stats[2] if stats[2] > -1 else None,
        "per_class": per_class,
        "score_threshold": float(score),
        **at_threshold,
        "num_images": len(annotations),
        "num_detections": len(detections),
        "pr_curve": None,
    }
    if pr_curve:
        result["pr_curve"] = plot_pr_curve(
            evaluator, class_names, pr_curve, (at_threshold["precision"], at_threshold["recall"])
        )
        result.update(write_evaluation_pictures(annotations, detections, class_names, pr_curve, score))
        record_written(evaluation_picture_paths(pr_curve).values())  # a re-run replaces them
    return result


def _prefetch(iterable: Iterable, size: int = 2):
    """Runs `iterable` on a thread, `size` items ahead (image decoding overlaps the model)."""
    items: queue.Queue = queue.Queue(maxsize=size)
    end = object()
    failure = []

    def produce():
        try:
            for item in iterable:
                items.put(item)
        except BaseException as error:  # noqa: BLE001 - re-raised below
            failure.append(error)
        finally:
            items.put(end)

    threading.Thread(target=produce, daemon=True, name="eval-reader").start()
    while True:
        item = items.get()
        if item is end:
            if failure:
                raise failure[0]
            return
        yield item


def detect_annotations(
    yolo, annotations, *, progress: bool = True, skipped: list | None = None
) -> tuple[list[dict], list[tuple[int, int]]]:
    """Runs `yolo` on every image of `annotations`.

    Args:
        skipped: when given, an image no decoder reads is left out, with a
            warning naming it, and its index in `annotations` appended here;
            image ids then count the images read. When None it raises.

    Returns:
        COCO results (image_id = index among the images read) and each image's (width, height).
    """

    def read(index, a):
        try:
            return read_image(a.image_path)
        except (OSError, ValueError) as error:
            where = f"{a.source}:{a.line_number}" if a.line_number else a.source
            if skipped is None:
                raise FileNotFoundError(f"{where}: cannot read image {a.image_path}: {error}") from None
            logger.warning("%s: cannot read image %s (%s): skipped", where, a.image_path, error)
            skipped.append(index)
            return None

    def batches():
        first = 0  # image id of the batch's first image: images read so far
        for start in range(0, len(annotations), yolo.batch_size):
            chunk = annotations[start : start + yolo.batch_size]
            images = [read(start + offset, a) for offset, a in enumerate(chunk)]
            prepared = [yolo.preprocess(image) for image in images if image is not None]
            if prepared:
                yield first, prepared
            first += len(prepared)
            bar.update(len(chunk) - len(prepared))

    results, sizes = [], []
    with progress_bar(len(annotations), unit="image", desc="detect", enabled=progress) as bar:
        for first, prepared in _prefetch(batches()):
            found = yolo.detect_letterboxed(np.stack([p[0] for p in prepared]), [p[1] for p in prepared])
            results.extend(coco_results(first, found))
            sizes.extend((int(width), int(height)) for _, (height, width) in prepared)
            bar.update(len(prepared))
    return results, sizes


def coco_results(first_image_id: int, found) -> list[dict]:
    """The detector's detections of consecutive images as COCO results.

    Args:
        first_image_id: image_id of the first image (the rest follow it).
        found: per image, detections with `boxes` (K, 4) x1, y1, x2, y2
            pixels, `scores` (K,), `classes` (K,) (`detect_letterboxed`'s).
    """
    results = []
    for offset, dets in enumerate(found):
        for (x1, y1, x2, y2), score, cls in zip(dets.boxes.tolist(), dets.scores.tolist(), dets.classes.tolist()):
            results.append(
                {
                    "image_id": first_image_id + offset,
                    "category_id": int(cls),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "score": score,
                }
            )
    return results


def evaluate_weights(
    weights: str,
    annotations,
    class_names=None,
    anchors=None,
    *,
    input_size: tuple[int, int] | None = None,
    score: float = 0.3,
    iou: float = 0.45,
    batch_size: int = 8,
    gpu_num: int = 1,
    root: str | None = None,
    pr_curve: str | None = None,
    save_detections: str | None = None,
    progress: bool = True,
    masks=None,
    settings=None,
) -> dict:
    """mAP of a weights file, or of an exported model (`inference.export_formats`), on an annotation file.

    The model keeps every box scoring at least `EVAL_MIN_SCORE` (up to 100
    per image, 100 per class) for the COCO metrics; `score` sets only the
    precision/recall figures. Other arguments as in `evaluate_detections`;
    `anchors` is an anchors file, `class_names` a classes file or list,
    `masks` anchor indices per scale; all default to the weights' metadata
    (which they must agree with), else YOLOv3's anchors, COCO's names and
    keras-yolo3's masks; `settings` (a `ModelMetadata`) replaces them all.
    `save_detections` writes the COCO results JSON, replacing a file there
    (evaluate.py first checks `outputs.check_output`).

    Returns:
        `evaluate_detections`'s dict.
    """
    # Keras's detector when a model runs: importing this module (the export command's) starts no backend.
    from keras_yolo_mgpu.inference.export_formats import open_detector

    annotations = load_annotations(annotations, root)
    if not os.path.exists(os.fspath(weights)):  # a SavedModel export is a folder
        raise FileNotFoundError(f"weights file not found: {weights}")
    if settings is None:
        settings = settings_for(
            weights,
            class_names=None if class_names is None else _class_names(class_names),
            anchors_path=anchors,
            masks=masks,
            input_shape=input_size,
        )
    class_names = list(settings.class_names)
    yolo = open_detector(
        weights,
        settings=settings,
        score=EVAL_MIN_SCORE,
        iou=iou,
        gpu_num=gpu_num,
        max_boxes=EVAL_MAX_DETECTIONS,
        max_detections=EVAL_MAX_DETECTIONS,
        batch_size=batch_size,
    )
    skipped: list[int] = []
    detections, sizes = detect_annotations(yolo, annotations, progress=progress, skipped=skipped)
    listed = len(annotations)
    unreadable = [annotations[i].image_path for i in skipped]
    dropped = set(skipped)
    annotations = [a for i, a in enumerate(annotations) if i not in dropped]
    if save_detections:
        write_text_atomic(save_detections, json.dumps(detections))
        record_written([save_detections])
    result = evaluate_detections(
        detections, annotations, class_names, score=score, pr_curve=pr_curve, image_sizes=sizes
    )
    result["weights"] = os.fspath(weights)
    result["num_listed"] = listed
    result["unreadable_images"] = unreadable
    return result


# ---- Command line ---------------------------------------------------------


def format_report(result: dict) -> str:
    """A human-readable table of the results."""

    def fmt(value):
        return "  n/a" if value is None else f"{value:.3f}"

    width = max([len(n) for n in result["per_class"]] + [5])
    lines = [f"{'class':<{width}}  {'AP':>6}  {'AP50':>6}  {'gt':>6}  {'dets':>6}"]
    for name, row in result["per_class"].items():
        lines.append(
            f"{name:<{width}}  {fmt(row['AP']):>6}  {fmt(row['AP50']):>6}  "
            f"{row['ground_truth']:>6}  {row['detections']:>6}"
        )
    lines.append(f"mAP@[.5:.95] {fmt(result['mAP'])}   mAP@.5 {fmt(result['mAP50'])}   mAP@.75 {fmt(result['mAP75'])}")
    lines.append(
        f"at score >= {result['score_threshold']:g} (IoU >= {MATCH_IOU}): precision {result['precision']:.3f}, "
        f"recall {result['recall']:.3f} (TP {result['tp']}, FP {result['fp']}, FN {result['fn']})"
    )
    if "num_listed" in result:
        skipped = result.get("unreadable_images") or []
        lines.append(
            f"scored {result['num_images']} of {result['num_listed']} images listed"
            + (f" ({len(skipped)} unreadable, skipped: {', '.join(skipped[:3])}{' ...' if len(skipped) > 3 else ''})"
               if skipped else "")
        )  # fmt: skip
    if result.get("pr_curve"):
        lines.append(f"precision-recall curve: {result['pr_curve']}")
        for key in ("confusion_matrix", "confidence_curves"):
            if result.get(key):
                lines.append(f"{key.replace('_', ' ')}: {result[key]}")
    return "\n".join(lines)


def compare_map(weights: str, exported: str, annotations: str, settings, *, iou: float = 0.45) -> dict:
    """mAP of the Keras weights and of their export (`inference.export`) on one annotation file.

    Returns:
        `{"keras": {"mAP", "mAP50"}, "export": {"mAP", "mAP50"}, "drop50"}`
        (drop50: the Keras mAP@0.5 minus the export's).
    """
    rows = {}
    for name, path in (("keras", weights), ("export", exported)):
        result = evaluate_weights(path, annotations, settings=settings, iou=iou, progress=False)
        rows[name] = {"mAP": result["mAP"] or 0.0, "mAP50": result["mAP50"] or 0.0}
    return {**rows, "drop50": rows["keras"]["mAP50"] - rows["export"]["mAP50"]}
