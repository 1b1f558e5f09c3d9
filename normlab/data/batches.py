"""In-memory token arrays and stateless, seeded batch sampling for next-token prediction.

Works are concatenated into one contiguous ``np.uint8`` array with ``SEPARATOR``
(``b"\\n\\n"``, a blank line) between consecutive works, so a training window may
straddle the end of one work and the start of the next, exactly as with one long file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np
import torch

from normlab.data.corpus import DEFAULT_CORPUS, DataError, Source, Work, load_works
from normlab.data.split import split_works

__all__ = [
    "SEPARATOR",
    "BatchSampler",
    "Span",
    "TextData",
    "TokenArray",
    "eval_batches",
    "load_text_data",
]

SEPARATOR = b"\n\n"
"""Bytes inserted between consecutive works in a :class:`TokenArray`."""

Batch = tuple[torch.Tensor, torch.Tensor]


class Span(NamedTuple):
    """Where one work lies in a :class:`TokenArray`: ``data[start:end]`` is its text."""

    name: str
    start: int
    end: int


class TokenArray:
    """One contiguous read-only ``np.uint8`` token array plus the spans of its works.

    ``label`` (e.g. ``"val split of shakespeare"``) is used in error messages.
    """

    def __init__(self, data: np.ndarray, spans: Sequence[Span], label: str = "data") -> None:
        array = np.ascontiguousarray(data, dtype=np.uint8)
        if array.ndim != 1:
            raise DataError(f"{label}: token array must be 1-D, got shape {array.shape}")
        self.data: np.ndarray = array
        self.spans: tuple[Span, ...] = tuple(spans)
        self.label = label

    @classmethod
    def from_works(cls, works: Sequence[Work], label: str = "data") -> TokenArray:
        """Concatenate the works' bytes with :data:`SEPARATOR` between them."""
        if not works:
            raise DataError(f"{label}: no works to build a token array from")
        spans: list[Span] = []
        pos = 0
        for i, work in enumerate(works):
            if i:
                pos += len(SEPARATOR)
            spans.append(Span(work.name, pos, pos + len(work.text)))
            pos += len(work.text)
        joined = SEPARATOR.join(w.text for w in works)
        return cls(np.frombuffer(joined, dtype=np.uint8), spans, label)

    @property
    def names(self) -> list[str]:
        """Names of the works, in array order."""
        return [s.name for s in self.spans]

    def __len__(self) -> int:
        return int(self.data.shape[0])

    @cached_property
    def unigram_entropy(self) -> float:
        """Entropy in nats of the byte frequencies of this array (computed once): the loss of the
        best predictor that ignores context, the plateau a language model starts from."""
        counts = np.bincount(self.data)
        p = counts[counts > 0] / len(self)
        return float(-(p * np.log(p)).sum())

    def __repr__(self) -> str:
        return f"TokenArray({self.label!r}, {len(self)} bytes, {len(self.spans)} works)"


def _positive_int(value: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise DataError(f"{field} must be a positive integer, got {value!r}")
    return int(value)


class BatchSampler:
    """Random windows ``(x, y)`` of shape ``[batch_size, seq_len]``; ``y`` is ``x`` shifted by 1.

    Sampling is stateless: the window starts for step ``i`` come only from
    ``np.random.default_rng([seed, i])``, so ``batch(i)`` is the same whenever and in
    whatever order it is called, and a resumed run reproduces its batches from the step.
    """

    def __init__(self, tokens: TokenArray, batch_size: int, seq_len: int, seed: int) -> None:
        self.batch_size = _positive_int(batch_size, "batch_size")
        self.seq_len = _positive_int(seq_len, "seq_len")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise DataError(f"seed must be a non-negative integer, got {seed!r}")
        self.seed = int(seed)
        need = self.seq_len + 1
        if len(tokens) < need:
            raise DataError(
                f"the {tokens.label} has {len(tokens)} bytes but seq_len={self.seq_len} needs "
                f"at least {need}; lower seq_len, give more text, or change val_fraction"
            )
        self.tokens = tokens
        self._window = np.arange(need, dtype=np.int64)

    def offsets(self, step: int) -> np.ndarray:
        """Start positions (``int64``, shape ``[batch_size]``) of the windows for ``step``."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise DataError(f"step must be a non-negative integer, got {step!r}")
        rng = np.random.default_rng([self.seed, int(step)])
        high = len(self.tokens) - self.seq_len  # exclusive: last start leaves room for y
        return rng.integers(0, high, size=self.batch_size, dtype=np.int64)

    def batch(self, step: int) -> Batch:
        """Return ``(x, y)``: contiguous ``int64`` CPU tensors, shape ``[batch_size, seq_len]``."""
        windows = self.tokens.data[self.offsets(step)[:, None] + self._window]
        full = torch.from_numpy(windows).long()
        return full[:, :-1].contiguous(), full[:, 1:].contiguous()

    __call__ = batch


def eval_batches(
    tokens: TokenArray, batch_size: int, seq_len: int, n_batches: int, seed: int
) -> list[Batch]:
    """A fixed list of ``n_batches`` validation batches (identical on every call)."""
    count = _positive_int(n_batches, "n_batches")
    sampler = BatchSampler(tokens, batch_size, seq_len, seed)
    return [sampler.batch(i) for i in range(count)]


@dataclass
class TextData:
    """Train/validation token arrays and the names of the works on each side.

    The trainers read a run's data through `sampler`, `val_batches`, `unigram_entropy`,
    `accuracy`, `masked_targets` and `meta`, which a synthetic task's data
    (`normlab.data.khop.KhopData`) has too.
    """

    train: TokenArray
    val: TokenArray
    train_works: list[str]
    val_works: list[str]

    def sampler(self, batch_size: int, seq_len: int, seed: int) -> BatchSampler:
        """The training batches of a run with this seed."""
        return BatchSampler(self.train, batch_size, seq_len, seed)

    def val_batches(self, batch_size: int, seq_len: int, n_batches: int, seed: int
                    ) -> list[Batch]:
        """The fixed validation batches of a run with this seed (see `eval_batches`)."""
        return eval_batches(self.val, batch_size, seq_len, n_batches, seed)

    @property
    def unigram_entropy(self) -> float:
        """Of the training bytes: the loss a context-free predictor reaches (`stalled`)."""
        return self.train.unigram_entropy

    def accuracy(self) -> None:
        """Text has no accuracy metric (a synthetic task's data returns its accumulator)."""
        return None

    @property
    def masked_targets(self) -> bool:
        """Whether some targets are ignored (-100); never in text: every byte is predicted."""
        return False

    def meta(self) -> dict[str, list[str]]:
        """What config.yaml's `meta` records about the data: the works on each side."""
        return {"train_works": self.train_works, "val_works": self.val_works}


def _describe(source: Source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    parts = [str(s) for s in source]
    return ", ".join(parts) if len(parts) <= 3 else ", ".join(parts[:3]) + ", ..."


def load_text_data(
    source: Source = DEFAULT_CORPUS, val_fraction: float = 0.1, seed: int = 0
) -> TextData:
    """Load ``source`` (see :func:`load_works`), split it by whole works, and tokenise."""
    works = load_works(source)
    train, val = split_works(works, val_fraction=val_fraction, seed=seed)
    where = _describe(source)
    return TextData(
        train=TokenArray.from_works(train, label=f"train split of {where}"),
        val=TokenArray.from_works(val, label=f"val split of {where}"),
        train_works=[w.name for w in train],
        val_works=[w.name for w in val],
    )
