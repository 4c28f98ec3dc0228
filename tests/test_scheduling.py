"""tests/scheduling.py: the units each worker is sent, and the large ones kept apart."""

import ast
from pathlib import Path

from scheduling import LARGE_UNITS, next_unit, work_unit_of

TESTS = Path(__file__).parent
# One real test id of each large unit (a parametrized test: one of its cases).
LARGE_UNIT_TESTS = {
    "recipe-all": ("test_recipe_equivalence.py", "test_all_options_together_through_both_stages_match_one_device"),
    "parallel-unfrozen-yolov3-tiny": (
        "test_parallel.py",
        "test_replicas_match_one_device[strategy-2-unfrozen-yolov3-tiny]",
    ),
    "recipe-jax-all": (
        "test_recipe_equivalence.py",
        "test_jax_all_options_together_through_both_stages_match_one_device",
    ),
    "parallel-frozen-yolov3-tiny": (
        "test_parallel.py",
        "test_replicas_match_one_device[strategy-2-frozen-yolov3-tiny]",
    ),
}


def _test_functions(module: str) -> set[str]:
    tree = ast.parse((TESTS / module).read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_large_unit_names_tests_that_exist():
    assert set(LARGE_UNIT_TESTS) == set(LARGE_UNITS)
    for unit, (module, test) in LARGE_UNIT_TESTS.items():
        assert work_unit_of(f"tests/{module}::{test}")[0] == unit
        assert test.split("[")[0] in _test_functions(module), test


def test_the_longest_unit_goes_first_while_no_large_unit_runs_elsewhere():
    queued = {"short": 5, "recipe-all": 230, "engine-matrix": 130}
    assert next_unit(queued, set()) == "recipe-all"
    assert next_unit(queued, {"engine-matrix"}) == "recipe-all"


def test_a_large_unit_waits_while_another_runs_on_the_other_worker():
    queued = {"short": 5, "recipe-jax-all": 110, "engine-matrix": 130, "parallel-unfrozen-yolov3-tiny": 100}
    assert next_unit(queued, {"recipe-all"}) == "engine-matrix"
    assert next_unit({"short": 5, "recipe-jax-all": 110}, {"recipe-all", "short-2"}) == "short"
    # Only large units left: the worker still gets the longest of them rather than nothing.
    assert next_unit({"recipe-jax-all": 110, "parallel-unfrozen-yolov3-tiny": 100}, {"recipe-all"}) == "recipe-jax-all"
