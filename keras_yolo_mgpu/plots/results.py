"""`results.png`: a run's loss, validation mAP and learning rate per epoch, from its history.csv."""

from __future__ import annotations

import os

import numpy as np

from keras_yolo_mgpu.optional import pyplot as plt

__all__ = ["plot_results"]


def _figure(rows: int, columns: int, size):
    plt.matplotlib.use("Agg")  # files, no display; a no-op once set
    figure, axes = plt.subplots(rows, columns, figsize=size, dpi=100)
    return plt, figure, np.atleast_1d(axes).ravel()


def _save(figure, path: str, **options) -> str:
    """Writes `figure` to `path` through a temporary file of the same ending (`savefig`'s `options`); closes it."""
    figure.tight_layout()
    root, extension = os.path.splitext(path)
    temporary = f"{root}.tmp{extension}"
    figure.savefig(temporary, **options)
    plt.close(figure)
    os.replace(temporary, path)
    return path


def _panel(axis, epochs, history, keys, title, log=False):
    drawn = False
    for key, label in keys:
        values = np.asarray(history.get(key, []), np.float64)
        if len(values) and np.isfinite(values).any():
            finite = np.isfinite(values)  # val_mAP only on evaluated epochs
            axis.plot(np.asarray(epochs)[finite], values[finite], marker="o", markersize=3, label=label)
            drawn = True
    axis.set_title(title)
    axis.set_xlabel("epoch")
    axis.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    axis.grid(True, alpha=0.3)
    if not drawn:
        axis.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=axis.transAxes, color="grey")
    else:
        axis.legend(fontsize=8)
        values = np.concatenate([np.asarray(history.get(k, []), np.float64) for k, _ in keys])
        values = values[np.isfinite(values) & (values > 0)]
        if log and len(values) and values.max() > 10 * values.min():  # log only where it spreads the curve
            axis.set_yscale("log")


def plot_results(history: dict[str, list[float]], output_png: str) -> str | None:
    """Draws loss, val_mAP / val_mAP50 and learning rate against the epoch (as history.csv numbers it).

    Args:
        history: a run's history.csv as columns (`training.callbacks.read_history`).

    Returns:
        `output_png`, or None when the history has no epoch yet.
    """
    epochs = history.get("epoch")
    if not epochs:
        return None
    _, figure, axes = _figure(1, 3, (13, 3.6))
    _panel(axes[0], epochs, history, (("loss", "training"), ("val_loss", "validation")), "loss (per image)", log=True)
    _panel(axes[1], epochs, history, (("val_mAP", "mAP@[.5:.95]"), ("val_mAP50", "mAP@.5")), "validation mAP")
    _panel(axes[2], epochs, history, (("learning_rate", "learning rate"),), "learning rate", log=True)
    figure.suptitle(os.path.basename(os.path.dirname(os.path.abspath(output_png))) or "training", fontsize=10)
    return _save(figure, output_png)
