"""The package's shape as STYLE.md asks it: short functions where a run is set up, imports at the top, no dates."""

import ast
import functools
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "keras_yolo_mgpu"
LONGEST_FUNCTION = 60  # lines, the `def` line to the last one
MOST_IMPORTS_INSIDE_FUNCTIONS = 0.10  # of all the package's import statements


@functools.cache
def _trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(PACKAGE.rglob("*.py"))}


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


@pytest.mark.parametrize("folder", ["training", "cli"])
def test_no_function_where_a_run_is_set_up_is_over_60_lines(folder):
    long = [
        f"{path.relative_to(PACKAGE)}:{function.lineno} {function.name} ({function.end_lineno - function.lineno + 1})"
        for path, tree in _trees().items()
        if path.is_relative_to(PACKAGE / folder)
        for function in _functions(tree)
        if function.end_lineno - function.lineno + 1 > LONGEST_FUNCTION
    ]
    assert long == []


def test_imports_stand_at_the_top_of_modules_but_for_a_tenth_at_most():
    total = inside = 0
    for tree in _trees().values():
        nested = {id(node) for function in _functions(tree) for node in ast.walk(function)}
        imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
        total += len(imports)
        inside += sum(id(node) in nested for node in imports)
    assert total > 500 and inside / total <= MOST_IMPORTS_INSIDE_FUNCTIONS, (inside, total)


def test_no_date_in_the_package():
    """Dated figures live in BENCHMARKS.md, with their command and machine; the package's text carries none."""
    dated = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\b20\d\d-[01]\d-[0-3]\d\b", line)
    ]
    assert dated == []
