"""Which xdist worker runs which test: one expensive child run per worker at a time, longest first.

Several tests share one expensive float64 child run (`isolation.computed_once`):
the 2- and 4-replica tests of one option, or every replica case of one
network and stage. With xdist's default `load` scheduling, the tests of one
run can land on both workers: one computes it, the other waits on the lock,
and half the machine idles. And the longest runs (up to ~4 min each) landed
at the end of the suite, where the other worker had nothing left to do.

`GroupedLoadScheduling` hands each worker whole work units: the tests of one
shared run form one unit (`work_unit_of`), any other test is a unit of its
own; units start longest first (the seconds in `WORK_UNITS`, measured alone on the
2-core CI machine, 2026-11-25), so the short tests fill the end. A unit whose
child process holds 2.5 GB or more (`LARGE_UNITS`) does not start while the
other worker has one queued or running, as long as any other unit is left,
so that the suite's peak stays well under the CI machine's 10 GB budget. The
controller only sees node ids (it imports neither TensorFlow nor the test
modules), hence the patterns below; a test they miss is still run, as a unit
of its own.
"""

from __future__ import annotations

import functools
import re

from xdist.scheduler import LoadScopeScheduling

# (node id pattern, work unit name or None for the test's own node id,
# expected seconds of the whole unit). The first match wins.
_OPTION = r"test_recipe_equivalence\.py::test_option_on_replicas_matches_one_device"
# The option groups of test_recipe_equivalence.py (`OPTION_GROUPS`): each group's tests share one run.
_GROUPED_OPTIONS = {
    "recipe-cosine_mosaic_eval": r"cosine_warmup|mosaic|eval_every_monitor_map",
    "recipe-plateau_multiscale_default": r"plateau_warmup|multi_scale|recipe_default",
}
_JAX_OPTION = r"test_recipe_equivalence\.py::test_jax_option_on_devices_matches_one_device\[(\w+)\]"
_REPLICA_CASE = r"test_parallel\.py::test_replicas_match_one_device\[\w+-\d-(\w+)-([\w-]+)\]"
_FREE_RUNNING = r"test_parallel\.py::test_free_running_replicas_track_one_device\[(\w+)-([\w-]+)\]"
WORK_UNITS = [
    (r"test_recipe_equivalence\.py::test_all_options_together", "recipe-all", 230),
    (r"test_recipe_equivalence\.py::test_the_tolerance_is_far_below_a_step", "recipe-ema", 70),
    (r"test_recipe_equivalence\.py::test_(iou_thresh_changes|xla_on_one_device)", "recipe-iou_thresh", 120),
    (_OPTION + r"\[ema\]", "recipe-ema", 70),
    (_OPTION + r"\[iou_thresh\]", "recipe-iou_thresh", 120),
    *((rf"{_OPTION}\[({options})\]", unit, 90) for unit, options in _GROUPED_OPTIONS.items()),
    (r"test_recipe_equivalence\.py::test_jax_all_options_together", "recipe-jax-all", 110),
    # Every JAX option group runs in one child; the tests that read those runs go with it.
    (r"test_recipe_equivalence\.py::test_(jax_tolerance|tensorflow_and_jax)", "recipe-jax-options", 140),
    (_JAX_OPTION, "recipe-jax-options", 140),
    (r"test_jax_engine\.py::", "jax-engine", 100),
    (r"test_inference_jax\.py::", "inference-jax", 50),
    (_REPLICA_CASE, "parallel-{0}-{1}", 120),
    (_FREE_RUNNING, "parallel-{0}-{1}", 120),
    # Every run of the engine matrix is shared by its tests.
    (r"test_engine_matrix\.py::", "engine-matrix", 130),
    (r"test_run_reproducible\.py::", None, 75),
    (r"test_gpu_check\.py::", None, 35),
    (r"test_feed_processes\.py::test_no_worker", None, 60),
    (r"test_feed_processes\.py::test_a_worker_killed", None, 25),
    # Module-scoped runs shared by the module's tests: one training run in a keras-yolo3 folder; three conversions.
    (r"test_keras_yolo3_train\.py::", "keras-yolo3-train", 200),
    (r"test_keras_yolo3_tools\.py::", "keras-yolo3-tools", 70),
    (r"test_api\.py::test_train_function", None, 40),
    # Two JAX runs (--batch-size auto, then the batch it chose) and one TensorFlow run on one dataset.
    (r"test_batch_fit\.py::test_(jax|tensorflow)_", "batch-auto", 150),
]
# Units measured longer than their pattern's figure above.
UNIT_SECONDS = {
    "parallel-unfrozen-yolov4-tiny": 190,
    "parallel-unfrozen-yolov3-tiny": 100,
    "parallel-frozen-yolov3-tiny": 45,
}
DEFAULT_SECONDS = 5
# Units whose largest process held 2.5 GB or more, in GB (peak resident memory,
# sampled each second over `.ci/run` on the 2-core CI machine, 2026-11-30).
# The other units' processes held at most 2.4 GB.
LARGE_UNITS = {
    "recipe-all": 4.4,
    "parallel-unfrozen-yolov3-tiny": 3.0,
    "recipe-jax-all": 3.0,
    "parallel-frozen-yolov3-tiny": 2.5,
}


@functools.cache  # asked for every unit left at each assignment
def work_unit_of(nodeid: str) -> tuple[str, float]:
    """(the work unit `nodeid` belongs to, the unit's expected seconds)."""
    for pattern, unit, seconds in WORK_UNITS:
        match = re.search(pattern, nodeid)
        if match:
            name = unit.format(*match.groups()) if unit else nodeid
            return name, UNIT_SECONDS.get(name, seconds)
    return nodeid, DEFAULT_SECONDS


def next_unit(queued: dict[str, float], unfinished_elsewhere: set[str]) -> str:
    """The unit to send a worker: the longest of `queued` (unit: expected seconds; the first of equals).

    A unit in `LARGE_UNITS` is passed over while another worker has one in
    `unfinished_elsewhere` (the units it was sent and has not finished), unless
    only such units are left: a worker is never left idle.
    """
    crowded = any(unit in LARGE_UNITS for unit in unfinished_elsewhere)
    allowed = [unit for unit in queued if not (crowded and unit in LARGE_UNITS)] or list(queued)
    return max(allowed, key=queued.__getitem__)


class GroupedLoadScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with `work_unit_of` as the scope, the unit sent chosen by `next_unit`."""

    def _split_scope(self, nodeid: str) -> str:
        return work_unit_of(nodeid)[0]

    def _assign_work_unit(self, node) -> None:
        # Move the chosen unit to the front (xdist sends the first), then let xdist send it.
        queued = {unit: work_unit_of(next(iter(tests)))[1] for unit, tests in self.workqueue.items()}
        unfinished_elsewhere = {
            unit
            for other, units in self.assigned_work.items()
            if other is not node
            for unit, tests in units.items()
            if not all(tests.values())
        }
        self.workqueue.move_to_end(next_unit(queued, unfinished_elsewhere), last=False)
        super()._assign_work_unit(node)
