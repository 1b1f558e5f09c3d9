"""Fine-tuning for claim C10 (post transfers better after fine-tuning): a pretrained decoder gets a
linear classifier on its pooled final stream and is trained on the Shakespeare genre task
(:mod:`normlab.data.genre`); the result is its test accuracy.

    finetune(run_dir, "genre", steps=200, lr=3e-4)          # a trained run, cached on disk
    finetune(run_dir, "genre", from_init=True)              # the run's architecture, at init
    finetune_model(model, "play", steps=50)                 # any NormTransformer, not cached

The classifier reads ``model.stream(idx)`` (the final normalized stream ``[B, T, d]``; a passage
longer than the pretraining context is read in ``window``-byte windows), pools it over positions
(``mean``; or ``last``, the one position that sees the whole passage in a causal decoder),
standardizes the pooled features with statistics of the training passages, and applies a new
``Linear(d, classes)``. All parameters are trained (only the head with
``freeze=True``) with AdamW, linear warmup then cosine decay (``normlab.train.schedules.lr_at``),
gradient clipping, and batches drawn from a seeded per-epoch permutation of the training
passages, so a run is a function of its settings: on CPU the same seed gives identical numbers.

A run folder's results go to ``run_dir/finetune/<task>-<hash>.json`` (``<task>-init-<hash>``
from init), the hash covering every setting and the checkpoint's step; an existing file is
returned as it is (with ``cached: True``), so a study that is re-run does no finished work again.

`loop.py` holds the classifier, its settings and the training loop (nothing cached);
`runs.py` fine-tunes a run folder, caches its results there, and runs many on worker processes.
"""

from normlab.finetune.loop import (
    FINETUNE_VERSION,
    FinetuneError,
    SequenceClassifier,
    finetune_model,
    finetune_model_lrs,
    finetune_settings,
)
from normlab.finetune.runs import finetune, finetune_lrs, finetune_many, finetune_path

__all__ = [
    "FINETUNE_VERSION",
    "FinetuneError",
    "SequenceClassifier",
    "finetune",
    "finetune_lrs",
    "finetune_many",
    "finetune_model",
    "finetune_model_lrs",
    "finetune_path",
    "finetune_settings",
]
