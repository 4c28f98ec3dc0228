"""CPU time of this process and of every process it started: what the benchmarks' CPU figures count.

The process feed (`train.py --feed processes`, `bench pipeline`'s
`pyprocesses` row) makes its batches in worker processes, where
`time.process_time()` (this process's threads) misses nearly all of its work.
`tree_cpu_seconds` adds the workers: on Linux from `/proc`, elsewhere through
psutil where it is installed (only in the test extra); where neither is there
the reading is None, "not measured" rather than wrong.
"""

from __future__ import annotations

import os
import time

from keras_yolo_mgpu.optional import psutil

# Linux's process table; a module constant so that the tests can take it away.
PROC = "/proc"


def tree_cpu_seconds() -> float | None:
    """CPU seconds (user + system) so far of this process, all its threads, and every process it started.

    The started processes are the live descendants (children, their
    children, ...), each with the processes it has waited for, and the
    children this process has waited for (`os.times()`), so a worker that
    ends between two readings still counts. Only differences of two
    readings mean something.

    Returns:
        The seconds, or None where the live descendants cannot be listed
        (neither `/proc` nor psutil).
    """
    live = _descendants_cpu_seconds()
    if live is None:
        return None
    ended = os.times()
    return time.process_time() + ended.children_user + ended.children_system + live


def _descendants_cpu_seconds() -> float | None:
    if os.path.exists(os.path.join(PROC, "self", "stat")):
        return sum(_proc_cpu_seconds(pid) for pid in _proc_descendants(os.getpid()))
    if not psutil.available:
        return None
    seconds = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:  # ended meanwhile
            continue
        seconds += times.user + times.system + getattr(times, "children_user", 0) + getattr(times, "children_system", 0)
    return seconds


def _proc_stat_fields(pid: int) -> list[str] | None:
    """The fields of `/proc/<pid>/stat` after the command name (state first), or None once the process is gone."""
    try:
        with open(os.path.join(PROC, str(pid), "stat"), encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    # The command name is in parentheses and may itself hold spaces and parentheses.
    return text[text.rindex(")") + 2 :].split()


def _proc_cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of `pid` (stat fields 14-17, in clock ticks); 0 once it is gone."""
    fields = _proc_stat_fields(pid)
    if fields is None:
        return 0.0
    return sum(int(tick) for tick in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _proc_descendants(pid: int) -> list[int]:
    """Every live process below `pid`: from each thread's `children` file, else from every process's parent."""
    if not os.path.exists(os.path.join(PROC, str(pid), "task", str(pid), "children")):
        # A kernel without CONFIG_PROC_CHILDREN: the parents of every process instead.
        return _descendants_by_parent(pid)
    found, parents = [], [pid]
    while parents:
        parent = parents.pop()
        task_dir = os.path.join(PROC, str(parent), "task")
        try:
            tasks = os.listdir(task_dir)
        except OSError:  # ended meanwhile
            continue
        for task in tasks:
            try:
                with open(os.path.join(task_dir, task, "children"), encoding="ascii") as handle:
                    children = [int(child) for child in handle.read().split()]
            except OSError:  # the thread ended meanwhile
                continue
            found.extend(children)
            parents.extend(children)
    return found


def _descendants_by_parent(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir(PROC):
        fields = _proc_stat_fields(int(name)) if name.isdigit() else None
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(name))
    found, parents = [], [pid]
    while parents:
        below = children.get(parents.pop(), [])
        found.extend(below)
        parents.extend(below)
    return found
