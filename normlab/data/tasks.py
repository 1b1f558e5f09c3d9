"""Which data a run trains on: text (`data.source`), or the synthetic task `data.task` names."""

from __future__ import annotations

from typing import Any

from normlab.data.batches import TextData, load_text_data
from normlab.data.khop import KhopData, KhopTask

__all__ = ["RunData", "load_run_data"]

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
