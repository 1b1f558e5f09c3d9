"""The fine-tuning loop: a linear classifier on a (pretrained) model's pooled final stream
(`SequenceClassifier`), trained on the Shakespeare genre or play-id task
(:mod:`normlab.data.genre`) by `finetune_model` (one lr) or `finetune_model_lrs` (a grid of
lrs), each with the settings of a `FinetuneConfig` (:mod:`normlab.finetune.config`). No caching
here: fine-tuning a run folder, with its results stored in the folder, is
:mod:`normlab.finetune.runs`.

Each lr trains on the loop runs train on (:mod:`normlab.train.loop`, `_FinetuneLoop`): the lr
schedule, the step with its gradient clipping, the stop on a non-finite loss and the logging
cadence of the loss curve are that loop's; the batches, the loss, the curve and the evaluation
after training (test, train and validation passages, whatever the outcome) are fine-tuning's own.
It has no checkpoints (a fine-tuning is short, and its result is cached whole), and a signal stops
it as it stops any code.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
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
from normlab.train.loop import Member, TrainLoop
from normlab.train.step import clip_and_step, gradient_norm, set_lr

__all__ = ["SequenceClassifier", "finetune_model", "finetune_model_lrs"]


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


# -- the training loop --------------------------------------------------------------------------
class _FinetuneLoop(TrainLoop):
    """Fine-tuning at one lr on the shared loop (`normlab.train.loop.TrainLoop`): one member,
    the classifier; batches from `plan` (rows of the training passages per step; a frozen body's
    pooled features from `shared`); stops on a non-finite loss only; records a loss curve
    (`curve`: `[step, mean train loss since the last point, lr]`, a diverged step's loss as
    text); no evaluation inside the loop (`finetune_model_lrs` evaluates after it, whatever the
    outcome), no checkpoints, and a signal or an error stops it as it would any code."""

    stops_on_signal = False
    records_failures = False
    evaluates = False
    checkpoints = False

    def __init__(self, member: Member, clf: SequenceClassifier,
                 optimizer: torch.optim.Optimizer, data: GenreTask, plan: list[np.ndarray],
                 dev: torch.device, shared: dict[str, Any],
                 progress: Callable[[str], None] | None) -> None:
        super().__init__([member])
        self.clf, self.optimizer, self.data, self.plan = clf, optimizer, data, plan
        self.all_params = list(clf.parameters())
        self.dev, self.shared, self.progress = dev, shared, progress
        self.tokens_per_step = len(plan[0]) * data.passage_bytes if plan else 0
        self.curve: list[list[Any]] = []
        self.recent: list[float] = []  # the losses since the curve's last point

    def gradients(self, lrs: list[float], stats_due: list[bool]
                  ) -> tuple[list[float], list[float]]:
        rows = self.plan[self.active[0].step]
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
        self.recent.append(loss_value)
        return [loss_value], [self.total_norm.item()]

    def divergence(self, m: Member, loss: float, grad_norm: float) -> str | None:
        return None if math.isfinite(loss) else "nonfinite_loss"

    def update(self, rows: list[int], lrs: list[float]) -> None:
        set_lr(self.optimizer, lrs[0])
        clip_and_step(self.optimizer, self.params, self.total_norm, self.active[0].tc.grad_clip)

    def write(self, m: Member, record: dict[str, Any]) -> None:
        if "diverged" in record:
            self.curve.append([m.step, str(record["train_loss"]), record["lr"]])
            return
        self.curve.append([m.step, float(np.mean(self.recent)), record["lr"]])
        self.recent = []
        if self.progress is not None:
            self.progress(f"step {m.step}/{m.tc.steps}, train loss {self.curve[-1][1]:.4f}")

    def finish(self, m: Member, outcome: str, reason: str | None = None, **extra: Any) -> None:
        pass  # the outcome is the member's; the caller evaluates


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
    pred = np.concatenate(preds)
    confusion = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(confusion, (y, pred), 1)
    loss = loss_sum / len(x)
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
    return finetune_model_lrs(model, cfg, lrs=[cfg.lr], data=data, device=device,
                              progress=progress)[0]


def finetune_model_lrs(model: NormTransformer, config: FinetuneConfig | None = None, *,
                       lrs: Sequence[float] | None = None, data: GenreTask | None = None,
                       device: str | torch.device = "auto",
                       progress: Callable[[str], None] | None = None, **settings: Any
                       ) -> list[dict[str, Any]]:
    """:func:`finetune_model` at each of ``lrs`` (default: the config's lr), in order: each
    result is the one a call of :func:`finetune_model` at that lr returns (the same numbers).
    With ``freeze=True`` the body is fixed, so its pooled features (of the standardization,
    training and evaluation passages) are computed once for every lr and only a head is trained
    per lr: a frozen linear probe's lr grid costs about one pass of the body over the
    passages."""
    from normlab.train.optim import adamw
    from normlab.train.trainer import resolve_device

    cfg = finetune_config(config, **settings)
    lrs = [cfg.lr] if lrs is None else list(lrs)
    if not lrs:
        raise FinetuneError("lrs: at least one learning rate")
    if data is not None:
        cfg = cfg.replace(task=data.task, passage_bytes=data.passage_bytes, gap=data.gap,
                          val_fraction=data.val_fraction)
    configs = [cfg.replace(lr=lr) for lr in lrs]
    if data is None:
        data = genre_task(cfg.task, passage_bytes=cfg.passage_bytes, gap=cfg.gap,
                          val_fraction=cfg.val_fraction)
    steps, batch_size, seed, freeze = cfg.steps, cfg.batch_size, cfg.seed, cfg.freeze
    window, standardize, eval_batch_size = cfg.window, cfg.standardize, cfg.eval_batch_size
    _check_model(model, data, window)
    dev = resolve_device(device) if isinstance(device, str) else torch.device(device)
    plan = [_batch_indices(len(data.train_y), batch_size, seed, s) for s in range(steps)]
    scored = evaluation_rows(len(data.test_y), cfg.test_max)
    n_tr = min(cfg.train_eval_max, len(data.train_y))
    val_rows = evaluation_rows(len(data.val_y), cfg.val_max)
    evaluated = {"test": (data.test_x[scored], data.test_y[scored]),
                 "train": (data.train_x[:n_tr], data.train_y[:n_tr]),
                 "val": (data.val_x[val_rows], data.val_y[val_rows])}
    # frozen: the classifier (body and standardization), its initial head, the training
    # passages' features and the evaluation passages' features (per batch), built once
    shared: dict[str, Any] = {}
    rng_devices = [dev.index or 0] if dev.type == "cuda" else []
    out = []
    for run_cfg in configs:
        t0 = time.perf_counter()
        with torch.random.fork_rng(devices=rng_devices):  # the caller's RNG state is left alone
            torch.manual_seed(seed)
            gen = torch.Generator().manual_seed(seed)
            if shared:
                clf = shared["clf"]
                clf.head.load_state_dict(shared["head"])  # the head a new run starts from
            else:
                body = copy.deepcopy(model).to(dev)
                clf = SequenceClassifier(body, data.n_classes, cfg.pooling, generator=gen,
                                         window=window).to(dev)
                if freeze:
                    body.requires_grad_(False)
                if standardize:
                    body.eval()
                    clf.standardize_from(_features(clf, data.train_x[:standardize], dev,
                                                   eval_batch_size))
                if freeze:  # the body is fixed: compute each needed passage's features once
                    body.eval()
                    needed = np.unique(np.concatenate(plan))
                    shared.update(
                        clf=clf, head=copy.deepcopy(clf.head.state_dict()),
                        rows={int(r): i for i, r in enumerate(needed)},
                        feats=_features(clf, data.train_x[needed], dev, eval_batch_size),
                        evaluated={k: _batched_features(clf, x, dev, eval_batch_size)
                                   for k, (x, _) in evaluated.items()})
            trainable = [p for p in clf.parameters() if p.requires_grad]
            tc = run_cfg.train_config()
            optimizer = adamw(clf, tc)  # decay on matrices only, as in training
            clf.train(not freeze)
            member = Member(tc=tc)
            loop = _FinetuneLoop(member, clf, optimizer, data, plan, dev, shared, progress)
            loop.run()
            train_s = time.perf_counter() - t0
            if progress is not None:
                progress(f"evaluating on {len(scored)} test passages")
            ev = {k: _evaluate(clf, x, y, data.n_classes, dev, eval_batch_size,
                               shared["evaluated"][k] if shared else None)
                  for k, (x, y) in evaluated.items() if k != "val" or len(y)}
        test, train, val = ev["test"], ev["train"], ev.get("val")
        confusion = test["confusion"]
        per_class = {c: float(confusion[k, k] / confusion[k].sum())
                     for k, c in enumerate(data.classes) if confusion[k].sum()}
        mc = model.cfg
        out.append({
            "settings": run_cfg.record(), "task": data.task, "classes": data.classes,
            "outcome": member.outcome,
            # a diverged run stops before the update of its last step
            "steps_done": member.step if member.outcome == "completed" else member.step - 1,
            "test_accuracy": test["accuracy"], "test_loss": test["loss"],
            "train_accuracy": train["accuracy"], "train_eval_loss": train["loss"],
            "val_accuracy": val["accuracy"] if val else None,
            "val_loss": val["loss"] if val else None, "n_val": int(len(val_rows)),
            "per_class_test_accuracy": per_class, "confusion": confusion.tolist(),
            "balanced_test_accuracy": float(np.mean(list(per_class.values()))),
            "chance": data.chance, "majority": data.majority,
            "n_train": int(len(data.train_y)), "n_test": int(len(scored)),
            "n_train_eval": int(n_tr), "loss_curve": loop.curve,
            "model": {"placement": mc.placement, "n_blocks": mc.n_blocks,
                      "d_model": mc.d_model, "kind": mc.kind, "norm": mc.norm,
                      "init": model.plan.init, "params": model.num_params()},
            "trainable_params": int(sum(p.numel() for p in trainable)),
            "device": str(dev), "torch": str(torch.__version__),
            "train_time_s": train_s, "time_s": time.perf_counter() - t0,
        })
    return out
