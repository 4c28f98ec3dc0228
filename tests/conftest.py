"""Test configuration: split the CPU into logical devices before TF starts.

Multi-device equivalence tests need several devices on a 2-core machine with
no GPU. TensorFlow only accepts a logical-device layout before it initialises
its devices, so `pytest_configure` does it before any test module is
collected (and imports code that touches TensorFlow). Under pytest-xdist the
controller collects and runs nothing: it never imports TensorFlow (~0.7 GB
saved of the suite's memory); each worker splits its own CPU.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Equivalence tests compare weights to 1e-5; oneDNN's reordered float sums
# are deterministic per shape but differ between batch sizes, so keep them
# off in tests for the cleanest comparison.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
# glibc gives each thread that allocates its own arena (up to 8 per core),
# and TensorFlow's thread pools keep freed memory in all of them. Two arenas
# per process cut a float64 replica child's peak by ~10 % at the same speed
# (4.3 -> 3.9 GB, 66 s either way, 2026-11-25). Set here, before the xdist
# workers and their children start: glibc reads it when a process starts.
os.environ.setdefault("MALLOC_ARENA_MAX", "2")

import shutil  # noqa: E402
import tempfile  # noqa: E402

import psutil  # noqa: E402
import pytest  # noqa: E402
from isolation import JAX_CACHE_VARIABLE, configure_test_devices, logical_device_names  # noqa: E402
from memory_report import TreeMemorySampler, largest_growths, record_module_growth, release_memory  # noqa: E402

_sampler = None
SCAN_CACHE_VARIABLE = "KERAS_YOLO_MGPU_CACHE"  # data.scan.CACHE_ENV, named here before the package is imported
# Each test module's resident growth in its worker, one line per module:
# set by the controller, inherited by the workers it starts.
_GROWTH_LOG = "KERAS_YOLO_TEST_MEMORY_LOG"


def _is_xdist_controller(config) -> bool:
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than ~20 s; still run by `make test`")
    global _sampler
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist), not a worker
        _sampler = TreeMemorySampler()
        _sampler.start()
        os.environ[_GROWTH_LOG] = tempfile.mkstemp(prefix="test-memory-", suffix=".tsv")[1]
        # One JAX compilation cache for every JAX process of this test run
        # (inherited by the workers and their children, isolation.jax_environment).
        os.environ.setdefault(JAX_CACHE_VARIABLE, tempfile.mkdtemp(prefix="test-jax-cache-"))
        # The commands' scan records (data/scan.py) go to a folder of this test run, not the user's cache.
        os.environ[SCAN_CACHE_VARIABLE] = tempfile.mkdtemp(prefix="test-scan-cache-")
    if not _is_xdist_controller(config):
        configure_test_devices()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Whole work units, longest first (tests/scheduling.py)."""
    from scheduling import GroupedLoadScheduling

    return GroupedLoadScheduling(config, log)


def pytest_terminal_summary(terminalreporter):
    if _sampler is not None:
        terminalreporter.write_line(_sampler.summary())
        terminalreporter.write_line(largest_growths(os.environ[_GROWTH_LOG]))
        os.remove(os.environ[_GROWTH_LOG])
        shutil.rmtree(os.environ.get(JAX_CACHE_VARIABLE, ""), ignore_errors=True)
        shutil.rmtree(os.environ.get(SCAN_CACHE_VARIABLE, ""), ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def _release_memory_after_each_module(request):
    """Gives back what each test module freed, and logs what it kept (the summary names the largest)."""
    process = psutil.Process()
    before = process.memory_info().rss
    yield
    release_memory()
    log = os.environ.get(_GROWTH_LOG)
    if log:
        record_module_growth(log, request.module.__name__, before, process.memory_info().rss)


@pytest.fixture
def logical_cpus():
    """Names of the logical CPU devices, e.g. ['/device:CPU:0', ...] (GPUs with KERAS_YOLO_TEST_DEVICES=GPU)."""
    return logical_device_names()
