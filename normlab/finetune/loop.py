"""The fine-tuning loop: a linear classifier on a (pretrained) model's pooled final stream
(`SequenceClassifier`), trained on the Shakespeare genre or play-id task
(:mod:`normlab.data.genre`) by `finetune_model` (one), `finetune_model_lrs` (a grid of lrs) or
`finetune_models` (any models and settings), each with the settings of a `FinetuneConfig`
(:mod:`normlab.finetune.config`). No caching here: fine-tuning a run folder, with its results
stored in the folder, is :mod:`normlab.finetune.runs`.

Fine-tunings train on the loop runs train on (:mod:`normlab.train.loop`): the lr schedule, the
divergence check (a non-finite loss) and the logging cadence of the loss curve are that loop's;
the batches, the loss, the curve and the evaluation after training (test, train and validation
passages, whatever the outcome) are fine-tuning's own. There are two kinds of step:

- alone (`_FinetuneLoop`): one classifier, `gradient_norm` and `clip_and_step` of
  `normlab.train.step`; a frozen body's lr grid shares its features;
- stacked (`_StackedFinetuneLoop`): fine-tunings that differ only in the settings of
  `normlab.train.group.PER_MEMBER_FINETUNE` (lr and its schedule, AdamW's settings, clipping,
  seed, standardization, the curve's cadence), of models of one `ModelConfig`, each from its own
  weights, train as one `StackedClassifier` (the stacked engine's `StackedTransformer` under
  one head per member) with `StackedAdamW`: one forward and backward for all of them, and one
  forward of the stack to evaluate them. Each member's result is its fine-tuning alone's within
  float rounding (the stack's products and the fused optimizer round differently).
  A fine-tuning the engine does not implement (`finetune_unstackable_reason`: a frozen body, or
  a model the stack cannot hold) trains alone.

There are no checkpoints (a fine-tuning is short, and its result is cached whole), and a signal
stops it as it stops any code.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from normlab.data.genre import GenreTask, evaluation_rows, genre_task
from normlab.finetune.config import (
    POOLINGS,
    FinetuneConfig,
    FinetuneError,
    Pooling,
    finetune_config,
)
from normlab.nn.model import NormTransformer
from normlab.nn.stacked import StackedLinear, StackedTransformer
from normlab.train.group import finetune_stack_key, finetune_unstackable_reason
from normlab.train.loop import Member, TrainLoop
from normlab.train.optim import adamw, adamw_hyper, decayed_names
from normlab.train.stacked_adamw import StackedAdamW
from normlab.train.step import clip_and_step, gradient_norm, set_lr

__all__ = ["SequenceClassifier", "StackedClassifier", "finetune_model", "finetune_model_lrs",
           "finetune_models"]


class SequenceClassifier(nn.Module):
    """``Linear(pool(body.stream(idx)))``: a sequence classifier on a (pretrained) model."""

    def __init__(self, body: NormTransformer, n_classes: int, pooling: Pooling = "mean",
                 generator: torch.Generator | None = None, window: int | None = None) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise FinetuneError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        self.body = body
        self.pooling = pooling
        self.window = window
        d = body.cfg.d_model
        self.head = nn.Linear(d, n_classes, bias=True)
        with torch.no_grad():
            self.head.weight.normal_(0.0, 0.02, generator=generator)
            self.head.bias.zero_()
        # Fixed per-feature standardization of the pooled stream (set by `standardize_from`).
        self.register_buffer("feature_mean", torch.zeros(d))
        self.register_buffer("feature_scale", torch.ones(d))

    def features(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        w = self.window or T
        if T % w:
            raise FinetuneError(f"a passage of {T} bytes does not split into windows of {w}")
        # A passage longer than the pretraining context is read as T/w windows, each from
        # position 0 (the positions the model was trained on); the windows' streams are pooled
        # together, so "mean" averages every byte of the passage and "last" reads its last byte.
        x = self.body.stream(idx.reshape(B * (T // w), w)).reshape(B, T, -1)
        return x.mean(1) if self.pooling == "mean" else x[:, -1]

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        return self.head((features - self.feature_mean) / self.feature_scale)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(idx))

    @torch.no_grad()
    def standardize_from(self, features: torch.Tensor) -> None:
        """Centre and scale each pooled feature by its mean and standard deviation over
        ``features`` (pooled training passages), once, before fine-tuning.

        Mean-pooling a normalized stream leaves a large component common to every passage: in a
        pretrained 6-block width-64 model the pooled vector has norm about 6 while each
        coordinate varies by about 0.08 between passages. A new head with the body's learning
        rate then learns nothing in a few hundred steps (test accuracy at the majority class);
        standardized, its inputs vary by 1 in every coordinate, whatever the placement's scale.
        """
        self.feature_mean.copy_(features.mean(0))
        self.feature_scale.copy_(features.std(0).clamp_min(1e-6))


class StackedClassifier(nn.Module):
    """M `SequenceClassifier`s of one shape as one module: their bodies as one
    `StackedTransformer` (:mod:`normlab.nn.stacked`), their heads as one `StackedLinear`, their
    standardizations as [M, d] buffers. `forward(idx [M, B, T])` gives each member's logits on
    its own passages, [M, B, classes]. Its parameters are named as a member's (``body.*``,
    ``head.*``; a body's LM head, which a classifier never reads, is left out), and `shapes`
    gives their shapes in a member, as `StackedAdamW` reads them. The classifiers given are
    used up (the stack adopts the first one's modules)."""

    def __init__(self, classifiers: Sequence[SequenceClassifier]) -> None:
        super().__init__()
        first = classifiers[0]
        self.pooling, self.window = first.pooling, first.window
        member_shapes = {n: tuple(p.shape) for n, p in first.named_parameters()}
        self.body = StackedTransformer([c.body for c in classifiers])
        if getattr(self.body, "lm_head", None) is not None:
            self.body.lm_head = None  # (tied: the embedding, kept as body.tok_emb.weight)
        self.head = StackedLinear(torch.stack([c.head.weight.detach() for c in classifiers]),
                                  torch.stack([c.head.bias.detach() for c in classifiers]))
        self.register_buffer("feature_mean", torch.stack([c.feature_mean for c in classifiers]))
        self.register_buffer("feature_scale",
                             torch.stack([c.feature_scale for c in classifiers]))
        self.shapes = {n: member_shapes[n] for n, _ in self.named_parameters()}

    @property
    def members(self) -> int:
        return self.head.weight.shape[0]

    def features(self, idx: torch.Tensor) -> torch.Tensor:
        M, B, T = idx.shape
        w = self.window or T
        x = self.body.stream(idx.reshape(M, B * (T // w), w)).reshape(M, B, T, -1)
        return x.mean(2) if self.pooling == "mean" else x[:, :, -1]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        f = self.features(idx)
        return self.head((f - self.feature_mean.unsqueeze(1)) / self.feature_scale.unsqueeze(1))

    def keep(self, rows: Sequence[int]) -> None:
        """Keep the buffers of these members (their parameters are `StackedAdamW.keep`'s)."""
        index = torch.tensor(list(rows), dtype=torch.long, device=self.feature_mean.device)
        self.feature_mean = self.feature_mean.index_select(0, index)
        self.feature_scale = self.feature_scale.index_select(0, index)


# -- the training loop --------------------------------------------------------------------------
@dataclass(kw_only=True)
class _Tuning(Member):
    """One fine-tuning on the loop: its settings, its batches (`plan`: the training rows of each
    step), its loss curve (`[step, mean train loss since the last point, lr]`, a diverged
    step's loss as text) and the losses since the curve's last point."""

    config: FinetuneConfig
    plan: list[np.ndarray]
    curve: list[list[Any]] = field(default_factory=list)
    recent: list[float] = field(default_factory=list)


class _TuningLoop(TrainLoop):
    """What every fine-tuning on the shared loop (`normlab.train.loop.TrainLoop`) does alike:
    stops on a non-finite loss only; records each member's loss curve; no evaluation inside the
    loop (`finetune_models` evaluates after it, whatever the outcome), no checkpoints, and a
    signal or an error stops it as it would any code."""

    stops_on_signal = False
    records_failures = False
    evaluates = False
    checkpoints = False

    def __init__(self, members: list[_Tuning], data: GenreTask, dev: torch.device,
                 progress: Callable[[str], None] | None) -> None:
        super().__init__(members)
        self.data, self.dev, self.progress = data, dev, progress
        plan = members[0].plan
        self.tokens_per_step = len(plan[0]) * data.passage_bytes if plan else 0

    def divergence(self, m: Member, loss: float, grad_norm: float) -> str | None:
        return None if math.isfinite(loss) else "nonfinite_loss"

    def write(self, m: _Tuning, record: dict[str, Any]) -> None:  # type: ignore[override]
        if "diverged" in record:
            m.curve.append([m.step, str(record["train_loss"]), record["lr"]])
            return
        m.curve.append([m.step, float(np.mean(m.recent)), record["lr"]])
        m.recent = []

    def finish(self, m: Member, outcome: str, reason: str | None = None, **extra: Any) -> None:
        pass  # the outcome is the member's; the caller evaluates


class _FinetuneLoop(_TuningLoop):
    """Fine-tuning one classifier alone; a frozen body's pooled features come from `shared`."""

    def __init__(self, member: _Tuning, clf: SequenceClassifier,
                 optimizer: torch.optim.Optimizer, data: GenreTask, dev: torch.device,
                 shared: dict[str, Any], progress: Callable[[str], None] | None) -> None:
        super().__init__([member], data, dev, progress)
        self.clf, self.optimizer, self.shared = clf, optimizer, shared
        self.all_params = list(clf.parameters())

    def gradients(self, lrs: list[float], stats_due: list[bool]
                  ) -> tuple[list[float], list[float]]:
        m = self.active[0]
        rows = m.plan[m.step]
        target = _tokens(self.data.train_y[rows], self.dev)
        if self.shared:  # frozen: the features of the passages, computed once
            feats = self.shared["feats"][[self.shared["rows"][int(r)] for r in rows]]
            logits = self.clf.classify(feats)
        else:
            logits = self.clf(_tokens(self.data.train_x[rows], self.dev))
        loss = F.cross_entropy(logits.float(), target)
        loss_value = loss.item()
        if not math.isfinite(loss_value):  # diverged: no backward (a shared head stays clean)
            return [loss_value], [math.nan]
        loss.backward()
        self.params, self.total_norm = gradient_norm(self.all_params)
        m.recent.append(loss_value)
        return [loss_value], [self.total_norm.item()]

    def update(self, rows: list[int], lrs: list[float]) -> None:
        set_lr(self.optimizer, lrs[0])
        clip_and_step(self.optimizer, self.params, self.total_norm, self.active[0].tc.grad_clip)

    def write(self, m: _Tuning, record: dict[str, Any]) -> None:  # type: ignore[override]
        super().write(m, record)
        if self.progress is not None and "diverged" not in record:
            self.progress(f"step {m.step}/{m.tc.steps}, train loss {m.curve[-1][1]:.4f}")


class _StackedFinetuneLoop(_TuningLoop):
    """Fine-tunings of one stack key as one `StackedClassifier` and one `StackedAdamW` (the
    stacked engine's): the members still training are the rows of the stack, in the order of
    `active`; a member that finishes or diverges leaves both, its weights kept (`final`) for the
    evaluation after the loop."""

    def __init__(self, members: list[_Tuning], classifiers: list[SequenceClassifier],
                 data: GenreTask, dev: torch.device,
                 progress: Callable[[str], None] | None) -> None:
        super().__init__(members, data, dev, progress)
        decayed = decayed_names(classifiers[0])
        self.model = StackedClassifier(classifiers)
        self.optim = StackedAdamW(self.model, decayed & set(self.model.shapes))
        self.final: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.logged: list[_Tuning] = []  # the members that added a point to their curve

    def gradients(self, lrs: list[float], stats_due: list[bool]
                  ) -> tuple[list[float], list[float]]:
        rows = [m.plan[m.step] for m in self.active]
        x = _tokens(np.stack([self.data.train_x[r] for r in rows]), self.dev)
        y = _tokens(np.stack([self.data.train_y[r] for r in rows]), self.dev)
        logits = self.model(x).float()
        losses = [F.cross_entropy(logits[i], y[i]) for i in range(len(rows))]
        values = torch.stack([loss.detach() for loss in losses]).tolist()
        finite = [loss for loss, v in zip(losses, values, strict=True) if math.isfinite(v)]
        if finite:  # each member's gradient is that of its own loss; a diverged one takes none
            torch.stack(finite).sum().backward()
        self.grads = self.optim.gather_grads()
        self.norms = torch.linalg.vector_norm(self.grads, dim=1).tolist()
        for m, v in zip(self.active, values, strict=True):
            if math.isfinite(v):
                m.recent.append(v)
        return values, [n if math.isfinite(v) else math.nan
                        for n, v in zip(self.norms, values, strict=True)]

    def update(self, rows: list[int], lrs: list[float]) -> None:
        grads, norms = self.grads, self.norms
        if len(rows) < len(norms):  # some diverged: the rest step
            grads, norms = grads[rows], [norms[r] for r in rows]
        self.optim.clip_(grads, norms, [m.tc.grad_clip for m in self.active])
        self.optim.step(grads, [adamw_hyper(m.tc, lr)
                                for m, lr in zip(self.active, lrs, strict=True)])
        self.optim.zero_grad()

    def keep_rows(self, rows: list[int]) -> None:
        self.optim.keep(rows)
        self.model.keep(rows)

    def write(self, m: _Tuning, record: dict[str, Any]) -> None:  # type: ignore[override]
        super().write(m, record)
        if "diverged" not in record:
            self.logged.append(m)

    def show(self, records: list[dict[str, Any]], dt: float) -> None:
        if self.progress is not None and self.logged:
            losses = [m.curve[-1][1] for m in self.logged]
            steps = max(m.tc.steps for m in self.members)
            self.progress(f"{len(self.members)} stacked fine-tunings: step "
                          f"{max(m.step for m in self.logged)}/{steps}, train loss "
                          f"{min(losses):.4f}-{max(losses):.4f}")
        self.logged = []

    def finish(self, m: Member, outcome: str, reason: str | None = None, **extra: Any) -> None:
        row = next(r for r, a in enumerate(self.active) if a is m)  # (leaving after this)
        self.final[id(m)] = (self.optim.flat[row].clone(), self.model.feature_mean[row].clone(),
                             self.model.feature_scale[row].clone())

    def gather(self) -> StackedClassifier:
        """The stack again, every member with the weights it ended with (for evaluation)."""
        saved = [self.final[id(m)] for m in self.members]
        self.optim.set_weights(torch.stack([w for w, _, _ in saved]))
        self.model.feature_mean = torch.stack([mean for _, mean, _ in saved])
        self.model.feature_scale = torch.stack([scale for _, _, scale in saved])
        return self.model


def _batch_indices(n: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Rows of step ``step``: consecutive slices of per-epoch permutations (stateless)."""
    start = step * batch_size
    out = []
    while len(out) < batch_size:
        epoch, pos = divmod(start + len(out), n)
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        out.extend(perm[pos:pos + batch_size - len(out)].tolist())
    return np.asarray(out, dtype=np.int64)


def _tokens(x: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.array(x, dtype=np.int64)).to(device)


@torch.no_grad()
def _features(clf: SequenceClassifier, x: np.ndarray, device: torch.device,
              batch: int) -> torch.Tensor:
    out = [clf.features(_tokens(x[i:i + batch], device)) for i in range(0, len(x), batch)]
    return torch.cat(out) if out else torch.zeros(0, clf.head.in_features, device=device)


@torch.no_grad()
def _batched_features(clf: SequenceClassifier, x: np.ndarray, device: torch.device,
                      batch: int) -> list[torch.Tensor]:
    """The pooled features of ``x`` in the batches `_evaluate` reads them in."""
    was_training = clf.training
    clf.eval()
    out = [clf.features(_tokens(x[i:i + batch], device)) for i in range(0, len(x), batch)]
    clf.train(was_training)
    return out


@torch.no_grad()
def _evaluate(clf: SequenceClassifier, x: np.ndarray, y: np.ndarray, n_classes: int,
              device: torch.device, batch: int,
              features: Sequence[torch.Tensor] | None = None) -> dict[str, Any]:
    """Accuracy, loss and confusion on ``x``; with ``features`` (`_batched_features` of ``x``,
    a frozen body's) only the head is applied."""
    was_training = clf.training
    clf.eval()
    preds, loss_sum = [], 0.0
    for k, i in enumerate(range(0, len(x), batch)):
        logits = (clf(_tokens(x[i:i + batch], device)) if features is None
                  else clf.classify(features[k])).float()
        target = _tokens(y[i:i + batch], device)
        loss_sum += F.cross_entropy(logits, target, reduction="sum").item()
        preds.append(logits.argmax(1).cpu().numpy())
    clf.train(was_training)
    return _scores(np.concatenate(preds), y, n_classes, loss_sum / len(x))


@torch.no_grad()
def _evaluate_stack(stack: StackedClassifier, x: np.ndarray, y: np.ndarray, n_classes: int,
                    device: torch.device, batch: int) -> list[dict[str, Any]]:
    """`_evaluate` of every member of ``stack`` on the same passages: one forward of the stack
    per batch."""
    stack.eval()
    members = stack.members
    preds: list[list[np.ndarray]] = [[] for _ in range(members)]
    loss_sum = [0.0] * members
    for i in range(0, len(x), batch):
        idx = _tokens(x[i:i + batch], device)
        logits = stack(idx.expand(members, *idx.shape)).float()
        target = _tokens(y[i:i + batch], device)
        for k in range(members):
            loss_sum[k] += F.cross_entropy(logits[k], target, reduction="sum").item()
            preds[k].append(logits[k].argmax(1).cpu().numpy())
    stack.train()
    return [_scores(np.concatenate(p), y, n_classes, s / len(x))
            for p, s in zip(preds, loss_sum, strict=True)]


def _scores(pred: np.ndarray, y: np.ndarray, n_classes: int, loss: float) -> dict[str, Any]:
    confusion = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(confusion, (y, pred), 1)
    return {"accuracy": float((pred == y).mean()),
            "loss": loss if math.isfinite(loss) else str(loss), "confusion": confusion}


def _check_model(model: Any, task: GenreTask, window: int | None = None) -> None:
    if not isinstance(model, NormTransformer):
        raise FinetuneError(f"expected a normlab NormTransformer, got {type(model).__name__}")
    read = window or task.passage_bytes
    if read > model.cfg.max_seq_len:
        what = f"window={window}" if window else f"passage_bytes={task.passage_bytes}"
        raise FinetuneError(
            f"{what} exceeds the model's max_seq_len={model.cfg.max_seq_len}; set window to "
            f"at most {model.cfg.max_seq_len} (a divisor of passage_bytes)")
    if task.passage_bytes % read:
        raise FinetuneError(f"window={window} must divide passage_bytes={task.passage_bytes}")


def finetune_model(model: NormTransformer, config: FinetuneConfig | None = None, *,
                   data: GenreTask | None = None, device: str | torch.device = "auto",
                   progress: Callable[[str], None] | None = None, **settings: Any
                   ) -> dict[str, Any]:
    """Fine-tune a copy of ``model`` (left unchanged) with ``config`` (or the `FinetuneConfig`
    of ``settings``) on the genre or play-id task; no caching. ``progress`` is told each point
    of the loss curve as it is recorded, then the evaluation.

    ``data``: the task's passages already built (a :class:`GenreTask`, e.g. a subset); its
    task, passage_bytes, gap and val_fraction are then the settings recorded, in place of the
    config's. Returns the settings (`FinetuneConfig.record`), ``test_accuracy``, ``test_loss``,
    ``train_accuracy`` (on the first ``train_eval_max`` training passages; the test set is every
    passage, or with ``test_max`` an evenly spaced subset of at most that many),
    ``val_accuracy`` (with ``val_fraction``: on at most ``val_max`` evenly spaced validation
    passages; else None), ``per_class_test_accuracy``, ``confusion`` (test; rows are true
    classes), ``chance``, ``majority``, ``loss_curve`` (``[step, mean train loss since the last
    point, lr]``), ``outcome`` (``completed``, or ``diverged`` on a non-finite loss),
    ``time_s`` and sizes.
    """
    cfg = finetune_config(config, **settings)
    return finetune_models([(model, cfg)], data=data, device=device, progress=progress)[0]


def finetune_model_lrs(model: NormTransformer, config: FinetuneConfig | None = None, *,
                       lrs: Sequence[float] | None = None, data: GenreTask | None = None,
                       device: str | torch.device = "auto",
                       progress: Callable[[str], None] | None = None, **settings: Any
                       ) -> list[dict[str, Any]]:
    """:func:`finetune_model` at each of ``lrs`` (default: the config's lr), in order
    (:func:`finetune_models`): the lrs train as one stacked group, each result the one
    :func:`finetune_model` at that lr returns within float rounding. With ``freeze=True`` the
    body is fixed, so its pooled features (of the standardization, training and evaluation
    passages) are computed once for every lr and only a head is trained per lr, alone, with
    the numbers :func:`finetune_model` gives: a frozen linear probe's lr grid costs about one
    pass of the body over the passages."""
    cfg = finetune_config(config, **settings)
    lrs = [cfg.lr] if lrs is None else list(lrs)
    if not lrs:
        raise FinetuneError("lrs: at least one learning rate")
    return finetune_models([(model, cfg.replace(lr=lr)) for lr in lrs], data=data,
                           device=device, progress=progress)


def finetune_models(members: Sequence[tuple[NormTransformer, FinetuneConfig]], *,
                    data: GenreTask | None = None, device: str | torch.device = "auto",
                    progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The fine-tuning of each ``(model, config)`` (a copy of the model; none is changed), in
    order: each result is the one :func:`finetune_model` gives it, with ``data`` as there.

    Members that the stacked engine can hold (`normlab.train.group.finetune_unstackable_reason`
    is None) and that share a stack key (`finetune_stack_key`: models of one `ModelConfig`, and
    every setting not in `PER_MEMBER_FINETUNE` equal) train as one stacked group, each member's
    numbers its fine-tuning alone's within float rounding; their results say ``engine:
    stacked`` and ``group_size``, and their times are their share of the group's. A group of
    one, and a member the engine cannot hold, trains alone (``progress`` is told why); frozen
    members of one model that differ only in lr share the body's features."""
    from normlab.train.trainer import resolve_device

    if data is not None:
        members = [(model, cfg.replace(task=data.task, passage_bytes=data.passage_bytes,
                                       gap=data.gap, val_fraction=data.val_fraction))
                   for model, cfg in members]
    dev = resolve_device(device) if isinstance(device, str) else torch.device(device)
    for model, cfg in members:
        _check_model(model, data or _task(cfg), cfg.window)
    # the tasks: stacked groups, frozen lr grids of one model, and single fine-tunings, in the
    # order of their first member
    groups: dict[Any, list[int]] = {}
    for i, (model, cfg) in enumerate(members):
        reason = finetune_unstackable_reason(cfg, model.cfg)
        if reason is None:
            key: Any = ("stacked", finetune_stack_key(cfg, model.cfg, str(dev)))
        elif cfg.freeze:
            key = ("frozen", id(model), cfg.replace(lr=FinetuneConfig().lr))
        else:
            key = ("alone", i)
        groups.setdefault(key, []).append(i)
        if reason is not None and progress is not None and len(members) > 1:
            progress(f"fine-tuning {i + 1} of {len(members)} alone: {reason}")
    out: list[dict[str, Any] | None] = [None] * len(members)
    for (kind, *_), rows in groups.items():
        task = data or _task(members[rows[0]][1])
        if kind == "stacked" and len(rows) > 1:
            results = _finetune_stacked([members[i][0] for i in rows],
                                        [members[i][1] for i in rows], task, dev, progress)
        else:
            results = _finetune_alone(members[rows[0]][0], [members[i][1] for i in rows], task,
                                      dev, progress)
        for i, result in zip(rows, results, strict=True):
            out[i] = result
    return out  # type: ignore[return-value]


def _task(cfg: FinetuneConfig) -> GenreTask:
    return genre_task(cfg.task, passage_bytes=cfg.passage_bytes, gap=cfg.gap,
                      val_fraction=cfg.val_fraction)


def _plan(data: GenreTask, cfg: FinetuneConfig) -> list[np.ndarray]:
    """The training rows of each step (a function of the seed and the step)."""
    return [_batch_indices(len(data.train_y), cfg.batch_size, cfg.seed, s)
            for s in range(cfg.steps)]


def _evaluation_sets(data: GenreTask, cfg: FinetuneConfig
                     ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The passages scored after training: test (at most ``test_max``, evenly spaced), the
    first ``train_eval_max`` training passages, validation (at most ``val_max``)."""
    scored = evaluation_rows(len(data.test_y), cfg.test_max)
    n_tr = min(cfg.train_eval_max, len(data.train_y))
    val_rows = evaluation_rows(len(data.val_y), cfg.val_max)
    return {"test": (data.test_x[scored], data.test_y[scored]),
            "train": (data.train_x[:n_tr], data.train_y[:n_tr]),
            "val": (data.val_x[val_rows], data.val_y[val_rows])}


def _classifier(model: NormTransformer, data: GenreTask, cfg: FinetuneConfig,
                dev: torch.device) -> SequenceClassifier:
    """A classifier on a copy of ``model``, its head initialised from the seed, its features
    standardized (`standardize`) on its own body (under the caller's `fork_rng`)."""
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    body = copy.deepcopy(model).to(dev)
    clf = SequenceClassifier(body, data.n_classes, cfg.pooling, generator=gen,
                             window=cfg.window).to(dev)
    if cfg.freeze:
        body.requires_grad_(False)
    if cfg.standardize:
        body.eval()
        clf.standardize_from(_features(clf, data.train_x[:cfg.standardize], dev,
                                       cfg.eval_batch_size))
    return clf


def _rng_devices(dev: torch.device) -> list[int]:
    return [dev.index or 0] if dev.type == "cuda" else []


def _finetune_alone(model: NormTransformer, configs: list[FinetuneConfig], data: GenreTask,
                    dev: torch.device, progress: Callable[[str], None] | None
                    ) -> list[dict[str, Any]]:
    """Each config's fine-tuning of ``model`` alone, one after another (several only frozen,
    differing in lr: the body's features are computed once for all of them)."""
    cfg = configs[0]
    freeze, eval_batch_size = cfg.freeze, cfg.eval_batch_size
    evaluated = _evaluation_sets(data, cfg)
    # frozen: the classifier (body and standardization), its initial head, the training
    # passages' features and the evaluation passages' features (per batch), built once
    shared: dict[str, Any] = {}
    out = []
    for run_cfg in configs:
        t0 = time.perf_counter()
        plan = _plan(data, run_cfg)
        with torch.random.fork_rng(devices=_rng_devices(dev)):  # the caller's RNG is left alone
            if shared:
                torch.manual_seed(run_cfg.seed)
                clf = shared["clf"]
                clf.head.load_state_dict(shared["head"])  # the head a new run starts from
            else:
                clf = _classifier(model, data, run_cfg, dev)
                if freeze:  # the body is fixed: compute each needed passage's features once
                    clf.body.eval()
                    needed = np.unique(np.concatenate(plan))
                    shared.update(
                        clf=clf, head=copy.deepcopy(clf.head.state_dict()),
                        rows={int(r): i for i, r in enumerate(needed)},
                        feats=_features(clf, data.train_x[needed], dev, eval_batch_size),
                        evaluated={k: _batched_features(clf, x, dev, eval_batch_size)
                                   for k, (x, _) in evaluated.items()})
            trainable = sum(p.numel() for p in clf.parameters() if p.requires_grad)
            tc = run_cfg.train_config()
            optimizer = adamw(clf, tc)  # decay on matrices only, as in training
            clf.train(not freeze)
            member = _Tuning(tc=tc, config=run_cfg, plan=plan)
            _FinetuneLoop(member, clf, optimizer, data, dev, shared, progress).run()
            train_s = time.perf_counter() - t0
            if progress is not None:
                progress(f"evaluating on {len(evaluated['test'][1])} test passages")
            ev = {k: _evaluate(clf, x, y, data.n_classes, dev, eval_batch_size,
                               shared["evaluated"][k] if shared else None)
                  for k, (x, y) in evaluated.items() if k != "val" or len(y)}
        out.append(_result(model, member, data, evaluated, ev, trainable, dev, train_s,
                           time.perf_counter() - t0))
    return out


def _finetune_stacked(models: list[NormTransformer], configs: list[FinetuneConfig],
                      data: GenreTask, dev: torch.device,
                      progress: Callable[[str], None] | None) -> list[dict[str, Any]]:
    """The fine-tunings of one stack key (``configs[i]`` of ``models[i]``) as one stacked
    group (`_StackedFinetuneLoop`), then evaluated by one forward of the stack per batch."""
    t0 = time.perf_counter()
    cfg = configs[0]  # (what the members share)
    evaluated = _evaluation_sets(data, cfg)
    with torch.random.fork_rng(devices=_rng_devices(dev)):  # the caller's RNG is left alone
        classifiers = [_classifier(m, data, c, dev) for m, c in zip(models, configs,
                                                                    strict=True)]
        trainable = sum(p.numel() for p in classifiers[0].parameters() if p.requires_grad)
        members = [_Tuning(tc=c.train_config(), config=c, plan=_plan(data, c)) for c in configs]
        loop = _StackedFinetuneLoop(members, classifiers, data, dev, progress)
        loop.run()
    train_s = time.perf_counter() - t0
    if progress is not None:
        progress(f"evaluating on {len(evaluated['test'][1])} test passages")
    stack = loop.gather()
    scores = {k: _evaluate_stack(stack, x, y, data.n_classes, dev, cfg.eval_batch_size)
              for k, (x, y) in evaluated.items() if k != "val" or len(y)}
    n = len(members)
    share = (time.perf_counter() - t0) / n
    return [_result(model, m, data, evaluated, {k: v[i] for k, v in scores.items()}, trainable,
                    dev, train_s / n, share) | {"engine": "stacked", "group_size": n}
            for i, (model, m) in enumerate(zip(models, members, strict=True))]


def _result(model: NormTransformer, m: _Tuning, data: GenreTask,
            evaluated: dict[str, tuple[np.ndarray, np.ndarray]], ev: dict[str, dict[str, Any]],
            trainable: int, dev: torch.device, train_s: float, time_s: float
            ) -> dict[str, Any]:
    """What a fine-tuning returns (`finetune_model`'s keys)."""
    test, train, val = ev["test"], ev["train"], ev.get("val")
    confusion = test["confusion"]
    per_class = {c: float(confusion[k, k] / confusion[k].sum())
                 for k, c in enumerate(data.classes) if confusion[k].sum()}
    mc = model.cfg
    return {
        "settings": m.config.record(), "task": data.task, "classes": data.classes,
        "outcome": m.outcome,
        # a diverged run stops before the update of its last step
        "steps_done": m.step if m.outcome == "completed" else m.step - 1,
        "test_accuracy": test["accuracy"], "test_loss": test["loss"],
        "train_accuracy": train["accuracy"], "train_eval_loss": train["loss"],
        "val_accuracy": val["accuracy"] if val else None,
        "val_loss": val["loss"] if val else None, "n_val": int(len(evaluated["val"][1])),
        "per_class_test_accuracy": per_class, "confusion": confusion.tolist(),
        "balanced_test_accuracy": float(np.mean(list(per_class.values()))),
        "chance": data.chance, "majority": data.majority,
        "n_train": int(len(data.train_y)), "n_test": int(len(evaluated["test"][1])),
        "n_train_eval": int(len(evaluated["train"][1])), "loss_curve": m.curve,
        "model": {"placement": mc.placement, "n_blocks": mc.n_blocks,
                  "d_model": mc.d_model, "kind": mc.kind, "norm": mc.norm,
                  "init": model.plan.init, "params": model.num_params()},
        "trainable_params": int(trainable),
        "device": str(dev), "torch": str(torch.__version__),
        "train_time_s": train_s, "time_s": time_s,
    }
