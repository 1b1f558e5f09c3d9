"""Which data a run trains on: text (`data.source`: text files, documents, or token files), or
the synthetic task `data.task` names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from normlab.data.batches import SEPARATOR, TextData, TokenArray
from normlab.data.corpus import DEFAULT_CORPUS, Source, load_works
from normlab.data.fingerprint import source_fingerprint
from normlab.data.khop import KhopData, KhopTask
from normlab.data.split import split_works
from normlab.data.tokenizer import BYTE, resolve_tokenizer, tokenizer_files

__all__ = ["RunData", "load_run_data", "load_text_data"]

RunData = TextData | KhopData


def load_run_data(data: Any, model: Any = None) -> RunData:
    """The data of a run's `data` config section (a `normlab.config.DataConfig`): `DataError`
    when its text cannot be read, or (given the run's `model` config) when the model's vocabulary
    cannot hold its token ids."""
    if data.task == "khop":
        return KhopData(KhopTask.from_config(data))
    if data.task is not None:
        raise ValueError(f"data.task: unknown task {data.task!r}")
    text = load_text_data(data.source, val_fraction=data.val_fraction, seed=data.split_seed,
                          tokenizer=data.tokenizer, text_field=data.text_field)
    if model is not None:
        text.check_vocab(model.vocab_size)
    return text


def load_text_data(
    source: Source = DEFAULT_CORPUS, val_fraction: float = 0.1, seed: int = 0,
    tokenizer: str = BYTE, text_field: str = "text",
) -> TextData:
    """Load ``source`` (see :func:`load_works`), split it by whole works, and tokenise with
    `tokenizer` (see `normlab.data.tokenizer`; ``bpe:N`` is trained on the training works).
    A folder holding ``train.bin`` and ``val.bin`` is read as token files instead
    (`normlab.data.tokenfiles`)."""
    from normlab.data.tokenfiles import is_token_folder, read_token_folder

    if is_token_folder(source):
        return read_token_folder(Path(source), tokenizer, val_fraction=val_fraction, seed=seed)
    works = load_works(source, text_field=text_field)
    train, val = split_works(works, val_fraction=val_fraction, seed=seed)
    tok = resolve_tokenizer(tokenizer, train)
    fingerprint = source_fingerprint(source, tokenizer_files(tok))
    where = _describe(source)
    return TextData(
        train=TokenArray.from_works(train, label=f"train split of {where}", tokenizer=tok),
        val=TokenArray.from_works(val, label=f"val split of {where}", tokenizer=tok),
        train_works=[w.name for w in train],
        val_works=[w.name for w in val],
        tokenizer=tok,
        val_bytes=sum(len(w.text) for w in val) + len(SEPARATOR) * (len(val) - 1),
        fingerprint=fingerprint,
    )


def _describe(source: Source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    parts = [str(s) for s in source]
    return ", ".join(parts) if len(parts) <= 3 else ", ".join(parts[:3]) + ", ..."
