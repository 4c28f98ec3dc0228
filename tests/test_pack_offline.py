"""scripts/pack_offline.py: packing, splitting and reassembly, on small local files (no network)."""

import hashlib
import importlib.util
import json
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def pack_offline():
    spec = importlib.util.spec_from_file_location("pack_offline", os.path.join(REPO, "scripts", "pack_offline.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def wheels(tmp_path):
    """Three files named like wheels, of sizes around the piece size, with distinct bytes."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    for index, size in enumerate((2500, 999, 4096)):
        (folder / f"package{index}-1.0-py3-none-any.whl").write_bytes(os.urandom(size))
    return folder


def test_sizes_parse(pack_offline):
    assert pack_offline.parse_size("60M") == 60_000_000
    assert pack_offline.parse_size("500k") == 500_000
    assert pack_offline.parse_size("1234") == 1234
    with pytest.raises(Exception, match="expected a size"):
        pack_offline.parse_size("60 MiB please")


def test_pack_splits_into_pieces_and_reassembles_the_same_wheels(pack_offline, wheels, tmp_path):
    out = tmp_path / "bundle"
    assert pack_offline.main(["pack", "--out", str(out), "--piece-size", "1K", "--wheels-from", str(wheels)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    pieces = manifest["pieces"]
    # The archive holds the wheels' 7,595 bytes plus tar headers: at least 8 pieces of <= 1,000 bytes.
    assert len(pieces) >= 8 and all(piece["size"] <= 1000 for piece in pieces)
    assert sum(piece["size"] for piece in pieces) == manifest["archive"]["size"]
    for piece in pieces:
        assert hashlib.sha256((out / piece["name"]).read_bytes()).hexdigest() == piece["sha256"]
    assert (out / "pack_offline.py").is_file()  # the installer travels with the bundle
    assert manifest["install"] == ["keras-yolo-mgpu", "tensorflow[and-cuda]==2.21.*"]

    restored = tmp_path / "restored"
    pack_offline.reassemble(str(out), str(restored))
    for wheel in wheels.iterdir():
        assert (restored / wheel.name).read_bytes() == wheel.read_bytes()
    assert not (restored / "bundle.tar").exists()


def test_a_damaged_or_missing_piece_is_named_and_nothing_is_unpacked(pack_offline, wheels, tmp_path):
    out = tmp_path / "bundle"
    pack_offline.pack(str(wheels), str(out), 1000, ["x"])
    damaged = out / "bundle.tar.003"
    data = bytearray(damaged.read_bytes())
    data[10] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(SystemExit, match=r"bundle\.tar\.003: sha256 differs"):
        pack_offline.reassemble(str(out), str(tmp_path / "restored"))
    assert not (tmp_path / "restored").exists()

    os.remove(damaged)
    with pytest.raises(SystemExit, match=r"bundle\.tar\.003: missing"):
        pack_offline.reassemble(str(out), str(tmp_path / "restored2"))


def test_pieces_in_the_wrong_order_fail_the_archive_hash(pack_offline, wheels, tmp_path):
    out = tmp_path / "bundle"
    pack_offline.pack(str(wheels), str(out), 1000, ["x"])
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["pieces"][0], manifest["pieces"][1] = manifest["pieces"][1], manifest["pieces"][0]
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match="pieces out of order"):
        pack_offline.reassemble(str(out), str(tmp_path / "restored"))


def test_verify_reports_the_cpu_when_no_gpu_is_visible(pack_offline, capfd):
    """The install's last step: matmul, conv, all-reduce with this TensorFlow (the CPU here)."""
    env_before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        assert pack_offline.main(["verify"]) == 0
    finally:
        if env_before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = env_before
    output = capfd.readouterr().out
    assert "no GPU visible to TensorFlow: checking on the CPU" in output
    assert "all-reduce over 1 device(s): 1.0" in output and "OK: TensorFlow 2.21" in output
