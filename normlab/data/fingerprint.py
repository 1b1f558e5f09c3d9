"""What a run read: fingerprints of data, by content where that is cheap.

One home for two uses of the same idea. `normlab prepare` keys its output by a digest of the
works it tokenizes (their names and bytes, `add_works`), and so does a trained BPE's cache entry.
A run records the files its text came from in its config.yaml (`meta.data_fingerprint`, written
by `TextData.meta`) and the trainer compares that record with the files as they are whenever the
run's folder is used again (a finished run asked for again, a resume): a run id hashes the
config, which names the files, not their content.

A file's record (`file_entry`) is its size, its modification time (``mtime_ns``) and, for a file
of up to `HASH_UP_TO` bytes (64 MiB), the sha256 of its content. A hashed file counts as changed
when its size or its content differs; one touched without a change (a new modification time, the
same bytes) is the same data. A larger file is compared by size and modification time only
(hashing a large token file at every start would cost more than the start), so touching one
counts as a change. Files are named as the source names them (`normlab.data.corpus.source_files`:
a file as given, a folder's files below the folder as given, the shipped corpus as
``shakespeare/<file>``). Hashes are kept per process by path, size and modification time, and the
shipped corpus is fingerprinted once per process.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from normlab.data.corpus import DEFAULT_CORPUS, Source, Work, source_files

__all__ = ["HASH_UP_TO", "Fingerprint", "add_works", "changes", "file_entry",
           "fingerprint_files", "source_fingerprint"]

HASH_UP_TO = 64 << 20
"""Files up to this many bytes are recorded with the sha256 of their content."""

Fingerprint = dict[str, dict[str, Any]]
"""A file's name (as its source names it) -> `file_entry`, in the order the files are read."""

_hashes: dict[tuple[str, int, int, int], str] = {}  # (path, size, mtime_ns, inode) -> sha256


def add_works(h: Any, works: Iterable[Work]) -> None:
    """Feed `works` (each name and its bytes) into the hash `h`: what `normlab prepare`'s
    fingerprint and a trained BPE's cache key cover of the text."""
    for w in works:
        h.update(hashlib.sha256(w.name.encode()).digest())
        h.update(hashlib.sha256(w.text).digest())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def file_entry(path: Path) -> dict[str, Any]:
    """`path`'s size, modification time and (up to `HASH_UP_TO` bytes) content sha256."""
    st = path.stat()
    entry: dict[str, Any] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if st.st_size <= HASH_UP_TO:
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
        digest = _hashes.get(key)
        if digest is None:
            digest = _sha256(path)
            if path.stat().st_mtime_ns == st.st_mtime_ns:  # not written to while it was read
                _hashes[key] = digest
        entry["sha256"] = digest
    return entry


def fingerprint_files(files: Iterable[tuple[str, Path]]) -> Fingerprint:
    """The fingerprint of `files`, each a (name, path) pair."""
    return {name: file_entry(path) for name, path in files}


@lru_cache(maxsize=1)
def _shipped() -> tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]:
    return tuple((name, tuple(entry.items()))
                 for name, entry in fingerprint_files(source_files(DEFAULT_CORPUS)).items())


def source_fingerprint(source: Source, extra: Iterable[tuple[str, Path]] = ()) -> Fingerprint:
    """The fingerprint of the files `load_works(source)` reads, plus `extra` (a tokenizer file);
    the shipped corpus's is taken once per process (it is a package's data)."""
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    out: Fingerprint = {}
    for s in sources:
        if isinstance(s, str) and s == DEFAULT_CORPUS:
            out.update((name, dict(entry)) for name, entry in _shipped())
        else:
            out.update(fingerprint_files(source_files(s)))
    out.update(fingerprint_files(extra))
    return out


def _size(n: Any) -> str:
    return f"{n:,} bytes" if isinstance(n, int) else "an unknown size"


def changes(recorded: Any, current: Fingerprint) -> list[str]:
    """What differs between a run's recorded fingerprint and the files now, one phrase per file
    (empty: the same data). A record that is not a mapping of files says nothing."""
    if not isinstance(recorded, dict):
        return []
    recorded = {str(k): v for k, v in recorded.items()}
    found = []
    for name, old in recorded.items():
        new = current.get(name)
        if new is None:
            found.append(f"{name} is gone (the run read it)")
            continue
        old = old if isinstance(old, dict) else {}
        if old.get("size") != new["size"]:
            found.append(f"{name} changed (it was {_size(old.get('size'))}, it is "
                         f"{_size(new['size'])} now)")
        elif "sha256" in old and "sha256" in new:
            if old["sha256"] != new["sha256"]:
                found.append(f"{name} changed (the same size, other content: sha256 "
                             f"{str(old['sha256'])[:12]} then, {new['sha256'][:12]} now)")
        elif old.get("mtime_ns") != new["mtime_ns"]:
            found.append(f"{name} was modified (the same size, a new modification time; a file "
                         f"over {HASH_UP_TO >> 20} MiB is compared by size and time, not by "
                         "content)")
    found.extend(f"{name} is new (the run did not read it)"
                 for name in current if name not in recorded)
    return found
