"""The package's imports point down its layers: no circle between modules, no import from a lower layer up.

Static: every module of keras_yolo_mgpu/ is parsed (`ast`), none imported.
The layers and the graph are `tools/import_graph.py`'s (`LAYERS`, one
entry per package folder); `python tools/import_graph.py` prints the same
findings with the edge counts between layers.
"""

import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def import_graph():
    spec = importlib.util.spec_from_file_location("import_graph", os.path.join(REPO, "tools", "import_graph.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def graph(import_graph):
    return import_graph.read_imports(REPO)


def test_every_module_is_in_a_layer(import_graph, graph):
    modules, _ = graph
    assert len(modules) > 100
    outside = import_graph.modules_without_layer(modules)
    assert not outside, f"add these to tools/import_graph.py's LAYERS: {outside}"


def test_no_circle_between_modules(import_graph, graph):
    circles = import_graph.circles(graph[1])
    assert not circles, "modules that import each other in a circle:\n" + "\n\n".join(
        "\n".join(map(str, circle)) for circle in circles
    )


def test_no_import_from_a_lower_layer_up(import_graph, graph):
    upward = import_graph.upward_imports(graph[1])
    assert not upward, "imports from a lower layer to a higher one (tools/import_graph.py, LAYERS):\n" + "\n".join(
        f"{item} ({import_graph.layer_name(import_graph.layer_of(item.source))} -> "
        f"{import_graph.layer_name(import_graph.layer_of(item.target))})"
        for item in upward
    )


def test_the_graph_sees_function_level_and_relative_imports(import_graph, tmp_path):
    package = tmp_path / import_graph.PACKAGE
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model" / "__init__.py").write_text("from . import boxes\n")
    (package / "model" / "boxes.py").write_text("import numpy\n")
    (package / "model" / "loss.py").write_text(
        "from .boxes import iou\n\ndef f():\n    from keras_yolo_mgpu.training.trainer import train\n"
    )
    (package / "training").mkdir()
    (package / "training" / "trainer.py").write_text("from ..model import loss\nimport keras_yolo_mgpu.model.boxes\n")
    _, imports = import_graph.read_imports(tmp_path)
    assert {(i.source, i.target, i.line) for i in imports} == {
        ("model", "model.boxes", 1),
        ("model.loss", "model.boxes", 1),
        ("model.loss", "training.trainer", 4),
        ("training.trainer", "model.loss", 1),
        ("training.trainer", "model.boxes", 2),
    }
    assert [(i.source, i.target) for i in import_graph.upward_imports(imports)] == [("model.loss", "training.trainer")]
    assert [[(i.source, i.target) for i in circle] for circle in import_graph.circles(imports)] == [
        [("model.loss", "training.trainer"), ("training.trainer", "model.loss")]
    ]


# Outside keras_yolo_mgpu/backend/, the files that may import TensorFlow or JAX or ask Keras which backend runs,
# each for a reason that is not an engine difference. A file whose name says its backend
# (`tf_dataset.py`) needs no entry.
BACKEND_SPECIFIC_FILES = {
    "keras_compat.py": "patches Keras's TensorFlow trainer under MultiWorkerMirroredStrategy",
    "inference/export.py": "SavedModel, TFLite and ONNX are exported through TensorFlow on either engine",
    "inference/export_formats.py": "the TFLite interpreter and SavedModel loader run the exported files",
    "inference/quantize.py": "TFLite's converter quantizes",
    "cli/quiet.py": "silences TensorFlow's C++ log lines before its import",
    "bench/train.py": "feeds TensorFlow's strategy a tf.data dataset, where JAX's batch is placed on the devices",
    "bench/pipeline.py": "times the tf.data pipeline beside the JAX feed",
}


def _backend_sites(path):
    """Lines of `path` that import tensorflow or jax, or call `keras.backend.backend()`."""
    import ast

    sites = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "keras_yolo_mgpu.optional":
            roots = {alias.name for alias in node.names}  # `optional.tensorflow`: TensorFlow, imported at first use
        elif isinstance(node, ast.ImportFrom) and not node.level:
            roots = {(node.module or "").split(".")[0]}
        elif isinstance(node, ast.Call):
            roots = {"backend()"} if ast.unparse(node.func) == "keras.backend.backend" else set()
        else:
            continue
        if roots & {"tensorflow", "jax", "backend()"}:
            sites.append(node.lineno)
    return sites


def test_backend_branches_live_in_the_backend_modules(import_graph):
    """Every other file is the same on both engines; listing keras_yolo_mgpu/backend/ shows every difference."""
    from pathlib import Path

    package = Path(REPO) / import_graph.PACKAGE
    found = {}
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(package).as_posix()
        says_its_backend = any(word in path.stem.split("_") for word in ("tf", "tensorflow", "jax"))
        if name.startswith("backend/") or says_its_backend or name in BACKEND_SPECIFIC_FILES:
            continue
        if sites := _backend_sites(path):
            found[name] = sites
    assert not found, f"backend branches outside keras_yolo_mgpu/backend/ (file: lines): {found}"
    stale = [name for name in BACKEND_SPECIFIC_FILES if not _backend_sites(package / name)]
    assert not stale, f"BACKEND_SPECIFIC_FILES names files with no backend branch left: {stale}"
