"""The suite's memory sampler: proportional memory read only when it can raise the peak, and the peak still found."""

import subprocess
import sys

import psutil
from memory_report import TreeMemorySampler, tree_members

# A child that touches 300 MB of its own pages after one line on stdin and holds them until stdin closes.
GROWING_CHILD = """
import sys
sys.stdin.readline()
held = bytearray(300 * 2**20)
held[:: 4096] = b"x" * len(held[:: 4096])
print("grown", flush=True)
sys.stdin.read()
"""


def _tree_proportional_bytes() -> int:
    return sum(pss for _, _, pss, _ in tree_members(psutil.Process()))


def test_proportional_memory_is_read_when_the_tree_grows_and_not_while_it_holds():
    sampler = TreeMemorySampler()
    root = psutil.Process()
    child = subprocess.Popen(
        [sys.executable, "-c", GROWING_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        sampler._sample(root)  # the first sample reads: no peak yet
        assert sampler.proportional_reads == 1
        before = sampler.peak_proportional_bytes
        sampler._sample(root)  # nothing grew by more than the resolution: no read
        assert sampler.proportional_reads == 1
        child.stdin.write("grow\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "grown"
        reads = sampler.proportional_reads
        sampler._sample(root)
        assert sampler.proportional_reads == reads + 1  # 300 MB of growth: the bound passed the peak
        after = sampler.peak_proportional_bytes
        assert after - before > 250 * 2**20
        # The peak is what a read of every process finds now (the child holds its pages).
        assert abs(after - _tree_proportional_bytes()) < 32 * 2**20
        reads = sampler.proportional_reads
        for _ in range(3):
            sampler._sample(root)
        assert sampler.proportional_reads == reads  # the tree holds its memory: no read
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    sampler._sample(root)  # the child ended: the tree shrank, no read
    assert sampler.proportional_reads == reads and sampler.peak_proportional_bytes == after
