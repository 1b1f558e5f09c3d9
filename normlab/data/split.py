"""Train/validation split that holds out whole works, chosen by a seeded permutation."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np

from normlab.data.corpus import DataError, Work

__all__ = ["split_works"]


def _check_fraction(val_fraction: float) -> float:
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)):
        raise DataError(f"val_fraction must be a number in (0, 0.5], got {val_fraction!r}")
    if not 0.0 < val_fraction <= 0.5:
        raise DataError(
            f"val_fraction must be in (0, 0.5], got {val_fraction}; e.g. use 0.1 to hold out "
            "about a tenth of the text for validation"
        )
    return float(val_fraction)


def split_works(
    works: Sequence[Work], val_fraction: float = 0.1, seed: int = 0
) -> tuple[list[Work], list[Work]]:
    """Split ``works`` into ``(train, val)``, each sorted by name.

    Works are sorted by name (so input order does not matter), permuted with
    ``np.random.default_rng(seed)``, and taken in that order into validation until at
    least ``val_fraction`` of all bytes is held out, always leaving one work for training.
    No work is ever cut in two, so no validation text is seen in training.

    A single work cannot be held out whole: it is then split by position (the last
    ``val_fraction`` of its bytes go to validation, names ``"name[:cut]"`` and
    ``"name[cut:]"``) and a ``UserWarning`` says so.

    Raises:
        DataError: ``val_fraction`` outside (0, 0.5], no works, duplicate names, or a
            single work too short to split.
    """
    fraction = _check_fraction(val_fraction)
    if not works:
        raise DataError("no works to split; the data source produced no text")
    ordered = sorted(works, key=lambda w: w.name)
    names = [w.name for w in ordered]
    if len(set(names)) != len(names):
        raise DataError("work names must be unique to split by work; rename the duplicate files")

    if len(ordered) == 1:
        work = ordered[0]
        n = len(work.text)
        n_val = max(1, math.ceil(fraction * n))
        if n_val >= n:
            raise DataError(
                f"text {work.name!r} has only {n} byte(s); it is too short to split into "
                "train and validation, give more text"
            )
        cut = n - n_val
        warnings.warn(
            f"only one work ({work.name!r}) in the data source, so no whole work can be held "
            f"out: validation is the last {fraction:.0%} of its bytes (from byte {cut}); "
            "give several files or a folder to hold out whole works",
            UserWarning,
            stacklevel=2,
        )
        return (
            [Work(f"{work.name}[:{cut}]", work.text[:cut])],
            [Work(f"{work.name}[{cut}:]", work.text[cut:])],
        )

    total = sum(len(w.text) for w in ordered)
    target = fraction * total
    order = np.random.default_rng(seed).permutation(len(ordered))
    chosen: set[int] = set()
    held = 0
    for index in order[: len(ordered) - 1]:  # always keep at least one training work
        if held >= target:
            break
        chosen.add(int(index))
        held += len(ordered[index].text)
    if held < target:
        warnings.warn(
            f"holding out {held / total:.1%} of the bytes instead of {fraction:.0%}: the one "
            "remaining work must stay in training",
            UserWarning,
            stacklevel=2,
        )
    train = [w for i, w in enumerate(ordered) if i not in chosen]
    val = [w for i, w in enumerate(ordered) if i in chosen]
    return train, val
