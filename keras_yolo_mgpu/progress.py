"""Progress of a long loop: tqdm's bar on a terminal, a log line every half minute in a log file.

A bar written to a file (`yolo_video.py clip.mp4 out.mp4 > log.txt`, nohup, a
batch job) keeps every redraw, ten a second, on one line joined by carriage
returns. In a file the loop's progress is a log line instead, as training's
is one line per epoch there.
"""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

logger = logging.getLogger(__name__)

LOG_INTERVAL_SECONDS = 30.0


def is_interactive(stream) -> bool:
    """Whether `stream` is watched as it is written: a terminal, or a notebook (whose streams are no terminal)."""
    return stream.isatty() or "ipykernel" in sys.modules


class LoggedProgress:
    """tqdm's `update`, `set_postfix`, `close` and `with`, as an INFO line every `interval` seconds.

    The line: "detect: N of M frames (P %), R frame/s, about T min left".
    Nothing is logged at the end: the commands log their own summary.
    """

    def __init__(self, total: int | None, *, unit: str, desc: str, byte_sizes: bool = False, interval: float):
        self.total = total
        self.n = 0
        self._unit, self._desc, self._byte_sizes, self._interval = unit, desc, byte_sizes, interval
        self._start = self._last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= self._interval:
            self._last = now
            logger.info("%s: %s", self._desc, self.describe(now - self._start))

    def describe(self, elapsed: float) -> str:
        """The line's text after `elapsed` seconds."""
        rate = self.n / elapsed if elapsed > 0 else 0.0
        if self.total:
            text = (
                f"{self._amount(self.n, unit=False)} of {self._amount(self.total)} ({100 * self.n / self.total:.0f} %)"
            )
        else:
            text = self._amount(self.n)
        text += f", {self._amount(rate)}/s" if self._byte_sizes else f", {rate:.1f} {self._unit}/s"
        if self.total and rate > 0 and self.n < self.total:
            text += f", about {(self.total - self.n) / rate / 60:.1f} min left"
        return text

    def _amount(self, count: float, unit: bool = True) -> str:
        if self._byte_sizes:
            return tqdm.format_sizeof(count, suffix="B", divisor=1024)
        return f"{int(count):,} {self._unit}s" if unit else f"{int(count):,}"

    def set_postfix(self, *args, **kwargs) -> None:
        """The bar's extra fields (its frame rate): the line has the rate already."""

    def close(self) -> None:
        """Nothing to close: no line is left open."""

    def __enter__(self) -> LoggedProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_bar(
    total: int | None, *, unit: str, desc: str, enabled: bool = True, byte_sizes: bool = False, **tqdm_options
):
    """A progress display for `total` items: tqdm's bar on a terminal or in a notebook, `LoggedProgress` in a file.

    Args:
        total: the number of items, or None when unknown (a stream).
        unit: an item's name ("image", "frame"); with `byte_sizes`, the items are bytes.
        desc: what is done ("detect"), the bar's and the line's start.
        enabled: False (`--no-progress`): a bar that shows nothing.
        tqdm_options: more of tqdm's options, for the bar on a terminal.

    Returns:
        an object with tqdm's `update`, `set_postfix`, `close` and `with`.
    """
    if not enabled:
        return tqdm(total=total, disable=True)
    if not is_interactive(sys.stderr):
        return LoggedProgress(total, unit=unit, desc=desc, byte_sizes=byte_sizes, interval=LOG_INTERVAL_SECONDS)
    if byte_sizes:
        tqdm_options = {"unit_scale": True, "unit_divisor": 1024, **tqdm_options}
    return tqdm(total=total, unit="B" if byte_sizes else unit, desc=desc, file=sys.stderr, **tqdm_options)
