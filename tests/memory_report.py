"""Wall time and peak resident memory of the whole test run, printed in pytest's summary.

The suite must fit the CI machine (2 cores, 23 GB, 90 minutes): every run
prints how much of it the run took, so each CI log shows the margin. The
memory is the sum over the pytest process and all its descendants (the
pytest-xdist workers and the child processes of `isolation.py`), sampled
from /proc (psutil) every `INTERVAL_S` seconds; a peak shorter than that
can be missed, so the figure is a lower bound at that resolution.
"""

from __future__ import annotations

import threading
import time

import psutil

INTERVAL_S = 0.5


def tree_resident_bytes(process: psutil.Process) -> int:
    """Resident bytes of `process` and every live descendant."""
    total = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            total += member.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass  # ended between the listing and the reading
    return total


class TreeMemorySampler:
    """Samples this process tree's resident memory in a daemon thread from `start()` on."""

    def __init__(self, interval_s: float = INTERVAL_S):
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-memory-sampler", daemon=True)
        self._started = None

    def start(self) -> None:
        self._started = time.perf_counter()
        self._thread.start()

    def _run(self) -> None:
        root = psutil.Process()
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, tree_resident_bytes(root))
            self._stop.wait(self.interval_s)

    def summary(self) -> str:
        """One line: wall time since `start()` and the peak, e.g. for pytest's terminal summary."""
        self.peak_bytes = max(self.peak_bytes, tree_resident_bytes(psutil.Process()))
        seconds = time.perf_counter() - self._started
        return (
            f"test run: wall {seconds / 60:.1f} min ({seconds:.0f} s), peak resident memory "
            f"of the process tree {self.peak_bytes / 1e9:.1f} GB (pytest, its workers and their children)"
        )
