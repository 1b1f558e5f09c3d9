"""Byte-level tokenizer: every byte is one token, so the vocabulary has 256 entries."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["VOCAB_SIZE", "decode", "encode"]

VOCAB_SIZE = 256


def encode(text: str | bytes | bytearray | memoryview) -> np.ndarray:
    """Return the bytes of ``text`` (``str`` is encoded as UTF-8) as a 1-D ``np.uint8`` array."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return np.frombuffer(data, dtype=np.uint8).copy()


def decode(tokens: np.ndarray | Iterable[int] | Any) -> str:
    """Turn token ids (numpy array, list, bytes or torch tensor) back into text.

    Invalid UTF-8 sequences (e.g. a multi-byte character cut by a window) become U+FFFD.

    Raises:
        ValueError: if an id is outside ``0..255``.
    """
    if isinstance(tokens, (bytes, bytearray, memoryview)):
        return bytes(tokens).decode("utf-8", errors="replace")
    if hasattr(tokens, "detach"):  # torch.Tensor, without importing torch here
        tokens = tokens.detach().cpu().numpy()
    ids = np.asarray(tokens).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= VOCAB_SIZE):
        raise ValueError(
            f"token ids must lie in 0..{VOCAB_SIZE - 1}, got range {ids.min()}..{ids.max()}"
        )
    return ids.astype(np.uint8).tobytes().decode("utf-8", errors="replace")
