"""In-memory token arrays and stateless, seeded batch sampling for next-token prediction.

Works are concatenated into one contiguous ``np.uint8`` array with ``SEPARATOR``
(``b"\\n\\n"``, a blank line) between consecutive works, so a training window may
straddle the end of one work and the start of the next, exactly as with one long file.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from normlab.data.corpus import DataError, Work
from normlab.data.tokenizer import BYTE, ByteTokenizer, Tokenizer, describe

__all__ = [
    "SEPARATOR",
    "BatchSampler",
    "Span",
    "TextData",
    "TokenArray",
    "eval_batches",
]

SEPARATOR = b"\n\n"
"""Bytes inserted between consecutive works in a :class:`TokenArray`."""

Batch = tuple[torch.Tensor, torch.Tensor]
TOKEN_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32))
CHUNK = 1 << 24  # tokens read at a time when a whole array is scanned
# A token array up to this size is copied once to the accelerator a run trains on, and each
# step's windows are gathered there (`BatchSampler.to`); a larger one (a memory-mapped corpus)
# stays in host memory and each batch is copied instead. The device copy holds uint8 as uint8,
# uint16 as int32 and uint32 as int64 (the integer types torch indexes on every device).
DEVICE_TOKENS_MAX_BYTES = 1 << 28
_DEVICE_DTYPES = {np.dtype(np.uint8): np.dtype(np.uint8), np.dtype(np.uint16): np.dtype(np.int32),
                  np.dtype(np.uint32): np.dtype(np.int64)}


class Span(NamedTuple):
    """Where one work lies in a :class:`TokenArray`: ``data[start:end]`` is its text."""

    name: str
    start: int
    end: int


class TokenArray:
    """One contiguous read-only token array (``np.uint8`` bytes, or ``uint16``/``uint32`` ids,
    possibly a memory map) plus the spans of its works.

    ``label`` (e.g. ``"val split of shakespeare"``) is used in error messages; ``path`` is the
    file a memory-mapped array reads (None otherwise).
    """

    path: Path | None = None

    def __init__(self, data: np.ndarray, spans: Sequence[Span], label: str = "data") -> None:
        if data.dtype in TOKEN_DTYPES and data.ndim == 1 and data.flags.c_contiguous:
            array = data  # (kept as it is: a memory map stays one)
        else:
            array = np.ascontiguousarray(data, dtype=np.uint8)
        if array.ndim != 1:
            raise DataError(f"{label}: token array must be 1-D, got shape {array.shape}")
        self.data: np.ndarray = array
        self.spans: tuple[Span, ...] = tuple(spans)
        self.label = label
        self._on_device: dict[torch.device, torch.Tensor] = {}

    @classmethod
    def from_works(cls, works: Sequence[Work], label: str = "data",
                   tokenizer: Tokenizer | None = None) -> TokenArray:
        """Concatenate the works' tokens with :data:`SEPARATOR`'s between them (bytes, or the
        ids of `tokenizer`, which encodes each work on its own)."""
        if not works:
            raise DataError(f"{label}: no works to build a token array from")
        if tokenizer is not None and tokenizer.spec != BYTE:
            parts = tokenizer.encode_many([w.text for w in works])
            sep = tokenizer.encode(SEPARATOR)
        else:
            parts = [np.frombuffer(w.text, dtype=np.uint8) for w in works]
            sep = np.frombuffer(SEPARATOR, dtype=np.uint8)
        spans: list[Span] = []
        pieces: list[np.ndarray] = []
        pos = 0
        for i, (work, ids) in enumerate(zip(works, parts, strict=True)):
            if i:
                pieces.append(sep)
                pos += len(sep)
            spans.append(Span(work.name, pos, pos + len(ids)))
            pieces.append(ids)
            pos += len(ids)
        joined = np.concatenate(pieces) if len(pieces) > 1 else pieces[0].copy()
        joined.flags.writeable = False
        return cls(joined, spans, label)

    @property
    def unit(self) -> str:
        """What a token is, for messages: bytes (a byte array) or tokens."""
        return "bytes" if self.data.dtype == np.uint8 else "tokens"

    @property
    def names(self) -> list[str]:
        """Names of the works, in array order."""
        return [s.name for s in self.spans]

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def device_bytes(self) -> int:
        """Bytes of the array's copy on a device (`on_device`)."""
        return len(self) * _DEVICE_DTYPES[self.data.dtype].itemsize

    def on_device(self, device: torch.device) -> torch.Tensor:
        """The array as a tensor on `device`, copied once and shared by every sampler of it."""
        if device not in self._on_device:
            host = self.data.astype(_DEVICE_DTYPES[self.data.dtype])  # (a writable copy)
            self._on_device[device] = torch.from_numpy(host).to(device)
        return self._on_device[device]

    @cached_property
    def unigram_entropy(self) -> float:
        """Entropy in nats of the token frequencies of this array (computed once): the loss of
        the best predictor that ignores context, the plateau a language model starts from."""
        counts = np.zeros(0, dtype=np.int64)
        for start in range(0, len(self), CHUNK):  # (a memory map is read a chunk at a time)
            part = np.bincount(self.data[start:start + CHUNK])
            if len(part) > len(counts):
                part[:len(counts)] += counts
                counts = part
            else:
                counts[:len(part)] += part
        p = counts[counts > 0] / len(self)
        return float(-(p * np.log(p)).sum())

    @cached_property
    def max_id(self) -> int:
        """The largest token id in the array (computed once, a chunk at a time)."""
        return max(int(self.data[s:s + CHUNK].max()) for s in range(0, len(self), CHUNK))

    def first_at_or_above(self, limit: int) -> tuple[int, int] | None:
        """(position, id) of the first token id >= `limit`, or None."""
        if len(self) == 0 or self.max_id < limit:
            return None
        for start in range(0, len(self), CHUNK):
            hits = np.flatnonzero(self.data[start:start + CHUNK] >= limit)
            if hits.size:
                pos = start + int(hits[0])
                return pos, int(self.data[pos])
        return None

    def __repr__(self) -> str:
        return f"TokenArray({self.label!r}, {len(self)} {self.unit}, {len(self.spans)} works)"


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
                f"the {tokens.label} has {len(tokens)} {tokens.unit} but seq_len={self.seq_len} "
                f"needs at least {need}; lower seq_len, give more text, or change val_fraction"
            )
        self.tokens = tokens
        self._window = np.arange(need, dtype=np.int64)
        self.device: torch.device | None = None  # where `batch` gathers (None: numpy, on host)

    def to(self, device: torch.device | str) -> BatchSampler:
        """This sampler with its batches gathered on `device` from the token array's copy there
        (`TokenArray.on_device`): the same windows as here, so a step copies only its window
        starts to the device, not its batch. An array above `DEVICE_TOKENS_MAX_BYTES` stays on
        the host: then this sampler itself is returned."""
        if self.tokens.device_bytes() > DEVICE_TOKENS_MAX_BYTES:
            return self
        out = copy.copy(self)
        out.device = torch.device(device)
        out._window_on_device = torch.from_numpy(self._window).to(out.device)
        return out

    def offsets(self, step: int) -> np.ndarray:
        """Start positions (``int64``, shape ``[batch_size]``) of the windows for ``step``."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise DataError(f"step must be a non-negative integer, got {step!r}")
        rng = np.random.default_rng([self.seed, int(step)])
        high = len(self.tokens) - self.seq_len  # exclusive: last start leaves room for y
        return rng.integers(0, high, size=self.batch_size, dtype=np.int64)

    def batch(self, step: int) -> Batch:
        """Return ``(x, y)``: contiguous ``int64`` tensors, shape ``[batch_size, seq_len]``, on the
        CPU (or on the sampler's device: `to`)."""
        return self.windows(self.offsets(step))

    __call__ = batch

    def windows(self, starts: np.ndarray) -> Batch:
        """``(x, y)`` of the windows that begin at `starts` (int64, any shape: ``[batch_size]``
        for a step, ``[members, batch_size]`` for a group), each ``starts.shape + [seq_len]``,
        gathered from the host array or, after `to`, from its copy on the device."""
        if self.device is not None:
            on_host = torch.from_numpy(starts)
            if self.device.type == "cuda":  # copied without waiting for the device
                on_host = on_host.pin_memory()
            there = on_host.to(self.device, non_blocking=True)
            tokens = self.tokens.on_device(self.device)
            full = tokens[there[..., None] + self._window_on_device].long()
        else:
            full = torch.from_numpy(self.tokens.data[starts[..., None] + self._window]
                                    .astype(np.int64, copy=False))
        return full[..., :-1].contiguous(), full[..., 1:].contiguous()


def stacked_batch(samplers: Sequence[Any], steps: Sequence[int]) -> Batch:
    """Each sampler's batch of its step, stacked: ``(x, y)`` of shape ``[members, batch_size,
    seq_len]``, as a stacked group trains (`normlab.train.group`). Samplers of one token array and
    one shape, gathering in one place (the host, or one device: `BatchSampler.to`), draw their
    window starts each from its own seed and step and gather them all in one indexing: the same
    windows their `batch` gives, in a few operations rather than a few per member (on a GPU, a
    few launches). Other samplers give their batches one by one, stacked."""
    first = samplers[0]
    if all(s.__class__ is BatchSampler and s.device == first.device
           and s.tokens is first.tokens and s.seq_len == first.seq_len
           and s.batch_size == first.batch_size for s in samplers):
        return first.windows(np.stack([s.offsets(step)
                                       for s, step in zip(samplers, steps, strict=True)]))
    pairs = [s.batch(step) for s, step in zip(samplers, steps, strict=True)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


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
    `accuracy`, `masked_targets`, `bits_per_byte` and `meta`, which a synthetic task's data
    (`normlab.data.khop.KhopData`) has too. `tokenizer` turns text into the arrays' ids (None for
    token files that name none); `vocab_size` is the number of ids the data may hold (the
    tokenizer's, or what the token files' meta.json states; None: not stated); `val_bytes` is the
    length in bytes of the held-out text (None: not known), for `bits_per_byte`.
    """

    train: TokenArray
    val: TokenArray
    train_works: list[str]
    val_works: list[str]
    tokenizer: Tokenizer | None = field(default_factory=ByteTokenizer)
    vocab_size: int | None = None
    val_bytes: int | None = None
    source_meta: dict[str, Any] = field(default_factory=dict)
    fingerprint: dict[str, dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.vocab_size is None and self.tokenizer is not None:
            self.vocab_size = self.tokenizer.vocab_size

    def sampler(self, batch_size: int, seq_len: int, seed: int) -> BatchSampler:
        """The training batches of a run with this seed."""
        return BatchSampler(self.train, batch_size, seq_len, seed)

    def val_batches(self, batch_size: int, seq_len: int, n_batches: int, seed: int
                    ) -> list[Batch]:
        """The fixed validation batches of a run with this seed (see `eval_batches`)."""
        return eval_batches(self.val, batch_size, seq_len, n_batches, seed)

    @property
    def unigram_entropy(self) -> float:
        """Of the training tokens: the loss a context-free predictor reaches (`stalled`)."""
        return self.train.unigram_entropy

    @property
    def tokens_per_byte(self) -> float | None:
        """Held-out tokens per byte of held-out text (None when its bytes are not known)."""
        if not self.val_bytes:
            return None
        return len(self.val) / self.val_bytes

    def bits_per_byte(self, loss: float) -> float | None:
        """A validation loss in nats per token as bits per byte of the held-out text:
        ``loss / ln 2 * tokens / bytes`` over the whole held-out split, so runs with different
        tokenizers compare (for bytes it is ``loss / ln 2``); None when the bytes are not known."""
        ratio = self.tokens_per_byte
        if ratio is None or loss is None:
            return None
        return float(loss) / math.log(2) * ratio

    def accuracy(self) -> None:
        """Text has no accuracy metric (a synthetic task's data returns its accumulator)."""
        return None

    @property
    def masked_targets(self) -> bool:
        """Whether some targets are ignored (-100); never in text: every token is predicted."""
        return False

    def meta(self) -> dict[str, Any]:
        """What config.yaml's `meta` records about the data: the works on each side, the
        tokenizer and the token files when they are not bytes read from text, and the
        fingerprint of the files read (`data_fingerprint`, see `normlab.data.fingerprint`)."""
        out: dict[str, Any] = {"train_works": self.train_works, "val_works": self.val_works}
        if self.tokenizer is not None and self.tokenizer.spec != BYTE:
            out.update(describe(self.tokenizer))
        out |= self.source_meta
        if self.fingerprint is not None:
            out["data_fingerprint"] = self.fingerprint
        return out

    def save_tokenizer(self, run_dir: Path) -> None:
        """Put the run's tokenizer in its folder as tokenizer.json (bytes need none), where
        `normlab sample` and the probes read it."""
        if self.tokenizer is not None and self.tokenizer.spec != BYTE:
            self.tokenizer.save(run_dir)

    def check_vocab(self, model_vocab: int) -> None:
        """`DataError` when the model cannot read these ids: a vocabulary smaller than the
        tokenizer's (or the token files' stated one), or a token id at or above either."""
        what = (f"tokenizer {self.tokenizer.spec!r}" if self.tokenizer is not None
                else "token files")
        if self.vocab_size is not None and model_vocab < self.vocab_size:
            raise DataError(
                f"model.vocab_size: {model_vocab} is smaller than the {self.vocab_size} tokens of "
                f"the {what}; set model.vocab_size: {self.vocab_size}")
        limit = min(model_vocab, self.vocab_size or model_vocab)
        for array in (self.train, self.val):
            if getattr(array, "path", None) is None:
                continue  # (ids a tokenizer made here lie below its vocabulary)
            bad = array.first_at_or_above(limit)
            if bad is not None:
                pos, value = bad
                stated = (f"the vocabulary of {self.vocab_size} tokens stated for them"
                          if self.vocab_size is not None and limit == self.vocab_size else
                          f"model.vocab_size={model_vocab}")
                raise DataError(
                    f"{array.path}: token id {value} (at token {pos}) is at or above {stated}; "
                    "the file was written with a larger vocabulary: set model.vocab_size above "
                    f"{array.max_id} (and vocab_size in meta.json), or prepare the file again "
                    "with the tokenizer the run uses")

