"""Token files: a folder holding ``train.bin`` and ``val.bin``, read by memory map.

The layout is nanoGPT's (``data/*/prepare.py`` there): each file is the token ids of one split,
one after the other, as ``uint16`` in the machine's byte order (little-endian on x86 and ARM), no
header. A vocabulary above 65,536 tokens needs ``uint32``, which a small ``meta.json`` beside the
files states::

    {"dtype": "uint32", "vocab_size": 100277}

`normlab prepare` (`prepare`) writes such a folder from any text source: the split by whole
works as a run makes it, each split's works tokenized one by one and joined by the tokens of a
blank line (as `TokenArray.from_works` joins them), the tokenizer as ``tokenizer.json`` (none for
bytes), and a ``meta.json`` with the dtype, the vocabulary, the tokenizer, the works on each side
and the byte length of each split (from which a run reports bits per byte). It is resumable: it
writes ``*.bin.part`` files and records in ``prepare.json`` how many works of each split are in
them, so a second call continues where an interrupted one stopped, and renames the files only at
the end. meta.json's fields are all optional for ``uint16``; ``dtype`` (``uint16`` or ``uint32``)
and ``vocab_size`` are required for ``uint32``. Every problem is a `DataError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from normlab.data.batches import SEPARATOR, Span, TextData, TokenArray
from normlab.data.corpus import DataError, Source, Work, load_works
from normlab.data.fingerprint import add_works, fingerprint_files
from normlab.data.split import split_works
from normlab.data.tokenizer import (
    BYTE,
    TOKENIZER_FILE,
    ByteTokenizer,
    Tokenizer,
    bpe_size,
    load_tokenizer_file,
    resolve_tokenizer,
    spec_problem,
    tokenizer_files,
)

__all__ = ["META_FILE", "SPLITS", "declared_vocab", "is_token_folder", "prepare", "read_meta",
           "read_token_folder"]

SPLITS = ("train", "val")
META_FILE = "meta.json"
STATE_FILE = "prepare.json"
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
FORMAT = "normlab-tokens/1"
_DEFAULT_VAL_FRACTION, _DEFAULT_SPLIT_SEED = 0.1, 0
_COUNT_BYTES_UP_TO = 50_000_000  # held-out tokens decoded to learn their bytes, when not stated


def is_token_folder(source: Any) -> bool:
    """Whether `source` is a folder holding ``train.bin`` or ``val.bin``."""
    if not isinstance(source, (str, os.PathLike)):
        return False
    path = Path(source).expanduser()
    return path.is_dir() and any((path / f"{s}.bin").exists() for s in SPLITS)


def read_meta(folder: Path) -> dict[str, Any]:
    """The folder's meta.json ({} when there is none); `DataError` when it does not parse."""
    path = folder / META_FILE
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path} does not parse as JSON ({e}); write it as "
                        '{"dtype": "uint16" or "uint32", "vocab_size": N}, or remove it') from None
    if not isinstance(meta, dict):
        raise DataError(f"{path}: expected a JSON object such as "
                        '{"dtype": "uint32", "vocab_size": 100277}')
    dtype = meta.get("dtype", "uint16")
    if dtype not in DTYPES:
        raise DataError(f"{path}: dtype {dtype!r} is not one normlab reads; give uint16 (nanoGPT's)"
                        " or uint32")
    vocab = meta.get("vocab_size")
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 2
                              or vocab > np.iinfo(DTYPES[dtype]).max + 1):
        raise DataError(f"{path}: vocab_size {vocab!r} must be a whole number from 2 to "
                        f"{np.iinfo(DTYPES[dtype]).max + 1} (the ids of {dtype})")
    if dtype == "uint32" and vocab is None:
        raise DataError(f"{path}: uint32 token files need their vocabulary stated; add "
                        '"vocab_size": N')
    return meta


def _memmap(path: Path, dtype: type[np.unsignedinteger], meta_given: bool) -> np.ndarray:
    if not path.is_file():
        other = "val.bin" if path.name == "train.bin" else "train.bin"
        raise DataError(f"{path} is missing beside {other}; a token folder needs both train.bin "
                        "and val.bin (write them with `normlab prepare`)")
    size = path.stat().st_size
    item = np.dtype(dtype).itemsize
    if size == 0:
        raise DataError(f"{path} is empty; write its tokens again (`normlab prepare`)")
    if size % item:
        stated = "as meta.json states" if meta_given else "nanoGPT's default, as no meta.json says"
        raise DataError(
            f"{path}: its size, {size} bytes, is not a whole number of {np.dtype(dtype).name} "
            f"tokens ({item} bytes each, {stated}); the file is cut short or was written with "
            "another dtype: write it again, or state its dtype in meta.json")
    try:
        return np.memmap(path, dtype=dtype, mode="r")
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {path} by memory map: {e}") from None


def _folder_tokenizer(folder: Path, spec: str, meta: dict[str, Any]) -> Tokenizer | None:
    if spec != BYTE:
        if bpe_size(spec) is not None:
            raise DataError(
                f"data.tokenizer {spec}: {folder} holds token files, which are already "
                "tokenized; a BPE is trained on text. Leave data.tokenizer out (the folder's "
                f"own {TOKENIZER_FILE} is used), give a {TOKENIZER_FILE}, or prepare the folder "
                f"with `normlab prepare SOURCE --tokenizer {spec} --out {folder}`")
        return resolve_tokenizer(spec)
    named = meta.get("tokenizer")
    if named == BYTE:
        return ByteTokenizer()
    if isinstance(named, str) and named:
        return load_tokenizer_file(folder / named, spec=str(folder / named))
    if (folder / TOKENIZER_FILE).is_file():
        return load_tokenizer_file(folder / TOKENIZER_FILE, spec=str(folder / TOKENIZER_FILE))
    return None


def _held_out_bytes(val: np.ndarray, tokenizer: Tokenizer) -> int | None:
    """Bytes of the held-out text, decoded from its ids (for folders whose meta.json does not
    state them); None above `_COUNT_BYTES_UP_TO` tokens."""
    if len(val) > _COUNT_BYTES_UP_TO:
        return None
    if tokenizer.spec == BYTE:
        return len(val)
    step = 1 << 20
    return sum(len(tokenizer.decode(np.asarray(val[s:s + step])).encode("utf-8"))
               for s in range(0, len(val), step))


def read_token_folder(folder: Path, tokenizer: str = BYTE, *,
                      val_fraction: float = _DEFAULT_VAL_FRACTION,
                      seed: int = _DEFAULT_SPLIT_SEED) -> TextData:
    """The train and val splits of a token folder, memory-mapped (see the module doc), with the
    fingerprint of the files read (`normlab.data.fingerprint`; named below `folder` as given)."""
    given = Path(folder)
    folder = given.expanduser()
    if val_fraction != _DEFAULT_VAL_FRACTION or seed != _DEFAULT_SPLIT_SEED:
        raise DataError(f"data.val_fraction / data.split_seed: {folder} holds token files, whose "
                        "held-out split is val.bin; remove them (they choose held-out works of "
                        "a text)")
    meta = read_meta(folder)
    dtype = DTYPES[meta.get("dtype", "uint16")]
    arrays = {}
    for split in SPLITS:
        path = folder / f"{split}.bin"
        data = _memmap(path, dtype, bool(meta))
        array = TokenArray(data, [Span(path.name, 0, len(data))], label=str(path))
        array.path = path
        arrays[split] = array
    tok = _folder_tokenizer(folder, tokenizer, meta)
    vocab = meta.get("vocab_size")
    if tok is not None and vocab is not None and tok.vocab_size > vocab:
        raise DataError(f"{folder / META_FILE}: vocab_size {vocab} is smaller than the "
                        f"{tok.vocab_size} tokens of tokenizer {tok.spec!r}; the files were not "
                        "written with it: give the tokenizer they were written with")
    val_bytes = meta.get("val_bytes")
    if not isinstance(val_bytes, int) or val_bytes <= 0:
        val_bytes = _held_out_bytes(arrays["val"].data, tok) if tok is not None else None
    works = {s: meta.get(f"{s}_works") for s in SPLITS}
    read = [f"{s}.bin" for s in SPLITS] + [META_FILE] * (folder / META_FILE).is_file()
    fingerprint = fingerprint_files([((given / name).as_posix(), folder / name) for name in read]
                                    + tokenizer_files(tok))
    return TextData(
        train=arrays["train"], val=arrays["val"],
        train_works=works["train"] if isinstance(works["train"], list) else ["train.bin"],
        val_works=works["val"] if isinstance(works["val"], list) else ["val.bin"],
        tokenizer=tok, vocab_size=vocab if vocab is not None else (
            tok.vocab_size if tok is not None else None),
        val_bytes=val_bytes,
        source_meta={"token_files": str(folder), "token_dtype": np.dtype(dtype).name,
                     **({"tokenizer": None} if tok is None else
                        {"tokenizer": BYTE} if tok.spec == BYTE else {})},
        fingerprint=fingerprint)


# -- writing: `normlab prepare` ----------------------------------------------------------------
def _fingerprint(works: list[Work], tokenizer: Tokenizer, val_fraction: float, seed: int) -> str:
    h = hashlib.sha256(f"{FORMAT} {val_fraction!r} {seed}\n".encode())
    h.update(hashlib.sha256((tokenizer.to_json() or BYTE).encode()).digest())
    add_works(h, works)
    return h.hexdigest()[:24]


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class _Bar:
    """Bytes tokenized so far: a rich bar on a terminal, a line per tenth otherwise."""

    def __init__(self, total: int, done: int, enabled: bool) -> None:
        self.total, self.enabled = max(total, 1), enabled
        self.tty = enabled and sys.stderr.isatty()
        self._shown = int(10 * done / self.total)
        self._bar = None
        if self.tty:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(TextColumn("[bold]tokenizing"), BarColumn(), DownloadColumn(),
                                 TimeRemainingColumn())
            self._task = self._bar.add_task("tokenizing", total=self.total, completed=done)
            self._bar.start()

    def update(self, done: int, label: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done)
        elif self.enabled and int(10 * done / self.total) > self._shown:
            self._shown = int(10 * done / self.total)
            print(f"tokenizing: {done / self.total:.0%} ({done:,} of {self.total:,} bytes, "
                  f"{label})", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _check_out(out: Path, fingerprint: str) -> dict[str, Any] | None:
    """The resumable state of `out` for this preparation (None: start afresh); `DataError` when
    `out` holds something else, which is never overwritten."""
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file; give a folder")
    meta_path, state_path = out / META_FILE, out / STATE_FILE
    if (out / "train.bin").exists() or (out / "val.bin").exists():
        meta = read_meta(out) if meta_path.exists() else {}
        if meta.get("fingerprint") == fingerprint:
            return {"done": True, "meta": meta}
        raise DataError(f"--out {out} already holds token files of another preparation (other "
                        "text, tokenizer or split); give another --out, or delete them first")
    if state_path.exists():
        try:
            state = json.loads(state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            state = None
        if isinstance(state, dict) and state.get("fingerprint") == fingerprint:
            return state
        raise DataError(f"--out {out} holds an unfinished preparation of other text, tokenizer "
                        f"or split ({STATE_FILE}); give another --out, or delete its "
                        "*.bin.part files and prepare.json first")
    return None


def prepare(source: Source, tokenizer: str, out: Path | str, *,
            val_fraction: float = _DEFAULT_VAL_FRACTION, seed: int = _DEFAULT_SPLIT_SEED,
            text_field: str = "text", progress: bool = True, batch_works: int = 8,
            stop_after: int | None = None,
            say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Tokenize `source` into token files in `out` (see the module doc); returns meta.json's
    content. ``bpe:N`` is trained on the training works only. `stop_after` stops after that
    many batches of works (as an interruption would; for tests)."""
    out = Path(out).expanduser()
    problem = spec_problem(tokenizer)
    if problem:
        raise DataError(f"--tokenizer {problem}")
    works = load_works(source, text_field=text_field)
    train, val = split_works(works, val_fraction=val_fraction, seed=seed)
    if say:
        say(f"{len(train)} works for training, {len(val)} held out; tokenizer {tokenizer}")
    tok = resolve_tokenizer(tokenizer, train)
    fingerprint = _fingerprint(works, tok, val_fraction, seed)
    state = _check_out(out, fingerprint)
    if state is not None and state.get("done"):
        if say:
            say(f"{out} is already prepared from this text, split and tokenizer")
        return state["meta"]
    out.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if tok.vocab_size <= 2**16 else np.uint32
    splits = {"train": train, "val": val}
    state = state or {"fingerprint": fingerprint, "works": dict.fromkeys(SPLITS, 0),
                      "tokens": dict.fromkeys(SPLITS, 0)}
    state_path = out / STATE_FILE
    sep = tok.encode(SEPARATOR).astype(dtype)
    total = sum(len(w.text) for w in works)
    done = sum(len(w.text) for s in SPLITS for w in splits[s][:state["works"][s]])
    bar = _Bar(total, done, progress)
    batches = 0
    t0 = time.perf_counter()
    try:
        for split in SPLITS:
            part = out / f"{split}.bin.part"
            item = np.dtype(dtype).itemsize
            if part.exists() and part.stat().st_size < state["tokens"][split] * item or (
                    not part.exists() and state["tokens"][split]):
                raise DataError(f"{part} holds less than {state_path} records; delete both to "
                                "prepare again from the start")
            with open(part, "ab") as f:
                f.truncate(state["tokens"][split] * item)  # drop what followed the last record
                f.seek(0, os.SEEK_END)
                items = splits[split]
                for start in range(state["works"][split], len(items), batch_works):
                    if stop_after is not None and batches >= stop_after:
                        return {"interrupted": True, **state}
                    chunk = items[start:start + batch_works]
                    written = 0
                    for i, ids in enumerate(tok.encode_many([w.text for w in chunk])):
                        if start + i:
                            f.write(sep.tobytes())
                            written += len(sep)
                        f.write(ids.astype(dtype).tobytes())
                        written += len(ids)
                    f.flush()
                    os.fsync(f.fileno())
                    state["works"][split] = start + len(chunk)
                    state["tokens"][split] += written
                    _write_json(state_path, state)
                    batches += 1
                    done += sum(len(w.text) for w in chunk)
                    bar.update(done, f"{split} split")
    finally:
        bar.close()
    meta = {
        "format": FORMAT, "dtype": np.dtype(dtype).name, "vocab_size": tok.vocab_size,
        "tokenizer": BYTE if tok.spec == BYTE else TOKENIZER_FILE, "tokenizer_spec": tok.spec,
        "source": str(source) if isinstance(source, (str, os.PathLike)) else [
            str(s) for s in source],
        "val_fraction": val_fraction, "split_seed": seed, "text_field": text_field,
        **{f"{s}_tokens": state["tokens"][s] for s in SPLITS},
        **{f"{s}_bytes": sum(len(w.text) for w in splits[s]) + len(SEPARATOR) * (
            len(splits[s]) - 1) for s in SPLITS},
        **{f"{s}_works": [w.name for w in splits[s]] for s in SPLITS},
        "fingerprint": fingerprint,
    }
    tok.save(out)
    _write_json(out / META_FILE, meta)
    for split in SPLITS:
        os.replace(out / f"{split}.bin.part", out / f"{split}.bin")
    state_path.unlink()
    if say:
        took = time.perf_counter() - t0
        say(f"wrote {out}: {meta['train_tokens']:,} training and {meta['val_tokens']:,} held-out "
            f"tokens ({meta['dtype']}, vocabulary {tok.vocab_size}) in {took:.1f} s")
    return meta


def declared_vocab(source: Any, tokenizer: str) -> int | None:
    """The vocabulary a text run's model needs, where the config or a small file states it:
    N of ``bpe:N``, a tokenizer file's, or a token folder's meta.json or tokenizer.json; None
    otherwise (bytes, or what cannot be read here: the run reports it when it reads the data)."""
    if not isinstance(tokenizer, str):
        return None
    n = bpe_size(tokenizer)
    if n is not None:
        return n
    try:
        if tokenizer.strip() != BYTE:
            return load_tokenizer_file(tokenizer.strip()).vocab_size
        if is_token_folder(source):
            folder = Path(source).expanduser()
            meta = read_meta(folder)
            if meta.get("vocab_size") is not None:
                return int(meta["vocab_size"])
            tok = _folder_tokenizer(folder, BYTE, meta)
            return tok.vocab_size if tok is not None else None
    except DataError:
        return None
    return None
