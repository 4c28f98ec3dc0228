"""What `--patience` would have done to a finished run: its history replayed through EarlyStopping's rule.

    python scripts/patience_replay.py logs/007/history.csv --patience 5,10,15,20,30

For each patience: the epoch after which Keras's EarlyStopping (mode max,
min_delta 0, on `--monitor`, default val_mAP50) would have ended the run, and
the epoch, mAP@0.5 and mAP@[.5:.95] of the best weights it would have kept.
A run trained with `--patience 0` (every epoch) gives the whole curve
(docs/training.md, "How long").
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from keras_yolo_mgpu.training.callbacks import read_history  # noqa: E402


def stop_epoch(values: list[float], patience: int) -> int | None:
    """The 1-based epoch EarlyStopping ends after (an improvement: strictly above the best so far), or None."""
    best, wait = -math.inf, 0
    for epoch, value in enumerate(values, 1):
        if value > best:
            best, wait = value, 0
        else:
            wait += 1
            if wait >= patience:
                return epoch
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("history", help="a run's history.csv")
    parser.add_argument("--patience", default="5,10,15,20,30", help="comma-separated patiences")
    parser.add_argument("--monitor", default="val_mAP50")
    args = parser.parse_args(argv)
    history = read_history(args.history)
    values = history[args.monitor]
    best = max(range(len(values)), key=values.__getitem__)
    print(f"{len(values)} epochs; best epoch {best + 1}: {values[best]:.3f}")
    print("| patience | stops after epoch | keeps: epoch, mAP@0.5, mAP@[.5:.95] |")
    print("| --- | --- | --- |")
    for patience in (int(p) for p in args.patience.split(",")):
        stop = stop_epoch(values, patience)
        seen = values[: stop or len(values)]
        kept = max(range(len(seen)), key=seen.__getitem__)
        print(
            f"| {patience} | {stop or 'none'} | {kept + 1}, {history['val_mAP50'][kept]:.3f}, "
            f"{history['val_mAP'][kept]:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
