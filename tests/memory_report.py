"""Wall time and peak resident memory of the whole test run, printed in pytest's summary.

The suite must fit the CI machine (2 cores, 23 GB, 90 minutes): every run
prints how much of it the run took, so each CI log shows the margin. The
memory is the sum over the pytest process and all its descendants (the
pytest-xdist workers and the child processes of `isolation.py`), sampled
from /proc (psutil) every `INTERVAL_S` seconds; a peak shorter than that
can be missed, so the figure is a lower bound at that resolution.

Two sums: resident memory (RSS) counts a page that several processes share
(the libraries, what a forked worker inherited) once in each of them, so it
overstates what the machine held; proportional memory (PSS, Linux's
/proc/PID/smaps_rollup) splits each shared page between its sharers, so its
sum over the tree is the memory the tree held.

Reading RSS costs microseconds; reading PSS walks the process's page tables
in the kernel, tens of milliseconds for a TensorFlow process of a few GB.
Read at every sample, PSS took minutes of CPU from the cores the tests run
on (BENCHMARKS.md, "The test suite's CPU"). So each sample bounds the tree's
PSS from above without reading it: the PSS sum of the last read plus every
process's RSS growth since then (a process that started since counts its
whole RSS). A page a process maps raises its RSS by one page and the tree's
PSS by at most one; a page it releases, or a process that ends, cannot
raise the tree's PSS. Two things escape the bound: pages shared with
processes outside the tree (the libraries every process maps), and a forked
process's copy-on-write pages, which its writes copy without raising any
RSS; the suite's processes are started fresh (subprocess, `spawn`), never
forked without an exec. PSS is read only when that bound exceeds
the peak so far by `PEAK_RESOLUTION_BYTES`, so the peak found can be that
much low (the kernel's batched RSS counters add a few MB): the summary
prints it to 0.1 GB.
"""

from __future__ import annotations

import threading
import time

import psutil

INTERVAL_S = 0.5
# A sample reads PSS when its bound exceeds the proportional peak so far by more than this.
PEAK_RESOLUTION_BYTES = 16 * 2**20


def tree_members(process: psutil.Process, proportional: bool = True) -> list[tuple[str, int, int | None, tuple]]:
    """(role, resident bytes, proportional bytes or None, identity) of `process` and each live descendant.

    The identity is (pid, start time): a pid can be reused within a run (32,768 of them by default).

    Roles: "pytest" (`process`), "worker" (its direct children: the xdist
    workers) and "child" (theirs: `isolation.py`'s processes). With
    `proportional` False, the proportional bytes are not read (None).
    """
    members = []
    for member in [process, *process.children(recursive=True)]:
        try:
            if proportional:  # smaps_rollup, the costly read, gives the resident bytes as well
                memory = member.memory_full_info()
                rss, pss = memory.rss, memory.pss
            else:
                rss, pss = member.memory_info().rss, None
            parent, identity = member.ppid(), (member.pid, member.create_time())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # ended between the listing and the reading
        role = "pytest" if member.pid == process.pid else "worker" if parent == process.pid else "child"
        members.append((role, rss, pss, identity))
    return members


def describe_members(members: list[tuple[str, int, int | None, tuple]]) -> str:
    """e.g. "pytest 0.3, workers 1.2 + 2.1, children 3.4 + 3.5 GB" (resident)."""
    parts = []
    for role, plural in (("pytest", "pytest"), ("worker", "workers"), ("child", "children")):
        sizes = [f"{rss / 1e9:.1f}" for member_role, rss, *_ in members if member_role == role]
        if sizes:
            parts.append(f"{plural if len(sizes) > 1 else role} {' + '.join(sizes)}")
    return ", ".join(parts) + " GB"


class TreeMemorySampler:
    """Samples this process tree's resident memory in a daemon thread from `start()` on."""

    def __init__(self, interval_s: float = INTERVAL_S):
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.peak_proportional_bytes = 0
        self.peak_members: list[tuple[str, int, int | None, tuple]] = []
        self.samples = 0
        self.proportional_reads = 0
        # The last PSS read: the tree's PSS sum and each process's RSS then (identity -> bytes).
        self._read_proportional_bytes = 0
        self._read_resident: dict[tuple, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-memory-sampler", daemon=True)
        self._started = None

    def start(self) -> None:
        self._started = time.perf_counter()
        self._thread.start()

    def _run(self) -> None:
        root = psutil.Process()
        while not self._stop.is_set():
            self._sample(root)
            self._stop.wait(self.interval_s)

    def _sample(self, root: psutil.Process) -> None:
        self.samples += 1
        members = tree_members(root, proportional=False)
        total = sum(rss for _, rss, *_ in members)
        if total > self.peak_bytes:
            self.peak_bytes, self.peak_members = total, members
        if self.proportional_bound(members) > self.peak_proportional_bytes + PEAK_RESOLUTION_BYTES:
            members = tree_members(root)
            self.proportional_reads += 1
            self._read_proportional_bytes = sum(pss for _, _, pss, _ in members)
            self._read_resident = {identity: rss for _, rss, _, identity in members}
            self.peak_proportional_bytes = max(self.peak_proportional_bytes, self._read_proportional_bytes)

    def proportional_bound(self, members: list[tuple[str, int, int | None, tuple]]) -> int:
        """An upper bound of the tree's PSS now: the last read's sum plus each process's RSS growth since."""
        growth = sum(max(0, rss - self._read_resident.get(identity, 0)) for _, rss, _, identity in members)
        return self._read_proportional_bytes + growth

    def summary(self) -> str:
        """One line: wall time since `start()` and the peak, e.g. for pytest's terminal summary."""
        self._sample(psutil.Process())
        seconds = time.perf_counter() - self._started
        return (
            f"test run: wall {seconds / 60:.1f} min ({seconds:.0f} s), peak resident memory "
            f"of the process tree {self.peak_bytes / 1e9:.1f} GB ({describe_members(self.peak_members)}); "
            f"proportional, shared pages counted once, {self.peak_proportional_bytes / 1e9:.1f} GB "
            f"(read at {self.proportional_reads} of {self.samples} samples); "
            f"this process's CPU, the sampling included, {time.process_time():.0f} s"
        )


def release_memory() -> None:
    """Frees what a finished test module left: Keras's global state, Python garbage, glibc's free pages.

    TensorFlow keeps the graphs a process traced (isolation.py), but much of
    a module's growth is freed memory that glibc keeps mapped;
    `malloc_trim(0)` gives those pages back to the system.
    """
    import ctypes

    import keras

    keras.backend.clear_session()  # collects Python's garbage too (free_memory=True)
    if keras.backend.backend() == "jax":
        import jax

        # The compiled programs of finished runs (a new model's step is a new
        # program; the suite's persistent cache still serves its next process).
        jax.clear_caches()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def record_module_growth(log_path: str, module: str, before: int, after: int) -> None:
    """Appends `module`'s resident growth (bytes, after `release_memory`) to the run's log."""
    with open(log_path, "a", encoding="utf-8") as handle:
        handle.write(f"{after - before}\t{after}\t{module}\n")


def largest_growths(log_path: str, count: int = 3) -> str:
    """e.g. "largest growth of a worker by module: test_train.py +0.8 GB (to 3.1 GB), ..."."""
    try:
        with open(log_path, encoding="utf-8") as handle:
            rows = [line.rstrip("\n").split("\t") for line in handle if line.strip()]
    except FileNotFoundError:
        return ""
    rows.sort(key=lambda row: -int(row[0]))
    parts = [f"{module} {int(grown) / 1e9:+.1f} GB (to {int(size) / 1e9:.1f} GB)" for grown, size, module in rows]
    return "largest growth of a worker by test module: " + ", ".join(parts[:count])
