"""The export self-check: an exported model against the Keras model, where there is signal.

A trained detector finds nothing in uniform noise, so comparing the
detections of two models on noise compares two empty lists and passes
whatever the export computes. This check compares, on real images when the
user gives some and on generated scenes with objects otherwise:

1. every decoded box and score before NMS (`decoded_boxes`, `decoded_scores`:
   all K anchors of every image), the export's own outputs;
2. the export's own NMS output at the score it was exported with;
3. detections at a score floor low enough that every image yields boxes
   (half of the image's weakest top score), by the same NMS on both decoded
   outputs (for a float32 export, its boxes with the Keras model's scores:
   its scores are judged in 1.).

It counts what it compared and fails when no detection was compared: an
empty comparison proves nothing. A float32 export must match to rounding
(`FLOAT_TOLERANCES`): every score and box, and the same detections, in any
order among scores that tie to rounding. A float16 or INT8 export is judged
on the task: how many of the Keras model's detections it finds again (same
class, IoU >= 0.5), looser score and box bounds, and the mean score
difference of the boxes that score at the floor (where a wrong score scale
shows however few they are). An INT8 export's score bound holds for all but
the worst 1 % of the decoded boxes: one box's 8-bit rounding past it does not
fail a good export. Accuracy is measured by mAP (`quantize`).
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

import numpy as np

from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.images import read_image
from keras_yolo_mgpu.data.letterbox import letterbox_array
from keras_yolo_mgpu.data.synthetic import render_sample
from keras_yolo_mgpu.inference.media import collect_images
from keras_yolo_mgpu.model.box_matching import MATCH_IOU, greedy_matches, iou_matrix

logger = logging.getLogger(__name__)

SCORE_FLOOR_MIN = 1e-3  # below this an image carries no signal (evaluate's floor)


class Tolerance(NamedTuple):
    """Largest differences accepted for one kind of export.

    Attributes:
        box_px: decoded box corners (pixels), for boxes that score at least
            the floor in the Keras model, plus `box_relative` x the box's
            larger side.
        score: the decoded score difference (a box's largest over its
            classes) at the `score_percentile` of all decoded boxes.
        score_percentile: 100 judges the largest difference (float32); a
            quantised export's worst boxes sit where an 8-bit step crosses a
            sigmoid's steep part, so it is judged below them.
        scored_mean: the mean decoded score difference over the boxes that
            score at least the floor in the Keras model.
        recall: least fraction of the Keras model's detections (floor and
            export score) the export finds again, same class, IoU >= 0.5.
        exact: detection lists must be equal (counts, classes, order).
    """

    box_px: float
    box_relative: float
    score: float
    score_percentile: float
    scored_mean: float
    recall: float
    exact: bool


FLOAT_TOLERANCES = Tolerance(
    box_px=0.05, box_relative=1e-4, score=1e-4, score_percentile=100.0, scored_mean=1e-4, recall=1.0, exact=True
)
HALF_TOLERANCES = Tolerance(
    box_px=2.0, box_relative=1e-2, score=0.02, score_percentile=100.0, scored_mean=0.02, recall=0.9, exact=False
)
# INT8: 8-bit activations move most scores by up to ~0.04 and a box's
# log-size by one quantisation step (several % of its size; measured on tiny
# YOLOv3 on real photos); a few of ~12,000 boxes move by more (0.102 on a
# good raccoon model, mAP@.5 0.955 against 0.965), and low-scoring detections
# trade places. A wrong anchor (x1.5), a swapped channel order or a wrong
# score scale moves far more boxes by far more, and an export that keeps no
# detection finds none of the Keras model's again.
INT8_TOLERANCES = Tolerance(
    box_px=8.0, box_relative=0.15, score=0.1, score_percentile=99.0, scored_mean=0.05, recall=0.5, exact=False
)
TOLERANCES = {"float32": FLOAT_TOLERANCES, "float16": HALF_TOLERANCES, "int8": INT8_TOLERANCES}  # by precision


class ExportCheckError(RuntimeError):
    """The export does not compute what the Keras model computes, or nothing was compared."""


def _letterboxed(arrays, input_shape):
    """((N, H, W, 3) uint8 letterboxed, (N, 2) float32 original (height, width)) of RGB `arrays`."""
    images = [letterbox_array(array, input_shape) for array in arrays]
    return np.stack(images), np.asarray([array.shape[:2] for array in arrays], np.float32)


def image_paths(source: str) -> list[str]:
    """Image files of a folder (recursively) or of an annotation file's lines, in order.

    Raises:
        FileNotFoundError: `source` does not exist or holds no image.
    """
    if not os.path.exists(source):
        raise FileNotFoundError(f"--images {source}: no such folder or annotation file")
    paths = collect_images([source]) if os.path.isdir(source) else [a.image_path for a in read_annotations(source)]
    if not paths:
        raise FileNotFoundError(f"--images {source}: no image found")
    return paths


def sample_paths(paths: list[str], count: int, seed: int = 0) -> list[str]:
    """`count` of `paths` spread evenly in a seeded shuffle (all of them when there are fewer)."""
    order = np.random.default_rng(seed).permutation(len(paths))
    return [paths[i] for i in sorted(order[:count])]


def real_check_images(source: str, input_shape, count: int = 8, seed: int = 0):
    """`count` images of `source` letterboxed: ((N, H, W, 3) uint8, (N, 2) original (height, width))."""
    return _letterboxed([read_image(path) for path in sample_paths(image_paths(source), count, seed)], input_shape)


def synthetic_check_images(input_shape, count: int = 4, seed: int = 0):
    """Generated scenes with objects (`data.synthetic`), of several sizes so the letterbox pads both ways."""
    rng = np.random.default_rng(seed)
    height, width = input_shape
    sizes = [(height, width), (height * 2, width), (height, width * 2), (max(16, height // 2), width)]
    scenes = [render_sample(rng, sizes[i % len(sizes)], empty_fraction=0.0).image for i in range(count)]
    return _letterboxed(scenes, input_shape)


def score_floor(decoded_scores: np.ndarray, score: float) -> float:
    """Half of the weakest image's top score (every image then yields boxes), at most `score`.

    Args:
        decoded_scores: (N, K, C) the Keras model's decoded scores.
    """
    top = np.asarray(decoded_scores).reshape(len(decoded_scores), -1).max(axis=1)
    return float(min(score, max(SCORE_FLOOR_MIN, 0.5 * top.min())))


def compare_detection_lists(reference: dict, other: dict) -> dict:
    """Two padded detection outputs (`boxes`, `scores`, `classes`, `valid_detections`), image by image.

    Returns:
        `compared` (the reference's detections), `found` (how many of them
        the other has, same class, IoU >= 0.5, greedy by score), `exact`
        (counts and classes equal in order), and over the rows present in
        both (the padding is not compared): `classes_equal`,
        `max_box_diff`, `max_score_diff` and `max_coord` (largest |corner|).
        Detections whose scores tie to rounding may come in either order, so
        each reference detection is also paired with the other's nearest box
        of its class: `paired` (equal counts, every one paired) and
        `paired_max_box_diff`, `paired_max_score_diff` over the pairs.
    """
    result = {"compared": 0, "found": 0, "exact": True, "classes_equal": True, "paired": True}
    result.update(max_box_diff=0.0, max_score_diff=0.0, max_coord=0.0, paired_max_box_diff=0.0)
    result["paired_max_score_diff"] = 0.0
    valid_ref = np.asarray(reference["valid_detections"]).reshape(-1)
    valid_other = np.asarray(other["valid_detections"]).reshape(-1)
    for i, n in enumerate(valid_ref):
        n, m = int(n), int(valid_other[i])
        result["compared"] += n
        ref_classes, other_classes = reference["classes"][i, :n], other["classes"][i, :m]
        result["exact"] &= n == m and bool(np.array_equal(ref_classes, other_classes))
        k = min(n, m)
        result["classes_equal"] &= bool(np.array_equal(ref_classes[:k], other_classes[:k]))
        if k:
            ref_boxes = reference["boxes"][i, :k]
            for key, values in (
                ("max_coord", ref_boxes),
                ("max_box_diff", ref_boxes - other["boxes"][i, :k]),
                ("max_score_diff", reference["scores"][i, :k] - other["scores"][i, :k]),
            ):
                result[key] = max(result[key], float(np.abs(values).max()))
        pairs = _pair_by_box(reference, other, i, n, m)
        result["paired"] &= n == m and len(pairs) == n
        for j, other_j in pairs:
            box_diff = np.abs(reference["boxes"][i, j] - other["boxes"][i, other_j]).max()
            score_diff = abs(reference["scores"][i, j] - other["scores"][i, other_j])
            result["paired_max_box_diff"] = max(result["paired_max_box_diff"], float(box_diff))
            result["paired_max_score_diff"] = max(result["paired_max_score_diff"], float(score_diff))
        if n and m:
            ious = iou_matrix(np.asarray(reference["boxes"][i, :n]), np.asarray(other["boxes"][i, :m]))
            ious[ref_classes[:, None] != other_classes[None, :]] = 0.0
            result["found"] += greedy_matches(ious, MATCH_IOU)
    return result


def _pair_by_box(reference: dict, other: dict, image: int, n: int, m: int) -> list[tuple[int, int]]:
    """(reference row, other row) pairs of image `image`: each reference detection, best first, takes the free
    detection of its class whose corners are nearest (largest |difference|); one with none left is unpaired."""
    ref_boxes, other_boxes = np.asarray(reference["boxes"][image, :n]), np.asarray(other["boxes"][image, :m])
    distance = np.abs(ref_boxes[:, None, :] - other_boxes[None, :, :]).max(axis=-1)  # (n, m)
    distance[reference["classes"][image, :n][:, None] != other["classes"][image, :m][None, :]] = np.inf
    pairs = []
    for j in range(n):
        nearest = int(np.argmin(distance[j])) if m else 0
        if m and np.isfinite(distance[j, nearest]):
            pairs.append((j, nearest))
            distance[:, nearest] = np.inf
    return pairs


def compare_decoded(reference: dict, other: dict, floor: float, tolerance: Tolerance) -> dict:
    """Every decoded score, and every box that scores >= `floor` in the reference.

    Returns:
        `boxes` (all decoded boxes), `scored_boxes` (those >= floor),
        `max_score_diff`, `score_diff_at_percentile` (at
        `tolerance.score_percentile` of the boxes), `scored_mean_score_diff`
        (over the scored boxes), `max_box_excess` (largest box difference
        less its tolerance; <= 0 passes), `max_box_diff`.
    """
    ref_boxes, other_boxes = np.asarray(reference["decoded_boxes"]), np.asarray(other["decoded_boxes"])
    ref_scores, other_scores = np.asarray(reference["decoded_scores"]), np.asarray(other["decoded_scores"])
    if ref_boxes.shape != other_boxes.shape or ref_scores.shape != other_scores.shape:
        raise ExportCheckError(
            f"decoded outputs differ in shape: boxes {ref_boxes.shape} vs {other_boxes.shape}, "
            f"scores {ref_scores.shape} vs {other_scores.shape}"
        )
    scored = ref_scores.max(axis=-1) >= floor  # (N, K)
    score_diff = np.abs(ref_scores - other_scores).max(axis=-1)  # (N, K): each box's largest over its classes
    diff = np.abs(ref_boxes - other_boxes)[scored]  # (S, 4)
    # Errors in a box's corners scale with the box (a log-size step moves
    # both corners by a share of the width), not with where it sits.
    size = np.abs(ref_boxes[..., 2:] - ref_boxes[..., :2]).max(axis=-1)[scored]  # (S,)
    allowed = tolerance.box_px + tolerance.box_relative * size[:, None]
    return {
        "boxes": int(scored.size),
        "scored_boxes": int(scored.sum()),
        "max_score_diff": float(score_diff.max()),
        "score_diff_at_percentile": float(np.percentile(score_diff, tolerance.score_percentile)),
        "scored_mean_score_diff": float(score_diff[scored].mean()) if scored.any() else 0.0,
        "max_box_diff": float(diff.max()) if diff.size else 0.0,
        "max_box_excess": float((diff - allowed).max()) if diff.size else 0.0,
    }


def run_keras(model, image: np.ndarray, image_shape: np.ndarray) -> dict:
    """The Keras export model's outputs as numpy, image by image when its batch is fixed at 1."""
    if model.inputs[0].shape[0] == 1:
        parts = [model([image[i : i + 1], image_shape[i : i + 1]], training=False) for i in range(len(image))]
        return {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in parts[0]}
    return {k: np.asarray(v) for k, v in model([image, image_shape], training=False).items()}


def check_export(model, run_export, images: np.ndarray, image_shapes: np.ndarray, **options) -> dict:
    """Compares an export with the Keras model it came from (see the module docstring).

    Args:
        model: the Keras export model (`export.build_export_model`, with
            decoded outputs), the reference.
        run_export: the export's runner (`export_formats.open_runner`).
        images: (N, H, W, 3) uint8 letterboxed RGB; image_shapes: (N, 2).
        options: `source` (what the images are, for the report),
            `max_boxes`, `max_detections`, `tolerance`, as `judge_outputs`.

    Returns:
        `{"source", "images", "floor", "decoded", "own_nms", "at_floor",
        "detections_compared"}`.

    Raises:
        ExportCheckError: nothing was compared, or a difference exceeds `tolerance`.
    """
    image = np.asarray(images, np.float32) / 255.0
    shapes = np.asarray(image_shapes, np.float32)
    reference, other = run_keras(model, image, shapes), run_export(image, shapes)
    nms = model.get_layer("yolo_nms")
    return judge_outputs(reference, other, score=nms.score_threshold, iou=nms.iou_threshold, **options)


def judge_outputs(
    reference: dict,
    other: dict,
    *,
    score: float,
    iou: float,
    source: str,
    max_boxes: int = 20,
    max_detections: int = 100,
    tolerance: Tolerance = FLOAT_TOLERANCES,
) -> dict:
    """`check_export`'s verdict on the two models' outputs on the same images.

    Args:
        reference, other: the Keras model's and the export's outputs:
            `decoded_boxes` (N, K, 4) pixels, `decoded_scores` (N, K, C), and
            their own NMS's `boxes` (N, M, 4), `scores` (N, M), `classes`
            (N, M), `valid_detections` (N,).
        score, iou: the export's NMS settings; the floor is at most `score`.

    Returns and raises as `check_export`.
    """
    # Keras's NMS when outputs are judged: importing this module (the export command's) starts no backend.
    from keras_yolo_mgpu.inference.export_formats import host_nms

    floor = score_floor(reference["decoded_scores"], score)
    options = dict(score=floor, iou=iou, max_boxes=max_boxes, max_detections=max_detections)
    # A float32 export's scores are judged box by box above, to rounding. Its NMS at the floor takes the Keras
    # model's scores: where scores tie to rounding (a barely trained network scores everything alike), rounding
    # would choose between overlapping boxes at random, and a correct export would fail.
    at_floor_input = {**other, "decoded_scores": reference["decoded_scores"]} if tolerance.exact else other
    result = {
        "source": source,
        "images": len(reference["decoded_scores"]),
        "floor": floor,
        "score_percentile": tolerance.score_percentile,
        "decoded": compare_decoded(reference, other, floor, tolerance),
        "own_nms": compare_detection_lists(reference, other),
        "at_floor": compare_detection_lists(host_nms(reference, **options), host_nms(at_floor_input, **options)),
    }
    result["detections_compared"] = result["own_nms"]["compared"] + result["at_floor"]["compared"]
    _raise_on_failure(result, tolerance)
    return result


def _raise_on_failure(result: dict, tolerance: Tolerance) -> None:
    problems = []
    if result["detections_compared"] == 0:
        problems.append(
            f"nothing was compared: the Keras model scores below {SCORE_FLOOR_MIN} everywhere on {result['source']}"
        )
    decoded = result["decoded"]
    if decoded["score_diff_at_percentile"] > tolerance.score:
        problems.append(
            f"decoded scores differ by up to {decoded['score_diff_at_percentile']:.3g} at the "
            f"{_percentile_name(tolerance.score_percentile)} of {decoded['boxes']} boxes (tolerance {tolerance.score})"
        )
    if decoded["scored_mean_score_diff"] > tolerance.scored_mean:
        problems.append(
            f"the {decoded['scored_boxes']} boxes scoring >= {result['floor']:.3g} differ in score by "
            f"{decoded['scored_mean_score_diff']:.3g} on average (tolerance {tolerance.scored_mean})"
        )
    if decoded["max_box_excess"] > 0:
        problems.append(f"decoded boxes differ by up to {decoded['max_box_diff']:.3g} px")
    for name in ("own_nms", "at_floor"):
        part = result[name]
        # Judged pair by pair, not row by row: detections whose scores tie to rounding come in either order.
        allowed_px = tolerance.box_px + tolerance.box_relative * part["max_coord"]
        if tolerance.exact and not part["paired"]:
            problems.append(f"{name}: detections differ in count or class")
        if tolerance.exact and part["paired_max_box_diff"] > allowed_px:
            problems.append(f"{name}: detection boxes differ by up to {part['paired_max_box_diff']:.3g} px")
        if part["compared"] and part["found"] < tolerance.recall * part["compared"]:
            problems.append(
                f"{name}: the export finds {part['found']} of the Keras model's {part['compared']} detections"
            )
    if problems:
        raise ExportCheckError("the export does not match the Keras model: " + "; ".join(problems))


def _percentile_name(percentile: float) -> str:
    return "largest" if percentile >= 100 else f"{percentile:g}th percentile"


def format_check(result: dict) -> str:
    """One line for the command's report: every figure the check judged."""
    decoded, own, floor = result["decoded"], result["own_nms"], result["at_floor"]
    percentile = result.get("score_percentile", 100.0)
    judged = "" if percentile >= 100 else f" ({_percentile_name(percentile)} {decoded['score_diff_at_percentile']:.2e})"
    return (
        f"check on {result['images']} {result['source']}: {decoded['boxes']} decoded boxes "
        f"({decoded['scored_boxes']} scoring >= {result['floor']:.3g}), largest differences "
        f"{decoded['max_box_diff']:.2e} px, score {decoded['max_score_diff']:.2e}{judged}, "
        f"mean score difference of the scored boxes {decoded['scored_mean_score_diff']:.2e}; "
        f"{floor['compared']} detections at score >= {result['floor']:.3g} ({floor['found']} found again) and "
        f"{own['compared']} from the export's own NMS ({own['found']} found again)"
    )
