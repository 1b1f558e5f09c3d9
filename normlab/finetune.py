"""Fine-tuning for claim C10 (post transfers better after fine-tuning): a pretrained decoder gets a
linear classifier on its pooled final stream and is trained on the Shakespeare genre task
(:mod:`normlab.data.genre`); the result is its test accuracy.

    finetune(run_dir, "genre", steps=200, lr=3e-4)          # a trained run, cached on disk
    finetune(run_dir, "genre", from_init=True)              # the run's architecture, at init
    finetune_model(model, "play", steps=50)                 # any NormTransformer, not cached

The classifier reads ``model.stream(idx)`` (the final normalized stream ``[B, T, d]``), pools it
over positions (``mean``; or ``last``, the one position that sees the whole passage in a causal
decoder) and applies a new ``Linear(d, classes)``. All parameters are trained (only the head with
``freeze=True``) with AdamW, linear warmup then cosine decay (``normlab.train.schedules.lr_at``),
gradient clipping, and batches drawn from a seeded per-epoch permutation of the training
passages, so a run is a function of its settings: on CPU the same seed gives identical numbers.

A run folder's results go to ``run_dir/finetune/<task>-<hash>.json`` (``<task>-init-<hash>``
from init), the hash covering every setting and the checkpoint's step; an existing file is
returned as it is (with ``cached: True``), so a study that is re-run does no finished work again.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from normlab.config import TrainConfig, parse_config
from normlab.data.genre import TASKS, GenreTask, evaluation_rows, genre_task
from normlab.nn.model import NormTransformer
from normlab.train.checkpoint import CheckpointError
from normlab.train.logging import read_json, write_json_atomic
from normlab.train.schedules import lr_at
from normlab.warnings import NormlabWarning

__all__ = [
    "FINETUNE_VERSION",
    "FinetuneError",
    "SequenceClassifier",
    "finetune",
    "finetune_model",
    "finetune_path",
    "finetune_settings",
]

FINETUNE_VERSION = 1
"""Bumped when a change to this module changes results, so old cached files are not reused."""

Pooling = Literal["mean", "last"]
POOLINGS: tuple[str, ...] = ("mean", "last")


class FinetuneError(ValueError):
    """Fine-tuning settings that cannot be used; the message names the setting."""


class SequenceClassifier(nn.Module):
    """``Linear(pool(body.stream(idx)))``: a sequence classifier on a (pretrained) model."""

    def __init__(self, body: NormTransformer, n_classes: int, pooling: Pooling = "mean",
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise FinetuneError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        self.body = body
        self.pooling = pooling
        d = body.cfg.d_model
        self.head = nn.Linear(d, n_classes, bias=True)
        with torch.no_grad():
            self.head.weight.normal_(0.0, 0.02, generator=generator)
            self.head.bias.zero_()

    def features(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.body.stream(idx)
        return x.mean(1) if self.pooling == "mean" else x[:, -1]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(idx))


# -- settings, hashing, paths ------------------------------------------------------------------
def finetune_settings(task: str = "genre", *, steps: int = 200, lr: float = 3e-4,
                      batch_size: int = 32, warmup: int = 20, seed: int = 0,
                      pooling: Pooling = "mean", freeze: bool = False,
                      passage_bytes: int = 256, gap: int = 1024, weight_decay: float = 0.01,
                      min_lr_ratio: float = 0.0, grad_clip: float | None = 1.0,
                      train_eval_max: int = 2048, test_max: int | None = None) -> dict[str, Any]:
    """The validated settings of one fine-tuning run (what its cache hash covers)."""
    problems = []
    if task not in TASKS:
        problems.append(f"task: one of {', '.join(TASKS)}, got {task!r}")
    for name, value, low in (("steps", steps, 1), ("batch_size", batch_size, 1),
                             ("warmup", warmup, 0), ("seed", seed, 0),
                             ("passage_bytes", passage_bytes, 2), ("gap", gap, 0),
                             ("train_eval_max", train_eval_max, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            problems.append(f"{name}: an integer >= {low}, got {value!r}")
    for name, value in (("lr", lr), ("weight_decay", weight_decay),
                        ("min_lr_ratio", min_lr_ratio)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value >= 0):
            problems.append(f"{name}: a finite number >= 0, got {value!r}")
    if isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr == 0:
        problems.append("lr: must be > 0")
    if isinstance(min_lr_ratio, (int, float)) and min_lr_ratio > 1:
        problems.append(f"min_lr_ratio: at most 1, got {min_lr_ratio}")
    if test_max is not None and (isinstance(test_max, bool) or not isinstance(
            test_max, (int, np.integer)) or test_max < 1):
        problems.append(f"test_max: an integer >= 1 or None, got {test_max!r}")
    if grad_clip is not None and not (isinstance(grad_clip, (int, float)) and grad_clip > 0):
        problems.append(f"grad_clip: a number > 0 or None, got {grad_clip!r}")
    if pooling not in POOLINGS:
        problems.append(f"pooling: one of {', '.join(POOLINGS)}, got {pooling!r}")
    if not isinstance(freeze, bool):
        problems.append(f"freeze: true or false, got {freeze!r}")
    if problems:
        raise FinetuneError("invalid fine-tuning settings: " + "; ".join(problems))
    return {"task": task, "steps": int(steps), "lr": float(lr), "batch_size": int(batch_size),
            "warmup": int(warmup), "seed": int(seed), "pooling": pooling, "freeze": freeze,
            "passage_bytes": int(passage_bytes), "gap": int(gap),
            "weight_decay": float(weight_decay), "min_lr_ratio": float(min_lr_ratio),
            "grad_clip": None if grad_clip is None else float(grad_clip),
            "train_eval_max": int(train_eval_max),
            "test_max": None if test_max is None else int(test_max),
            "optimizer": "adamw(0.9,0.999,1e-8)", "schedule": "cosine",
            "version": FINETUNE_VERSION}


def _hash(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def _checkpoint_step(run_dir: Path) -> int | None:
    path = run_dir / "checkpoint" / "trainer_state.json"
    try:
        return int(json.loads(path.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def finetune_path(run_dir: Path | str, settings: dict[str, Any], from_init: bool = False) -> Path:
    """Where the result of fine-tuning ``run_dir`` with ``settings`` is (or will be) stored."""
    run_dir = Path(run_dir)
    key = {"settings": settings, "from_init": from_init, "run_id": run_dir.name,
           "checkpoint_step": None if from_init else _checkpoint_step(run_dir)}
    name = f"{settings['task']}-{'init-' if from_init else ''}{_hash(key)}.json"
    return run_dir / "finetune" / name


# -- the training loop --------------------------------------------------------------------------
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
def _evaluate(clf: SequenceClassifier, x: np.ndarray, y: np.ndarray, n_classes: int,
              device: torch.device, batch: int) -> dict[str, Any]:
    was_training = clf.training
    clf.eval()
    preds, loss_sum = [], 0.0
    for i in range(0, len(x), batch):
        logits = clf(_tokens(x[i:i + batch], device)).float()
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


def _check_model(model: Any, task: GenreTask) -> None:
    if not isinstance(model, NormTransformer):
        raise FinetuneError(f"expected a normlab NormTransformer, got {type(model).__name__}")
    if task.passage_bytes > model.cfg.max_seq_len:
        raise FinetuneError(
            f"passage_bytes={task.passage_bytes} exceeds the model's max_seq_len="
            f"{model.cfg.max_seq_len}; lower passage_bytes")


def finetune_model(model: NormTransformer, task: str | GenreTask = "genre", *, steps: int = 200,
                   lr: float = 3e-4, batch_size: int = 32, warmup: int = 20, seed: int = 0,
                   pooling: Pooling = "mean", freeze: bool = False, passage_bytes: int = 256,
                   gap: int = 1024, weight_decay: float = 0.01, min_lr_ratio: float = 0.0,
                   grad_clip: float | None = 1.0, train_eval_max: int = 2048,
                   test_max: int | None = None, device: str | torch.device = "auto",
                   eval_batch_size: int = 128,
                   log_every: int | None = None) -> dict[str, Any]:
    """Fine-tune a copy of ``model`` (left unchanged) on the genre or play-id task; no caching.

    ``task`` is ``"genre"``, ``"play"`` or a :class:`GenreTask` (then ``passage_bytes`` and
    ``gap`` come from it). Returns the settings, ``test_accuracy``, ``test_loss``,
    ``train_accuracy`` (on the first ``train_eval_max`` training passages; the test set is every
    passage, or with ``test_max`` an evenly spaced subset of at most that many),
    ``per_class_test_accuracy``, ``confusion`` (test; rows are true classes), ``chance``,
    ``majority``, ``loss_curve`` (``[step, mean train loss since the last point, lr]``),
    ``outcome`` (``completed``, or ``diverged`` on a non-finite loss), ``time_s`` and sizes.
    """
    from normlab.train.trainer import param_groups, resolve_device

    if isinstance(task, GenreTask):
        data = task
        passage_bytes, gap = data.passage_bytes, data.gap
    else:
        data = None
    settings = finetune_settings(
        data.task if data is not None else task, steps=steps, lr=lr, batch_size=batch_size,
        warmup=warmup, seed=seed, pooling=pooling, freeze=freeze, passage_bytes=passage_bytes,
        gap=gap, weight_decay=weight_decay, min_lr_ratio=min_lr_ratio, grad_clip=grad_clip,
        train_eval_max=train_eval_max, test_max=test_max)
    if data is None:
        data = genre_task(settings["task"], passage_bytes=settings["passage_bytes"],
                          gap=settings["gap"])
    _check_model(model, data)
    dev = resolve_device(device) if isinstance(device, str) else torch.device(device)
    schedule = parse_config(TrainConfig, {"steps": steps, "lr": lr, "warmup": warmup,
                                          "schedule": "cosine", "min_lr_ratio": min_lr_ratio})
    log_every = log_every or max(1, steps // 50)
    t0 = time.perf_counter()

    rng_devices = [dev.index or 0] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices):  # the caller's RNG state is left alone
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        body = copy.deepcopy(model).to(dev)
        clf = SequenceClassifier(body, data.n_classes, pooling, generator=gen).to(dev)
        if freeze:
            body.requires_grad_(False)
        trainable = [p for p in clf.parameters() if p.requires_grad]
        groups = []
        for group in param_groups(clf, weight_decay):  # decay on matrices only, as in training
            params = [p for p in group["params"] if p.requires_grad]
            if params:
                groups.append(group | {"params": params})
        optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)
        plan = [_batch_indices(len(data.train_y), batch_size, seed, s) for s in range(steps)]
        cached_features: dict[int, int] = {}
        feats = None
        if freeze:  # the body is fixed: compute each needed passage's features once
            body.eval()
            needed = np.unique(np.concatenate(plan))
            cached_features = {int(r): i for i, r in enumerate(needed)}
            feats = _features(clf, data.train_x[needed], dev, eval_batch_size)
        clf.train(not freeze)
        curve: list[list[float]] = []
        window: list[float] = []
        outcome = "completed"
        step = 0
        for step in range(steps):
            rows = plan[step]
            lr_now = lr_at(step, schedule)
            for group in optimizer.param_groups:
                group["lr"] = lr_now
            target = _tokens(data.train_y[rows], dev)
            if freeze:
                assert feats is not None
                logits = clf.head(feats[[cached_features[int(r)] for r in rows]])
            else:
                logits = clf(_tokens(data.train_x[rows], dev))
            loss = F.cross_entropy(logits.float(), target)
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                outcome = "diverged"
                curve.append([step + 1, str(loss_value), lr_now])
                break
            loss.backward()
            if grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(trainable, grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            window.append(loss_value)
            if (step + 1) % log_every == 0 or step + 1 == steps:
                curve.append([step + 1, float(np.mean(window)), lr_now])
                window = []
        train_s = time.perf_counter() - t0
        scored = evaluation_rows(len(data.test_y), test_max)
        test = _evaluate(clf, data.test_x[scored], data.test_y[scored], data.n_classes,
                         dev, eval_batch_size)
        n_tr = min(train_eval_max, len(data.train_y))
        train = _evaluate(clf, data.train_x[:n_tr], data.train_y[:n_tr], data.n_classes, dev,
                          eval_batch_size)

    confusion = test["confusion"]
    per_class = {c: float(confusion[k, k] / confusion[k].sum())
                 for k, c in enumerate(data.classes) if confusion[k].sum()}
    cfg = model.cfg
    return {
        "settings": settings, "task": data.task, "classes": data.classes, "outcome": outcome,
        "steps_done": step + 1 if outcome == "completed" else step,
        "test_accuracy": test["accuracy"], "test_loss": test["loss"],
        "train_accuracy": train["accuracy"], "train_eval_loss": train["loss"],
        "per_class_test_accuracy": per_class, "confusion": confusion.tolist(),
        "balanced_test_accuracy": float(np.mean(list(per_class.values()))),
        "chance": data.chance, "majority": data.majority,
        "n_train": int(len(data.train_y)), "n_test": int(len(scored)),
        "n_train_eval": int(n_tr), "loss_curve": curve,
        "model": {"placement": cfg.placement, "n_blocks": cfg.n_blocks, "d_model": cfg.d_model,
                  "kind": cfg.kind, "norm": cfg.norm, "init": model.plan.init,
                  "params": model.num_params()},
        "trainable_params": int(sum(p.numel() for p in trainable)),
        "device": str(dev), "torch": str(torch.__version__),
        "train_time_s": train_s, "time_s": time.perf_counter() - t0,
    }


def _load_run_model(run_dir: Path, from_init: bool):
    from normlab.nn import build_model
    from normlab.train import RunFolderError, load_trained_model, read_run_config

    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: no such run folder")
    try:
        if from_init:
            cfg = read_run_config(run_dir)
            return cfg, build_model(cfg.model, seed=cfg.train.seed)
        return load_trained_model(run_dir)
    except RunFolderError as e:
        raise CheckpointError(str(e)) from None


def finetune(run_dir: Path | str, task: str = "genre", *, steps: int = 200, lr: float = 3e-4,
             batch_size: int = 32, warmup: int = 20, seed: int = 0, pooling: Pooling = "mean",
             freeze: bool = False, from_init: bool = False, passage_bytes: int = 256,
             gap: int = 1024, weight_decay: float = 0.01, min_lr_ratio: float = 0.0,
             grad_clip: float | None = 1.0, train_eval_max: int = 2048,
             test_max: int | None = None, device: str = "auto", force: bool = False
             ) -> dict[str, Any]:
    """Fine-tune the trained model of ``run_dir`` (or, ``from_init``, its architecture at init
    with the run's seed) and store the result in ``run_dir/finetune/<task>-<hash>.json``.

    If that file exists (same settings, same checkpoint step), it is returned without training,
    with ``cached: True`` (``force=True`` recomputes). See :func:`finetune_model` for the keys;
    added here: ``run_dir``, ``run_id``, ``from_init``, ``checkpoint_step``, ``pretrain`` (the
    run's outcome and losses), ``path``.

    Raises:
        CheckpointError: not a run folder, or no checkpoint (unless ``from_init``).
        FinetuneError: bad settings, or ``passage_bytes`` above the model's ``max_seq_len``.
    """
    from normlab.train import read_summary

    run_dir = Path(run_dir)
    settings = finetune_settings(
        task, steps=steps, lr=lr, batch_size=batch_size, warmup=warmup, seed=seed,
        pooling=pooling, freeze=freeze, passage_bytes=passage_bytes, gap=gap,
        weight_decay=weight_decay, min_lr_ratio=min_lr_ratio, grad_clip=grad_clip,
        train_eval_max=train_eval_max, test_max=test_max)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: no such run folder")
    path = finetune_path(run_dir, settings, from_init)
    if not force:
        stored = read_json(path)  # None when missing or damaged: recomputed
        if isinstance(stored, dict) and stored.get("settings") == settings:
            return stored | {"cached": True}
    run_cfg, model = _load_run_model(run_dir, from_init)
    hint = " or pretrain with a larger model.max_seq_len"
    if settings["passage_bytes"] > run_cfg.model.max_seq_len:
        raise FinetuneError(
            f"passage_bytes={settings['passage_bytes']} exceeds the run's model.max_seq_len="
            f"{run_cfg.model.max_seq_len}; lower passage_bytes{hint}")
    if (not from_init and run_cfg.model.positions == "learned"
            and settings["passage_bytes"] > run_cfg.data.seq_len):
        warnings.warn(
            f"passage_bytes={settings['passage_bytes']} is longer than the run's data.seq_len="
            f"{run_cfg.data.seq_len}: learned positions beyond it were never trained",
            NormlabWarning, stacklevel=2)
    result = finetune_model(model, task, device=device, **{
        k: settings[k] for k in ("steps", "lr", "batch_size", "warmup", "seed", "pooling",
                                 "freeze", "passage_bytes", "gap", "weight_decay",
                                 "min_lr_ratio", "grad_clip", "train_eval_max",
                                 "test_max")})
    summary = read_summary(run_dir) or {}
    result |= {"run_dir": str(run_dir), "run_id": run_dir.name, "from_init": from_init,
               "checkpoint_step": None if from_init else _checkpoint_step(run_dir),
               "pretrain": {k: summary.get(k) for k in ("outcome", "step", "train_loss",
                                                        "val_loss", "best_val_loss")},
               "path": str(path)}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, result)
    return result | {"cached": False}
