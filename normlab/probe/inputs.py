"""The batches the probes read: held-out text as `(idx, targets)` pairs.

Decoder targets are the next tokens (bytes, or the ids of a trained run's tokenizer). An encoder
has no downstream task in `normlab.data` yet, so its targets are a fixed synthetic labelling of
the text, `label = (sum of the window's tokens) mod n_classes`: independent of the model, so loss
changes are comparable between models. Read the encoder's loss deltas with that in mind; the KL
numbers do not depend on labels at all.
"""

from __future__ import annotations

from pathlib import Path

import torch

from normlab.data import BatchSampler, DataError, eval_batches, load_text_data

Batch = tuple[torch.Tensor, torch.Tensor]


def on_device(model: torch.nn.Module, batches: list[Batch], device: str | torch.device
              ) -> tuple[torch.nn.Module, list[Batch]]:
    """`model` moved to `device` and `batches` copied there: a probe reads its batches where
    its model is. A model built on the CPU and moved keeps the CPU's init, so a measurement at
    init on a GPU is of the same weights as on the CPU."""
    return model.to(device), [(x.to(device), y.to(device)) for x, y in batches]


def synthetic_labels(idx: torch.Tensor, n_classes: int) -> torch.Tensor:
    """One class per sequence: the sum of its tokens modulo `n_classes`."""
    return idx.long().sum(dim=-1).remainder(n_classes)


def for_kind(batches: list[Batch], kind: str, n_classes: int = 2) -> list[Batch]:
    """Decoder: the batches as they are. Encoder: the same inputs with synthetic labels."""
    if kind == "decoder":
        return batches
    return [(x, synthetic_labels(x, n_classes)) for x, _ in batches]


def text_batches(source: str | Path = "shakespeare", *, n_batches: int = 4, batch_size: int = 8,
                 seq_len: int = 64, seed: int = 0, val_fraction: float = 0.1,
                 split_seed: int = 0, kind: str = "decoder", n_classes: int = 2,
                 split: str = "val", tokenizer: str = "byte") -> list[Batch]:
    """`n_batches` fixed windows from the validation split of `source` (the Shakespeare corpus
    by default, or a user's .txt file or folder; `normlab.data.split_works` holds out whole works,
    or the last `val_fraction` of a single file), ready for a model of `kind`. `split="train"`
    draws from the training side instead (the update-size probe trains on it). `tokenizer` is
    a trained run's (`data.tokenizer`, or the tokenizer.json in its folder): the text is read as
    that run's model reads it."""
    if str(source) != "shakespeare" and not Path(source).exists():
        raise DataError(f"text {source}: no such file or folder")
    data = load_text_data(source, val_fraction=val_fraction, seed=split_seed,
                          tokenizer=tokenizer)
    if split == "val":
        batches = eval_batches(data.val, batch_size, seq_len, n_batches, seed)
    else:
        sampler = BatchSampler(data.train, batch_size, seq_len, seed)
        batches = [sampler.batch(i) for i in range(n_batches)]
    return for_kind(batches, kind, n_classes)
