"""pyproject.toml: every subpackage is installed, and every console script points at a command."""

import importlib
import os

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

with open(os.path.join(REPO, "pyproject.toml"), "rb") as handle:
    PYPROJECT = tomllib.load(handle)


def test_every_subpackage_is_listed():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    on_disk = {"keras_yolo_mgpu"}
    for folder, _, files in os.walk(os.path.join(REPO, "keras_yolo_mgpu")):
        if "__init__.py" in files:
            on_disk.add(os.path.relpath(folder, REPO).replace(os.sep, "."))
    assert on_disk <= listed, f"add to pyproject.toml [tool.setuptools] packages: {sorted(on_disk - listed)}"
    assert "keras_yolo_mgpu.model_data" in listed
    assert PYPROJECT["tool"]["setuptools"]["package-dir"]["keras_yolo_mgpu.model_data"] == "model_data"


@pytest.mark.parametrize("name,target", sorted(PYPROJECT["project"]["scripts"].items()))
def test_console_scripts_resolve_to_commands(name, target):
    module_name, function_name = target.split(":")
    function = getattr(importlib.import_module(module_name), function_name)
    assert callable(function)
    try:
        status = function(["--help"])
    except SystemExit as exit_info:  # argparse's --help
        status = exit_info.code
    assert status == 0


def test_the_test_extra_brings_the_linter():
    assert "ruff" in PYPROJECT["project"]["optional-dependencies"]["test"]
