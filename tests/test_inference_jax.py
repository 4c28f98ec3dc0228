"""Detection, evaluation, video and the validation-mAP callback on JAX, checked against TensorFlow.

The suite runs on TensorFlow. The JAX side runs in ONE child process
(`isolation.run_isolated(..., backend="jax")`: Keras on JAX with 4 CPU
devices) in which TensorFlow cannot be imported, as on the GPU machines where
JAX runs; JAX's start and compiles cost seconds per process, so that child
does every JAX check and this module compares its results with TensorFlow's:

- weights files cross backends: a `.weights.h5` (with metadata) written by
  TensorFlow detects the same boxes on JAX, and one written by JAX the same
  boxes on TensorFlow, by the detector and by the export's model;
- NMS: `backend.jax.nms.greedy_nms` (what JAX runs) keeps exactly the boxes
  TensorFlow's kernels keep, ties, degenerate boxes and IoU exactly at the
  threshold included (also checked here, on TensorFlow, over many blocks);
- `gpu_num=4` on JAX splits a batch that 4 does not divide;
- `evaluate.py`'s evaluation gives the same detections and mAP on both;
- the validation-mAP callback inside `keras.distribution.DataParallel` over
  4 devices (the training's scope), with batches of 3, scores what the
  evaluation scores, and keeps its detector's weights on one device;
- video and the run's val_pred.jpg run on JAX, the video's detections
  matching TensorFlow's frame by frame.
"""

from __future__ import annotations

import importlib.abc
import json
import pickle
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from inference_helpers import CLASS_NAMES, INPUT_SHAPE, TINY_ANCHORS, make_body, random_images
from isolation import computed_once, run_isolated, shared_folder

SCORE, IOU = 0.3, 0.45
BOX_TOLERANCE = 2e-3  # pixels; measured 1.6e-4 between the backends' float32 decodings
SCORE_TOLERANCE = 1e-5
JAX_SEED = 3  # the JAX child's own body (JAX's random numbers differ from TensorFlow's anyway)


# ---- NMS cases: the same inputs to both backends' NMS ------------------------------


def nms_cases(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray, dict]]:
    """(boxes (N, K, 4), scores (N, K, C), NMS options) that probe the selection rule.

    Random boxes overlap heavily; every 17th has its corners swapped, every
    23rd zero width; a seventh of the scores are rounded to one decimal (ties
    within and across classes). The last case holds a pair at IoU exactly
    0.5 (both kept: the rule is IoU > threshold) and a pair one float step
    above it (the second box suppressed).
    """
    rng = np.random.default_rng(seed)
    cases = []
    for images, num_boxes, num_classes, options in (
        (2, 60, 2, dict(max_boxes_per_class=20, max_detections=100, iou_threshold=0.45, score_threshold=0.3)),
        (1, 300, 3, dict(max_boxes_per_class=5, max_detections=11, iou_threshold=0.5, score_threshold=0.1)),
        (3, 200, 4, dict(max_boxes_per_class=100, max_detections=100, iou_threshold=0.3, score_threshold=0.001)),
    ):
        corner = rng.uniform(0, 200, (images, num_boxes, 2)).astype(np.float32)
        size = rng.uniform(1, 80, (images, num_boxes, 2)).astype(np.float32)
        boxes = np.concatenate([corner, corner + size], axis=-1)
        boxes[:, ::17] = boxes[:, ::17][..., [2, 3, 0, 1]]
        boxes[:, 5::23, 2] = boxes[:, 5::23, 0]
        scores = rng.random((images, num_boxes, num_classes), dtype=np.float32)
        scores[:, ::7] = np.round(scores[:, ::7], 1)
        cases.append((boxes, scores, options))
    boxes = np.array(
        [[[0, 0, 10, 10], [0, 0, 10, 5], [50, 50, 60, 60], [50, 50, 60, np.nextafter(np.float32(55), np.float32(60))]]],
        np.float32,
    )
    scores = np.array([[[0.9], [0.8], [0.7], [0.6]]], np.float32)
    cases.append((boxes, scores, dict(max_boxes_per_class=4, max_detections=4, iou_threshold=0.5, score_threshold=0.0)))
    return cases


def tensorflow_nms(boxes, scores, options, method="padded"):
    from keras_yolo_mgpu.backend.tensorflow.nms import non_max_suppression

    return tuple(np.asarray(t) for t in non_max_suppression(boxes, scores, method=method, **options))


def assert_same_nms(got, expected):
    for name, a, b in zip(("boxes", "scores", "classes", "valid_detections"), got, expected):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_greedy_nms_keeps_what_tensorflow_kernels_keep():
    """The algorithm JAX runs, run here by TensorFlow's keras.ops, block sizes from 1 to all the boxes."""
    from keras_yolo_mgpu.backend.jax.nms import greedy_nms

    for boxes, scores, options in nms_cases(seed=1):
        expected = tensorflow_nms(boxes, scores, options)
        for block_size in (7, 256):
            assert_same_nms(greedy_nms(boxes, scores, **options, block_size=block_size), expected)
    # Without ties TensorFlow's combined op (the detector's on TensorFlow) agrees with its padded ops.
    boxes, scores, options = nms_cases(seed=2)[2]
    scores = np.random.default_rng(2).random(scores.shape, dtype=np.float32)
    assert_same_nms(greedy_nms(boxes, scores, **options), tensorflow_nms(boxes, scores, options, "combined"))


# ---- the JAX child ----------------------------------------------------------------


# Modules allowed to import TensorFlow in the JAX child: none. Every module
# the JAX path reaches imports TensorFlow only where the TensorFlow backend uses it.
TENSORFLOW_IMPORTERS_TO_FIX: set[str] = set()


class _NoTensorFlow(importlib.abc.MetaPathFinder):
    """Makes `import tensorflow` fail, as on a machine where it is not installed.

    Except from a module of `TENSORFLOW_IMPORTERS_TO_FIX`. The project's
    modules that try are recorded in `importers`, before any error.
    """

    def __init__(self):
        self.importers = set()

    def find_spec(self, name, path, target=None):
        if name != "tensorflow" and not name.startswith("tensorflow."):
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib")):
            frame = frame.f_back
        importer = frame.f_globals.get("__name__", "?") if frame is not None else "?"
        if importer.startswith("tensorflow"):
            return None  # TensorFlow's own imports, once let in
        if importer.startswith("keras_yolo_mgpu"):  # Keras's own optional imports handle the error
            self.importers.add(importer)
        if importer in TENSORFLOW_IMPORTERS_TO_FIX:
            return None
        raise ModuleNotFoundError(f"No module named {name!r} (imported by {importer}; the JAX test runs without it)")


def _plain(detections) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    return [tuple(np.asarray(part) for part in found) for found in detections]


def _on_jax(folder: str) -> dict:
    """Every JAX check's raw results, in a process without TensorFlow (see the module docstring)."""
    tensorflow_at_start = "tensorflow" in sys.modules
    blocker = _NoTensorFlow()
    sys.meta_path.insert(0, blocker)
    import jax
    import keras

    from keras_yolo_mgpu.data.annotations import read_annotations
    from keras_yolo_mgpu.evaluation.mean_ap import evaluate_weights
    from keras_yolo_mgpu.inference.detector import YOLO
    from keras_yolo_mgpu.inference.export_formats import make_nms_runner
    from keras_yolo_mgpu.inference.media import process_video
    from keras_yolo_mgpu.model.yolo3 import build_body
    from keras_yolo_mgpu.training.checkpoint import save_weights_atomic
    from keras_yolo_mgpu.training.evaluation_callback import MeanAPEvaluation
    from keras_yolo_mgpu.training.pictures import write_prediction_pictures
    from keras_yolo_mgpu.weights.loading import load_weights
    from keras_yolo_mgpu.weights.metadata import make_metadata

    folder = Path(folder)
    with open(folder / "inputs.pickle", "rb") as handle:
        inputs = pickle.load(handle)
    tf_weights, images = str(folder / "tf.weights.h5"), inputs["images"]
    results = {"tensorflow_at_start": tensorflow_at_start}

    # Weights across backends: TensorFlow's file here, and a file of JAX's own.
    results["tf_file"] = _plain(YOLO(tf_weights, score=SCORE, iou=IOU).detect_batch(images))
    save_weights_atomic(
        make_body(seed=JAX_SEED), str(folder / "jax.weights.h5"), make_metadata(TINY_ANCHORS, CLASS_NAMES, INPUT_SHAPE)
    )
    results["jax_file"] = _plain(YOLO(str(folder / "jax.weights.h5"), score=SCORE, iou=IOU).detect_batch(images))

    # 5 images on 4 devices: padded to 8, split 2 per device.
    spread = YOLO(tf_weights, score=SCORE, iou=IOU, gpu_num=4)
    results["spread_devices"] = len({str(device) for device in spread.devices})
    results["spread"] = _plain(spread.detect_batch(images))

    results["nms"] = [make_nms_runner(**options)(boxes, scores) for boxes, scores, options in inputs["nms_cases"]]

    report = evaluate_weights(
        tf_weights, inputs["val"], save_detections=str(folder / "jax_detections.json"), progress=False
    )
    results["evaluation"] = {key: report[key] for key in ("mAP", "mAP50", "num_detections")}

    # The callback where training runs it: inside DataParallel over 4
    # devices, the template's variables replicated on all of them.
    with keras.distribution.DataParallel(devices=jax.devices()[:4]).scope():
        template = build_body(TINY_ANCHORS, len(CLASS_NAMES))
        load_weights(template, tf_weights)
        callback = MeanAPEvaluation(
            template, read_annotations(inputs["val"]), CLASS_NAMES, TINY_ANCHORS, INPUT_SHAPE, 1, 1, batch_size=3
        )
        logs = {}
        callback.on_epoch_end(0, logs)
        results["callback"] = {
            "logs": {key: logs[key] for key in ("val_mAP", "val_mAP50")},
            "template_devices": len(template.weights[0].value.sharding.device_set),
            "detector_devices": {len(w.value.sharding.device_set) for w in callback._detector.body.weights},
        }
        run_dir = folder / "run"
        run = SimpleNamespace(
            val_annotations=read_annotations(inputs["val"]),
            class_names=CLASS_NAMES,
            run_dir=str(run_dir),
            config=SimpleNamespace(log_dir=str(run_dir)),
        )
        run_dir.mkdir()
        write_prediction_pictures(run, tf_weights)  # logs (and swallows) any failure: the file tells

    results["video"] = process_video(
        YOLO(tf_weights, score=SCORE, iou=IOU, batch_size=4),
        inputs["clip"],
        str(folder / "jax.mp4"),
        save_json=str(folder / "jax_video.jsonl"),
        progress=False,
    )
    # `align` reads train.py's batches without TensorFlow too (float32 here: the default threshold).
    from keras_yolo_mgpu.cli import align as align_cli

    align_flags = ["--annotations", inputs["val"], "--classes", inputs["classes"], "--tiny", "--input-size", "64"]
    align_flags += ["--batch-size", "4", "--gpus", "2", "--simulate-devices", "--steps", "2"]
    results["align_status"] = align_cli.main(align_flags)
    # The API's export from this process, whose Keras runs on JAX: a child Python on TensorFlow writes it.
    import keras_yolo_mgpu as kym

    exported = kym.export(weights=str(folder / "jax.weights.h5"), format="tflite", output=str(folder / "jax.tflite"))
    results["export"] = {key: exported[key] for key in ("path", "format", "precision", "check")}
    try:
        kym.export(weights=str(folder / "no.weights.h5"), format="onnx")
    except FileNotFoundError as error:  # the child's error, raised here as the function's own
        results["export_refused"] = str(error)
    results["tensorflow_importers"] = blocker.importers
    return results


# ---- the TensorFlow side and the comparisons ---------------------------------------


def _prepare_and_run_jax(folder: Path) -> dict:
    """TensorFlow's weights file, a dataset, a clip and the NMS cases in `folder`, then the JAX child on them."""
    from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset, make_synthetic_video
    from keras_yolo_mgpu.training.checkpoint import save_weights_atomic
    from keras_yolo_mgpu.weights.metadata import make_metadata

    folder.mkdir()
    save_weights_atomic(
        make_body(), str(folder / "tf.weights.h5"), make_metadata(TINY_ANCHORS, CLASS_NAMES, INPUT_SHAPE)
    )
    data = make_synthetic_dataset(folder / "data", num_train=0, num_val=5, image_size=96, classes=CLASS_NAMES)
    clip = make_synthetic_video(folder / "clip.mp4", num_frames=8, frame_size=(120, 160), fps=10.0, seed=3)
    # The first case is left to the test run here: each case is a compile on JAX.
    inputs = {"images": random_images(5, seed=4), "nms_cases": nms_cases()[1:], "val": data.val, "clip": clip}
    inputs["classes"] = data.classes
    with open(folder / "inputs.pickle", "wb") as handle:
        pickle.dump(inputs, handle)
    return {"folder": folder, "inputs": inputs, "jax": run_isolated(_on_jax, str(folder), backend="jax")}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The JAX child's results, computed once per test run even when pytest-xdist spreads these tests."""
    shared = shared_folder(tmp_path_factory)
    return computed_once("inference_jax", lambda: _prepare_and_run_jax(shared / "inference_jax"), shared)


def assert_same_detections(got, expected):
    """Per image: the same classes and scores, boxes within `BOX_TOLERANCE` pixels (ordered by class, then score)."""
    assert len(got) == len(expected)
    for (boxes, scores, classes), (e_boxes, e_scores, e_classes) in zip(got, expected):
        order, e_order = np.lexsort((-scores, classes)), np.lexsort((-e_scores, e_classes))
        np.testing.assert_array_equal(classes[order], e_classes[e_order])
        np.testing.assert_allclose(scores[order], e_scores[e_order], rtol=0, atol=SCORE_TOLERANCE)
        np.testing.assert_allclose(boxes[order], e_boxes[e_order], rtol=0, atol=BOX_TOLERANCE)


@pytest.mark.slow  # the JAX child: ~40 s on 2 cores, shared by these tests
def test_weights_files_cross_backends(run):
    from keras_yolo_mgpu.inference import export
    from keras_yolo_mgpu.inference.detector import YOLO

    folder, images, jax = run["folder"], run["inputs"]["images"], run["jax"]
    on_tensorflow = _plain(YOLO(str(folder / "tf.weights.h5"), score=SCORE, iou=IOU).detect_batch(images))
    assert sum(len(found[1]) for found in on_tensorflow) > 10
    assert_same_detections(jax["tf_file"], on_tensorflow)

    # JAX's file, read by TensorFlow with its metadata alone (classes, anchors, input size).
    jax_file = str(folder / "jax.weights.h5")
    yolo = YOLO(jax_file, score=SCORE, iou=IOU)
    assert yolo.class_names == CLASS_NAMES and tuple(yolo.model_image_size) == INPUT_SHAPE
    expected = _plain(yolo.detect_batch(images))
    assert sum(len(found[1]) for found in expected) > 10
    assert_same_detections(jax["jax_file"], expected)
    # The export's model loads it too, and finds the same boxes before clipping.
    model = export.build_export_model(jax_file, TINY_ANCHORS, CLASS_NAMES, input_size=INPUT_SHAPE, score=SCORE)
    prepared = [yolo.preprocess(image) for image in images]
    out = model([np.stack([p[0] for p in prepared]).astype(np.float32) / 255.0, np.array([p[1] for p in prepared])])
    for i, (height, width) in enumerate(p[1] for p in prepared):
        n = int(out["valid_detections"][i])
        boxes = np.array(out["boxes"][i, :n])
        boxes[:, 0::2], boxes[:, 1::2] = boxes[:, 0::2].clip(0, width), boxes[:, 1::2].clip(0, height)
        assert_same_detections(
            [(boxes, np.asarray(out["scores"][i, :n]), np.asarray(out["classes"][i, :n]))], [expected[i]]
        )


@pytest.mark.slow  # the JAX child: ~40 s on 2 cores, shared by these tests
def test_jax_nms_keeps_what_tensorflow_keeps(run):
    """Bit for bit on the same inputs: the boxes, scores, classes and counts of TensorFlow's padded NMS."""
    cases = run["inputs"]["nms_cases"]
    assert len(run["jax"]["nms"]) == len(cases)
    for got, (boxes, scores, options) in zip(run["jax"]["nms"], cases):
        assert_same_nms(got, tensorflow_nms(boxes, scores, options))
    # The threshold case: the pair at IoU exactly 0.5 both kept, the other pair not.
    np.testing.assert_array_equal(run["jax"]["nms"][-1][1][0], np.float32([0.9, 0.8, 0.7, 0.0]))


@pytest.mark.slow  # the JAX child: ~40 s on 2 cores, shared by these tests
def test_gpu_num_splits_an_uneven_batch_on_jax(run):
    assert run["jax"]["spread_devices"] == 4
    assert_same_detections(run["jax"]["spread"], run["jax"]["tf_file"])


def _saved_detections(path) -> list:
    with open(path) as handle:
        found = json.load(handle)
    return [
        (np.array([d["bbox"]]), np.array([d["score"]]), np.array([d["image_id"] * 10 + d["category_id"]]))
        for d in found
    ]


@pytest.mark.slow  # the JAX child: ~40 s on 2 cores, shared by these tests
def test_evaluation_on_jax_matches_tensorflow(run):
    from keras_yolo_mgpu.evaluation.mean_ap import evaluate_weights

    folder = run["folder"]
    report = evaluate_weights(
        str(folder / "tf.weights.h5"),
        run["inputs"]["val"],
        save_detections=str(folder / "tf_detections.json"),
        progress=False,
    )
    jax_report = run["jax"]["evaluation"]
    assert jax_report["num_detections"] == report["num_detections"] > 100  # at evaluation's score floor
    assert jax_report["mAP"] == pytest.approx(report["mAP"], abs=1e-6)
    assert jax_report["mAP50"] == pytest.approx(report["mAP50"], abs=1e-6)
    # Every detection, as one "image" of (image, class)-labelled rows.
    got, expected = (
        [tuple(np.concatenate(parts) for parts in zip(*_saved_detections(folder / name)))]
        for name in ("jax_detections.json", "tf_detections.json")
    )
    assert_same_detections(got, expected)


@pytest.mark.slow  # the JAX child: ~40 s on 2 cores, shared by these tests
def test_map_callback_under_data_parallel(run):
    callback = run["jax"]["callback"]
    assert callback["template_devices"] == 4  # the scope training runs the callback in
    assert callback["detector_devices"] == {1}  # its detector's own weights, on one device
    evaluation = run["jax"]["evaluation"]
    assert callback["logs"]["val_mAP"] == pytest.approx(evaluation["mAP"], abs=1e-9)
    assert callback["logs"]["val_mAP50"] == pytest.approx(evaluation["mAP50"], abs=1e-9)


@pytest.mark.slow  # the JAX child: ~40 s on 2 cores, shared by these tests
def test_video_and_pictures_on_jax(run):
    from keras_yolo_mgpu.inference.detector import YOLO
    from keras_yolo_mgpu.inference.media import process_video

    folder = run["folder"]
    assert (folder / "run" / "val_pred.jpg").read_bytes()[:2] == b"\xff\xd8"
    stats = run["jax"]["video"]
    assert stats["frames"] == 8 and (folder / "jax.mp4").stat().st_size > 0
    process_video(
        YOLO(str(folder / "tf.weights.h5"), score=SCORE, iou=IOU, batch_size=4),
        run["inputs"]["clip"],
        None,
        save_json=str(folder / "tf_video.jsonl"),
        progress=False,
    )

    def frames(name):
        lines = [json.loads(line) for line in (folder / name).read_text().splitlines()]
        return [
            (
                np.array([d["box"] for d in line["detections"]], np.float32).reshape(-1, 4),
                np.array([d["score"] for d in line["detections"]], np.float32),
                np.array([d["class_id"] for d in line["detections"]]),
            )
            for line in lines
        ]

    expected = frames("tf_video.jsonl")
    assert sum(len(found[1]) for found in expected) > 0
    # The JSON rounds boxes to 0.01 px and scores to 1e-5.
    for got, want in zip(frames("jax_video.jsonl"), expected, strict=True):
        np.testing.assert_array_equal(np.sort(got[2]), np.sort(want[2]))
        np.testing.assert_allclose(np.sort(got[0], axis=0), np.sort(want[0], axis=0), atol=0.011)


@pytest.mark.slow  # the JAX child: ~40 s on 2 cores, shared by these tests
def test_export_from_a_jax_process_is_the_export_tensorflow_writes(run):
    """`kym.export` where Keras runs on JAX: written by a TensorFlow child, the file this process would write."""
    import keras_yolo_mgpu as kym

    folder, jax = run["folder"], run["jax"]
    here = kym.export(weights=str(folder / "jax.weights.h5"), format="tflite", output=str(folder / "tf.tflite"))
    assert jax["export"]["path"] == str(folder / "jax.tflite") and jax["export"]["format"] == "tflite"
    assert (folder / "jax.tflite").read_bytes() == (folder / "tf.tflite").read_bytes()
    checked = [{key: check[key] for key in ("source", "images", "detections_compared")}
               for check in (jax["export"]["check"], here["check"])]  # fmt: skip
    assert checked[0] == checked[1] and checked[0]["detections_compared"] > 0
    assert "no.weights.h5" in jax["export_refused"]


@pytest.mark.slow  # the JAX child: ~40 s on 2 cores, shared by these tests
def test_jax_ran_without_tensorflow(run):
    assert not run["jax"]["tensorflow_at_start"]
    assert run["jax"]["tensorflow_importers"] <= TENSORFLOW_IMPORTERS_TO_FIX


@pytest.mark.slow
def test_align_on_jax_reads_its_batches_without_tensorflow(run):
    assert run["jax"]["align_status"] == 0
