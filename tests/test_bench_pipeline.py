"""Pipeline benchmark: image generator script, the three generators, the CLI's JSON line."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from keras_yolo_mgpu.bench.pipeline import GENERATORS, run_benchmark
from keras_yolo_mgpu.bench.reference_generator import data_generator
from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.check import check_annotations
from keras_yolo_mgpu.resources import get_anchors, model_data_path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOC_CLASSES = os.path.join(REPO, "model_data", "voc_classes.txt")


@pytest.fixture(scope="module")
def bench_images(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "scripts", "make_bench_images.py"),
            "--out",
            str(out),
            "--num",
            "6",
            "--seed",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return out / "train.txt"


def test_make_bench_images_writes_valid_640x480_jpegs(bench_images):
    report = check_annotations(str(bench_images), num_classes=20)
    assert report.problems == [] and report.num_images == 6 and report.num_boxes >= 6
    for annotation in report.annotations:
        with Image.open(annotation.image_path) as image:
            assert image.format == "JPEG" and image.size == (640, 480)
    assert all(not os.path.isabs(line.split()[0]) for line in bench_images.read_text().splitlines())


@pytest.mark.parametrize("generator", ["reference", "decode-only"])
def test_other_generators_run(bench_images, generator):
    annotations = read_annotations(str(bench_images))
    anchors = get_anchors(model_data_path("tiny_yolo_anchors.txt"))
    result = run_benchmark(generator, annotations, (64, 64), anchors, 20, batch_size=4, batches=2, warmup=1)
    assert result["generator"] == generator and result["images_per_sec"] > 0
    assert result["batch_size"] == 4 and result["batches"] == 2
    with pytest.raises(ValueError, match="generator"):
        run_benchmark("nope", annotations, (64, 64), anchors, 20, batch_size=4, batches=1)
    assert set(GENERATORS) == {"tfdata", "reference", "decode-only"}


def test_reference_generator_batches(bench_images):
    annotations = read_annotations(str(bench_images))
    anchors = get_anchors(model_data_path("yolo_anchors.txt"))
    np.random.seed(0)
    (images, *y_true), zeros = next(data_generator(annotations, 4, (64, 96), anchors, 20))
    assert images.shape == (4, 64, 96, 3) and 0 <= images.min() and images.max() <= 1
    assert [t.shape for t in y_true] == [(4, 2, 3, 3, 25), (4, 4, 6, 3, 25), (4, 8, 12, 3, 25)]
    assert zeros.shape == (4,)


def test_cli_prints_json_last_line(bench_images):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_yolo_mgpu.bench",
            "pipeline",
            "--annotations",
            str(bench_images),
            "--classes",
            VOC_CLASSES,
            "--input-size",
            "64",
            "--batch-size",
            "4",
            "--batches",
            "2",
            "--warmup",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["generator"] == "tfdata" and record["images_per_sec"] > 0
    assert record["input_size"] == [64, 64] and record["augment"] is True
