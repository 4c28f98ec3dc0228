"""Video and image detection: threads, colours, codecs, the CLI, the benchmark."""

from __future__ import annotations

import http.server
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
from inference_helpers import (
    CLASS_NAMES,
    INPUT_SHAPE,
    TINY_ANCHORS,
    TINY_ANCHORS_PATH,
    make_body,
    random_images,
    write_classes,
)
from PIL import Image, ImageOps

from keras_yolo_mgpu.cli.copy_scripts import main as copy_scripts_main
from keras_yolo_mgpu.cli.detect import main
from keras_yolo_mgpu.data.synthetic import make_synthetic_video
from keras_yolo_mgpu.inference import video as video_module
from keras_yolo_mgpu.inference.detector import YOLO
from keras_yolo_mgpu.inference.media import OutputRule, process_images, process_video
from keras_yolo_mgpu.inference.video import VideoError, VideoReader, VideoWriter

REPO = Path(__file__).resolve().parents[1]
SCORE = 0.5
RED, GREEN = (255, 0, 0), (0, 255, 0)


@pytest.fixture(scope="module")
def body():
    return make_body()


@pytest.fixture(scope="module")
def yolo(body):
    return YOLO.from_body(body, TINY_ANCHORS, CLASS_NAMES, score=SCORE, model_image_size=INPUT_SHAPE, batch_size=4)


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clip")
    return make_synthetic_video(folder / "clip.mp4", num_frames=12, frame_size=(120, 160), fps=10.0, seed=3)


def read_bgr_frames(path):
    capture = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        frames.append(frame)
    capture.release()
    return frames


def video_properties(path):
    capture = cv2.VideoCapture(str(path))
    props = (
        capture.get(cv2.CAP_PROP_FPS),
        int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)),
        int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT)),
        int(capture.get(cv2.CAP_PROP_FRAME_COUNT)),
    )
    capture.release()
    return props


# ---- reader and writer --------------------------------------------------------------


def test_writer_and_reader_convert_colours_keep_size_fps_and_end_cleanly(tmp_path):
    frames = [np.full((64, 96, 3), RED if i % 2 == 0 else GREEN, np.uint8) for i in range(10)]
    with VideoWriter(tmp_path / "colours.mp4", 7.0, (96, 64)) as writer:
        for frame in frames:
            writer.write(frame)
    assert writer.path.endswith("colours.mp4") and writer.fourcc == "mp4v" and writer.frames_written == 10
    assert video_properties(writer.path)[:3] == (7.0, 96, 64)
    first_bgr = read_bgr_frames(writer.path)[0]
    assert first_bgr[..., 2].mean() > 200 and first_bgr[..., 0].mean() < 50  # red stored as BGR red

    with VideoReader(writer.path) as reader:
        assert (reader.fps, reader.size, reader.frame_count) == (7.0, (96, 64), 10)
        items = list(reader)  # past the last frame: a normal end, no exception
    assert [index for index, _, _ in items] == list(range(10))
    red, green = items[0][1], items[1][1]
    assert red[..., 0].mean() > 200 and red[..., 2].mean() < 50  # back to RGB
    assert green[..., 1].mean() > 200 and green[..., 0].mean() < 50


def test_writer_falls_back_to_avi_when_mp4v_does_not_open(tmp_path, monkeypatch):
    real_writer = cv2.VideoWriter

    def no_mp4v(path, fourcc, fps, size):
        if fourcc == cv2.VideoWriter_fourcc(*"mp4v"):
            return real_writer()  # never opened, like a build without the codec
        return real_writer(path, fourcc, fps, size)

    monkeypatch.setattr(video_module.cv2, "VideoWriter", no_mp4v)
    with VideoWriter(tmp_path / "out.mp4", 5.0, (32, 32)) as writer:
        writer.write(np.zeros((32, 32, 3), np.uint8))
    assert writer.path == str(tmp_path / "out.avi") and writer.fourcc == "MJPG"
    assert video_properties(writer.path)[1:] == (32, 32, 1)


def test_unusable_inputs_raise_video_error(tmp_path):
    with pytest.raises(VideoError, match="not found"):
        VideoReader(tmp_path / "missing.mp4")
    fake = tmp_path / "fake.mp4"
    fake.write_text("not a video")
    with pytest.raises(VideoError, match="cannot (open|read)"):
        VideoReader(fake)


def test_a_camera_that_cannot_open_is_one_error_without_opencv_warnings(capfd, caplog):
    caplog.set_level(logging.INFO, logger="keras_yolo_mgpu")  # not -v, whatever an earlier test left the root at
    with pytest.raises(VideoError, match="cannot open video input camera 7"):
        VideoReader(7)  # no /dev/video7 here: OpenCV warns on its own C++ stderr, which the error replaces
    assert "WARN" not in capfd.readouterr().err


# ---- the pipeline ----------------------------------------------------------------------


def test_process_video_detects_on_rgb_frames(yolo, clip, tmp_path):
    out = tmp_path / "out.mp4"
    jsonl = tmp_path / "frames.jsonl"
    stats = process_video(yolo, clip, str(out), batch_size=4, save_json=str(jsonl), progress=False)
    assert stats["frames"] == 12 and stats["output"] == str(out)
    assert video_properties(out) == (10.0, 160, 120, 12)  # input's size, frame rate and length

    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r["frame"] for r in records] == list(range(12))
    assert sum(len(r["detections"]) for r in records) == stats["detections"] > 0
    differs_from_bgr = False
    for record, bgr in zip(records, read_bgr_frames(clip)):
        expected = yolo.detect(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
        got = record["detections"]
        assert [d["class_id"] for d in got] == expected.classes.tolist()
        np.testing.assert_allclose([d["box"] for d in got] or np.zeros((0, 4)), expected.boxes, atol=0.01)
        np.testing.assert_allclose([d["score"] for d in got], expected.scores, atol=1e-4)
        swapped = yolo.detect(bgr)  # what keras-yolo3 fed its RGB model
        differs_from_bgr |= swapped.classes.tolist() != expected.classes.tolist() or not np.allclose(
            swapped.boxes, expected.boxes
        )
    assert differs_from_bgr  # the test can tell the channel order apart


def test_process_images_annotates_folder_and_skips_unreadable(yolo, tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for i, image in enumerate(random_images(3, seed=4)):
        cv2.imwrite(str(folder / f"img{i}.png"), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    (folder / "broken.jpg").write_text("not an image")
    stats = process_images(
        yolo, [str(folder)], str(tmp_path / "out"), save_json=str(tmp_path / "images.jsonl"), progress=False
    )
    assert (stats["images"], stats["failed"]) == (3, 1)
    for i, image in enumerate(random_images(3, seed=4)):
        annotated = cv2.imread(str(tmp_path / "out" / f"img{i}.png"))
        assert annotated.shape == image.shape
    lines = (tmp_path / "images.jsonl").read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["image"].endswith("img0.png")


def test_one_image_is_annotated_into_the_file_output_names_and_several_are_refused(yolo, tmp_path):
    images = random_images(2, seed=5)
    for i, image in enumerate(images):
        cv2.imwrite(str(tmp_path / f"img{i}.png"), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    stats = process_images(yolo, [str(tmp_path / "img0.png")], str(tmp_path / "result.jpg"), progress=False)
    assert stats["images"] == 1 and (tmp_path / "result.jpg").is_file()
    assert cv2.imread(str(tmp_path / "result.jpg")).shape == images[0].shape
    with pytest.raises(ValueError, match="names one image file, and 2 images were given: give a folder"):
        process_images(yolo, [str(tmp_path / "img0.png"), str(tmp_path / "img1.png")], str(tmp_path / "two.png"))
    assert not (tmp_path / "two.png").exists()


def test_a_photo_stored_sideways_is_detected_and_drawn_as_a_viewer_shows_it(yolo, clip, tmp_path):
    """A phone's portrait photo: stored 160 wide and 120 high, EXIF orientation 6 (turn 90 degrees clockwise to
    show). The network sees it upright and the annotated file is upright, as ultralytics draws it (keras-yolo3 drew
    it sideways)."""
    stored = Image.fromarray(cv2.cvtColor(read_bgr_frames(clip)[0], cv2.COLOR_BGR2RGB))
    exif = Image.Exif()
    exif[0x0112] = 6
    stored.save(tmp_path / "portrait.jpg", quality=95, exif=exif.tobytes())
    stats = process_images(
        yolo, [str(tmp_path / "portrait.jpg")], str(tmp_path / "out"), save_json=str(tmp_path / "d.jsonl")
    )
    assert stats["images"] == 1
    record = json.loads((tmp_path / "d.jsonl").read_text())
    assert (record["width"], record["height"]) == (120, 160)
    assert cv2.imread(str(tmp_path / "out" / "portrait.jpg")).shape == (160, 120, 3)
    with Image.open(tmp_path / "portrait.jpg") as shown:
        upright, as_stored = np.asarray(ImageOps.exif_transpose(shown)), np.asarray(shown)
    upright_found, stored_found = (yolo.detect_batch([pixels])[0] for pixels in (upright, as_stored))
    assert upright_found.num_boxes > 0 and record["detections"] == upright_found.to_records(yolo.class_names)
    assert record["detections"] != stored_found.to_records(yolo.class_names)  # the test tells the two apart


# ---- the command line -------------------------------------------------------------------


def test_cli_reports_bad_inputs_without_traceback(tmp_path, capsys):
    classes = write_classes(tmp_path / "classes.txt")
    weights = tmp_path / "w.weights.h5"
    make_body().save_weights(str(weights))
    common = ["--model", str(weights), "--anchors", TINY_ANCHORS_PATH, "--classes", classes, "--input-size", "96x128"]
    assert main(common + ["--input", str(tmp_path / "missing.mp4")]) == 1
    assert main(["--model", str(tmp_path / "none.h5"), "--input", "x.mp4"]) == 1
    assert main(common + ["--image", str(tmp_path / "missing.jpg")]) == 1
    err = capsys.readouterr().err
    assert "error: video input not found" in err
    assert "error: model weights not found" in err
    assert "error: image not found" in err
    assert "Traceback" not in err


def test_missing_default_weights_say_how_keras_yolo3_makes_them(tmp_path, monkeypatch, capsys):
    """keras-yolo3's README runs convert.py before yolo_video.py; a user who skipped it is told the line."""
    monkeypatch.chdir(tmp_path)
    assert main(["--input", "clip.mp4"]) == 1
    assert main(["--model", "elsewhere/best.h5", "--input", "clip.mp4"]) == 1
    default_error, other_error = capsys.readouterr().err.strip().splitlines()
    assert "model weights not found: model_data/yolo.h5, the default" in default_error
    assert "python convert.py yolov3.cfg yolov3.weights model_data/yolo.h5" in default_error
    assert "--model yolov3 for the official weights by name" in default_error
    assert "error: model weights not found: elsewhere/best.h5 (run with -v for details)" == other_error
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif("GUI:                           NONE" not in cv2.getBuildInformation(), reason="OpenCV can show")
def test_show_without_a_display_fails_before_a_frame_is_written(tmp_path, clip, caplog, capsys):
    """On a headless OpenCV, --show is refused up front: no model built, no output file (it used to keep the frames
    annotated before the first window failed)."""
    classes = write_classes(tmp_path / "classes.txt")
    weights = tmp_path / "w.weights.h5"
    make_body().save_weights(str(weights))
    common = ["--model", str(weights), "--anchors", TINY_ANCHORS_PATH, "--classes", classes, "--input-size", "96x128"]
    output = tmp_path / "shown.avi"
    with caplog.at_level(logging.INFO):
        assert main([*common, "--input", clip, "--output", str(output), "--show"]) == 1
    assert "error: --show needs a display" in capsys.readouterr().err
    assert not output.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["classes.txt", "w.weights.h5"]
    assert "Loaded" not in caplog.text  # refused before the model is built


def test_cli_image_folder_in_process(tmp_path):
    classes = write_classes(tmp_path / "classes.txt")
    weights = tmp_path / "w.weights.h5"
    make_body().save_weights(str(weights))
    folder = tmp_path / "images"
    folder.mkdir()
    for i, image in enumerate(random_images(2, seed=4)):
        cv2.imwrite(str(folder / f"{i}.jpg"), image)
    argv = [
        "--model",
        str(weights),
        "--anchors",
        TINY_ANCHORS_PATH,
        "--classes",
        classes,
        "--input-size",
        "96x128",
        "--score",
        str(SCORE),
        "--image",
        str(folder),
        "--output",
        str(tmp_path / "annotated"),
        "--no-progress",
    ]
    assert main(argv) == 0
    assert sorted(os.listdir(tmp_path / "annotated")) == ["0.jpg", "1.jpg"]


def test_cli_video_with_keras2_multi_gpu_file(tmp_path, clip, body):
    """The real script, in a subprocess, on a Keras 2 multi_gpu_model file as keras-yolo3 users have."""
    k2 = pytest.importorskip("keras2_reference")
    keras2_body = k2.build_body(tiny=True, num_classes=2)
    model_file = str(tmp_path / "keras2_multi_gpu.h5")
    k2.build_multi_gpu_wrapper(keras2_body, gpus=2).save_weights(model_file)
    classes = write_classes(tmp_path / "classes.txt")
    out, jsonl = tmp_path / "out.mp4", tmp_path / "frames.jsonl"
    command = [
        sys.executable,
        str(REPO / "yolo_video.py"),
        "--model",
        model_file,
        "--anchors",
        TINY_ANCHORS_PATH,
        "--classes",
        classes,
        "--input-size",
        "96x128",
        "--score",
        "0.05",
        "--gpu_num",
        "1",
        "--input",
        str(clip),
        "--output",
        str(out),
        "--save-json",
        str(jsonl),
        "--batch-size",
        "4",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # In a log (stderr is a pipe here) no bar redraws; the summary gives the frame rate.
    assert "\r" not in result.stderr and "detect:  " not in result.stderr
    assert re.search(r"12 frames in [\d.]+ s \([\d.]+ fps\)", result.stderr), result.stderr[-2000:]
    assert video_properties(out) == (10.0, 160, 120, 12)
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(records) == 12

    # The same file loaded here gives the same detections as the script's.
    yolo = YOLO(model_file, TINY_ANCHORS_PATH, classes, score=0.05, model_image_size=INPUT_SHAPE)
    first = yolo.detect(cv2.cvtColor(read_bgr_frames(clip)[0], cv2.COLOR_BGR2RGB))
    assert [d["class_id"] for d in records[0]["detections"]] == first.classes.tolist()
    np.testing.assert_allclose([d["box"] for d in records[0]["detections"]] or np.zeros((0, 4)), first.boxes, atol=0.01)


def test_bench_infer_prints_json_last(capsys):
    from keras_yolo_mgpu.cli.bench_infer import main as bench_main

    argv = [
        "--frames",
        "8",
        "--frame-size",
        "64x96",
        "--input-size",
        "64",
        "--batch-size",
        "4",
        "--repeats",
        "1",
        "--num-classes",
        "2",
    ]
    assert bench_main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["fps"] > 0 and result["forward_fps"] > 0
    assert result["ratio"] == pytest.approx(result["fps"] / result["forward_fps"], rel=1e-2)


def test_help_names_each_flag_of_this_command():
    from keras_yolo_mgpu.cli.detect import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "--tiny alias of --architecture yolov3-tiny" in text  # --model is the weights file here
    assert "--model FILE keras-yolo3's name for --weights" in text


# ---- keras-yolo3's command lines, through the real script --------------------------------
#
# One folder for these tests: weights, classes, two images, two clips. The
# commands run in it (keras-yolo3's default `detections/` lands there).

CLIP_FRAMES, LIVE_FRAMES = 12, 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory, body):
    root = tmp_path_factory.mktemp("script")
    body.save_weights(str(root / "w.weights.h5"))
    write_classes(root / "classes.txt")
    for name, image in zip(("a.jpg", "b.jpg"), random_images(2, seed=4, sizes=((64, 80),))):
        cv2.imwrite(str(root / name), image)
    # .avi (MJPG): a cut file still plays up to the cut, as a dropped stream does
    make_synthetic_video(root / "clip.avi", num_frames=CLIP_FRAMES, frame_size=(64, 80), fps=10.0, seed=3)
    make_synthetic_video(root / "live.avi", num_frames=LIVE_FRAMES, frame_size=(64, 80), fps=10.0, seed=5)
    return root


def yolo_video(folder, *args, stdin=None, backend=None, environment=None):
    """Runs yolo_video.py in `folder` with the test model; returns the CompletedProcess.

    `environment`: variables to set, a None value removes one.
    """
    model = ["--model", "w.weights.h5", "--anchors", TINY_ANCHORS_PATH, "--classes", "classes.txt"]
    model += ["--input-size", "64", "--score", str(SCORE), "--no-progress"]
    # FFmpeg honours http_proxy: the loopback server must be reached directly.
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env["no_proxy"] = env["NO_PROXY"] = "127.0.0.1"
    if backend:
        env["KERAS_BACKEND"] = backend
    for name, value in (environment or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return subprocess.run(
        [sys.executable, str(REPO / "yolo_video.py"), *model, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=folder,
        env=env,
    )


class _ClipHandler(http.server.BaseHTTPRequestHandler):
    """Serves the test folder's clips; under /cut/ it announces the whole file, sends half and hangs up."""

    timeout = 20  # a client that stalls cannot hold the test
    root: Path

    def do_GET(self):
        cut = self.path.startswith("/cut/")
        path = self.root / Path(self.path).name
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "video/x-msvideo")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2] if cut else data)
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(folder):
    handler = type("Handler", (_ClipHandler,), {"root": folder})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def test_image_prompt_annotates_each_name_until_end_of_input(folder):
    """keras-yolo3's `python yolo_video.py --image`: a file name per line, to the end of input (EOF)."""
    detections = folder / "detections"
    detections.mkdir(exist_ok=True)
    (detections / "mine.jpg").write_bytes(b"the user's own file")
    (folder / "mine.jpg").write_bytes((folder / "a.jpg").read_bytes())
    (folder / "c d.jpg").write_bytes((folder / "b.jpg").read_bytes())
    # A file dropped on a terminal comes quoted, or with its spaces escaped (macOS's Terminal).
    typed = "a.jpg\nmissing.jpg\n\nmine.jpg\n  b.jpg  \n'c d.jpg'\nc\\ d.jpg\n"
    result = yolo_video(folder, "--image", stdin=typed)

    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("Input image filename:") == 8  # 7 lines, then the end of input
    assert result.stderr.count("annotated image detections/c d.jpg") == 2  # the second replaces its own output
    # Names from a pipe are echoed as a terminal shows them, so each prompt's line ends.
    assert result.stdout.splitlines()[:2] == ["Input image filename:a.jpg", "Input image filename:missing.jpg"]
    for name in ("a.jpg", "b.jpg"):
        assert cv2.imread(str(detections / name)).shape == (64, 80, 3)
        assert f"annotated image detections/{name}" in result.stderr  # where each one went
    assert "Open Error! Try again! no such image file: missing.jpg" in result.stderr
    assert "annotated image detections/mine.jpg already exists" in result.stderr  # reported, and the loop goes on
    assert (detections / "mine.jpg").read_bytes() == b"the user's own file"
    assert result.stderr.index("missing.jpg") < result.stderr.index("detections/b.jpg")
    assert "Traceback" not in result.stderr


def test_outputs_that_are_inputs_or_not_ours_are_refused_before_anything_is_read(folder):
    source = folder / "source.avi"
    source.write_bytes((folder / "clip.avi").read_bytes())
    before = source.read_bytes()
    for args in (["--input", "source.avi", "--output", "source.avi"], ["source.avi", "./source.avi"]):
        result = yolo_video(folder, *args)
        assert result.returncode == 1 and "is also an input of this command" in result.stderr, result.stderr
        assert source.read_bytes() == before

    user_video = folder / "user.avi"
    user_video.write_bytes(b"the user's own video")
    result = yolo_video(folder, "clip.avi", "user.avi")
    assert result.returncode == 1 and "--output user.avi already exists" in result.stderr
    assert "--overwrite" in result.stderr and user_video.read_bytes() == b"the user's own video"

    # Images named up front: every annotated file is checked before the first detection.
    out = folder / "annotated"
    out.mkdir()
    (out / "b.jpg").write_bytes(b"the user's own picture")
    result = yolo_video(folder, "--image", "a.jpg", "b.jpg", "--output", "annotated")
    assert result.returncode == 1 and "annotated image annotated/b.jpg already exists" in result.stderr
    assert sorted(os.listdir(out)) == ["b.jpg"] and (out / "b.jpg").read_bytes() == b"the user's own picture"
    (folder / "results.txt").write_text("the user's own notes")  # a file where the folder would go
    result = yolo_video(folder, "--image", "a.jpg", "b.jpg", "--output", "results.txt")
    assert result.returncode == 1 and "--output results.txt is a file: the annotated images go into a folder" in (
        result.stderr
    )
    assert (folder / "results.txt").read_text() == "the user's own notes"

    notes = folder / "notes.txt"
    notes.write_text((REPO / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
    result = yolo_video(folder, "--input", "notes.txt", "--output", "notes.avi")
    assert result.returncode == 1 and "video input notes.txt is a text file, not a video" in result.stderr
    assert not (folder / "notes.avi").exists()


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_the_command_writes_one_image_into_the_file_output_names(folder, backend, tmp_path):
    """On JAX the command keeps its compiled programs in the user's cache folder, and a re-run compiles nothing new."""
    # Not the suite's shared JAX cache (a process that names its own is left alone): the user's cache folder.
    environment = {"KERAS_YOLO_MGPU_CACHE": str(tmp_path / "cache"), "JAX_COMPILATION_CACHE_DIR": None}
    target = folder / f"a_boxes_{backend}.jpg"
    result = yolo_video(folder, "--image", "a.jpg", "--output", target.name, backend=backend, environment=environment)
    assert result.returncode == 0, result.stderr
    programs = sorted(os.listdir(tmp_path / "cache" / "xla")) if backend == "jax" else []
    assert (len(programs) > 0) == (backend == "jax")
    assert target.is_file() and cv2.imread(str(target)).shape == cv2.imread(str(folder / "a.jpg")).shape
    # a.jpg stored sideways with EXIF orientation 6: the command draws it upright, as a viewer shows it.
    exif = Image.Exif()
    exif[0x0112] = 6
    with Image.open(folder / "a.jpg") as image:
        image.save(folder / f"portrait_{backend}.jpg", quality=95, exif=exif.tobytes())
    turned = folder / f"portrait_boxes_{backend}.jpg"
    result = yolo_video(
        folder, "--image", f"portrait_{backend}.jpg", "--output", turned.name, backend=backend, environment=environment
    )
    assert result.returncode == 0, result.stderr
    assert cv2.imread(str(turned)).shape == (80, 64, 3)  # a.jpg is 64 high and 80 wide, as stored
    if backend == "jax":
        assert sorted(os.listdir(tmp_path / "cache" / "xla")) == programs


def test_a_role_given_twice_or_nothing_to_detect_is_a_usage_error(folder):
    for args, message in (
        (["--input", "clip.avi", "live.avi"], "the video is given twice: --input clip.avi and live.avi"),
        (["clip.avi", "out.avi", "--output", "o.avi"], "the output is given twice: --output o.avi and out.avi"),
        ([], "nothing to detect"),
    ):
        result = yolo_video(folder, *args)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr[-2000:])


def test_positional_video_then_a_stream_rerun_replaces_its_own_output(folder, server):
    """keras-yolo3's `python yolo_video.py [video_path] [output_path]`, then the same output from an http stream."""
    out = folder / "out.avi"
    result = yolo_video(folder, "clip.avi", "out.avi", "--gpu_num", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert video_properties(out)[1:] == (80, 64, CLIP_FRAMES)

    jsonl = folder / "live.jsonl"
    result = yolo_video(folder, "--input", f"{server}/live.avi", "--output", "out.avi", "--save-json", "live.jsonl")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "replacing out.avi, an earlier output of keras-yolo-mgpu" in result.stderr
    assert len(read_bgr_frames(out)) == LIVE_FRAMES
    assert [json.loads(line)["frame"] for line in jsonl.read_text().splitlines()] == list(range(LIVE_FRAMES))
    assert not [name for name in os.listdir(folder) if ".tmp" in name]  # the temporary video was renamed


def test_a_stream_cut_midway_keeps_the_frames_written(folder, server):
    """The server hangs up halfway: the run ends cleanly, and --overwrite replaces the user's file with those frames."""
    user_video = folder / "kept.avi"
    user_video.write_bytes(b"the user's own video")
    result = yolo_video(folder, f"{server}/cut/clip.avi", "kept.avi", "--overwrite")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "replacing kept.avi (--overwrite)" in result.stderr
    kept = len(read_bgr_frames(user_video))  # a video that plays: the writer was closed
    assert 0 < kept < CLIP_FRAMES
    assert f"ended after {kept} of the {CLIP_FRAMES} frames it announced" in result.stderr
    assert "Traceback" not in result.stderr


def test_process_video_ends_cleanly_at_a_read_error_midway(yolo, clip, tmp_path, monkeypatch):
    real_open = video_module.open_capture

    class FailingAfterFour:
        def __init__(self, capture):
            self._capture, self._reads = capture, 0

        def read(self):
            self._reads += 1
            if self._reads > 3:  # the first frame is read when opening
                raise cv2.error("corrupt packet")
            return self._capture.read()

        def __getattr__(self, name):
            return getattr(self._capture, name)

    def failing_open(source):
        capture, first = real_open(source)
        return FailingAfterFour(capture), first

    monkeypatch.setattr(video_module, "open_capture", failing_open)
    rule = OutputRule(strict=True)
    stats = process_video(yolo, clip, str(tmp_path / "out.mp4"), progress=False, rule=rule)
    assert stats["frames"] == 4 and stats["input_ended_early"]
    assert video_properties(tmp_path / "out.mp4")[3] == 4  # the frames before the error, in a finished file


def test_an_mp4_from_a_server_without_byte_ranges_is_refused_with_the_reason(folder, server, monkeypatch):
    """FFmpeg cannot seek to an .mp4's index at its end on such a server: the error says so, not "the file"."""
    make_synthetic_video(folder / "clip.mp4", num_frames=60, frame_size=(240, 320), seed=3)
    for proxy in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    with pytest.raises(VideoError, match=r"clip\.mp4: the stream sent no decodable frame .*byte ranges"):
        video_module.open_capture(f"{server}/clip.mp4")


USER_SCRIPT = """
import sys
from PIL import Image
from yolo import YOLO, detect_video

yolo = YOLO(model_path="w.weights.h5", anchors_path=sys.argv[1], classes_path="classes.txt", score=0.01,
            model_image_size=(64, 64))
found = yolo.detect(Image.open("a.jpg"))
yolo.detect_image(Image.open("a.jpg")).save("script_a.png")
print("boxes", len(found.scores))
detect_video(yolo, "clip.avi", "script_clip.avi")
"""


def test_a_script_written_against_keras_yolo3s_yolo_py_runs_beside_this_one(folder):
    """`from yolo import YOLO, detect_video` in the folder: detect_image draws what yolo_video.py draws with the
    same detector set in its SETTINGS, and detect_video writes every frame (without a display: not shown, said)."""
    (folder / "user_script.py").write_text(USER_SCRIPT)
    (folder / "yolo.py").write_bytes((REPO / "yolo.py").read_bytes())
    result = subprocess.run(
        [sys.executable, "user_script.py", TINY_ANCHORS_PATH], capture_output=True, text=True, timeout=180, cwd=folder
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "boxes 0" not in result.stdout and "no display: the frames are not shown" in result.stderr
    # yolo_video.py with the same detector set in its SETTINGS (keras-yolo3's YOLO._defaults), no model flag given.
    script = (REPO / "yolo_video.py").read_text()
    for setting, value in (
        ("model_path", "w.weights.h5"),
        ("anchors_path", TINY_ANCHORS_PATH),
        ("classes_path", "classes.txt"),
        ("score", 0.01),
        ("model_image_size", (64, 64)),
    ):
        assert script.count(f"    {setting}=None,") == 1
        script = script.replace(f"    {setting}=None,", f"    {setting}={value!r},")
    (folder / "yolo_video.py").write_text(script)
    command = subprocess.run(
        [sys.executable, "yolo_video.py", "--image", "a.jpg", "--output", "command_a.png", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=folder,
    )
    assert command.returncode == 0, command.stderr
    assert "yolo_video.py sets model_path = 'w.weights.h5', anchors_path = " in command.stderr
    np.testing.assert_array_equal(cv2.imread(str(folder / "script_a.png")), cv2.imread(str(folder / "command_a.png")))
    assert video_properties(folder / "script_clip.avi")[1:] == (80, 64, CLIP_FRAMES)


def test_keras_yolo3s_own_yolo_video_py_runs_on_the_yolo_py_copy_scripts_writes(folder, tmp_path):
    """keras-yolo3's yolo_video.py, as a script of a user's beside an edited keras-yolo3 yolo.py: after copy_scripts,
    `YOLO.get_defaults` builds its help, `YOLO(**vars(FLAGS))` takes its flags (--model chooses the weights, which
    keras-yolo3's did not) over the edited `_defaults`, and `detect_video` draws what the detector given the same
    values draws."""
    keras_yolo3 = tmp_path / "keras-yolo3"
    keras_yolo3.mkdir()
    for name in ("w.weights.h5", "classes.txt", "clip.avi"):
        shutil.copy(folder / name, keras_yolo3 / name)
    yolo_py = (REPO / "tests" / "keras_yolo3_scripts" / "yolo.py.txt").read_text()
    for old, new in (
        (""""model_path": 'model_data/yolo.h5',""", """"model_path": 'model_data/absent.h5',"""),
        (""""classes_path": 'model_data/coco_classes.txt',""", """"classes_path": 'classes.txt',"""),
        (""""score" : 0.3,""", """"score" : 0.01,"""),
        (""""model_image_size" : (416, 416),""", """"model_image_size" : (64, 64),"""),
    ):
        assert yolo_py.count(old) == 1, old
        yolo_py = yolo_py.replace(old, new)
    (keras_yolo3 / "yolo.py").write_text(yolo_py)
    assert copy_scripts_main([str(keras_yolo3)]) == 0
    (keras_yolo3 / "my_video.py").write_text((REPO / "tests" / "keras_yolo3_scripts" / "yolo_video.py.txt").read_text())
    flags = ["--model", "w.weights.h5", "--anchors", TINY_ANCHORS_PATH, "--input", "clip.avi", "--output", "mine.avi"]
    result = subprocess.run(
        [sys.executable, "my_video.py", *flags], capture_output=True, text=True, timeout=180, cwd=keras_yolo3
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reference = YOLO(
        str(folder / "w.weights.h5"), TINY_ANCHORS_PATH, str(folder / "classes.txt"), 0.01, model_image_size=(64, 64)
    )
    process_video(reference, str(folder / "clip.avi"), str(tmp_path / "reference.avi"), show=False)
    written, expected = read_bgr_frames(keras_yolo3 / "mine.avi"), read_bgr_frames(tmp_path / "reference.avi")
    assert len(written) == CLIP_FRAMES
    np.testing.assert_array_equal(np.stack(written), np.stack(expected))
    assert not np.array_equal(np.stack(written), np.stack(read_bgr_frames(folder / "clip.avi")))  # boxes drawn


def test_keras_yolo3s_class_interface_and_its_yolo_video_flag_names():
    """`_defaults`, `get_defaults` and keras-yolo3's flag names as keywords; a typo or a path named twice is an error
    before anything loads."""
    assert YOLO.get_defaults("model_path") == os.path.join("model_data", "yolo.h5")
    assert YOLO.get_defaults("gpu_num") == 1
    assert YOLO.get_defaults("colour") == "Unrecognized attribute name 'colour'"
    with pytest.raises(TypeError, match="unexpected keyword argument 'scroe'"):
        YOLO(scroe=0.5)
    with pytest.raises(TypeError, match="model_path='a.h5' and model='b.h5': give one of them"):
        YOLO(model_path="a.h5", model="b.h5", image=False, input="clip.avi", output="")
    with pytest.raises(TypeError, match="no default named colour"):
        YOLO.with_defaults(colour="red")
    edited = YOLO.with_defaults(score=0.01)
    assert edited.get_defaults("score") == 0.01 and YOLO.get_defaults("score") == 0.3
    with pytest.raises(FileNotFoundError, match="b.h5"):  # the flag's name wins over the default
        edited(model="b.h5", image=False)
