"""Tokenizers of text runs (`data.tokenizer`): bytes, a byte-level BPE trained on the training
split, or a Hugging Face tokenizer file.

- ``byte`` (the default): every byte is one token, 256 of them (`normlab.data.tokens`).
- ``bpe:N``: a byte-level BPE of ``N`` tokens (Hugging Face `tokenizers`), trained on the
  training split's works only, never on the held-out ones. Training is deterministic; the result
  is cached by a hash of what it was trained on (the works' names and bytes, ``N`` and the
  `tokenizers` version), under ``$NORMLAB_CACHE/tokenizers`` (default
  ``~/.cache/normlab/tokenizers``), and a run saves its own copy as ``tokenizer.json`` in its
  folder.
- a path: a ``tokenizer.json`` file, or a folder holding one (a Hugging Face tokenizer folder).

Text is handed to a Hugging Face tokenizer as UTF-8 (bytes that are not UTF-8 become U+FFFD).
Token ids are stored in the smallest unsigned type that holds the vocabulary (`token_dtype`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from normlab.data.corpus import DataError, Work, cache_root
from normlab.data.fingerprint import add_works
from normlab.data.tokens import VOCAB_SIZE

__all__ = [
    "BYTE",
    "TOKENIZER_FILE",
    "ByteTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "bpe_size",
    "cache_dir",
    "describe",
    "load_tokenizer_file",
    "resolve_tokenizer",
    "spec_problem",
    "token_dtype",
    "tokenizer_files",
    "train_bpe",
]

BYTE = "byte"
TOKENIZER_FILE = "tokenizer.json"
MIN_BPE = VOCAB_SIZE + 1  # the 256 byte tokens and at least one merge
MAX_VOCAB = 2**32 - 1
_BPE = re.compile(r"bpe:(\d+)")


def bpe_size(spec: str) -> int | None:
    """N of a ``bpe:N`` spec, or None for any other spec."""
    m = _BPE.fullmatch(spec.strip())
    return int(m.group(1)) if m else None


def spec_problem(spec: str) -> str | None:
    """Why `spec` cannot name a tokenizer (checked without reading any file), or None."""
    if not spec.strip():
        return f"empty; give {BYTE}, bpe:N (e.g. bpe:2048) or a path to a {TOKENIZER_FILE}"
    if spec.strip().lower().startswith("bpe"):
        n = bpe_size(spec)
        if n is None:
            return f"{spec!r}: write bpe:N with N a whole number of tokens, e.g. bpe:2048"
        if not MIN_BPE <= n <= MAX_VOCAB:
            return (f"{spec!r}: a byte-level BPE has the 256 byte tokens and its merges; give "
                    f"N from {MIN_BPE} to {MAX_VOCAB}")
    return None


def token_dtype(vocab_size: int) -> type[np.unsignedinteger]:
    """The smallest unsigned integer type that holds every id below `vocab_size`."""
    if vocab_size <= 2**8:
        return np.uint8
    if vocab_size <= 2**16:
        return np.uint16
    return np.uint32


def cache_dir() -> Path:
    """Where trained tokenizers are kept: `normlab.data.corpus.cache_root()`/tokenizers."""
    return cache_root() / "tokenizers"


class Tokenizer:
    """What a text run needs of a tokenizer: its name (`spec`), vocabulary, encode and decode."""

    spec: str
    vocab_size: int

    @property
    def dtype(self) -> type[np.unsignedinteger]:
        return token_dtype(self.vocab_size)

    def encode(self, text: bytes | str) -> np.ndarray:
        """Token ids of `text` (bytes, or a str taken as UTF-8), 1-D, of `dtype`."""
        raise NotImplementedError

    def encode_many(self, texts: Sequence[bytes]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Any) -> str:
        """Text of token ids (numpy array, list or torch tensor); ids outside the vocabulary are
        a `ValueError`."""
        raise NotImplementedError

    def to_json(self) -> str | None:
        """The tokenizer as a ``tokenizer.json`` document (None for bytes, which need none)."""
        return None

    def save(self, folder: Path) -> Path | None:
        """Write ``tokenizer.json`` into `folder` (atomically; nothing for bytes)."""
        text = self.to_json()
        if text is None:
            return None
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / TOKENIZER_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        return path


def _ids(tokens: Any, vocab: int) -> np.ndarray:
    if hasattr(tokens, "detach"):  # torch.Tensor, without importing torch here
        tokens = tokens.detach().cpu().numpy()
    ids = np.asarray(tokens).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"token ids must lie in 0..{vocab - 1}, got range "
                         f"{ids.min()}..{ids.max()}")
    return ids.astype(np.int64)


class ByteTokenizer(Tokenizer):
    """Every byte is a token (the default, `normlab.data.tokens`)."""

    spec = BYTE
    vocab_size = VOCAB_SIZE

    def encode(self, text: bytes | str) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return np.frombuffer(data, dtype=np.uint8).copy()

    def decode(self, ids: Any) -> str:
        return _ids(ids, VOCAB_SIZE).astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers.Tokenizer`; `spec` names where it came from (``bpe:N`` or the
    path given)."""

    def __init__(self, tokenizer: Any, spec: str) -> None:
        self.tokenizer = tokenizer
        self.spec = spec
        self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))

    @staticmethod
    def _text(text: bytes | str) -> str:
        return text if isinstance(text, str) else bytes(text).decode("utf-8", errors="replace")

    def encode(self, text: bytes | str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(self._text(text), add_special_tokens=False).ids,
                          dtype=self.dtype)

    def encode_many(self, texts: Sequence[bytes]) -> list[np.ndarray]:
        out = self.tokenizer.encode_batch([self._text(t) for t in texts],
                                          add_special_tokens=False)
        return [np.asarray(e.ids, dtype=self.dtype) for e in out]

    def decode(self, ids: Any) -> str:
        return self.tokenizer.decode(_ids(ids, self.vocab_size).tolist(),
                                     skip_special_tokens=False)

    def to_json(self) -> str:
        return self.tokenizer.to_str()


def hf_tokenizers(what: str) -> Any:
    """The Hugging Face `tokenizers` package, or a `DataError` saying that `what` needs it and
    how to install it (it is optional: normlab[data])."""
    try:
        import tokenizers
    except ImportError:
        raise DataError(f"{what} needs Hugging Face `tokenizers`; install it with `pip install "
                        "'normlab[data]'` (or pip install tokenizers)") from None
    return tokenizers


def load_tokenizer_file(path: str | os.PathLike[str], spec: str | None = None) -> HFTokenizer:
    """A Hugging Face tokenizer from a ``tokenizer.json`` file or a folder holding one;
    `DataError` naming the file when it is missing or does not parse."""
    HF = hf_tokenizers(f"reading the tokenizer {path}").Tokenizer

    given = Path(path).expanduser()
    file = given / TOKENIZER_FILE if given.is_dir() else given
    if not file.is_file():
        where = (f"folder {given} has no {TOKENIZER_FILE}" if given.is_dir() else
                 f"{given} does not exist")
        raise DataError(f"tokenizer {str(path)!r}: {where}; give {BYTE}, bpe:N (e.g. bpe:2048), "
                        f"a {TOKENIZER_FILE} file or a Hugging Face tokenizer folder")
    try:
        tokenizer = HF.from_file(str(file))
    except Exception as e:  # tokenizers raises plain Exception subclasses for bad JSON
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"tokenizer file {file} does not parse as a Hugging Face "
                        f"{TOKENIZER_FILE} ({detail}); give a file saved by "
                        "`tokenizers` (Tokenizer.save) or `transformers` (save_pretrained), "
                        "or use bpe:N to train one") from None
    return HFTokenizer(tokenizer, spec or str(path))


def _content_key(works: Iterable[Work], vocab: int) -> str:
    tokenizers = hf_tokenizers(f"a byte-level BPE of {vocab} tokens")
    h = hashlib.sha256(f"bpe:{vocab}:tokenizers {tokenizers.__version__}\n".encode())
    add_works(h, works)
    return h.hexdigest()[:20]


def train_bpe(works: Sequence[Work], vocab: int, *, cache: Path | None = None) -> HFTokenizer:
    """A byte-level BPE of `vocab` tokens trained on `works` (the training split): the 256 byte
    tokens, then the merges in order of frequency. Deterministic; kept in `cache` (default
    `cache_dir()`) under a hash of the works and `vocab`, and read from there when present."""
    tokenizers = hf_tokenizers(f"training a byte-level BPE of {vocab} tokens")
    HF, decoders, models = tokenizers.Tokenizer, tokenizers.decoders, tokenizers.models
    pre_tokenizers, trainers = tokenizers.pre_tokenizers, tokenizers.trainers

    spec = f"bpe:{vocab}"
    if not works:
        raise DataError(f"tokenizer {spec}: no training text to learn the merges from")
    folder = cache if cache is not None else cache_dir()
    path = folder / f"bpe{vocab}-{_content_key(works, vocab)}.json"
    if path.is_file():
        try:
            return HFTokenizer(HF.from_file(str(path)), spec)
        except Exception:  # a damaged cache entry is trained again
            pass
    tokenizer = HF(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = [w.text.decode("utf-8", errors="replace") for w in works]
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    result = HFTokenizer(tokenizer, spec)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(result.to_json(), encoding="utf-8")
        tmp.replace(path)
    except OSError:  # a read-only cache only costs the training next time
        pass
    return result


def resolve_tokenizer(spec: str, train_works: Sequence[Work] | None = None) -> Tokenizer:
    """The tokenizer `spec` names (see the module doc); ``bpe:N`` is trained on `train_works`."""
    problem = spec_problem(spec)
    if problem:
        raise DataError(f"data.tokenizer: {problem}")
    if spec == BYTE:
        return ByteTokenizer()
    n = bpe_size(spec)
    if n is not None:
        if train_works is None:
            raise DataError(f"tokenizer {spec} is trained on a text's training split; this "
                            "source has no text to train it on (give a tokenizer file)")
        return train_bpe(train_works, n)
    return load_tokenizer_file(spec)


def describe(tokenizer: Tokenizer) -> dict[str, Any]:
    """What config.yaml's `meta` records about a non-byte tokenizer."""
    return {"tokenizer": tokenizer.spec, "tokenizer_vocab": tokenizer.vocab_size,
            "tokenizer_sha256": hashlib.sha256((tokenizer.to_json() or "").encode()
                                               ).hexdigest()[:16]}


def tokenizer_files(tokenizer: Tokenizer | None) -> list[tuple[str, Path]]:
    """The file a tokenizer was read from, named as its spec gives it (a folder's
    ``tokenizer.json`` below the folder), for a run's data fingerprint; none for bytes, for
    ``bpe:N`` (trained from the text, which the fingerprint covers) and for no tokenizer."""
    if tokenizer is None or tokenizer.spec == BYTE or bpe_size(tokenizer.spec) is not None:
        return []
    given = Path(tokenizer.spec).expanduser()
    if given.is_dir():
        return [((Path(tokenizer.spec) / TOKENIZER_FILE).as_posix(), given / TOKENIZER_FILE)]
    return [(tokenizer.spec, given)] if given.is_file() else []
