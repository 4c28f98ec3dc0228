"""keras-yolo3's own command lines for convert.py, kmeans.py, voc_annotation.py and coco_annotation.py, verbatim.

Each runs as the real script in a subprocess whose working folder is laid out
as keras-yolo3's (model_data/, 2012_train.txt, VOCdevkit/, mscoco2017/).
Expected lines come from transcriptions of keras-yolo3's scripts below
(qqwweee/keras-yolo3 voc_annotation.py, coco_annotation.py, kmeans.py
`result2txt`), not from our code. The conftest points the record of written
files (`keras_yolo_mgpu.outputs`) at a folder of this test run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import h5py
import keras
import numpy as np
import pytest
from darknet_files import random_weights, write_weights

from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset
from keras_yolo_mgpu.model.yolo3 import tiny_yolo_body, yolo_body
from keras_yolo_mgpu.resources import get_anchors
from keras_yolo_mgpu.weights import darknet
from keras_yolo_mgpu.weights.convert import convert, load_converted
from keras_yolo_mgpu.weights.loading import load_weights
from keras_yolo_mgpu.weights.metadata import read_metadata

REPO = Path(__file__).resolve().parents[1]
TINY_CFG = REPO / "model_data" / "yolov3-tiny.cfg"  # the official cfg, as keras-yolo3 ships it


def run_script(script: str, *args: str, cwd) -> subprocess.CompletedProcess:
    """`python <repo>/<script> args...` in `cwd`, as a keras-yolo3 user types it there."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, str(REPO / script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


# ---------------------------------------------------------------------------
# convert.py


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A keras-yolo3 folder after its convert.py lines: (folder, {name: CompletedProcess}).

    Three conversions (the expensive part, shared by the tests below):
    `convert.py yolov3-tiny.cfg yolov3-tiny.weights model_data/yolo.h5`, the
    same again with `-p` (a re-run over its own output), and `-w ...
    model_data/yolo_weights.h5 --overwrite` over a file the user made, first
    refused without `--overwrite`.
    """
    folder = tmp_path_factory.mktemp("keras_yolo3_convert")
    shutil.copy(TINY_CFG, folder / "yolov3-tiny.cfg")
    convs, _ = darknet.infer_layers(darknet.parse_cfg(str(TINY_CFG)))
    write_weights(folder / "yolov3-tiny.weights", random_weights(convs))
    (folder / "model_data").mkdir()
    darknet_args = ("yolov3-tiny.cfg", "yolov3-tiny.weights")
    runs = {"first": run_script("convert.py", *darknet_args, "model_data/yolo.h5", cwd=folder)}
    runs["first_stat"] = os.stat(folder / "model_data" / "yolo.h5")
    runs["again"] = run_script("convert.py", "-p", *darknet_args, "model_data/yolo.h5", cwd=folder)
    (folder / "model_data" / "yolo_weights.h5").write_text("the user's own file\n")
    runs["refused"] = run_script("convert.py", "-w", *darknet_args, "model_data/yolo_weights.h5", cwd=folder)
    runs["refused_left"] = (folder / "model_data" / "yolo_weights.h5").read_text()
    runs["weights_only"] = run_script(
        "convert.py", "-w", *darknet_args, "model_data/yolo_weights.h5", "--overwrite", cwd=folder
    )
    return folder, runs


def _outputs(path, image):
    body = tiny_yolo_body(keras.Input(shape=(None, None, 3)), 3, 80)
    report = load_weights(body, str(path))
    return report, [np.asarray(o) for o in body(image, training=False)]


def test_convert_verbatim_and_w_write_loadable_keras2_h5_with_metadata(converted):
    folder, runs = converted
    for name in ("first", "weights_only"):
        assert runs[name].returncode == 0, runs[name].stderr
    model_data = folder / "model_data"
    with h5py.File(model_data / "yolo.h5", "r") as handle:  # Keras 2 `model.save`, as keras-yolo3's convert.py
        assert "model_weights" in handle and "model_config" in handle.attrs
    with h5py.File(model_data / "yolo_weights.h5", "r") as handle:  # Keras 2 `save_weights`, as its -w
        assert "layer_names" in handle.attrs and "model_weights" not in handle
    reference = convert(folder / "yolov3-tiny.cfg", folder / "yolov3-tiny.weights", folder / "reference.weights.h5")
    image = np.random.default_rng(0).uniform(0, 1, (1, 64, 64, 3)).astype(np.float32)
    _, expected = _outputs(folder / "reference.weights.h5", image)
    for name, file_format in (("yolo.h5", "keras2-model"), ("yolo_weights.h5", "keras2-weights")):
        # What `yolo_video.py --model model_data/yolo.h5` reads: the metadata, then the weights.
        assert read_metadata(model_data / name) == reference.metadata
        report, outputs = _outputs(model_data / name, image)
        assert report.format == file_format and report.loaded == 24
        for got, want in zip(outputs, expected, strict=True):
            np.testing.assert_array_equal(got, want)


def test_convert_rerun_replaces_its_own_output_and_plots_or_says_what_to_install(converted):
    folder, runs = converted
    again = runs["again"]
    assert again.returncode == 0, again.stderr
    assert "replacing model_data/yolo.h5, an earlier output of keras-yolo-mgpu" in again.stderr
    assert os.stat(folder / "model_data" / "yolo.h5").st_ino != runs["first_stat"].st_ino  # written anew
    plot = folder / "model_data" / "yolo.png"
    if not plot.exists():  # no pydot/graphviz here: converted anyway, and one line says what to install
        (line,) = [line for line in again.stderr.splitlines() if "not plotted" in line]
        assert "pip install pydot" in line and "graphviz" in line


def test_convert_refuses_a_users_file_without_overwrite_and_replaces_it_with(converted):
    folder, runs = converted
    refused = runs["refused"]
    assert refused.returncode == 1
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert "model_data/yolo_weights.h5 already exists" in line and "--overwrite" in line
    assert runs["refused_left"] == "the user's own file\n"
    assert "replacing model_data/yolo_weights.h5 (--overwrite)" in runs["weights_only"].stderr


@pytest.mark.slow
def test_darknet53_from_convert_py_starts_train_py_as_its_backbone(tmp_path):
    """keras-yolo3's README: `convert.py -w darknet53.cfg darknet53.weights model_data/darknet53_weights.h5`,
    then "use model_data/darknet53_weights.h5 in train.py": the backbone loads, the head starts fresh."""
    shutil.copy(REPO / "model_data" / "darknet53.cfg", tmp_path / "darknet53.cfg")
    convs, _ = darknet.infer_layers(darknet.parse_cfg(str(tmp_path / "darknet53.cfg")))
    write_weights(tmp_path / "darknet53.weights", random_weights(convs))
    (tmp_path / "model_data").mkdir()
    backbone = "model_data/darknet53_weights.h5"
    converted = run_script("convert.py", "-w", "darknet53.cfg", "darknet53.weights", backbone, cwd=tmp_path)
    assert converted.returncode == 0, converted.stderr[-2000:]
    paths = make_synthetic_dataset(tmp_path / "data", num_train=4, num_val=0, image_size=64, seed=0)
    flags = ["--annotations", paths.train, "--classes", paths.classes, "--weights", backbone, "--val-split", "0"]
    flags += ["--input-size", "32", "--batch-size", "2", "--steps-per-epoch", "1", "--epochs", "1", "--no-pictures"]
    # keras-yolo3's recipe: stage 1 freezes all but the output convolutions, so the backbone ends as loaded.
    trained = run_script("train.py", *flags, "--recipe", "keras-yolo3", "--freeze-epochs", "1", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "holds the backbone alone (104 of the model's 147 layers with weights" in trained.stderr
    final = yolo_body(keras.Input((None, None, 3)), 3, 4)
    load_weights(final, str(tmp_path / "logs" / "000" / "trained_weights_final.h5"))
    source = load_converted(tmp_path / backbone)
    source_convs = [layer for layer in source.layers if isinstance(layer, keras.layers.Conv2D)]
    final_convs = [layer for layer in final.layers if isinstance(layer, keras.layers.Conv2D)]
    assert len(source_convs) == 52
    for ours, theirs in zip(final_convs, source_convs):  # the first 52: Darknet-53's
        np.testing.assert_array_equal(ours.get_weights()[0], theirs.get_weights()[0])
    # `train.py --weights darknet53.weights` converts it to a Keras 3 file first: that loads as the backbone too.
    convert(str(tmp_path / "darknet53.cfg"), str(tmp_path / "darknet53.weights"), str(tmp_path / "d53.weights.h5"))
    report = load_weights(yolo_body(keras.Input((None, None, 3)), 3, 4), str(tmp_path / "d53.weights.h5"))
    assert report.loaded == 104 and len(report.skipped) == 43


def test_convert_output_that_is_an_input_is_refused_even_with_overwrite(tmp_path):
    darknet_file = tmp_path / "darknet.h5"  # Darknet weights under a name convert.py accepts as output
    darknet_file.write_bytes(b"\0" * 64)
    result = run_script("convert.py", str(TINY_CFG), "darknet.h5", "darknet.h5", "--overwrite", cwd=tmp_path)
    assert result.returncode == 1
    assert "output_path darknet.h5 is also an input" in result.stderr
    assert darknet_file.read_bytes() == b"\0" * 64


# ---------------------------------------------------------------------------
# kmeans.py, voc_annotation.py, coco_annotation.py without flags


def keras_yolo3_result2txt(text: str) -> np.ndarray:
    """Parses keras-yolo3's `yolo_anchors.txt` as its kmeans.py `result2txt` writes it: `%d,%d` joined by ', '."""
    assert re.fullmatch(r"\d+,\d+(, \d+,\d+)*", text), repr(text)
    return np.array([[int(v) for v in pair.split(",")] for pair in text.split(", ")])


def test_kmeans_without_flags_reads_2012_train_and_writes_keras_yolo3s_yolo_anchors(tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    for i in range(12):
        boxes = []
        for _ in range(3):
            x, y = rng.integers(0, 200, 2)
            w, h = rng.integers(8, 300, 2)
            boxes.append(f"{x},{y},{x + w},{y + h},{rng.integers(0, 20)}")
        lines.append(f"{tmp_path}/VOCdevkit/VOC2012/JPEGImages/{i:06d}.jpg " + " ".join(boxes))
    (tmp_path / "2012_train.txt").write_text("\n".join(lines) + "\n")

    result = run_script("kmeans.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "keras-yolo3's defaults --annotations 2012_train.txt" in result.stderr
    written = (tmp_path / "yolo_anchors.txt").read_text()
    anchors = keras_yolo3_result2txt(written)
    assert anchors.shape == (9, 2)
    np.testing.assert_array_equal(get_anchors(tmp_path / "yolo_anchors.txt"), anchors)  # our reader takes it

    assert run_script("kmeans.py", cwd=tmp_path).returncode == 0  # replaces its own output
    (tmp_path / "yolo_anchors.txt").write_text("10,13,  16,30,  33,23\n")  # the user's edit
    refused = run_script("kmeans.py", cwd=tmp_path)
    assert refused.returncode == 1 and "--output yolo_anchors.txt already exists" in refused.stderr
    assert "--overwrite" in refused.stderr
    assert (tmp_path / "yolo_anchors.txt").read_text() == "10,13,  16,30,  33,23\n"
    assert run_script("kmeans.py", "--overwrite", cwd=tmp_path).returncode == 0
    keras_yolo3_result2txt((tmp_path / "yolo_anchors.txt").read_text())


VOC_CLASSES = [
    "aeroplane",
    "bicycle",
    "bird",
    "boat",
    "bottle",
    "bus",
    "car",
    "cat",
    "chair",
    "cow",
    "diningtable",
    "dog",
    "horse",
    "motorbike",
    "person",
    "pottedplant",
    "sheep",
    "sofa",
    "train",
    "tvmonitor",
]  # fmt: skip  (keras-yolo3's voc_annotation.py `classes`)


def keras_yolo3_voc_lines(cwd: str, year: str, image_set: str, classes=VOC_CLASSES) -> str:
    """keras-yolo3's voc_annotation.py for one set, transcribed (its `wd = getcwd()`, int boxes, difficult skipped).

    `classes`: the script's `classes` list, which its users edit to their own.
    """
    out = []
    ids = open(f"{cwd}/VOCdevkit/VOC{year}/ImageSets/Main/{image_set}.txt").read().strip().split()
    for image_id in ids:
        out.append(f"{cwd}/VOCdevkit/VOC{year}/JPEGImages/{image_id}.jpg")
        for obj in ET.parse(f"{cwd}/VOCdevkit/VOC{year}/Annotations/{image_id}.xml").getroot().iter("object"):
            difficult, cls = obj.find("difficult").text, obj.find("name").text
            if cls not in classes or int(difficult) == 1:
                continue
            box = obj.find("bndbox")
            b = [int(box.find(t).text) for t in ("xmin", "ymin", "xmax", "ymax")]
            out.append(" " + ",".join(str(a) for a in b) + "," + str(classes.index(cls)))
        out.append("\n")
    return "".join(out)


def _voc_xml(objects) -> str:
    parts = ["<annotation><folder>VOC2007</folder><size><width>500</width><height>375</height></size>"]
    for name, box, difficult in objects:
        coords = "".join(f"<{t}>{v}</{t}>" for t, v in zip(("xmin", "ymin", "xmax", "ymax"), box))
        parts.append(f"<object><name>{name}</name><difficult>{difficult}</difficult><bndbox>{coords}</bndbox></object>")
    return "".join(parts) + "</annotation>"


def test_voc_annotation_without_flags_writes_keras_yolo3s_three_files(tmp_path):
    voc = tmp_path / "VOCdevkit" / "VOC2007"
    for sub in ("Annotations", "ImageSets/Main", "JPEGImages"):
        (voc / sub).mkdir(parents=True)
    objects = {
        "000001": [("dog", (48, 240, 195, 371), 0), ("person", (8, 12, 352, 498), 1), ("tvmonitor", (1, 2, 3, 4), 0)],
        "000002": [("person", (8, 12, 352, 498), 1)],  # only a difficult object: a line with no box
        "000003": [("unicorn", (1, 1, 5, 5), 0), ("aeroplane", (10, 20, 30, 40), 0)],
    }
    for image_id, objs in objects.items():
        (voc / "Annotations" / f"{image_id}.xml").write_text(_voc_xml(objs))
    for image_set, ids in (("train", "000001\n000003\n"), ("val", "000002\n"), ("test", "000003\n000001\n")):
        (voc / "ImageSets" / "Main" / f"{image_set}.txt").write_text(ids)

    result = run_script("voc_annotation.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "keras-yolo3's defaults --devkit" in result.stderr
    cwd = os.path.realpath(tmp_path)  # what keras-yolo3's getcwd() returns
    for image_set in ("train", "val", "test"):
        written = (tmp_path / f"2007_{image_set}.txt").read_text()
        assert written == keras_yolo3_voc_lines(cwd, "2007", image_set), image_set
    assert (tmp_path / "2007_train.txt").read_text().startswith(f"{cwd}/VOCdevkit/VOC2007/JPEGImages/000001.jpg 48,")

    # A keras-yolo3 user with their own classes lists them in model_data/voc_classes.txt, the file
    # train.py reads there (and in the script's `classes`): the ids follow that file.
    (tmp_path / "model_data").mkdir()
    own_classes = ["unicorn", "dog", "aeroplane"]
    (tmp_path / "model_data" / "voc_classes.txt").write_text("\n".join(own_classes) + "\n")
    result = run_script("voc_annotation.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "class names from model_data/voc_classes.txt" in result.stderr
    for image_set in ("train", "val", "test"):
        written = (tmp_path / f"2007_{image_set}.txt").read_text()
        assert written == keras_yolo3_voc_lines(cwd, "2007", image_set, own_classes), image_set

    # A list none of the objects is in would write every image without boxes: refused, nothing replaced.
    (tmp_path / "model_data" / "voc_classes.txt").write_text("kangaroo\n")
    result = run_script("voc_annotation.py", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "(aeroplane, dog, person, tvmonitor, unicorn) is in model_data/voc_classes.txt" in result.stderr
    assert written == (tmp_path / "2007_test.txt").read_text()


def keras_yolo3_coco_train_txt(instances: dict) -> str:
    """keras-yolo3's coco_annotation.py, transcribed: its category offsets, int boxes, paths from image ids."""
    name_box_id: dict[str, list] = {}
    for ant in instances["annotations"]:
        name = "mscoco2017/train2017/%012d.jpg" % ant["image_id"]  # noqa: UP031 (verbatim)
        cat = ant["category_id"]
        for low, high, offset in ((1, 11, 1), (13, 25, 2), (27, 28, 3), (31, 44, 5), (46, 65, 6), (67, 67, 7),
                                  (70, 70, 9), (72, 82, 10), (84, 90, 11)):  # fmt: skip
            if low <= cat <= high:
                cat -= offset
                break
        name_box_id.setdefault(name, []).append([ant["bbox"], cat])
    out = []
    for key, infos in name_box_id.items():
        out.append(key)
        for info in infos:
            x_min, y_min = int(info[0][0]), int(info[0][1])
            x_max, y_max = x_min + int(info[0][2]), y_min + int(info[0][3])
            out.append(" %d,%d,%d,%d,%d" % (x_min, y_min, x_max, y_max, int(info[1])))  # noqa: UP031
        out.append("\n")
    return "".join(out)


def test_coco_annotation_without_flags_writes_keras_yolo3s_train_txt(tmp_path):
    annotations = [
        {"id": 1, "image_id": 7, "category_id": 90, "bbox": [1.6, 2.7, 2.6, 3.5], "iscrowd": 0},  # 1+2=3, not 4
        {"id": 2, "image_id": 5, "category_id": 1, "bbox": [473.07, 395.93, 38.65, 28.67], "iscrowd": 0},
        {"id": 3, "image_id": 7, "category_id": 13, "bbox": [10, 20, 30, 40], "iscrowd": 1},  # crowd: kept
        {"id": 4, "image_id": 5, "category_id": 44, "bbox": [5, 6, 0.4, 7], "iscrowd": 0},  # 0 px wide: kept
        {"id": 5, "image_id": 123456, "category_id": 67, "bbox": [0, 0, 5, 5], "iscrowd": 0},
    ]
    images = [{"id": i, "file_name": f"{i:012d}.jpg", "width": 640, "height": 480} for i in (5, 7, 9, 123456)]
    categories = [{"id": i, "name": f"category {i}"} for i in (1, 13, 44, 67, 90)]
    instances = {"images": images, "annotations": annotations, "categories": categories}
    (tmp_path / "mscoco2017" / "annotations").mkdir(parents=True)
    (tmp_path / "mscoco2017" / "annotations" / "instances_train2017.json").write_text(json.dumps(instances))

    result = run_script("coco_annotation.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "keras-yolo3's defaults: --instances mscoco2017/annotations/instances_train2017.json" in result.stderr
    written = (tmp_path / "train.txt").read_text()
    assert written == keras_yolo3_coco_train_txt(instances)
    assert written.splitlines()[0] == "mscoco2017/train2017/000000000007.jpg 1,2,3,5,79 10,20,40,60,11"


def test_no_flag_runs_outside_a_keras_yolo3_folder_name_the_file_and_the_flags(tmp_path):
    for script, named in (
        ("kmeans.py", ("2012_train.txt", "--annotations", "--data")),
        ("voc_annotation.py", ("VOCdevkit", "--devkit", "--xml-dir")),
        ("coco_annotation.py", ("mscoco2017/annotations/instances_train2017.json", "--instances", "--output")),
    ):
        result = run_script(script, cwd=tmp_path)
        assert result.returncode == 2, (script, result.stderr)
        assert all(word in result.stderr for word in named), (script, result.stderr)
    assert os.listdir(tmp_path) == []


def test_evaluate_save_detections_refuses_a_users_file_before_running_a_model(tmp_path):
    saved = tmp_path / "detections.json"
    saved.write_text("[]  the user's own\n")
    result = run_script(
        "evaluate.py", "--annotations", "val.txt", "--weights", "w.h5", "--save-detections", str(saved), cwd=tmp_path
    )
    assert result.returncode == 1
    assert f"--save-detections {saved} already exists" in result.stderr and "--overwrite" in result.stderr
    assert saved.read_text() == "[]  the user's own\n"
