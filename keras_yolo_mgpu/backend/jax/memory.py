"""Device memory on JAX: what a device has, what one training step needs, what an out-of-memory error says.

A step's need is XLA's own account of the compiled program
(`Compiled.memory_analysis()`): its arguments (weights, optimizer state, the
batch), the outputs not written over a donated argument, the temporaries
and the code. It is known once the step compiles, before anything runs, so
`--batch-size auto` (`training.batch_fit`) measures without allocating.
"""

from __future__ import annotations

import os
import re
import resource

import jax
import keras
import numpy as np

_REQUESTED_BYTES = re.compile(r"(?:allocating|allocate) (\d+) bytes")


def device_memory_bytes() -> int:
    """Bytes one training device has: a GPU's allocator limit; the CPU's is the process's data limit
    (`ulimit -d`) where one is set, else the machine's memory."""
    device = jax.local_devices()[0]
    limit = (device.memory_stats() or {}).get("bytes_limit")
    if limit is not None:
        return int(limit)
    data_limit = resource.getrlimit(resource.RLIMIT_DATA)[0]
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return memory if data_limit == resource.RLIM_INFINITY else min(data_limit, memory)


def training_step_bytes(train_model, inputs: dict) -> int | None:
    """Bytes one device needs for one training step of the compiled `train_model` on `inputs`.

    Args:
        train_model: a compiled (optimizer, loss) training model on one device.
        inputs: one device's batch, the model's inputs (arrays, or anything
            with `shape` and `dtype`); only their shapes matter.

    Returns:
        The step's bytes, as XLA assigned them; nothing runs.
    """
    images = keras.tree.flatten(inputs)[0].shape[0]
    # (x, y) as the feed gives them: y is zeros (B, 1), the loss is the model's output.
    batch = keras.tree.map_structure(
        lambda array: jax.ShapeDtypeStruct(np.shape(array), array.dtype), (inputs, np.zeros((images, 1), np.float32))
    )
    # Builds the optimizer's and the metrics' variables, as `fit` does before its first step.
    train_model._symbolic_build(data_batch=batch)
    state = train_model._get_jax_state(
        trainable_variables=True, non_trainable_variables=True, optimizer_variables=True, metrics_variables=True
    )
    # The step as Keras's JAX trainer jits it (`make_train_function`): the state donated, so the new state
    # takes the old one's buffers.
    compiled = jax.jit(train_model.train_step, donate_argnums=0).lower(state, batch).compile()
    stats = compiled.memory_analysis()
    return int(
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
        + stats.temp_size_in_bytes
        + stats.generated_code_size_in_bytes
    )


def out_of_memory(error: BaseException) -> tuple[int | None, int | None] | None:
    """(bytes the failed allocation asked for, bytes the first device has), each None when unknown; None when
    `error` is not an out-of-memory error.

    XLA says RESOURCE_EXHAUSTED and the bytes it tried to allocate.
    """
    if not isinstance(error, jax.errors.JaxRuntimeError) or "RESOURCE_EXHAUSTED" not in str(error):
        return None
    found = _REQUESTED_BYTES.search(str(error))
    return (int(found.group(1)) if found else None), device_memory_bytes()
