#!/usr/bin/env python3
"""CPU per image of handing a batch over in shared memory: a fresh block per batch against one reused.

    python scripts/shared_block_cost.py --batch-size 32 --input-size 416 --batches 40

What `data/host_processes.py`'s worker and training process do per batch,
without the batch's making: the batch's uint8 images written into a shared
block and copied out of it. "fresh" makes and unlinks a block per batch (the
process feed before 2026-11-26), "reused" writes into one block made once
(`host_processes.BatchSlots`). Prints CPU-ms per image (user + system, this
process) for each, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from multiprocessing import shared_memory

import numpy as np


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--input-size", type=int, default=416)
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args(argv)
    images = np.random.default_rng(0).integers(0, 256, (args.batch_size, args.input_size, args.input_size, 3), np.uint8)
    per_image = 1000.0 / (args.batches * args.batch_size)

    start = _cpu_seconds()
    for _ in range(args.batches):
        block = shared_memory.SharedMemory(create=True, size=images.nbytes)
        np.ndarray(images.shape, images.dtype, block.buf)[...] = images
        name = block.name
        block.close()
        reader = shared_memory.SharedMemory(name=name)
        np.ndarray(images.shape, images.dtype, reader.buf).copy()
        reader.close()
        reader.unlink()
    fresh = (_cpu_seconds() - start) * per_image

    block = shared_memory.SharedMemory(create=True, size=images.nbytes)
    try:
        slot = np.ndarray(images.shape, images.dtype, block.buf)
        slot[...] = images  # its pages faulted in once, as a reused block's are after its first batch
        start = _cpu_seconds()
        for _ in range(args.batches):
            slot[...] = images
            slot.copy()
        reused = (_cpu_seconds() - start) * per_image
        del slot
    finally:
        block.close()
        block.unlink()
    print(f"fresh block per batch: {fresh:.3f} CPU-ms/image; one block reused: {reused:.3f} CPU-ms/image")
    record = {"benchmark": "shared-block-cost", "batch_size": args.batch_size, "input_size": args.input_size}
    record.update(fresh_cpu_ms_per_image=round(fresh, 3), reused_cpu_ms_per_image=round(reused, 3))
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
