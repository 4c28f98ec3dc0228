"""This process's C heap (glibc's malloc): giving freed memory back to the system, and keeping it where that is faster.

Numpy's arrays, OpenCV's images and XLA's and TensorFlow's buffers live in
glibc's heap, not Python's. glibc keeps what a program frees for its next
allocations, and gives it back to the system only from the top of each
arena, so a burst of short-lived allocations (an XLA compile) can stay
resident for the life of the process. Everywhere else (macOS, musl) these
functions do nothing and say so by their result.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

# glibc's `mallopt` parameters, and the largest values its own dynamic thresholds reach on 64-bit Linux.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_MMAP_THRESHOLD_MAX = 32 << 20


@functools.lru_cache(maxsize=1)
def _glibc():
    """The C library when it is glibc, else None."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def return_freed_memory() -> bool:
    """Gives every whole free page of every arena back to the system (`malloc_trim(0)`); False where not glibc.

    What an XLA compile frees stays resident otherwise (see
    `backend/jax/distribution.return_memory_after_compiles`). A walk over
    the heap: milliseconds, for after rare, large frees, not for every step.
    """
    libc = _glibc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True


def reuse_freed_memory() -> None:
    """Keeps freed image buffers for the next images instead of returning them to the kernel (glibc only).

    A fresh worker process's glibc maps every decoded image (0.9 MB for
    640x480) anew and gives the heap's top back as soon as it is freed, so
    each image faults its pages in again (not so in the threads'
    long-running process, whose frees have raised glibc's thresholds). With
    the thresholds that process reaches, 2 workers spend less CPU per image,
    about what the threads spend (`tools/feed_probes.py ceiling --workers 2
    --batches 96`; BENCHMARKS.md, "The feed past one interpreter lock").
    """
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallopt"):
        return
    libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
    libc.mallopt(_M_TRIM_THRESHOLD, 2 * _MMAP_THRESHOLD_MAX)


def limit_arenas() -> int | None:
    """Caps glibc's arenas at two per core, from now on; returns the cap, or None where not set.

    glibc gives each thread that allocates an arena of its own, up to 8 per
    core, and each arena keeps up to 64 MB of freed memory on top once a
    free of 32 MB or more has raised its thresholds (XLA's step buffers do).
    Two per core are one for each feed worker (one per core by default) and
    one for each of XLA's or TensorFlow's compute threads: the threads that
    allocate in every step keep arenas of their own, the others share.
    Cores are counted as the feed counts them (`os.cpu_count()`). Measured:
    worker threads make the same images/s with the cap as with glibc's
    default (`tools/feed_probes.py ceiling --workers 1,2`; BENCHMARKS.md, "A
    COCO-size dataset: start-up time and memory", which also has the start's
    memory with the cap). A cap the user set (`MALLOC_ARENA_MAX`) stands.
    Arenas made before the call stay.
    """
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallopt") or "MALLOC_ARENA_MAX" in os.environ:
        return None
    cap = 2 * (os.cpu_count() or 1)
    libc.mallopt(_M_ARENA_MAX, cap)
    return cap
