"""The feed in worker processes (`--feed processes`, data/host_processes.py): the threads' batches, no orphans.

Batch `k` of a stream is a pure function of `k` and its settings, so worker
processes make the batches worker threads make, bit for bit and in order,
with augmentation, mosaic, multi-scale and a resumed stream position. The
workers end with the process that started them: after Ctrl-C of the trainer,
and after a SIGKILL that gives it no chance to stop them.
"""

import contextlib
import dataclasses
import gc
import logging
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest
from isolation import jax_environment

from keras_yolo_mgpu.data import host_processes
from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.py_dataset import make_py_dataset
from keras_yolo_mgpu.data.shared_image_cache import READY, SharedImageCache
from keras_yolo_mgpu.data.streams import choose_feed
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINING = {"seed": 3, "mosaic": 0.5, "multi_scale": (32, 96), "start_position": 6}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_synthetic_dataset(tmp_path_factory.mktemp("feed"), num_train=12, num_val=4, image_size=64, seed=2)


def _batches(annotations, processes: bool, training: bool, count: int):
    # Validation reads through the RAM cache: with processes, the one block they share.
    options = TRAINING if training else {"cache": "ram"}
    ahead = 2
    feed = make_py_dataset(
        annotations, (64, 64), 4, 4, training=training, workers=2, use_multiprocessing=processes,
        max_queue_size=ahead, **options,
    )  # fmt: skip
    try:
        # Held while more are made: with processes, each batch's arrays are views of its shared block, which
        # must not be lent for another batch meanwhile (the comparison with the threads' batches fails if it is).
        batches = [feed[k] for k in range(count)]
        if processes and training:
            for k in range(count, count + 4 * ahead):
                feed[k]  # dropped at once: its block is reused
            assert 0 < feed.shared_blocks <= count + ahead + 2
        assert feed.batches_in_own_blocks == 0  # every batch came through the shared blocks
        if processes and not training:
            # The workers filled the shared cache (this process never made a batch).
            assert (feed.host.source.shared.table[:, 0] == READY).sum() == len(annotations)
        return batches
    finally:
        feed.close(wait=True)


@pytest.mark.parametrize("training", [True, False], ids=["training", "validation"])
def test_worker_processes_make_the_threads_batches(dataset, training):
    annotations = read_annotations(dataset.train if training else dataset.val)
    count = 4 if training else 1  # the whole validation pass
    threads, processes = (_batches(annotations, kind, training, count) for kind in (False, True))
    for made_in_threads, made_in_processes in zip(threads, processes, strict=True):
        flat = [np.asarray(a) for a in _flatten(made_in_threads)], [np.asarray(a) for a in _flatten(made_in_processes)]
        assert len(flat[0]) == len(flat[1]) >= 4
        for a, b in zip(*flat, strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b)


def test_what_workers_log_is_said_once_by_the_training_process(dataset, tmp_path, caplog):
    # One truncated image under every line: each worker that reads it warns once, in a process of its own.
    first = open(dataset.train).readline().split()
    truncated = tmp_path / "truncated.png"
    whole = open(first[0], "rb").read()
    truncated.write_bytes(whole[: len(whole) // 2])
    (tmp_path / "train.txt").write_text(f"{truncated} {' '.join(first[1:])}\n" * 8)
    annotations = read_annotations(str(tmp_path / "train.txt"))
    feed = make_py_dataset(annotations, (64, 64), 4, 4, training=True, workers=2, use_multiprocessing=True)
    with caplog.at_level(logging.WARNING):
        try:
            for k in range(4):
                feed[k]
        finally:
            feed.close(wait=True)
    said = [record for record in caplog.records if "truncated" in record.getMessage()]
    assert [record.name for record in said] == ["keras_yolo_mgpu.data.images"], caplog.text
    assert str(truncated) in said[0].getMessage()


def test_a_shared_cache_that_cannot_fit_is_refused_with_both_sizes(dataset):
    # Size unknown: room for the whole canvas, 4000 x 8192 x 8192 x 3 bytes.
    annotation = dataclasses.replace(read_annotations(dataset.train)[0], size=None)
    refused = r"4000 decoded images in one shared block, which needs about 805,307 MB of shared memory, but /dev/shm"
    with pytest.raises(ValueError, match=refused):
        SharedImageCache([annotation] * 4000, (8192, 8192), None)


def _flatten(batch):
    x, *rest = batch
    return [x["image"], x["boxes"], x["hsv"], *rest]


# A process holding the feed of worker processes, as the trainer does: it prints the workers' ids once they run.
HOLDER = """
import os, sys, time
import psutil
from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.py_dataset import make_py_dataset
feed = make_py_dataset(read_annotations(sys.argv[1]), (64, 64), 4, 4, training=True, workers=2,
                       use_multiprocessing=True)
feed[0]
print(" ".join(str(child.pid) for child in psutil.Process().children()), flush=True)
time.sleep(300)
"""


def _workers_end(pids, seconds=10.0):
    deadline = time.time() + seconds
    while time.time() < deadline:
        alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        if not alive:
            return []
        time.sleep(0.2)
    return alive


def _steps_done(run_files, steps: int) -> int:
    """The last step of the second epoch that Keras's progress bar (stdout.txt) showed as done; 0 before it."""
    # errors="replace": the copy from the terminal may end inside a character of the bar.
    shown = (run_files / "stdout.txt").read_text(errors="replace").partition("Epoch 2/")[2]
    return max((int(step) for step in re.findall(rf"(\d+)/{steps}\b", shown)), default=0)


@contextlib.contextmanager
def _terminal_into(path):
    """A pseudo-terminal for a child's stdout (yields its fd), copied into `path` as the child writes."""
    leader, follower = pty.openpty()
    out = open(path, "wb")

    def copy():
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: no process holds the terminal any more
                break
            if not data:
                break
            out.write(data)
            out.flush()

    copier = threading.Thread(target=copy, daemon=True)
    copier.start()
    try:
        yield follower
    finally:
        os.close(follower)  # with the child gone too, the copy reads EIO and ends
        copier.join(timeout=30)
        os.close(leader)
        out.close()


def _sigint_as_at_a_terminal():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_no_worker_outlives_the_trainer_after_ctrl_c_or_a_kill(dataset, tmp_path):
    # SIGKILL: the holder cannot stop its workers; their watchdog ends them.
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, dataset.train], stdout=subprocess.PIPE, text=True)
    pids = [int(pid) for pid in holder.stdout.readline().split()]
    assert len(pids) >= 2  # the workers (and the spawn's resource tracker)
    holder.kill()
    holder.wait()
    assert _workers_end(pids) == []

    # Ctrl-C of train.py on JAX with --feed processes and their shared RAM cache, in its second epoch; one image,
    # listed twice (one of the two may be drawn for validation), is truncated: a worker warns of it.
    lines = open(dataset.train).read().splitlines()
    first = lines[0].split()
    truncated = tmp_path / "truncated.png"
    whole = open(first[0], "rb").read()
    truncated.write_bytes(whole[: len(whole) // 2])
    annotations = tmp_path / "train.txt"
    annotations.write_text("".join(f"{line}\n" for line in [" ".join([str(truncated), *first[1:]])] * 2 + lines[1:]))
    # PYTHONFAULTHANDLER: a SIGABRT prints every thread's stack to stderr, read below if the run does not end.
    env = dict(os.environ, **jax_environment(1), PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    steps = 60  # an epoch with more steps left at the Ctrl-C than XLA queues (32)
    command = [
        *(sys.executable, os.path.join(REPO, "train.py"), "--annotations", str(annotations), "--classes"),
        *(dataset.classes, "--tiny", "--input-size", "64", "--batch-size", "4", "--epochs", "50", "--seed", "0"),
        *("--feed", "processes", "--workers", "2", "--cache", "ram", "--no-pictures", "--steps-per-epoch", str(steps)),
        *("--log-dir", str(tmp_path / "run")),
    ]
    # Its messages into a file, its progress bar through a terminal into another (`_terminal_into`): a pipe
    # nobody reads while it runs could fill and stop it, and only at a terminal does the bar count the steps.
    with open(tmp_path / "stderr.txt", "w+") as stderr, _terminal_into(tmp_path / "stdout.txt") as stdout:
        # Ctrl-C as at a terminal: a suite started in the background of a script (`make test &`) ignores SIGINT, and
        # its children inherit that, so the trainer would rightly train on (seen 2026-11-28).
        trainer = subprocess.Popen(
            command, env=env, cwd=REPO, stdout=stdout, stderr=stderr, preexec_fn=_sigint_as_at_a_terminal
        )
        process, workers, deadline = psutil.Process(trainer.pid), [], time.time() + 240
        warned = f"WARNING keras_yolo_mgpu.data.images: {truncated} is truncated"
        while time.time() < deadline and trainer.poll() is None:
            workers = [child.pid for child in process.children(recursive=True)] or workers
            epoch_done = (tmp_path / "run" / "history.csv").exists()
            if epoch_done and warned in (tmp_path / "stderr.txt").read_text() and _steps_done(tmp_path, steps) >= 10:
                break
            time.sleep(0.2)
        assert trainer.poll() is None and len(workers) >= 2, (tmp_path / "stderr.txt").read_text()[-3000:]
        done_at_interrupt = _steps_done(tmp_path, steps)
        trainer.send_signal(signal.SIGINT)
        try:
            trainer.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # One Ctrl-C did not always end a loaded run (seen in the suite on the 2-core machine, 2026-11-26,
            # with the messages in an unread pipe; not since): a user's second Ctrl-C must.
            trainer.send_signal(signal.SIGINT)
            try:
                trainer.wait(timeout=60)
            except subprocess.TimeoutExpired:
                trainer.send_signal(signal.SIGABRT)
                trainer.wait(timeout=30)
                stacks = (tmp_path / "stderr.txt").read_text()
                raise AssertionError(f"two Ctrl-C did not end the run; its threads:\n{stacks[-12000:]}") from None
        messages = (tmp_path / "stderr.txt").read_text()
    # Said as an interruption, not as the TypeError of Keras's clean-up after a first step that never finished
    # (Python may also print a Ctrl-C it ignored in JAX's garbage-collection callback: training.callbacks).
    assert trainer.returncode == 130 and "interrupted" in messages and "TypeError" not in messages, messages[-3000:]
    # What the run keeps and how to continue it, said once: the first epoch's state is saved.
    kept = f"the run stopped; {tmp_path / 'run'} keeps the weights it saved (last.weights.h5, best.weights.h5)."
    assert messages.count(kept) == 1, messages[-3000:]
    assert f"python train.py --resume {tmp_path / 'run'} continues it from epoch 2 of 50 " in messages
    # Only the few steps dispatched ahead (DispatchLimit) ran after the Ctrl-C: without the bound the step loop
    # had queued up to XLA's 32 programs, each run before the process could end.
    after = _steps_done(tmp_path, steps) - done_at_interrupt
    assert done_at_interrupt < steps - 40 and after <= 6, (done_at_interrupt, after)
    # The worker's warning, said by the trainer in its format, once.
    assert messages.count(warned) == 1 and messages.count(f"{truncated} is truncated") == 1, messages[-3000:]
    assert _workers_end(workers) == []


@pytest.mark.parametrize(
    "feed, workers, on_accelerators, cores, chosen",
    [
        ("auto", None, True, 16, "processes"),  # a GPU host: one process per core
        ("auto", 2, True, 1, "processes"),  # two workers asked for
        ("auto", None, True, 1, "threads"),  # one core: one worker, no process to start
        ("auto", None, False, 16, "threads"),  # the step computes on the cores the workers would share
        ("threads", None, True, 16, "threads"),  # a feed given is kept
        ("processes", None, False, 1, "processes"),
    ],
)
def test_the_default_feed_is_chosen_by_devices_and_cores(feed, workers, on_accelerators, cores, chosen):
    assert choose_feed(feed, workers, on_accelerators, cores)[0] == chosen


def test_a_lent_batch_freed_by_the_collector_inside_take_does_not_deadlock():
    # A batch's arrays caught in a reference cycle (a traceback's, after Ctrl-C) are freed by the garbage
    # collector in whichever thread allocates next: here a thread inside `take`, holding the slots' lock.
    slots = host_processes.BatchSlots(2, 64)
    slot = slots.take()
    layout = [((2, 2), np.dtype(np.uint8).str, 0), ((1, 4), np.dtype(np.float32).str, 0), ((2,), "<f4", 0)]
    batch = host_processes.take_batch((slot, layout, False), slots, slot)
    cycle = [batch]
    cycle.append(cycle)
    del batch, cycle
    taken = []

    def take_while_collecting():
        with slots._lock:  # as `take` holds it when its block allocation starts a collection
            gc.collect()
            taken.append(slots.take())

    thread = threading.Thread(target=take_while_collecting, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "the finalizer waited on the lock its own thread held"
    assert taken == [slot]  # the block came back, and was lent again
    slots.close()


@pytest.mark.slow
def test_a_worker_killed_midway_ends_the_run_in_one_paragraph_that_keeps_its_weights(dataset, tmp_path):
    """A worker process ended by SIGKILL, as the kernel's out-of-memory killer ends one: train.py says so in one
    paragraph with the batch's size and what uses less memory, keeps the epochs it saved, and no worker is left."""
    run = tmp_path / "run"
    command = [
        *(sys.executable, os.path.join(REPO, "train.py"), "--annotations", dataset.train, "--classes"),
        *(dataset.classes, "--tiny", "--input-size", "64", "--batch-size", "4", "--epochs", "50", "--seed", "0"),
        *("--feed", "processes", "--workers", "2", "--no-pictures", "--steps-per-epoch", "4", "--quiet"),
        *("--log-dir", str(run)),
    ]
    env = dict(os.environ, **jax_environment(1), PYTHONUNBUFFERED="1")
    with open(tmp_path / "stderr.txt", "w+") as stderr:
        trainer = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr)
        process, deadline, workers = psutil.Process(trainer.pid), time.time() + 240, []
        while time.time() < deadline and trainer.poll() is None and not (run / "last.weights.h5").exists():
            time.sleep(0.2)
        with contextlib.suppress(psutil.NoSuchProcess):
            workers = [child for child in process.children() if "spawn_main" in " ".join(child.cmdline())]
        assert trainer.poll() is None and len(workers) == 2, (tmp_path / "stderr.txt").read_text()[-3000:]
        workers[0].kill()
        trainer.wait(timeout=120)
        messages = (tmp_path / "stderr.txt").read_text()
    assert trainer.returncode == 1 and "Traceback" not in messages, messages[-3000:]
    paragraph = (
        "error: a worker process making batches ended abruptly: killed (on Linux most often by the kernel's "
        "out-of-memory killer when the host's memory runs out; `dmesg` names the process it killed) or crashed, at "
        "global batch 4 (64x64 input): one batch's images alone take 48 KiB, and several are made ahead. To use less "
        "of the host's memory: --batch-size 2, fewer --workers, --feed threads, or no --cache ram. The run folder "
        f"{run} keeps what it saved (--resume {run} goes on)."
    )
    assert paragraph in messages, messages[-3000:]
    assert (run / "last.weights.h5").is_file()
    assert _workers_end([worker.pid for worker in workers]) == []
