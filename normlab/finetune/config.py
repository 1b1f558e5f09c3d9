"""The settings of one fine-tuning: `FinetuneConfig`, validated and frozen like a run's
`TrainConfig` (:mod:`normlab.config`), the one home of fine-tuning's defaults and checks.

What a fine-tuning computes is a function of its config and of the weights it starts from (a run
folder's checkpoint, or its architecture at init), so `FinetuneConfig.cache_hash` of the two names
its result file in the run folder (:mod:`normlab.finetune.runs`). Where it runs (``device``),
whether a cached result is recomputed and who is told of its progress are arguments of the calls,
not settings: they change nothing computed.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, ValidationError, field_validator, model_validator

from normlab.config import TrainConfig, _Frozen, format_validation_error, load_yaml, parse_config

Pooling = Literal["mean", "last"]
POOLINGS: tuple[str, ...] = get_args(Pooling)

FINETUNE_VERSION = 2
"""Bumped when a change to this package changes results, so old cached files are not reused."""

# AdamW's betas and eps for fine-tuning: BERT's (Devlin et al. 2019, "BERT: Pre-training of Deep
# Bidirectional Transformers for Language Understanding", appendices A.2-A.3), not the 0.95 of
# normlab's pretraining runs.
FINETUNE_BETAS = (0.9, 0.999)
FINETUNE_EPS = 1e-8

# Fields added after result files were first written: in the cache hash only when set away from
# their default, so every file written before they existed keeps its name.
HASHED_WHEN_SET = ("eval_batch_size", "log_every")
# The optimizer's fields, recorded as one text (`adamw(beta1,beta2,eps)`), as they always were.
_OPTIMIZER = ("beta1", "beta2", "eps")
_INTEGERS = ("steps", "batch_size", "warmup", "seed", "passage_bytes", "gap", "train_eval_max",
             "test_max", "window", "val_max", "standardize", "eval_batch_size", "log_every")


class FinetuneError(ValueError):
    """Fine-tuning settings that cannot be used; the message names the setting."""


class FinetuneConfig(_Frozen):
    """One fine-tuning on a Shakespeare task (:mod:`normlab.data.genre`): a linear head on a
    model's pooled final stream, trained with AdamW (Loshchilov & Hutter 2019), linear warmup then
    cosine decay, and gradient clipping, on batches from seeded per-epoch permutations."""

    task: Literal["genre", "play"] = Field(
        "genre", description="genre: comedy, history or tragedy of a passage (3 classes); play: "
        "which of the 36 Folio plays (36 classes)")
    steps: int = Field(200, ge=1, description="optimizer steps")
    lr: float = Field(3e-4, gt=0.0, description="peak AdamW learning rate")
    batch_size: int = Field(32, ge=1, description="passages per step")
    warmup: int = Field(20, ge=0, description="linear warmup steps (then cosine decay)")
    seed: int = Field(0, ge=0, description="seed of the head's init and of the batch order")
    pooling: Pooling = Field(
        "mean", description="the stream pooled over positions (mean), or its last position, the "
        "only one that sees the whole passage in a causal decoder (last)")
    freeze: bool = Field(False, description="train only the linear head on the fixed body (a "
                         "linear probe); false: every weight")
    passage_bytes: int = Field(256, ge=2, description="bytes per passage")
    gap: int = Field(1024, ge=0, description="bytes left out between a play's training and test "
                     "regions (and validation region)")
    weight_decay: float = Field(
        0.01, ge=0.0, description="AdamW decay of weight matrices (not norms, biases, "
        "embeddings)")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0,
                                description="floor of the cosine decay, as a share of lr")
    grad_clip: float | None = Field(1.0, gt=0.0, description="max grad norm; null disables")
    beta1: float = Field(FINETUNE_BETAS[0], ge=0.0, lt=1.0,
                         description="AdamW beta1 (BERT's fine-tuning, Devlin et al. 2019)")
    beta2: float = Field(FINETUNE_BETAS[1], ge=0.0, lt=1.0,
                         description="AdamW beta2 (BERT's 0.999, not pretraining's 0.95)")
    eps: float = Field(FINETUNE_EPS, gt=0.0, description="AdamW epsilon")
    train_eval_max: int = Field(2048, ge=1, description="training accuracy on the first this "
                                "many training passages")
    test_max: int | None = Field(None, ge=1, description="score at most this many evenly spaced "
                                 "test passages; null: all")
    window: int | None = Field(
        None, ge=1, description="read each passage as windows of this many bytes, each from "
        "position 0 (a divisor of passage_bytes; for passages longer than the pretraining "
        "context); null: whole, or for a run folder its data.seq_len where that divides "
        "passage_bytes and positions are learned")
    val_fraction: float = Field(0.0, ge=0.0, lt=0.5, description="share of each play's training "
                                "region cut off for validation passages (for tuning the lr)")
    val_max: int | None = Field(None, ge=1, description="score at most this many evenly spaced "
                                "validation passages; null: all")
    standardize: int = Field(
        512, ge=0, description="centre and scale each pooled feature over this many training "
        "passages before training (0: off; else at least 2)")
    eval_batch_size: int = Field(128, ge=1, description="passages per forward pass when "
                                 "evaluating and computing features")
    log_every: int | None = Field(None, ge=1, description="steps between the loss curve's "
                                  "points; null: a fiftieth of the steps (at least 1)")

    @model_validator(mode="before")
    @classmethod
    def _one_optimizer(cls, data: Any) -> Any:
        if isinstance(data, dict) and "optimizer" in data:
            raise ValueError(
                f"optimizer: fine-tuning trains with AdamW only (BERT's recipe), got "
                f"{data['optimizer']!r}; a run trained with train.optimizer: muon is fine-tuned "
                "with AdamW like any other: remove optimizer")
        return data

    @field_validator(*_INTEGERS, mode="before")
    @classmethod
    def _not_a_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):  # pydantic reads true as 1: a flag given for a number
            raise ValueError(f"an integer, got {value!r}")
        return value

    @model_validator(mode="after")
    def _check(self) -> FinetuneConfig:
        problems = []
        if self.window is not None and self.passage_bytes % self.window:
            problems.append(f"window: must divide passage_bytes={self.passage_bytes}, got "
                            f"{self.window}")
        if self.standardize == 1:
            problems.append("standardize: 0 (off) or at least 2 passages, got 1")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @classmethod
    def parse(cls, data: dict[str, Any]) -> FinetuneConfig:
        """The config of `data` (field -> value), or `FinetuneError` naming each bad field."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise FinetuneError(format_validation_error(cls, e)) from None

    @classmethod
    def load(cls, path: str | Path) -> FinetuneConfig:
        """The config in a YAML file of fields (`ConfigError` for a file that cannot be read,
        `FinetuneError` naming each bad field)."""
        return cls.parse(load_yaml(Path(path)))

    def replace(self, **changes: Any) -> FinetuneConfig:
        """A copy with `changes`, validated (pydantic's `model_copy` does not validate)."""
        return self.parse(self.model_dump() | changes)

    def resolved_log_every(self) -> int:
        return self.log_every or max(1, self.steps // 50)

    def train_config(self) -> TrainConfig:
        """What normlab's training loop and its optimizer (`normlab.train.optim.adamw`) read of
        this fine-tuning: the lr schedule, AdamW's settings, clipping and the loss curve's
        cadence; no evaluation, block statistics or checkpoints inside the loop."""
        return parse_config(TrainConfig, {
            "steps": self.steps, "lr": self.lr, "warmup": self.warmup, "schedule": "cosine",
            "min_lr_ratio": self.min_lr_ratio, "weight_decay": self.weight_decay,
            "beta1": self.beta1, "beta2": self.beta2, "eps": self.eps,
            "grad_clip": self.grad_clip, "log_every": self.resolved_log_every(),
            "eval_every": 0, "block_stats_every": 0, "checkpoint_every": 0})

    def record(self) -> dict[str, Any]:
        """The settings as a result stores them (its ``settings``) and its cache hash covers
        them: the fields, with the optimizer's as the text ``adamw(beta1,beta2,eps)``, the
        schedule and `FINETUNE_VERSION`; a field of `HASHED_WHEN_SET` only when set away from
        its default. So a config of the settings a result file was written with before this
        class existed records what that file holds, and hashes to its name."""
        data = self.model_dump()
        optimizer = ",".join(_number(data.pop(k)) for k in _OPTIMIZER)
        for key in HASHED_WHEN_SET:
            if data[key] == type(self).model_fields[key].default:
                del data[key]
        return data | {"optimizer": f"adamw({optimizer})", "schedule": "cosine",
                       "version": FINETUNE_VERSION}

    def cache_hash(self, run_id: str, from_init: bool, checkpoint_step: int | None) -> str:
        """The 12 hex digits that name this fine-tuning's result in a run folder: a SHA-256 of
        `record` and of the weights it starts from (the run's id; at init, or the training step
        of the checkpoint)."""
        key = {"settings": self.record(), "from_init": from_init, "run_id": run_id,
               "checkpoint_step": checkpoint_step}
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def _number(value: float) -> str:
    """`value` exactly (its repr) with the exponent's leading zeros dropped: ``1e-8``, not
    ``1e-08``, as the optimizer's text was first written."""
    return re.sub(r"e([+-]?)0*(\d)", r"e\1\2", repr(float(value)))


def finetune_config(config: FinetuneConfig | None = None, **settings: Any) -> FinetuneConfig:
    """`config`, or with no config the one of ``settings`` (`FinetuneConfig` fields, the rest
    at their defaults): the calls of :mod:`normlab.finetune` take either, never both."""
    if config is None:
        return FinetuneConfig.parse(settings)
    if not isinstance(config, FinetuneConfig):
        hint = (" (the passages of a GenreTask go in data=)" if type(config).__name__ ==
                "GenreTask" else " (a task's name goes in task=)" if isinstance(config, str)
                else "")
        raise FinetuneError(f"config: a FinetuneConfig, got {type(config).__name__}{hint}")
    if settings:
        raise FinetuneError(f"give a config or settings ({', '.join(sorted(settings))}), not "
                            "both: config.replace(...) changes a config's settings")
    return config
