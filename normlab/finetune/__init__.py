"""Fine-tuning for claim C10 (post transfers better after fine-tuning): a pretrained decoder gets a
linear classifier on its pooled final stream and is trained on the Shakespeare genre task
(:mod:`normlab.data.genre`); the result is its test accuracy.

    cfg = FinetuneConfig(task="genre", steps=200, lr=3e-4)
    finetune(run_dir, cfg)                                  # a trained run, cached on disk
    finetune(run_dir, cfg, from_init=True)                  # the run's architecture, at init
    finetune_model(model, task="play", steps=50)            # any NormTransformer, not cached

The settings are a `FinetuneConfig` (:mod:`normlab.finetune.config`); every call takes one, or
its fields as keywords (``finetune(run_dir, task="play", steps=50)``), never both.

The classifier reads ``model.stream(idx)`` (the final normalized stream ``[B, T, d]``; a passage
longer than the pretraining context is read in ``window``-byte windows), pools it over positions
(``mean``; or ``last``, the one position that sees the whole passage in a causal decoder),
standardizes the pooled features with statistics of the training passages, and applies a new
``Linear(d, classes)``. All parameters are trained (only the head with
``freeze=True``) with AdamW, linear warmup then cosine decay (``normlab.train.schedules.lr_at``),
gradient clipping, and batches drawn from a seeded per-epoch permutation of the training
passages, so a run is a function of its settings: on CPU the same seed gives identical numbers
(alone; in a stacked group, the same within float rounding).

A run folder's results go to ``run_dir/finetune/<task>-<hash>.json`` (``<task>-init-<hash>``
from init), the hash (`FinetuneConfig.cache_hash`) covering every setting and the checkpoint's
step; an existing file is returned as it is (with ``cached: True``), so a study that is re-run
does no finished work again.

Fine-tunings that differ only in per-member settings (lr, seed, ...) of models of one shape train
as one stacked group on the stacked engine (`finetune_models`, `finetune_lrs`, `finetune_many`),
each within float rounding of its fine-tuning alone.

`config.py` holds the settings; `loop.py` the classifier and the training loop, alone and stacked
(nothing cached); `runs.py` fine-tunes a run folder, caches its results there, and runs many,
grouped, on worker processes.
"""

from normlab.finetune.config import FINETUNE_VERSION, FinetuneConfig, FinetuneError
from normlab.finetune.loop import (
    SequenceClassifier,
    StackedClassifier,
    finetune_model,
    finetune_model_lrs,
    finetune_models,
)
from normlab.finetune.runs import (
    finetune,
    finetune_lrs,
    finetune_many,
    finetune_path,
    plan_finetunes,
)

__all__ = [
    "FINETUNE_VERSION",
    "FinetuneConfig",
    "FinetuneError",
    "SequenceClassifier",
    "StackedClassifier",
    "finetune",
    "finetune_lrs",
    "finetune_many",
    "finetune_model",
    "finetune_model_lrs",
    "finetune_models",
    "finetune_path",
    "plan_finetunes",
]
