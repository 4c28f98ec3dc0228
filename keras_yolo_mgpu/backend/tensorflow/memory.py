"""Device memory on TensorFlow: what a device has, what one training step needs, what an out-of-memory error says.

A step's need is measured by a trial: the step runs twice on the default
device, and the peak of the second is what it needed, weights and optimizer
state included. On a GPU that is the device allocator's peak
(`get_memory_info`, reset before the step). On the CPU, whose memory is the
process's, it is the process's peak resident memory (Linux's VmHWM, reset
through /proc/self/clear_refs): TensorFlow's CPU allocator does not see the
buffers XLA allocates, and it may refuse to reset its statistics. A trial
that runs out of memory did not fit. Unlike XLA's account on JAX the figure
is measured, so it varies a little from run to run.
"""

from __future__ import annotations

import os
import re
import resource

import numpy as np
import tensorflow as tf
from tensorflow.python.client import device_lib

_TENSOR_SHAPE = re.compile(r"OOM when allocating tensor with shape\[([\d,]+)\] and type (\w+)")
_ALLOCATOR_LIMIT = re.compile(r"Limit:\s+([\d.]+)([KMGT]i)?B")


def _trial_device() -> str:
    """Where a model built outside any strategy runs: the first GPU, else the CPU."""
    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


def device_memory_bytes() -> int:
    """Bytes one training device has: a GPU's allocator limit; the CPU's is the process's data limit
    (`ulimit -d`) where one is set, else the machine's memory."""
    limits = [device.memory_limit for device in device_lib.list_local_devices() if device.device_type == "GPU"]
    if limits:
        return int(min(limits))
    data_limit = resource.getrlimit(resource.RLIMIT_DATA)[0]
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return memory if data_limit == resource.RLIM_INFINITY else min(data_limit, memory)


def training_step_bytes(train_model, inputs: dict) -> int | None:
    """Bytes one device needed for one training step of the compiled `train_model` on `inputs`, run once.

    Args:
        train_model: a compiled (optimizer, loss) training model on the default device.
        inputs: one device's batch, the model's inputs.

    Returns:
        The device allocator's peak during the step, or None when the step ran out of memory.
    """
    device = _trial_device()
    # y is zeros (B, 1), as the feed gives it: the loss is the model's output.
    targets = np.zeros((tf.nest.flatten(inputs)[0].shape[0], 1), np.float32)
    try:
        # The first step at a shape also traces and optimizes its graph: the second is the one every later
        # step repeats.
        train_model.train_on_batch(inputs, targets)
        if device.startswith("GPU"):
            tf.config.experimental.reset_memory_stats(device)
            train_model.train_on_batch(inputs, targets)
            return int(tf.config.experimental.get_memory_info(device)["peak"])
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # the peak resident memory starts again from the current
        train_model.train_on_batch(inputs, targets)
        return _peak_resident_bytes()
    except tf.errors.ResourceExhaustedError:
        return None


def _peak_resident_bytes() -> int:
    """The process's peak resident memory since it was last reset (VmHWM of /proc/self/status)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("/proc/self/status has no VmHWM line")


def out_of_memory(error: BaseException) -> tuple[int | None, int | None] | None:
    """(bytes the failed allocation asked for, bytes the device's allocator had), each None when unsaid; None
    when `error` is not an out-of-memory error.

    TensorFlow says both in its message: "OOM when allocating tensor with
    shape[32,4096,4096,16] and type float ..." and its allocator's "Limit:".
    """
    if not isinstance(error, tf.errors.ResourceExhaustedError):
        return None
    text = str(error)
    requested = limit = None
    shape = _TENSOR_SHAPE.search(text)
    if shape:
        dims = [int(d) for d in shape.group(1).split(",") if d]
        try:
            itemsize = tf.as_dtype(shape.group(2)).size
        except TypeError:
            itemsize = 4
        requested = int(np.prod(dims, dtype=np.int64)) * itemsize
    found = _ALLOCATOR_LIMIT.search(text)
    if found:
        scale = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[found.group(2)]
        limit = int(float(found.group(1)) * scale)
    return requested, limit
