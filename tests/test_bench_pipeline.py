"""Pipeline benchmark: image generator script, the generators, rows and rounds, the CLI's JSON line."""

import json
import logging
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from keras_yolo3_generator import data_generator
from PIL import Image

from keras_yolo_mgpu.bench import cpu_time
from keras_yolo_mgpu.bench.pipeline import GENERATORS, parse_rows, run_benchmark, run_rounds
from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.check import check_annotations
from keras_yolo_mgpu.optional import LazyModule
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


@pytest.mark.parametrize("generator", ["reference", "decode-only", "pyprocesses"])
def test_other_generators_run(bench_images, generator):
    annotations = read_annotations(str(bench_images))
    anchors = get_anchors(model_data_path("tiny_yolo_anchors.txt"))
    result = run_benchmark(generator, annotations, (64, 64), anchors, 20, batch_size=4, batches=2, warmup=1)
    assert result["generator"] == generator and result["images_per_sec"] > 0
    assert result["batch_size"] == 4 and result["batches"] == 2
    with pytest.raises(ValueError, match="generator"):
        run_benchmark("nope", annotations, (64, 64), anchors, 20, batch_size=4, batches=1)
    assert set(GENERATORS) == {"tfdata-device", "pydataset", "pyprocesses", "grain", "reference", "decode-only"}
    # The host-built dense targets' row is gone with them; its name says what to time instead.
    with pytest.raises(ValueError, match="'tfdata' was retired: time 'tfdata-device'"):
        run_benchmark("tfdata", annotations, (64, 64), anchors, 20, batch_size=4, batches=1)


def test_rows_with_caches_in_interleaved_rounds(bench_images, tmp_path):
    annotations = read_annotations(str(bench_images))
    anchors = get_anchors(model_data_path("tiny_yolo_anchors.txt"))
    rows = parse_rows(f"decode-only,tfdata-device@{tmp_path / 'cache'},pydataset@ram,tfdata-device", default_cache=None)
    cache = str(tmp_path / "cache")
    assert rows == [("decode-only", None), ("tfdata-device", cache), ("pydataset", "ram"), ("tfdata-device", None)]
    result = run_rounds(rows, 2, annotations, (64, 64), anchors, 20, 4, 2, warmup=1, workers=2)
    assert result["rounds"] == 2 and [r["generator"] for r in result["rows"]] == [g for g, _ in rows]
    for row in result["rows"]:
        assert len(row["cpu_ms_per_image"]) == 2 and row["median_cpu_ms_per_image"] > 0
        assert "cpu_ratio_to_decode_only" in row
        # A cached row is timed warm: the first round filled the cache with every image.
        if row["cache"]:
            assert row["cache_seconds"][0] is not None
    assert len(os.listdir(tmp_path / "cache")) == 6  # every image, once
    with pytest.raises(ValueError, match="generator"):
        parse_rows("tfdata-device,nope")
    with pytest.raises(ValueError, match="no cache"):
        parse_rows("decode-only@ram")


def test_reference_generator_batches(bench_images):
    annotations = read_annotations(str(bench_images))
    anchors = get_anchors(model_data_path("yolo_anchors.txt"))
    np.random.seed(0)
    (images, *y_true), zeros = next(data_generator(annotations, 4, (64, 96), anchors, 20))
    assert images.shape == (4, 64, 96, 3) and 0 <= images.min() and images.max() <= 1
    assert [t.shape for t in y_true] == [(4, 2, 3, 3, 25), (4, 4, 6, 3, 25), (4, 8, 12, 3, 25)]
    assert zeros.shape == (4,)


def test_the_baseline_rows_name_the_test_reference_an_installed_package_lacks(monkeypatch, tmp_path):
    from keras_yolo_mgpu.bench import baseline

    monkeypatch.setattr(baseline, "TESTS_DIR", tmp_path / "tests")
    with pytest.raises(FileNotFoundError, match=r"tests/keras_yolo3_missing\.py.*from a checkout"):
        baseline.load_reference("keras_yolo3_missing")


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
    assert record["generator"] == "tfdata-device" and record["images_per_sec"] > 0
    assert record["input_size"] == [64, 64] and record["augment"] is True


def test_cli_times_the_pydataset_where_tensorflow_cannot_be_imported(bench_images):
    from isolation import jax_environment

    command = [sys.executable, "-m", "keras_yolo_mgpu.bench", "pipeline", "--annotations", str(bench_images)]
    command += ["--classes", VOC_CLASSES, "--input-size", "64", "--batch-size", "4", "--batches", "2", "--warmup", "1"]
    env = {**os.environ, **jax_environment(1)}
    run = subprocess.run(
        [*command, "--generator", "pydataset", "--workers", "2", "--without-tensorflow"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads(run.stdout.strip().splitlines()[-1])
    assert record["generator"] == "pydataset" and record["tensorflow_loaded"] is False
    refused = subprocess.run(
        [*command, "--generator", "tfdata-device", "--without-tensorflow"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert refused.returncode == 2 and "needs KERAS_BACKEND=jax" in refused.stderr


# A child process that starts, says so, spins 0.3 s of its own CPU when told to, and waits to be closed.
SPINNER = """
import sys, time
print("ready", flush=True)
sys.stdin.readline()
start = time.process_time()
while time.process_time() - start < 0.3:
    pass
print("done", flush=True)
sys.stdin.read()
"""


def _hide_psutil(monkeypatch):
    """As where psutil is not installed (`sys.modules["psutil"] = None` would break the suite's memory sampler)."""
    monkeypatch.setattr(cpu_time, "psutil", LazyModule("no_such_module", "none"))


@pytest.mark.parametrize("source", ["proc", "psutil"])
def test_tree_cpu_counts_a_busy_child_process_live_and_ended(monkeypatch, tmp_path, source):
    if source == "proc":
        _hide_psutil(monkeypatch)  # /proc alone
    else:
        pytest.importorskip("psutil")
        monkeypatch.setattr(cpu_time, "PROC", str(tmp_path / "no-proc"))  # as on macOS
    child = subprocess.Popen([sys.executable, "-c", SPINNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        before, own = cpu_time.tree_cpu_seconds(), time.process_time()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "done\n"
        live, own = cpu_time.tree_cpu_seconds() - before, time.process_time() - own
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    ended = cpu_time.tree_cpu_seconds() - before
    # This process waited, nearly idle; the child's 0.3 s (clock ticks of 10 ms) count while it runs...
    assert own < 0.1 and 0.27 <= live <= 0.5, (own, live)
    # ... and after it has ended and been waited for (its exit adds a little).
    assert live - 0.02 <= ended <= 0.8, (live, ended)


def test_without_proc_or_psutil_the_cpu_figure_is_not_measured(bench_images, monkeypatch, tmp_path, caplog):
    _hide_psutil(monkeypatch)
    monkeypatch.setattr(cpu_time, "PROC", str(tmp_path / "no-proc"))
    assert cpu_time.tree_cpu_seconds() is None
    annotations = read_annotations(str(bench_images))
    anchors = get_anchors(model_data_path("tiny_yolo_anchors.txt"))
    with caplog.at_level(logging.INFO, logger="keras_yolo_mgpu.bench.pipeline"):
        result = run_rounds([("reference", None)], 1, annotations, (64, 64), anchors, 20, 4, 1, warmup=1)
    (row,) = result["rows"]
    assert row["cpu_ms_per_image"] == [None] and row["median_cpu_ms_per_image"] is None
    assert "reference: not measured CPU-ms/image" in caplog.text
