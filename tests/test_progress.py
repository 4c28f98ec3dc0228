"""Progress displays: tqdm's bar on a terminal, a log line per interval in a log file (`keras_yolo_mgpu.progress`)."""

import logging
import os
import pty
import re
import sys
import types

from tqdm import tqdm

from keras_yolo_mgpu import progress
from keras_yolo_mgpu.progress import LoggedProgress, is_interactive, progress_bar


def test_the_line_has_the_count_the_share_the_rate_and_the_time_left():
    bar = LoggedProgress(400, unit="frame", desc="detect", interval=30.0)
    bar.update(100)
    # 100 frames in 10 s: 10 frame/s, 300 frames left = 30 s.
    assert bar.describe(10.0) == "100 of 400 frames (25 %), 10.0 frame/s, about 0.5 min left"
    stream = LoggedProgress(None, unit="frame", desc="detect", interval=30.0)  # a camera: no total
    stream.update(1200)
    assert stream.describe(60.0) == "1,200 frames, 20.0 frame/s"
    download = LoggedProgress(2 << 20, unit="byte", desc="yolov3", byte_sizes=True, interval=30.0)
    download.update(1 << 20)
    assert download.describe(2.0) == "1.00MB of 2.00MB (50 %), 512kB/s, about 0.0 min left"


def test_a_line_is_logged_once_per_interval(caplog):
    with caplog.at_level(logging.INFO, logger=progress.__name__):
        every_update = LoggedProgress(3, unit="image", desc="detect", interval=0.0)
        with every_update:
            for _ in range(3):
                every_update.update(1)
                every_update.set_postfix(fps="1.0", refresh=False)  # tqdm's call, accepted
        hourly = LoggedProgress(3, unit="image", desc="detect", interval=3600.0)
        for _ in range(3):
            hourly.update(1)
    assert len(caplog.messages) == 3
    assert re.fullmatch(r"detect: 1 of 3 images \(33 %\), [\d.]+ image/s, about [\d.]+ min left", caplog.messages[0])
    assert re.fullmatch(r"detect: 3 of 3 images \(100 %\), [\d.]+ image/s", caplog.messages[2])


def test_a_terminal_gets_the_bar_a_file_the_lines_and_no_progress_nothing(monkeypatch, tmp_path):
    main, secondary = pty.openpty()
    try:
        with open(secondary, "w", closefd=False) as terminal:
            monkeypatch.setattr("sys.stderr", terminal)
            bar = progress_bar(10, unit="image", desc="detect")
            assert isinstance(bar, tqdm) and not bar.disable
            bar.close()
        with open(tmp_path / "log.txt", "w") as log:
            monkeypatch.setattr("sys.stderr", log)
            assert isinstance(progress_bar(10, unit="image", desc="detect"), LoggedProgress)
            silent = progress_bar(10, unit="image", desc="detect", enabled=False)
            assert isinstance(silent, tqdm) and silent.disable
    finally:
        os.close(main)
        os.close(secondary)


def test_a_notebook_gets_the_bar_though_its_streams_are_no_terminal(monkeypatch, tmp_path):
    """Jupyter's streams answer isatty() False; its kernel module is loaded (here a stand-in: not installed)."""
    with open(tmp_path / "cell_output.txt", "w") as stream:
        monkeypatch.setattr("sys.stderr", stream)
        assert not is_interactive(sys.stderr)
        monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
        assert is_interactive(sys.stderr)
        bar = progress_bar(10, unit="image", desc="detect")
        assert isinstance(bar, tqdm) and not bar.disable
        bar.close()
