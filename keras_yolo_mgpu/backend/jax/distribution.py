"""Devices on JAX: device selection, simulated CPU devices, several processes, the data-parallel distribution.

JAX runs N devices as one SPMD program: `keras.distribution.DataParallel`
replicates every variable over a 1-D device mesh and shards each batch along
it, and XLA compiles the whole training step once for all of them. A mean over the batch axis (the
loss's, BatchNormalization's) is then the global batch's mean: N devices
compute what one device computes, by construction, and XLA compiles the step
at every device count (TensorFlow's MirroredStrategy cannot, with Keras 3.15).

Several processes (machines) join through `jax.distributed`, which
`keras.distribution.initialize()` starts from the environment variables
`KERAS_DISTRIBUTION_JOB_ADDRESSES` (the coordinator's `host:port` first),
`KERAS_DISTRIBUTION_NUM_PROCESSES` and `KERAS_DISTRIBUTION_PROCESS_ID`;
each process then feeds only its own slice of every global batch. TensorFlow's
other engines are refused with what to use instead; the input is a
`keras.utils.PyDataset`.
"""

from __future__ import annotations

import importlib.util
import logging
import os

import jax
import keras
from jax.experimental import multihost_utils

from keras_yolo_mgpu import heap
from keras_yolo_mgpu.keras_compat import latest_jax_state

logger = logging.getLogger(__name__)

# How the training data reaches this engine (`data/streams.py`): a PyDataset of worker threads or processes.
INPUT_PIPELINE = "py_dataset"
# The variables `keras.distribution.initialize()` reads.
PROCESS_COUNT_VARIABLE = "KERAS_DISTRIBUTION_NUM_PROCESSES"
CLUSTER_VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", PROCESS_COUNT_VARIABLE, "KERAS_DISTRIBUTION_PROCESS_ID")
_SIMULATE_FLAG = "--xla_force_host_platform_device_count"
# `jax.distributed` is started once per process.
_processes_started = False


def build_engine_fields(
    gpus: int | None, *, simulate: bool, strategy: str, parallel: str, sync_bn: bool, devices
) -> dict:
    """`parallel.engine.Engine`'s fields on JAX: the processes joined, the devices chosen, `DataParallel` over them.

    Raises:
        ValueError: a TensorFlow-only choice (`check_options`).
    """
    check_options(strategy=strategy, parallel=parallel, sync_bn=sync_bn)
    start_processes()
    enable_float64_if_asked()
    if devices is None:
        devices = select_devices(gpus, simulate)
    else:
        by_name = {str(device): device for device in jax.devices()}
        by_name.update({str(device): device for device in jax.devices("cpu")})
        devices = [by_name.get(str(name), name) for name in devices]
    return dict(
        strategy=make_distribution(devices),
        devices=tuple(str(device) for device in devices),
        replicas=len(devices),
        parallel="strategy",
        sync_bn=len(devices) > 1,
        processes=process_slice(),
        bfloat16=supports_bfloat16(devices),
    )


def check_options(*, strategy: str = "mirrored", parallel: str = "strategy", sync_bn: bool = True) -> None:
    """Raises ValueError for TensorFlow-only choices, saying what to use on JAX instead."""
    if parallel != "strategy":
        _refuse_parallel(parallel)
    if strategy != "mirrored":
        raise ValueError(
            f"--strategy {strategy} configures TensorFlow's MultiWorkerMirroredStrategy (TF_CONFIG). On JAX start "
            "train.py in every process with KERAS_DISTRIBUTION_JOB_ADDRESSES (the coordinator's host:port first), "
            "KERAS_DISTRIBUTION_NUM_PROCESSES and KERAS_DISTRIBUTION_PROCESS_ID set, and drop --strategy."
        )
    if not sync_bn:
        raise ValueError(
            "--no-sync-bn has no meaning on JAX: N devices run one program, and BatchNormalization always "
            "normalises over the global batch, as on one device. Drop --no-sync-bn, or set KERAS_BACKEND=tensorflow "
            "for per-replica statistics."
        )


def replica_model(train_model, devices):
    """TensorFlow's in-graph replica model (`--parallel multi_gpu_model`) has no JAX counterpart: ValueError."""
    _refuse_parallel("multi_gpu_model")


def _refuse_parallel(parallel: str):
    raise ValueError(
        f"--parallel {parallel} is TensorFlow's in-graph replication. On JAX every device count runs as one "
        "SPMD program (keras.distribution.DataParallel): drop --parallel, or set KERAS_BACKEND=tensorflow."
    )


def simulate_devices(count: int) -> list:
    """`count` CPU devices for JAX, through `XLA_FLAGS=--xla_force_host_platform_device_count`.

    Rehearses a multi-GPU run on any machine. JAX reads the flag when it first
    starts its backends (the first array or device query), so this must run
    before that; on a machine with GPUs the rehearsal runs on the CPU (JAX
    cannot split one GPU into several devices).

    Returns:
        The first `count` CPU devices.

    Raises:
        RuntimeError: JAX already started with fewer CPU devices.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1. Received: count={count}")
    _reserve_cpu_devices(count)
    devices = jax.devices("cpu")
    if len(devices) < count:
        raise RuntimeError(
            f"cannot simulate {count} devices: JAX already started with {len(devices)} CPU device(s). Set "
            f"XLA_FLAGS={_SIMULATE_FLAG}={count} before the first JAX computation of the process: from Python, "
            "in a new process (a run or model built earlier in it fixed the devices)."
        )
    return devices[:count]


def _reserve_cpu_devices(count: int) -> None:
    """Sets `XLA_FLAGS` so that JAX, when it starts, splits the host into at least `count` CPU devices."""
    flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split() if not flag.startswith(_SIMULATE_FLAG)]
    existing = _flag_value(os.environ.get("XLA_FLAGS", ""))
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"{_SIMULATE_FLAG}={max(count, existing)}"])


def _flag_value(flags: str) -> int:
    for flag in flags.split():
        if flag.startswith(_SIMULATE_FLAG + "="):
            return int(flag.split("=", 1)[1])
    return 0


def start_processes() -> bool:
    """Joins the cluster the `KERAS_DISTRIBUTION_*` variables describe; False when they describe none.

    Must run before the first JAX computation. On CPUs the processes
    all-reduce through gloo (JAX's CPU collectives), which the multi-process
    rehearsal on one machine needs.
    """
    global _processes_started
    count = int(os.environ.get(PROCESS_COUNT_VARIABLE, "1") or 1)
    if count <= 1:
        return False
    if _processes_started:
        return True
    missing = [name for name in CLUSTER_VARIABLES if not os.environ.get(name)]
    if missing:
        raise ValueError(
            f"{PROCESS_COUNT_VARIABLE}={count} asks for several processes, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set: every process needs all of {', '.join(CLUSTER_VARIABLES)}"
        )

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    keras.distribution.initialize()
    _processes_started = True
    logger.info("JAX process %d of %d joined the cluster", jax.process_index(), jax.process_count())
    return True


def select_devices(gpus: int | None = None, simulate: bool = False) -> list:
    """The devices to train on: every process's first `gpus` local GPUs (default: all, else one CPU).

    Raises:
        ValueError: more GPUs asked for than JAX sees (without `simulate`).
    """
    if simulate:
        per_process = gpus or 2
        simulate_devices(per_process)
        platform = "cpu"
    else:
        accelerators = [d for d in jax.local_devices() if d.platform != "cpu"]
        if gpus is not None and gpus > len(accelerators):
            raise ValueError(
                f"--gpus {gpus} asked for {gpus} GPUs but JAX sees {len(accelerators)} "
                f"({', '.join(str(d) for d in accelerators) or 'none'}). Check CUDA_VISIBLE_DEVICES and JAX's CUDA "
                "install (pip install 'jax[cuda13]'), or add --simulate-devices to rehearse on CPU devices."
            )
        platform = accelerators[0].platform if accelerators else "cpu"
        per_process = (gpus or len(accelerators)) if accelerators else 1
    if jax.process_count() == 1:
        return jax.local_devices(backend=platform)[:per_process]
    # Every process's first `per_process` devices, in global order: one mesh over the cluster.
    by_process: dict[int, list] = {}
    for device in jax.devices(platform):
        by_process.setdefault(device.process_index, []).append(device)
    return [device for index in sorted(by_process) for device in by_process[index][:per_process]]


def enable_float64_if_asked() -> None:
    """Turns on JAX's 64-bit types when Keras's floatx is float64.

    Without `jax_enable_x64` JAX silently computes float64 requests in
    float32: a float64 run (the equivalence proofs, `align --float64`) would
    then prove nothing. Must run before the first array is built.
    """
    if keras.config.floatx() == "float64" and not jax.config.jax_enable_x64:
        jax.config.update("jax_enable_x64", True)
        logger.info("floatx float64: JAX's 64-bit types enabled (jax_enable_x64)")


def make_distribution(devices: list):
    """`keras.distribution.DataParallel` over `devices`: variables replicated, batches sharded.

    `auto_shard_dataset=False`: the training pipeline already gives each
    process its own slice of every global batch (`data.streams`), so Keras
    must not shard it again.
    """
    return keras.distribution.DataParallel(devices=list(devices), auto_shard_dataset=False)


def is_chief(strategy=None) -> bool:
    """Process 0 writes the run's files (`strategy`: unused, every process knows its index)."""
    return jax.process_index() == 0


def worker_index(strategy=None) -> int:
    """This process's index: where a process other than the chief writes its copy of a checkpoint."""
    return jax.process_index()


def training_strategy(model):
    """What `is_chief` and `worker_index` take for a model in training: nothing on JAX."""
    return None


def process_slice() -> tuple[int, int]:
    """(this process's index, the number of processes): which slice of each global batch it reads."""
    return jax.process_index(), jax.process_count()


def wait_for_all_workers(strategy, name: str) -> None:
    """A barrier over the processes (none with one), so no process exits while the chief saves."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def device_names(gpus: int | None = None, simulate: bool = False) -> list[str]:
    """The names of the devices a run would train on (`select_devices`), the processes joined first."""
    start_processes()
    enable_float64_if_asked()
    return [str(device) for device in select_devices(gpus, simulate)]


def visible_accelerators(cpu_devices: int = 0) -> list[str]:
    """The GPUs (TPUs) JAX sees in this process, by name; empty on a CPU-only machine.

    `cpu_devices`: the CPU devices a later `simulate_devices` may ask for.
    JAX splits the host into its CPU devices once, when it starts, which
    this query does: asked for here, the split is still free.
    """
    if cpu_devices:
        _reserve_cpu_devices(cpu_devices)
    return [str(device) for device in jax.local_devices() if device.platform != "cpu"]


def fit_callbacks(distribution) -> list:
    """Callbacks every `fit` under `distribution` needs: few steps in flight; with one device, one compile."""
    callback = commit_state_callback(distribution.device_mesh.devices.flatten().tolist())
    return [DispatchLimit(), *([callback] if callback is not None else [])]


# Steps dispatched beyond the one running: enough that the device never waits for Python's dispatch.
STEPS_AHEAD = 2


@jax.jit
def _finished_marker(value):
    """A new scalar that is ready once `value` is: it outlives the donation of `value` to the next step."""
    return value.reshape(-1)[0]


class DispatchLimit(keras.callbacks.Callback):
    """Keeps at most `ahead` training or validation steps queued behind the one the devices run.

    With every callback `async_safe`, Keras's JAX `fit` dispatches a step without waiting
    for the one before; only the feed and XLA's queue (32 programs per device on the CPU)
    bound it. Unbounded, the queued steps hold their batches in memory and a Ctrl-C waits
    for all of them: tens of seconds on a COCO-size set (BENCHMARKS.md, "A COCO-size
    dataset: start-up time and memory"). Before dispatching a step this waits, outside any
    C call, for the step `ahead` before it, so the interrupt is raised then. A dispatched
    step's state arrays are donated to the next; `_finished_marker` reads one into an array
    that is ready when that step is, and outlives it.
    """

    async_safe = True

    def __init__(self, ahead: int = STEPS_AHEAD):
        super().__init__()
        if ahead < 1:
            raise ValueError(f"`ahead` must be at least 1. Received: ahead={ahead}")
        self.ahead = ahead
        self._markers = []  # one per step in flight, oldest first

    def _wait_for_older_steps(self, *_args, **_kwargs):
        state = latest_jax_state(self.model)
        if state is None:  # the first step of a `fit` or `evaluate`: nothing in flight
            self._markers.clear()
            return
        arrays = [value for value in keras.tree.flatten(state) if isinstance(value, jax.Array)]
        if arrays:
            self._markers.append(_finished_marker(min(arrays, key=lambda array: array.size)))
        while len(self._markers) > self.ahead:
            self._markers.pop(0).block_until_ready()

    on_train_batch_begin = on_test_batch_begin = _wait_for_older_steps

    def on_epoch_begin(self, epoch, logs=None):
        self._markers.clear()  # Keras synced the state at the last epoch's end

    on_test_begin = on_epoch_begin


# What the compiled programs of past runs may hold on disk; the least recently used go first.
COMPILATION_CACHE_BYTES = 2 * 1024**3


def use_compilation_cache(folder: str | None) -> None:
    """Keeps XLA's compiled programs in `folder/xla` so the next start of the same run skips the compiles.

    JAX's persistent compilation cache (keyed by the program, the devices and the JAX
    version; at most `COMPILATION_CACHE_BYTES`). Every program is kept, not only those past
    JAX's default 1 s: Keras's eager initialisers compile one small program per weight
    shape, seconds of each start, and take little disk (BENCHMARKS.md, "A COCO-size
    dataset: start-up time and memory"). `folder`: the user's cache folder
    (`--scan-cache`), None to keep nothing.
    """
    if folder is None or jax.config.jax_compilation_cache_dir:
        return  # off, or already chosen by whoever started this process
    jax.config.update("jax_compilation_cache_dir", os.path.join(folder, "xla"))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:  # a user's own choice stands
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    # JAX evicts old programs only with `filelock` installed (it locks the folder); without it the cache grows.
    if importlib.util.find_spec("filelock") is not None:
        jax.config.update("jax_compilation_cache_max_size", COMPILATION_CACHE_BYTES)


# A compile that ran this long frees enough to be worth a walk over the heap (`heap.return_freed_memory`).
_LONG_COMPILE_SECONDS = 1.0
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_returning_memory = False


def return_memory_after_compiles() -> None:
    """After each long XLA compile, gives what the compiler freed back to the system, before the program runs.

    The compiler's scratch stays in glibc's heap otherwise, under the step's own buffers,
    so a start that compiles peaks well above one whose step comes from the cache; this and
    `heap.limit_arenas` take most of that back (BENCHMARKS.md, "A COCO-size dataset:
    start-up time and memory"). Registered once per process as a JAX monitoring listener.
    """
    global _returning_memory
    if _returning_memory:
        return

    def listener(event: str, duration: float, **_kwargs) -> None:
        if event == _COMPILE_EVENT and duration >= _LONG_COMPILE_SECONDS:
            heap.return_freed_memory()

    jax.monitoring.register_event_duration_secs_listener(listener)
    _returning_memory = True


def check_feed(feed: str) -> None:
    """Every feed of the PyDataset runs here: worker "threads" or "processes"."""


def batch_placer(distribution):
    """`batch -> the batch on the devices`, sharded along the batch axis as the step reads it (one process)."""
    sharding = distribution.get_data_layout((None,)).backend_layout

    def place(batch):
        return jax.device_put(batch, sharding)

    return place


def supports_bfloat16(devices: list) -> bool:
    """Whether the devices compute bfloat16 natively: NVIDIA Ampere (compute capability 8) and later, TPUs."""
    for device in devices:
        if device.platform == "tpu":
            continue
        capability = getattr(device, "compute_capability", None)
        if device.platform != "gpu" or capability is None or float(capability) < 8.0:
            return False
    return bool(devices)


def commit_state_callback(devices: list):
    """A callback that places every variable on the one training device at each epoch's start; None for a mesh.

    On a one-device mesh Keras leaves a value it assigns from the host (start weights,
    restored backups, reset metrics, the EMA swap) uncommitted, and JAX compiles a step for
    uncommitted arguments apart from the committed ones the step returns: the first steps
    of a run compiled the step three times (BENCHMARKS.md, "The JAX trainer on one GPU").
    Committed from the start, it compiles once. On several devices Keras commits them.
    """
    if len(devices) != 1:
        return None

    device = devices[0]

    class CommitState(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            # After Keras resets the metrics, before it gathers the step's state.
            model = self.model
            optimizer_variables = model.optimizer.variables if model.optimizer is not None else []
            for variable in [*model.variables, *optimizer_variables, *model.metrics_variables]:
                variable.assign(jax.device_put(variable.value, device))

    return CommitState()
