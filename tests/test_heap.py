"""The process's C heap (keras_yolo_mgpu/heap.py): freed memory given back, and after each long XLA compile."""

import os
import platform
import subprocess
import sys

import pytest
from isolation import jax_environment

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

# Frees 200 MB of 100 KB blocks (glibc's heap, below its mmap threshold), each followed by a small block that
# stays: free() gives back only the heap's top, so only a trim of the free pages inside gives them back.
FRAGMENTED = """
import ctypes, sys
from keras_yolo_mgpu import heap
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
blocks, pins = [], []
for _ in range(2000):
    block = libc.malloc(100_000)
    ctypes.memset(block, 1, 100_000)
    blocks.append(block)
    pins.append(libc.malloc(64))
for block in blocks:
    libc.free(ctypes.c_void_p(block))
before = resident()
returned = heap.return_freed_memory()
print(returned, before - resident())
"""


def test_freed_memory_inside_the_heap_goes_back_to_the_system():
    done = subprocess.run([sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, check=True)
    returned, released = done.stdout.split()
    assert returned == "True" and int(released) > 150e6, done.stdout


# JAX reports each backend compile to its listeners; a long one (threshold lowered here) is followed by a trim.
COMPILES = """
import numpy as np, jax, jax.numpy as jnp
from keras_yolo_mgpu import heap
from keras_yolo_mgpu.backend.jax import distribution
calls = []
heap.return_freed_memory = lambda: calls.append(1) or True
distribution._LONG_COMPILE_SECONDS = 0.0
distribution.return_memory_after_compiles()
distribution.return_memory_after_compiles()  # registered once
jax.jit(lambda x: jnp.sin(x) * 3)(np.ones(7, np.float32)).block_until_ready()
print(len(calls))
"""


def test_a_jax_compile_is_followed_by_one_trim():
    env = dict(os.environ, **jax_environment(1))
    done = subprocess.run([sys.executable, "-c", COMPILES], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "1", done.stdout
