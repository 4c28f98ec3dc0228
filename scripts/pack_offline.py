"""Install keras-yolo-mgpu with TensorFlow and its CUDA libraries on a machine with no package registry.

On a machine with internet access, for the target's platform and Python:

    python scripts/pack_offline.py pack --out offline --python-version 3.11 --piece-size 60M

writes `offline/`: the wheels of the project, `tensorflow[and-cuda]==2.21.*`
and every dependency, as one archive split into pieces of at most 60 MB
(`bundle.tar.000`, ...), `manifest.json` with the sha256 of every piece, of
the archive and of every wheel, and a copy of this script. Carry the folder
over, then on the GPU machine (Python only, nothing else needed):

    python offline/pack_offline.py install offline --venv .venv

reassembles the archive, checks every hash (a piece that does not match is
named and nothing is installed), creates the virtual environment, installs
with `pip --no-index` from the wheels only, and verifies the install on the
visible GPUs: a matmul, a convolution and an all-reduce over all of them
(on the CPU, with a message, when TensorFlow sees no GPU). `verify` runs the
last step alone.

This script uses the standard library only: it runs before anything is
installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

MANIFEST = "manifest.json"
ARCHIVE = "bundle.tar"
TENSORFLOW = "tensorflow[and-cuda]==2.21.*"
PROJECT = "keras-yolo-mgpu"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHUNK = 1 << 20


def parse_size(text: str) -> int:
    """`60M` -> 60_000_000 bytes (K, M, G are powers of 1000; a plain number is bytes)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text.upper())
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"expected a size like 60M, 500K or 1G, got {text!r}")
    return int(match.group(1)) * {"": 1, "K": 10**3, "M": 10**6, "G": 10**9}[match.group(2)]


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def download_wheels(wheel_dir: str, *, python_version: str, platform: str, requirements: list[str]) -> None:
    """The project's wheel and every wheel it and `requirements` need, for the target, into `wheel_dir`."""
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--no-deps", "--wheel-dir", wheel_dir, REPO], check=True)
    project_wheel = next(name for name in os.listdir(wheel_dir) if name.startswith(PROJECT.replace("-", "_")))
    target = ["--only-binary=:all:", "--platform", platform, "--python-version", python_version]
    target += ["--implementation", "cp", "--dest", wheel_dir]
    subprocess.run([*pip, "download", *target, os.path.join(wheel_dir, project_wheel), *requirements], check=True)


def split_file(path: str, out_dir: str, piece_size: int) -> list[dict]:
    """Cuts `path` into `<name>.000`, `.001`, ... of at most `piece_size` bytes; returns their name, size, sha256."""
    pieces = []
    name = os.path.basename(path)
    with open(path, "rb") as source:
        while True:
            data = source.read(piece_size)
            if not data and pieces:
                break
            piece = f"{name}.{len(pieces):03d}"
            with open(os.path.join(out_dir, piece), "wb") as handle:
                handle.write(data)
            pieces.append({"name": piece, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
            if len(data) < piece_size:
                break
    return pieces


def pack(wheel_dir: str, out_dir: str, piece_size: int, install: list[str]) -> dict:
    """Archives the wheels of `wheel_dir`, splits the archive into `out_dir`, writes the manifest; returns it."""
    wheels = sorted(name for name in os.listdir(wheel_dir) if name.endswith(".whl"))
    if not wheels:
        raise SystemExit(f"no .whl files in {wheel_dir}")
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        archive = os.path.join(scratch, ARCHIVE)
        # Uncompressed: wheels are zip files already.
        with tarfile.open(archive, "w") as tar:
            for name in wheels:
                tar.add(os.path.join(wheel_dir, name), arcname=name)
        manifest = {
            "archive": {"name": ARCHIVE, "size": os.path.getsize(archive), "sha256": sha256_of(archive)},
            "pieces": split_file(archive, out_dir, piece_size),
            "wheels": [{"name": name, "sha256": sha256_of(os.path.join(wheel_dir, name))} for name in wheels],
            "install": install,
        }
    with open(os.path.join(out_dir, MANIFEST), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=2)
    shutil.copy(os.path.abspath(__file__), os.path.join(out_dir, os.path.basename(__file__)))
    return manifest


def reassemble(bundle_dir: str, wheel_dir: str) -> dict:
    """Checks every piece, joins them, checks the archive and every wheel, unpacks the wheels into `wheel_dir`.

    Raises:
        SystemExit: naming the first piece, archive or wheel that is missing
            or does not match the manifest (nothing is unpacked then).
    """
    with open(os.path.join(bundle_dir, MANIFEST), encoding="utf-8") as handle:
        manifest = json.load(handle)
    for piece in manifest["pieces"]:
        path = os.path.join(bundle_dir, piece["name"])
        if not os.path.isfile(path):
            raise SystemExit(f"{path}: missing ({len(manifest['pieces'])} pieces expected)")
        if sha256_of(path) != piece["sha256"]:
            raise SystemExit(f"{path}: sha256 differs from {MANIFEST}: the piece is damaged, copy it again")
    archive = os.path.join(wheel_dir, ARCHIVE)
    os.makedirs(wheel_dir, exist_ok=True)
    digest = hashlib.sha256()
    with open(archive, "wb") as joined:
        for piece in manifest["pieces"]:
            with open(os.path.join(bundle_dir, piece["name"]), "rb") as handle:
                for block in iter(lambda: handle.read(_CHUNK), b""):
                    digest.update(block)
                    joined.write(block)
    if digest.hexdigest() != manifest["archive"]["sha256"]:
        os.remove(archive)
        raise SystemExit(f"the joined {ARCHIVE} differs from {MANIFEST}: pieces out of order or from another pack")
    with tarfile.open(archive, mode="r") as tar:
        # The "data" filter (Python >= 3.11.4) refuses links and paths outside wheel_dir.
        options = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(wheel_dir, **options)
    os.remove(archive)
    for wheel in manifest["wheels"]:
        if sha256_of(os.path.join(wheel_dir, wheel["name"])) != wheel["sha256"]:
            raise SystemExit(f"{wheel['name']}: sha256 differs from {MANIFEST}")
    return manifest


VERIFY_PROGRAM = """
import tensorflow as tf
gpus = tf.config.list_logical_devices("GPU")
devices = [d.name for d in gpus] or ["/CPU:0"]
if not gpus:
    print("no GPU visible to TensorFlow: checking on the CPU (is the NVIDIA driver installed? nvidia-smi)")
with tf.device(devices[0]):
    a = tf.random.stateless_normal((1024, 1024), seed=(1, 2))
    product = tf.matmul(a, a)
    image = tf.random.stateless_normal((8, 64, 64, 16), seed=(3, 4))
    conv = tf.nn.conv2d(image, tf.ones((3, 3, 16, 32)), strides=1, padding="SAME")
print("matmul", product.shape, "on", product.device, "| conv", conv.shape, "on", conv.device)
strategy = tf.distribute.MirroredStrategy(devices)
summed = strategy.reduce("SUM", strategy.run(lambda: tf.ones(())), axis=None)
assert int(summed) == len(devices), (int(summed), devices)
print("all-reduce over", len(devices), "device(s):", float(summed))
print("OK: TensorFlow", tf.__version__, "with", len(gpus), "GPU(s)")
"""


def verify(python: str) -> int:
    """Runs a matmul, a conv and an all-reduce with the installed TensorFlow; returns the exit status."""
    return subprocess.run([python, "-c", VERIFY_PROGRAM]).returncode


def install(bundle_dir: str, venv: str) -> int:
    """Reassembles and checks the bundle, installs it into a new `venv` with `pip --no-index`, verifies it."""
    wheel_dir = os.path.join(bundle_dir, "wheels")
    manifest = reassemble(bundle_dir, wheel_dir)
    print(f"{len(manifest['pieces'])} pieces and {len(manifest['wheels'])} wheels match {MANIFEST}")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    pip = [python, "-m", "pip", "install", "--no-index", "--find-links", wheel_dir]
    subprocess.run([*pip, *manifest["install"]], check=True)
    return verify(python)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="download the wheels and write the split bundle")
    packing.add_argument("--out", required=True, help="folder to write the pieces, manifest and installer into")
    packing.add_argument("--piece-size", type=parse_size, default=parse_size("60M"), help="largest piece (60M)")
    packing.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}")
    packing.add_argument("--platform", default="manylinux2014_x86_64", help="pip's platform tag of the target")
    packing.add_argument("--tensorflow", default=TENSORFLOW, help=f"TensorFlow requirement ({TENSORFLOW})")
    packing.add_argument("--wheels-from", default=None, help="pack the wheels of this folder, download nothing")
    installing = commands.add_parser("install", help="check, reassemble, install into a new venv, verify")
    installing.add_argument("bundle", help="the folder `pack` wrote")
    installing.add_argument("--venv", required=True, help="virtual environment to create")
    checking = commands.add_parser("verify", help="matmul, conv and all-reduce with an installed TensorFlow")
    checking.add_argument("--python", default=sys.executable)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "verify":
        return verify(args.python)
    if args.command == "install":
        return install(args.bundle, args.venv)
    requirements = [PROJECT, args.tensorflow]
    if args.wheels_from:
        manifest = pack(args.wheels_from, args.out, args.piece_size, requirements)
    else:
        with tempfile.TemporaryDirectory() as wheel_dir:
            download_wheels(
                wheel_dir, python_version=args.python_version, platform=args.platform, requirements=[args.tensorflow]
            )
            manifest = pack(wheel_dir, args.out, args.piece_size, requirements)
    total = manifest["archive"]["size"]
    print(f"{len(manifest['wheels'])} wheels, {total / 1e6:.0f} MB in {len(manifest['pieces'])} pieces: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
