"""Images listed twice: within a split, and between training and validation.

An image in both splits makes the validation score (and the best checkpoint
chosen by it) measure images the model trained on; an image listed twice in
one split weighs double. Neither is an error of any one line, so the line
checks (`data.check`) do not see it. Images are the same by path (resolved),
or by content: files of equal size whose bytes are equal (only files whose
size matches another's are read, so the content check costs a `stat` per
image and a read of the rare candidates).
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

# Names shown per finding; the counts are always whole.
SHOWN = 3


@dataclass
class Overlap:
    """What `find_overlap` found.

    Attributes:
        repeated: split name -> image paths listed more than once in it.
        shared: (split a, split b) -> image paths listed in both (by path).
        same_content: (split a, split b) -> (path in a, path in b) pairs of
            different paths with identical bytes.
    """

    repeated: dict[str, list[str]] = field(default_factory=dict)
    shared: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    same_content: dict[tuple[str, str], list[tuple[str, str]]] = field(default_factory=dict)

    @property
    def splits_overlap(self) -> bool:
        return any(self.shared.values()) or any(self.same_content.values())

    def messages(self) -> list[tuple[bool, str]]:
        """(whether it is an overlap between splits, one sentence with its count and the first few names)."""
        lines = []
        for split, paths in self.repeated.items():
            text = f"{len(paths)} image(s) listed more than once in {split} (they weigh double): {_first(paths)}"
            lines.append((False, text))
        for (a, b), paths in self.shared.items():
            lines.append((True, f"{len(paths)} image(s) in both {a} and {b}: {_first(paths)}"))
        for (a, b), pairs in self.same_content.items():
            shown = [f"{x} = {y}" for x, y in pairs]
            lines.append((True, f"{len(pairs)} image(s) of {a} have the same bytes as one of {b}: {_first(shown)}"))
        return lines


def _first(items: Sequence[str]) -> str:
    return ", ".join(items[:SHOWN]) + (f", ... ({len(items) - SHOWN} more)" if len(items) > SHOWN else "")


def _key(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def _digest(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha1(handle.read()).hexdigest()
    except OSError:
        return None


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None  # a missing image is the line checks' report


def _same_content(first: Sequence[str], second: Sequence[str]) -> list[tuple[str, str]]:
    """(path in `first`, path in `second`) pairs of different files with equal bytes."""
    by_size: dict[int, list[str]] = defaultdict(list)
    for path in first:
        size = _size(path)
        if size is not None:
            by_size[size].append(path)
    pairs = []
    digests: dict[str, str | None] = {}
    for path in second:
        size = _size(path)
        candidates = by_size.get(size, []) if size is not None else []
        if not candidates:
            continue
        digest = digests.setdefault(path, _digest(path))
        for candidate in candidates:
            if _key(candidate) != _key(path) and digests.setdefault(candidate, _digest(candidate)) == digest:
                pairs.append((candidate, path))
                break
    return pairs


def find_overlap(splits: dict[str, Sequence[str]], *, by_content: bool = True) -> Overlap:
    """Images repeated within each split and shared between any two splits.

    Args:
        splits: split name (e.g. "train", "val", or a file name) -> the image
            paths of its records, in order.
        by_content: also compare bytes across splits (files of equal size).

    Returns:
        An `Overlap`; findings with nothing in them are left out.
    """
    overlap = Overlap()
    keys = {}
    for name, paths in splits.items():
        seen, repeated = set(), []
        for path in paths:
            key = _key(path)
            if key in seen and path not in repeated:
                repeated.append(path)
            seen.add(key)
        if repeated:
            overlap.repeated[name] = repeated
        keys[name] = seen
    names = list(splits)
    for index, a in enumerate(names):
        for b in names[index + 1 :]:
            shared = [path for path in dict.fromkeys(splits[b]) if _key(path) in keys[a]]
            if shared:
                overlap.shared[(a, b)] = shared
            if by_content:
                pairs = _same_content(list(dict.fromkeys(splits[a])), list(dict.fromkeys(splits[b])))
                if pairs:
                    overlap.same_content[(a, b)] = pairs
    return overlap
