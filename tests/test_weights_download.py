"""Official Darknet weights by name: downloaded once, verified, cached; nothing half-written is kept.

Downloads come from a server on 127.0.0.1 (`KERAS_YOLO_MGPU_WEIGHTS_URL`
points at it) serving a small generated file; the registry entry is
monkeypatched to that file's size and md5, the real entries stay as they are.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from keras_yolo_mgpu.resources import model_data_path
from keras_yolo_mgpu.weights import darknet, download
from keras_yolo_mgpu.weights.download import (
    OFFICIAL_WEIGHTS,
    OfficialWeights,
    WeightsDownloadError,
    resolve_weights,
)
from keras_yolo_mgpu.weights.start_weights import OFFICIAL_SIZES, find_cfg

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Over one read block (1 MiB), so the copy loop goes round more than once.
PAYLOAD = random.Random(0).randbytes(1_500_000)
NAME = "yolov3-tiny"


class _Mirror:
    """What the loopback server serves and what it was asked for."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        # File name -> bytes actually sent while Content-Length announces the whole file.
        self.cut_at: dict[str, int] = {}
        self.requests: list[str] = []
        self.url = ""


@pytest.fixture
def mirror():
    state = _Mirror()

    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # a stuck test ends instead of hanging

        def do_GET(self):
            name = self.path.removeprefix("/mirror/")
            state.requests.append(name)
            if name not in state.files:
                self.send_error(404)
                return
            body = state.files[name]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: state.cut_at.get(name, len(body))])
            self.close_connection = True

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/mirror"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache, and the yolov3-tiny entry made to describe PAYLOAD (size and md5)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("KERAS_YOLO_MGPU_CACHE", str(folder))
    real = OFFICIAL_WEIGHTS[NAME]
    monkeypatch.setitem(
        OFFICIAL_WEIGHTS,
        NAME,
        OfficialWeights(NAME, real.url, len(PAYLOAD), (f"md5:{hashlib.md5(PAYLOAD).hexdigest()}",)),
    )
    monkeypatch.chdir(tmp_path)  # no yolov3-tiny.weights here: the name means the download
    return folder / "weights"


def _serve(mirror, monkeypatch, body: bytes, cut_at: int | None = None) -> str:
    mirror.files[f"{NAME}.weights"] = body
    if cut_at is not None:
        mirror.cut_at[f"{NAME}.weights"] = cut_at
    monkeypatch.setenv(download.WEIGHTS_URL_ENV, mirror.url)
    return f"{mirror.url}/{NAME}.weights"


def test_download_is_verified_cached_and_reused_without_a_request(mirror, cache, monkeypatch):
    _serve(mirror, monkeypatch, PAYLOAD)
    path = resolve_weights(NAME)
    assert path == str(cache / f"{NAME}.weights")
    with open(path, "rb") as handle:
        assert handle.read() == PAYLOAD
    assert os.listdir(cache) == [f"{NAME}.weights"]  # no temporary left beside it
    assert mirror.requests == [f"{NAME}.weights"]
    # keras-yolo3's spelling, with no such file in the folder: the same cached file, no second request.
    assert resolve_weights(f"{NAME}.weights") == path
    assert len(mirror.requests) == 1


@pytest.mark.parametrize(
    "cut_at, content_length_lies",
    [(len(PAYLOAD) // 3, True), (None, False)],
    ids=["closes-early", "short-file"],
)
def test_truncated_download_is_refused_and_nothing_is_kept(mirror, cache, monkeypatch, cut_at, content_length_lies):
    body = PAYLOAD if content_length_lies else PAYLOAD[:1000]
    url = _serve(mirror, monkeypatch, body, cut_at)
    with pytest.raises(WeightsDownloadError) as raised:
        resolve_weights(NAME)
    message = str(raised.value)
    assert url in message and str(cache / f"{NAME}.weights") in message
    got = f"{cut_at:,}" if content_length_lies else "1,000"
    assert got in message and f"{len(PAYLOAD):,}" in message
    assert not cache.exists() or os.listdir(cache) == []


def test_corrupted_download_is_refused_and_not_cached(mirror, cache, monkeypatch):
    corrupted = bytearray(PAYLOAD)
    corrupted[len(corrupted) // 2] ^= 0xFF
    url = _serve(mirror, monkeypatch, bytes(corrupted))
    with pytest.raises(WeightsDownloadError, match="checksum mismatch") as raised:
        resolve_weights(NAME)
    message = str(raised.value)
    assert url in message
    assert f"md5:{hashlib.md5(corrupted).hexdigest()}" in message  # what it got
    assert f"md5:{hashlib.md5(PAYLOAD).hexdigest()}" in message  # what it expected
    assert os.listdir(cache) == []


def test_http_error_names_the_url(mirror, cache, monkeypatch):
    monkeypatch.setenv(download.WEIGHTS_URL_ENV, mirror.url)  # serving nothing: 404
    with pytest.raises(WeightsDownloadError, match="HTTP 404") as raised:
        resolve_weights(NAME)
    assert f"{mirror.url}/{NAME}.weights" in str(raised.value)
    assert not cache.exists() or os.listdir(cache) == []


def test_offline_error_names_the_url_and_the_cache_path(cache, monkeypatch, tmp_path):
    monkeypatch.setenv(download.WEIGHTS_URL_ENV, f"http://127.0.0.1:{_closed_port()}/")
    with pytest.raises(WeightsDownloadError, match="cannot connect") as raised:
        resolve_weights(NAME)
    message = str(raised.value)
    assert f"/{NAME}.weights" in message and OFFICIAL_WEIGHTS[NAME].url in message
    assert str(cache / f"{NAME}.weights") in message
    assert "\n" not in message  # one error line
    assert "or put it in" not in message
    # Given as keras-yolo3's file name (`convert.py yolov3.cfg yolov3.weights ...`): that name in this folder works too.
    here = tmp_path / "keras-yolo3"
    here.mkdir()
    monkeypatch.chdir(here)
    with pytest.raises(WeightsDownloadError, match="cannot connect") as raised:
        resolve_weights(f"{NAME}.weights")
    assert str(raised.value).endswith(f"; or put it in {here} as {NAME}.weights")
    (here / f"{NAME}.weights").write_bytes(b"put there by hand")
    assert resolve_weights(f"{NAME}.weights") == f"{NAME}.weights"


def test_existing_paths_and_other_names_are_returned_untouched(mirror, cache, monkeypatch, tmp_path):
    monkeypatch.setenv(download.WEIGHTS_URL_ENV, mirror.url)
    (tmp_path / f"{NAME}.weights").write_bytes(b"user's own file")
    assert resolve_weights(f"{NAME}.weights") == f"{NAME}.weights"  # the README's line with the file present
    assert resolve_weights("missing.weights.h5") == "missing.weights.h5"
    # A folder in the text names a place, not a download.
    assert resolve_weights(f"model_data/{NAME}.weights") == f"model_data/{NAME}.weights"
    assert resolve_weights(None) is None
    # A bare word that is no file and no official name: the names, and the one meant.
    with pytest.raises(FileNotFoundError, match=r"yolov3-tinyy: no such file.*did you mean yolov3-tiny\? .*v4-tiny"):
        resolve_weights("yolov3-tinyy")
    with pytest.raises(FileNotFoundError, match=r"resnet50: no such file, and no official net of that name \(by name"):
        resolve_weights("resnet50")
    assert mirror.requests == []


def test_cached_file_of_the_wrong_size_is_refused_without_a_request(mirror, cache, monkeypatch):
    monkeypatch.setenv(download.WEIGHTS_URL_ENV, mirror.url)
    cache.mkdir(parents=True)
    (cache / f"{NAME}.weights").write_bytes(b"x" * 10)
    with pytest.raises(WeightsDownloadError, match="10 bytes") as raised:
        resolve_weights(NAME)
    assert str(cache / f"{NAME}.weights") in str(raised.value)
    assert mirror.requests == []


def test_registry_matches_the_official_sizes_urls_and_shipped_cfgs():
    assert len(OFFICIAL_SIZES) == len(OFFICIAL_WEIGHTS)  # a file's size names its network: no two share one
    assert OFFICIAL_WEIGHTS["yolov3-tiny"].checksums == ("md5:3bcd6b390912c18924b46b26a9e7ff53",)
    for name, entry in OFFICIAL_WEIGHTS.items():
        assert entry.url.startswith("https://") and entry.url.endswith(f"/{name}.weights")
        # The shipped cfg describes a file of exactly the official size: 20 header bytes + float32s.
        convs, _ = darknet.infer_layers(darknet.parse_cfg(model_data_path(f"{name}.cfg")))
        assert 20 + 4 * sum(conv.num_floats for conv in convs) == entry.size, name
    assert os.path.isfile(model_data_path("darknet53.cfg"))


@pytest.mark.parametrize("name", sorted(OFFICIAL_SIZES.values()))
def test_find_cfg_falls_back_to_the_shipped_cfg_by_size(tmp_path, caplog, name):
    weights = tmp_path / "downloaded.weights"
    with open(weights, "wb") as handle:
        handle.truncate(OFFICIAL_WEIGHTS[name].size)  # sparse: the official size for free
    with caplog.at_level(logging.INFO, logger="keras_yolo_mgpu.weights.start_weights"):
        assert find_cfg(str(weights)) == model_data_path(f"{name}.cfg")
    assert model_data_path(f"{name}.cfg") in caplog.text
    # A cfg beside the file still wins over the shipped one.
    (tmp_path / f"{name}.cfg").write_text("[net]\n")
    assert find_cfg(str(weights)) == str(tmp_path / f"{name}.cfg")


def test_find_cfg_of_an_unofficial_size_still_asks_for_one(tmp_path):
    weights = tmp_path / "mine.weights"
    weights.write_bytes(b"\0" * 1024)
    with pytest.raises(FileNotFoundError, match="--cfg"):
        find_cfg(str(weights))


def test_train_offline_with_an_official_name_exits_1_naming_url_and_cache(tmp_path):
    (tmp_path / "train.txt").write_text("")
    (tmp_path / "classes.txt").write_text("a\n")
    env = dict(os.environ)
    env["KERAS_YOLO_MGPU_CACHE"] = str(tmp_path / "cache")
    env[download.WEIGHTS_URL_ENV] = f"http://127.0.0.1:{_closed_port()}"
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "train.py"), "--annotations", "train.txt", "--classes", "classes.txt"]
        + ["--weights", "yolov4-tiny"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert f"{env[download.WEIGHTS_URL_ENV]}/yolov4-tiny.weights" in errors[0]
    assert str(tmp_path / "cache" / "weights" / "yolov4-tiny.weights") in errors[0]
    assert not (tmp_path / "cache" / "weights").exists() or os.listdir(tmp_path / "cache" / "weights") == []


def test_cache_turned_off_is_an_error_not_a_download_elsewhere(mirror, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERAS_YOLO_MGPU_CACHE", "none")
    monkeypatch.setenv(download.WEIGHTS_URL_ENV, mirror.url)
    with pytest.raises(WeightsDownloadError, match="turns the cache off") as raised:
        resolve_weights(NAME)
    assert OFFICIAL_WEIGHTS[NAME].url in str(raised.value)
    assert mirror.requests == []


@pytest.fixture(scope="module")
def cached_tiny(tmp_path_factory):
    """A cache holding a yolov3-tiny.weights of the official size (random weights of the shipped cfg)."""
    from darknet_files import random_weights, write_weights

    cache = tmp_path_factory.mktemp("cache")
    convs, _ = darknet.infer_layers(darknet.parse_cfg(model_data_path("yolov3-tiny.cfg")))
    (cache / "weights").mkdir()
    write_weights(cache / "weights" / "yolov3-tiny.weights", random_weights(convs, seed=3))
    return cache


def _command(script, *args, cache, cwd):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_YOLO_MGPU_CACHE=str(cache))
    env[download.WEIGHTS_URL_ENV] = "http://127.0.0.1:9"  # nothing may be downloaded: the cache has it
    return subprocess.run(
        [sys.executable, os.path.join(REPO, script), *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=cwd,
    )


def test_keras_yolo3_quick_start_without_wget_and_detection_by_name(cached_tiny, tmp_path):
    from PIL import Image

    # keras-yolo3's README: `wget .../yolov3-tiny.weights` then convert with the cfg beside convert.py; here
    # neither file is in the folder: the name comes from the cache and the cfg from model_data/.
    converted = _command(
        "convert.py", "yolov3-tiny.cfg", "yolov3-tiny.weights", "model_data/yolo.h5", cache=cached_tiny, cwd=tmp_path
    )
    assert converted.returncode == 0, converted.stderr[-3000:]
    assert "using the shipped official" in converted.stderr and (tmp_path / "model_data" / "yolo.h5").is_file()
    Image.new("RGB", (96, 64), (90, 120, 200)).save(tmp_path / "photo.jpg")
    detected = _command(
        "yolo_video.py", "--model", "yolov3-tiny", "--image", "photo.jpg", cache=cached_tiny, cwd=tmp_path
    )
    assert detected.returncode == 0, detected.stderr[-3000:]
    assert "converting with" in detected.stderr and (tmp_path / "detections" / "photo.jpg").is_file()
    # The conversion is kept in the cache: the next run loads it instead of converting again.
    assert list((cached_tiny / "weights" / "converted").glob("yolov3-tiny-*.weights.h5"))


def test_python_detector_takes_an_official_name_or_a_darknet_file(cached_tiny, tmp_path, monkeypatch):
    """`kym.YOLO("yolov3-tiny")` and `kym.YOLO("yolov3-tiny.weights")` load what `yolo_video.py --model` loads."""
    from PIL import Image

    import keras_yolo_mgpu as kym

    monkeypatch.setenv("KERAS_YOLO_MGPU_CACHE", str(cached_tiny))
    monkeypatch.setenv(download.WEIGHTS_URL_ENV, f"http://127.0.0.1:{_closed_port()}")  # the cache has it
    monkeypatch.chdir(tmp_path)
    by_name = kym.YOLO("yolov3-tiny")
    by_file = kym.YOLO(str(cached_tiny / "weights" / "yolov3-tiny.weights"))
    converted = cached_tiny / "weights" / "converted"
    for detector in (by_name, by_file):
        assert os.path.dirname(detector.model_path) == str(converted) and len(detector.class_names) == 80
    boxes, scores, classes = by_name.detect(Image.new("RGB", (96, 64), (90, 120, 200)))
    assert boxes.shape == (len(scores), 4) and len(classes) == len(scores)
    with pytest.raises(FileNotFoundError, match="did you mean yolov3-tiny"):
        kym.YOLO("yolov3-tinyy")
