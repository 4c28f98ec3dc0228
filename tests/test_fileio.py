"""fileio: an interrupted write never destroys the previous file or folder."""

import os
import stat

import pytest

from keras_yolo_mgpu.fileio import atomic_write, replace_directory, write_lines_atomic, write_text_atomic


def test_atomic_write_replaces_and_keeps_the_ending(tmp_path):
    path = tmp_path / "sub" / "model.weights.h5"
    seen = []

    def write(temporary):
        seen.append(temporary)
        with open(temporary, "w") as handle:
            handle.write("new")

    assert atomic_write(path, write) == str(path)
    assert path.read_text() == "new"
    assert seen[0].endswith(".tmp.weights.h5") and os.path.dirname(seen[0]) == str(path.parent)
    assert os.listdir(path.parent) == ["model.weights.h5"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~umask  # as a plain open() would


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, error):
    path = tmp_path / "anchors.txt"
    path.write_text("old\n")

    def half_write(temporary):
        with open(temporary, "w") as handle:
            handle.write("half")
        raise error

    with pytest.raises(type(error)):
        atomic_write(path, half_write)
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["anchors.txt"]


def test_text_and_lines(tmp_path):
    write_text_atomic(tmp_path / "a.txt", "x\n")
    write_lines_atomic(tmp_path / "b.txt", ["1", "2"])
    assert (tmp_path / "a.txt").read_text() == "x\n"
    assert (tmp_path / "b.txt").read_text() == "1\n2\n"


def test_replace_directory_keeps_the_old_folder_on_failure(tmp_path):
    target = tmp_path / "saved_model"

    def fill(text):
        def write(folder):
            os.makedirs(folder)
            with open(os.path.join(folder, "content"), "w") as handle:
                handle.write(text)
            if text == "broken":
                raise RuntimeError("export failed")

        return write

    replace_directory(target, fill("first"))
    assert (target / "content").read_text() == "first"
    with pytest.raises(RuntimeError):
        replace_directory(target, fill("broken"))
    assert (target / "content").read_text() == "first"
    replace_directory(target, fill("second"))
    assert (target / "content").read_text() == "second"
    assert os.listdir(tmp_path) == ["saved_model"]
