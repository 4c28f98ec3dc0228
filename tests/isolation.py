"""Runs a test's heavy work in a fresh Python process, on the suite's device layout.

TensorFlow keeps the graphs of every model a process has traced:
`keras.backend.clear_session()` does not give back the memory of a finished
`train.py` run or of a replicated float64 step. Run in the pytest process,
the suite's ~40 float64 replica runs grew it to ~20 GB (2026-11-25, 2-core
machine). A child process returns its memory to the system when it ends, so
the suite's peak becomes one group of runs instead of all of them.

The child is started with `spawn` (a clean interpreter: a forked copy of a
process that already runs TensorFlow's thread pools is unsafe), splits the
CPU (or a GPU) into the same logical devices as `conftest.py` before
TensorFlow initialises, and builds models in the `floatx` asked for. The
function and its arguments are pickled: pass module-level functions and
plain data (paths, lists, numbers); return plain data (numpy arrays, dicts).
An exception raised in the child (a failed `assert` included) is raised
again in the test, with the child's traceback in its message.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import pickle
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

NUM_LOGICAL_DEVICES = 4
# KERAS_YOLO_TEST_DEVICES=GPU splits the first GPU instead (4 logical GPUs of
# 2 GiB): the equivalence tests then run on GPU kernels (a rehearsal on a
# one-GPU machine; CI uses the CPU).
TEST_DEVICE_TYPE = os.environ.get("KERAS_YOLO_TEST_DEVICES", "CPU").upper()


def configure_test_devices() -> None:
    """Splits the first CPU (or GPU) into `NUM_LOGICAL_DEVICES` logical devices.

    Must run before TensorFlow initialises its devices (the first op).
    """
    import tensorflow as tf

    if TEST_DEVICE_TYPE == "GPU":
        physical = tf.config.list_physical_devices("GPU")[0]
        layout = [tf.config.LogicalDeviceConfiguration(memory_limit=2048)] * NUM_LOGICAL_DEVICES
    else:
        physical = tf.config.list_physical_devices("CPU")[0]
        layout = [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_DEVICES
    tf.config.set_logical_device_configuration(physical, layout)


def logical_device_names() -> list[str]:
    """Names of the logical test devices, e.g. ['/device:CPU:0', ...]."""
    import tensorflow as tf

    return [device.name for device in tf.config.list_logical_devices(TEST_DEVICE_TYPE)]


def _prepare_child(floatx: str) -> None:
    configure_test_devices()
    import keras

    keras.config.set_floatx(floatx)
    keras.config.set_dtype_policy(floatx)


def _prepare_jax_child(floatx: str) -> None:
    """JAX's counterpart of `_prepare_child`: float64 enabled where asked, before anything is built.

    `KERAS_BACKEND=jax` and the simulated devices (`XLA_FLAGS`) come from the
    environment the child was started with (`run_isolated(..., backend="jax")`).
    """
    import jax

    if floatx == "float64":
        jax.config.update("jax_enable_x64", True)
    import keras

    keras.config.set_floatx(floatx)
    keras.config.set_dtype_policy(floatx)


# The JAX compilation cache the test run shares (set by conftest.py).
JAX_CACHE_VARIABLE = "JAX_COMPILATION_CACHE_DIR"


def jax_environment(devices: int = NUM_LOGICAL_DEVICES) -> dict[str, str]:
    """Environment variables of a process that runs Keras on JAX with `devices` CPU devices.

    The suite's JAX processes share one persistent compilation cache: a
    run's many small eager programs (initialisers, casts) and the steps
    shared between tests compile once per test run, not once per process.
    """
    environment = {
        "KERAS_BACKEND": "jax",
        # XLA flags the suite was started with stay (a dump, a compiler option to try).
        "XLA_FLAGS": " ".join([*_other_xla_flags(), f"--xla_force_host_platform_device_count={devices}"]),
        "JAX_PLATFORMS": "cpu",
    }
    if os.environ.get(JAX_CACHE_VARIABLE):
        environment.update(
            {
                JAX_CACHE_VARIABLE: os.environ[JAX_CACHE_VARIABLE],
                # Cache every program, however small or quick to compile.
                "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
            }
        )
    return environment


def _other_xla_flags() -> list[str]:
    """The `XLA_FLAGS` of this process but its device count."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    return [flag for flag in flags if not flag.startswith("--xla_force_host_platform_device_count")]


def run_isolated(function, /, *args, floatx: str = "float32", backend: str = "tensorflow", **kwargs):
    """`function(*args, **kwargs)` in a fresh process; returns its (picklable) result.

    Args:
        function: a module-level function (pickled by reference).
        floatx: "float32" or "float64": the child's Keras floatx and dtype policy.
        backend: "tensorflow" (4 logical CPU devices, as the suite's) or "jax"
            (Keras on JAX with 4 CPU devices, `jax_environment`).
    """
    context = multiprocessing.get_context("spawn")
    initializer = _prepare_jax_child if backend == "jax" else _prepare_child
    environment = jax_environment() if backend == "jax" else {}
    saved = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)  # the spawned child starts with it
    try:
        with ProcessPoolExecutor(1, mp_context=context, initializer=initializer, initargs=(floatx,)) as pool:
            future = pool.submit(function, *args, **kwargs)
            _restore_environment(saved)
            return future.result()
    finally:
        _restore_environment(saved)


def _restore_environment(saved: dict) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


_computed = {}


def shared_folder(tmp_path_factory) -> Path:
    """A folder that every pytest-xdist worker of this test run shares (this process's own without xdist).

    A worker's base temporary folder is `<run's base>/popen-gwN`; the run's base
    lives until the whole run ends.
    """
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def computed_once(key: str, compute, folder: Path):
    """`compute()`'s (picklable) result, computed once per test run, also across pytest-xdist workers.

    Tests that share one expensive child run (1, 2 and 4 replicas of one
    option) may be sent to different workers: the first to ask computes it
    under a file lock in `folder` (`shared_folder`), the others wait and read
    the pickled result. (pytest-xdist's `--dist loadgroup` would keep them on
    one worker, but with pytest 9 it does not: xdist 3.8 renames the items'
    node ids, which pytest 9 no longer reads back, so the groups are ignored.)
    """
    if key in _computed:
        return _computed[key]
    path = Path(folder) / f"{key}.pickle"
    with open(Path(folder) / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            with open(path, "rb") as handle:
                result = pickle.load(handle)
        else:
            result = compute()
            temporary = path.with_suffix(".partial")
            with open(temporary, "wb") as handle:
                pickle.dump(result, handle)
            os.replace(temporary, path)
    _computed[key] = result
    return result
