"""Train several runs of one model shape as one stacked model in one process.

Runs that differ only in the train settings of `PER_MEMBER_TRAIN` (lr and its schedule, AdamW's
settings, clipping, seed, steps, spike detector, cadences, labels) train together: one forward
and backward of a `StackedTransformer` over `[M, B, T]` inputs (each member its own batches from
its own seed's `BatchSampler`) and one `StackedAdamW` step, each member with its own learning-rate
schedule and its own gradient clipping. Each member's results match its own `train_run` within
float tolerance.

Each member keeps the run folder `train_run` writes (config.yaml, metrics.jsonl, summary.json,
checkpoint/ in the same format, so `train_run` or `normlab train --resume` can continue a member
alone), its own divergence detection (a diverged member ends `diverged` and leaves the stack; the
others go on), evaluation at its own steps (with the token-varying share of its final stream, and
`stalled` for a member that ends no better than the unigram entropy, as in `train_run`), and
resumes from its own checkpoint. Members already finished are skipped; members may resume from
different steps. The members train in one precision, decided as `train_run` decides it
(`normlab.train.precision`: `auto` measured once for the group); a resumed member keeps the
precision its folder recorded, and one that recorded another trains in a stack of its own.

The group trains on the loop `train_run` trains on (`normlab.train.loop.TrainLoop`, with the
run-folder records of `normlab.train.trainer.RunLoop`): the cadences, divergence checks, stops,
checkpoints, summaries and failures are the same code; only the step (`_GroupLoop.gradients`,
`update`), the evaluation and the checkpoint of one member out of the stack are the group's.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from normlab.config import ModelConfig, RunConfig
from normlab.data import BatchSampler, RunData, load_run_data, stacked_batch
from normlab.data.khop import IGNORE
from normlab.nn import build_model, capture
from normlab.nn.model import NormTransformer
from normlab.nn.stacked import StackedTransformer, unstackable_reason
from normlab.train.checkpoint import keep_weights, save_checkpoint
from normlab.train.diagnostics import FINAL_STREAM, TokenShare
from normlab.train.divergence import SpikeDetector
from normlab.train.logging import MetricsLog, Progress
from normlab.train.machine import tune_cpu_allocator
from normlab.train.numerics import kept_numerics
from normlab.train.optim import OPTIMIZER_FIELDS, adamw, adamw_hyper, decayed_names
from normlab.train.precision import (
    Precision,
    precision_context,
    recorded_precision,
    resolve_precision,
    warn_slow_bf16,
)
from normlab.train.rundir import hold_run
from normlab.train.stacked_adamw import StackedAdamW
from normlab.train.trainer import (
    RunLoop,
    RunMember,
    bits_per_byte,
    block_stat_tensors,
    check_run_folder,
    checkpoint_state,
    record_failure,
    recover_run_folder,
    resolve_device,
    restore_checkpoint,
    run_meta,
    throughput,
    write_run_config,
)

T = TypeVar("T")

# What the stacked engine does with each setting of a run. Every field of `TrainConfig` and
# `ModelConfig` is in exactly one list (tests/train/test_stacked_optim.py); a field in none, or
# an unstackable one away from its default, makes a run unstackable (`run_unstackable_reason`),
# so a setting added without teaching the engine is refused, not ignored.
# Applied to each member on its own (they may differ within a group):
PER_MEMBER_TRAIN = frozenset({
    *OPTIMIZER_FIELDS,  # `StackedAdamW`, from `adamw_hyper`
    "steps", "schedule", "warmup", "min_lr_ratio", "decay_frac",  # each member's lr schedule
    "grad_clip",  # `StackedAdamW.clip_`
    "seed",  # each member's init, batches and validation batches
    "spike_factor", "spike_patience", "stall_margin",  # each member's detector and outcome
    "eval_every", "log_every", "block_stats_every", "checkpoint_every", "keep_checkpoints",
    "name", "tags"})
# Applied to the whole group: its members must share them (`stack_key`).
SHARED_TRAIN = ("batch_size", "eval_batches", "device", "precision",
                "compile")  # (the stack's forward and loss compiled: `_GroupLoop`)
# The stacked model keeps its members' blocks and stacks their leaves (`normlab.nn.stacked`), so
# it computes whatever these settings build, as long as the members share them.
SHARED_MODEL = frozenset({
    "vocab_size", "n_blocks", "d_model", "n_heads", "d_ff", "max_seq_len", "positions",
    "rope_base", "mlp", "attention", "embedding", "gelu_approx", "bias", "tie_embeddings",
    "n_classes", "pooling",  # (an encoder's: a decoder, the only kind stacked, has no use)
    "norm", "norm_bias", "norm_eps", "dyt_alpha", "out_norm",  # (batchnorm: `unstackable_reason`)
    "placement", "placement_file", "placement_def", "block_placements", "final_norm",
    "embed_norm", "residual_attention", "init", "init_std", "deepnorm_arch", "deepnorm_alpha",
    "deepnorm_beta", "deepnorm_other_blocks", "admin_omega", "mix_switch", "gate_init",
    "qk_norm"})  # (the stacked norms take Q and K folded member-major, as the QKV norms)
# Not implemented by the stacked engine: a run that sets one away from its default trains alone.
UNSTACKABLE_TRAIN = {"grad_accum": "gradient accumulation",
                     "activation_checkpointing": "activation checkpointing",
                     "deterministic": "deterministic algorithms",
                     "extends": "continuing another run's checkpoint",
                     # (each member's branch factors would need their own [M] ramp per block)
                     "prores_steps": "ProRes residual warmup",
                     "optimizer": "Muon (Newton-Schulz orthogonalization of each member's own "
                                  "[out, in] matrices, not StackedAdamW's elementwise step over "
                                  "the stacked [M, out, in] parameters)"}
UNSTACKABLE_MODEL = {"kind": "encoders", "dropout": "dropout",  # (`unstackable_reason` says why)
                     # (`StackedAdamW` takes one lr and eps per member, not CompleteP's groups)
                     "depth_param": "CompleteP's per-group learning rates and AdamW eps",
                     "depth_base": "CompleteP's per-group learning rates and AdamW eps",
                     "depth_alpha": "CompleteP's per-group learning rates and AdamW eps"}

# A fine-tuning (`normlab.finetune.FinetuneConfig`) stacks the same way (`normlab.finetune.loop`):
# its members are classifiers on models of one `ModelConfig`, classified as above, each member
# from its own weights (a run's checkpoint, or its architecture at init). Every field of
# `FinetuneConfig` is in exactly one of these lists (tests/train/test_stacked_optim.py).
# Applied to each member on its own:
PER_MEMBER_FINETUNE = frozenset({
    *OPTIMIZER_FIELDS,  # `StackedAdamW`, from `adamw_hyper` of the member's `train_config()`
    "steps", "warmup", "min_lr_ratio",  # its lr schedule
    "grad_clip",  # `StackedAdamW.clip_`
    "seed",  # its head's init and its batches
    "standardize",  # its features' statistics, from its own body before it joins the stack
    "log_every"})  # its loss curve
# Shared by a group (`finetune_stack_key`): the passages and how a passage is read, the batch
# (the stack's input is [members, batch, bytes]) and the passages evaluated (one forward of the
# stack scores every member).
SHARED_FINETUNE = ("task", "passage_bytes", "gap", "val_fraction", "window", "pooling",
                   "batch_size", "train_eval_max", "test_max", "val_max", "eval_batch_size")
# Not implemented by the stacked engine: a fine-tuning that sets one trains alone.
UNSTACKABLE_FINETUNE = {"freeze": "a frozen body (a linear probe: its features are computed once "
                                  "for all its lrs, and each head trains on them alone)"}


class GroupError(ValueError):
    """Runs that cannot be trained as one stacked group."""


def _unhonoured(section: str, settings: Any, honoured: set[str] | frozenset[str],
                unstackable: dict[str, str], who: str) -> str | None:
    """The first field of `settings` set away from its default that the stacked engine does not
    honour, as the reason `who` (a run, a fine-tuning) trains alone; None when there is none."""
    for name, field in type(settings).model_fields.items():
        value = getattr(settings, name)
        if name in honoured or value == field.default:
            continue
        what = f"{unstackable[name]} is " if name in unstackable else ""
        return (f"{section}.{name}={value} ({what}not implemented by the stacked engine: "
                f"the {who} trains alone)")
    return None


def run_unstackable_reason(cfg: RunConfig) -> str | None:
    """Why the run of `cfg` cannot join a stacked group, or None when it can."""
    reason = unstackable_reason(cfg.model)
    if reason:
        return f"model: {reason}"
    return (_unhonoured("model", cfg.model, SHARED_MODEL, UNSTACKABLE_MODEL, "run")
            or _unhonoured("train", cfg.train, PER_MEMBER_TRAIN | set(SHARED_TRAIN),
                           UNSTACKABLE_TRAIN, "run"))


def stack_key(cfg: RunConfig) -> str:
    """Runs with equal keys can train as one stacked model: the same model and data, and every
    train setting the engine does not apply per member (`PER_MEMBER_TRAIN`) equal."""
    d = cfg.to_dict()
    train = {k: getattr(cfg.train, k) for k, field in type(cfg.train).model_fields.items()
             if k in SHARED_TRAIN or (k not in PER_MEMBER_TRAIN
                                      and getattr(cfg.train, k) != field.default)}
    return json.dumps({"model": d["model"], "data": d["data"], "train": train},
                      sort_keys=True, default=str)


def finetune_unstackable_reason(cfg: Any, model: ModelConfig) -> str | None:
    """Why a fine-tuning with settings `cfg` (a `normlab.finetune.FinetuneConfig`) of a model of
    `model` cannot join a stacked group, or None when it can."""
    reason = unstackable_reason(model)
    if reason:
        return f"model: {reason}"
    return (_unhonoured("model", model, SHARED_MODEL, UNSTACKABLE_MODEL, "fine-tuning")
            or _unhonoured("finetune", cfg, PER_MEMBER_FINETUNE | set(SHARED_FINETUNE),
                           UNSTACKABLE_FINETUNE, "fine-tuning"))


def finetune_stack_key(cfg: Any, model: ModelConfig, device: str) -> str:
    """Fine-tunings with equal keys can train as one stacked group: models of one `ModelConfig`
    on one device, and every setting the engine does not apply per member
    (`PER_MEMBER_FINETUNE`) equal."""
    settings = {k: getattr(cfg, k) for k, field in type(cfg).model_fields.items()
                if k in SHARED_FINETUNE or (k not in PER_MEMBER_FINETUNE
                                            and getattr(cfg, k) != field.default)}
    return json.dumps({"model": model.to_dict(), "finetune": settings, "device": device},
                      sort_keys=True, default=str)


def split_evenly(items: Sequence[T], workers: int, limit: int) -> list[list[T]]:
    """`items` (of one stack key, in order) as near-equal consecutive groups of at most `limit`,
    enough of them to give each of `workers` one where there are items for it (8 on 2 workers:
    two groups of 4); a group has at least 2 items unless only one is left."""
    items = list(items)
    if not items:
        return []
    size = min(limit, max(2, math.ceil(len(items) / max(1, workers))))
    n = math.ceil(len(items) / size)
    base, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + base + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


@dataclass(kw_only=True)
class _Member(RunMember):
    """A run of the group: its batches, validation batches, and until the stack is built its
    model and optimizer state."""

    sampler: BatchSampler  # (or a synthetic task's sampler: the same interface)
    val: list
    model: NormTransformer | None
    optimizer_state: dict[str, dict[str, torch.Tensor]]

    def hyper(self, lr: float) -> dict[str, Any]:
        return adamw_hyper(self.tc, lr)


def _setup(cfg: RunConfig, run_dir: Path, data: RunData, device: torch.device,
           repairs: list[str], precision: Precision) -> _Member:
    """Build one member as `train_run` would (same seed, init and batches) to train in
    `precision` and restore it from its checkpoint; the run folder gets its config.yaml."""
    tc = cfg.train
    sampler = data.sampler(tc.batch_size, cfg.data.seq_len, seed=tc.seed)
    val = data.val_batches(tc.batch_size, cfg.data.seq_len, tc.eval_batches, seed=tc.seed)
    model = build_model(cfg.model, seed=tc.seed, profile_batch=sampler.batch(0)[0]).to(device)
    if device.type != "cpu":  # batches gathered on the device, validation batches kept there
        sampler = sampler.to(device) if isinstance(sampler, BatchSampler) else sampler
        val = [(x.to(device), y.to(device)) for x, y in val]
    optimizer = adamw(model, tc)  # (what the checkpoint restores into: its state by parameter)
    spike = SpikeDetector(factor=tc.spike_factor, patience=tc.spike_patience)
    write_run_config(run_dir, cfg, run_meta(cfg, model, data, device, precision))
    data.save_tokenizer(run_dir)
    metrics = MetricsLog(run_dir / "metrics.jsonl", tb_dir=run_dir / "tb")
    restored = restore_checkpoint(run_dir, cfg, model, optimizer, spike, metrics)
    metrics.write_config(cfg.to_yaml(), restored.step)
    names = {p: n for n, p in model.named_parameters()}
    state = {names[p]: s for p, s in optimizer.state.items() if s}
    return _Member.restored(cfg, run_dir, restored, spike, metrics, precision, data, repairs,
                            sampler=sampler, val=val, model=model, optimizer_state=state)


def check_group(cfgs: list[RunConfig]) -> None:
    """Raise `GroupError` unless the runs can train as one stacked group."""
    if not cfgs:
        raise GroupError("a stacked group needs at least one run")
    for cfg in cfgs:
        reason = run_unstackable_reason(cfg)
        if reason:
            raise GroupError(f"run {cfg.run_id()} cannot be stacked: {reason}")
    if len({stack_key(c) for c in cfgs}) != 1:
        raise GroupError("the runs of a stacked group must share model, data and train."
                         + ", train.".join(SHARED_TRAIN))
    if len({c.run_id() for c in cfgs}) != len(cfgs):
        raise GroupError("a run appears twice in the group")


def train_group(cfgs: list[RunConfig], root: Path | str = "runs", *, progress: bool = False,
                interrupt_at: int | None = None) -> dict[str, dict[str, Any]]:
    """Train (or resume, or just report) the runs of `cfgs` under `root` as one stacked model;
    returns each run's summary by run id. A member whose folder or checkpoint cannot be used ends
    `failed` alone. Every member's folder is locked while the group trains (`RunLockedError`,
    before anything is written, when another process holds one). `interrupt_at` stops every
    member at that step as a signal would."""
    check_group(cfgs)
    data = load_run_data(cfgs[0].data, cfgs[0].model)
    device = resolve_device(cfgs[0].train.device)
    if device.type == "cpu":
        tune_cpu_allocator()
    summaries: dict[str, dict[str, Any]] = {}
    members: list[_Member] = []
    decided: list[Precision] = []  # the precision of the members that begin now: decided once

    def precision_of(cfg: RunConfig, run_dir: Path) -> Precision:
        recorded = recorded_precision(run_dir) if cfg.train.precision == "auto" else None
        if recorded is None and not decided:
            decided.append(resolve_precision(cfg, device))
        return recorded or decided[0]

    with contextlib.ExitStack() as held:
        held.enter_context(kept_numerics())  # a resumed member's recorded flags, for this call
        # every member's lock (re-entered when a sweep worker holds them), in one order everywhere
        stale = {cfg.run_id(): held.enter_context(hold_run(Path(root) / cfg.run_id()))
                 for cfg in sorted(cfgs, key=lambda c: c.run_id())}
        for cfg in cfgs:
            run_dir = Path(root) / cfg.run_id()
            try:  # a stale lock cleared (warned as it was) is kept with the repairs
                repairs = [*filter(None, [stale[cfg.run_id()]]), *recover_run_folder(run_dir)]
                finished = check_run_folder(cfg, run_dir, "auto", data.fingerprint)
                if finished is not None:
                    summaries[cfg.run_id()] = finished
                else:
                    members.append(_setup(cfg, run_dir, data, device, repairs,
                                          precision_of(cfg, run_dir)))
            except Exception as e:  # this member's folder or checkpoint: it fails, the rest train
                summaries[cfg.run_id()] = record_failure(run_dir, cfg.run_id(), e,
                                                         tb=traceback.format_exc())
        # one stack per precision: members that begin now share the one decided for them (for
        # `auto`: measured once); a resumed member keeps what its folder recorded
        signalled = False  # a signal that stopped one stack stops the next one at once
        for precision in sorted({m.precision.precision for m in members}):
            stack = [m for m in members if m.precision.precision == precision]
            before = torch.get_num_threads()
            try:
                _match_group_threads(stack, device)
                loop = _GroupLoop(stack, device, progress)
                loop.run(interrupt_at, signalled)
                done = loop.summaries
            finally:
                torch.set_num_threads(before)
            summaries.update(done)
            signalled = signalled or any(s.get("reason") == "signal" for s in done.values()
                                         if s["outcome"] == "interrupted")
    return {c.run_id(): summaries[c.run_id()] for c in cfgs}


def _match_group_threads(members: list[_Member], device: torch.device) -> None:
    """A stacked group runs on one CPU thread count: the one its resumed members recorded (the
    most common, if they disagree), so a resumed group continues its curves exactly. A member
    resumed with another count than its own says so in its summary."""
    recorded = Counter(m.threads for m in members if m.threads is not None)
    if device.type != "cpu" or not recorded:
        return
    threads = recorded.most_common(1)[0][0]
    torch.set_num_threads(threads)
    for m in members:
        if m.threads is not None and m.threads != threads:
            m.repairs.append(f"resumed at step {m.step} with {threads} CPU thread(s), not the "
                             f"{m.threads} it was trained with: its numbers from here differ "
                             "in the last bits from an uninterrupted run's")


class _GroupLoop(RunLoop):
    """The training loop of a group (`normlab.train.loop.TrainLoop`): the members still
    training are the rows of the stack, in the order of `active`; a member that finishes,
    diverges or stops leaves both."""

    def __init__(self, members: list[_Member], device: torch.device, progress: bool) -> None:
        super().__init__(members, device)
        self.group_size = len(members)
        self.template = copy.deepcopy(members[0].model)  # a member's shape, for its checkpoint
        self.template_opt = adamw(self.template, members[0].tc)  # (its state is a member's)
        self.model = StackedTransformer([m.model for m in members])
        self.optim = StackedAdamW(self.model, decayed_names(self.template),
                                  [m.optimizer_state for m in members])
        for m in members:
            m.model, m.optimizer_state = None, {}  # the stack holds them now
        tc = members[0].cfg.train
        # the training forward and loss, compiled lazily (the first step pays) with
        # `train.compile`; evaluation and checkpoints use the stack itself
        self.net = torch.compile(self.model) if tc.compile else self.model
        self.tokens_per_step = tc.batch_size * members[0].cfg.data.seq_len
        self.precision = members[0].precision
        self.autocast = precision_context(self.precision.precision, device)
        if progress and tc.precision == "auto":
            print(f"{len(members)} stacked runs train in {self.precision.precision} "
                  f"({self.precision.reason})", file=sys.stderr, flush=True)
        warn_slow_bf16(members[0].cfg, self.precision.precision, device)
        total = max(m.cfg.train.steps for m in members)
        self.bar = Progress(total, min(m.step for m in members),
                            f"{len(members)} stacked runs", every=tc.log_every, enabled=progress)
        # fed the time per member-step, so its tokens/s and MFU are those of the whole stack
        self.speed = throughput(members[0].cfg, self.precision.precision, self.tokens_per_step,
                                device, progress)

    def summary_fields(self) -> dict[str, Any]:
        return {"engine": "stacked", "group_size": self.group_size}

    # -- member records ---------------------------------------------------------------------------
    def checkpoint(self, row: int) -> None:
        m = self.active[row]
        weights = self.model.member_tensors(row)
        state = self.optim.member_state(row)
        with torch.no_grad():
            for name, p in self.template.named_parameters():
                p.copy_(weights[name])
        self.template_opt.state.clear()
        for name, p in self.template.named_parameters():
            self.template_opt.state[p] = state[name]
        save_checkpoint(m.run_dir / "checkpoint", self.template, self.template_opt,
                        checkpoint_state(m.step, m.best_val, m.spike, m.run_id))

    def keep_weights(self, row: int) -> None:
        m = self.active[row]
        keep_weights(m.run_dir / "checkpoint", m.step)

    def keep_rows(self, rows: list[int]) -> None:
        self.optim.keep(rows)

    # -- the step ---------------------------------------------------------------------------------
    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = stacked_batch([m.sampler for m in self.active], [m.step for m in self.active])
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def gradients(self, lrs: list[float], stats_due: list[bool]
                  ) -> tuple[list[float], list[float]]:
        x, y = self.batch()
        with (capture(self.model, "blocks.*.mlp.stream_out") if any(stats_due)
              else contextlib.nullcontext()) as cap, self.autocast:
            losses = self.net(x, y).loss
        losses.sum().backward()  # each member's gradient is that of its own loss
        self.stats = self.member_block_stats(cap) if any(stats_due) else None
        self.grads = self.optim.gather_grads()
        # one device-to-host copy for the losses and gradient norms of all members
        loss_list, self.norms = torch.stack([losses.detach().float(),
                                             torch.linalg.vector_norm(self.grads, dim=1)]).tolist()
        return loss_list, self.norms

    def block_stats(self, row: int) -> dict[str, float]:
        return self.stats[row]

    def update(self, rows: list[int], lrs: list[float]) -> None:
        grads, norms = self.grads, self.norms
        if len(rows) < len(norms):  # some diverged: the rest step
            grads, norms = grads[rows], [norms[r] for r in rows]
        self.optim.clip_(grads, norms, [m.tc.grad_clip for m in self.active])
        self.optim.step(grads, [m.hyper(lr) for m, lr in zip(self.active, lrs, strict=True)])
        self.optim.zero_grad()

    def member_block_stats(self, cap) -> list[dict[str, float]]:
        """`normlab.train.trainer.block_stats` of each member, in one host sync."""
        names, grads, streams = block_stat_tensors(self.model, cap, members=True)
        columns = torch.cat([grads, streams]).t().tolist()
        return [dict(zip(names, col, strict=True)) for col in columns]

    def show(self, records: list[dict[str, Any]], dt: float) -> None:
        n = len(self.active)
        self.speed.update(dt / n)
        losses = [r["train_loss"] for r in records]
        self.bar.update(max(m.step for m in self.active),
                        f"{n} runs, loss {min(losses):.4f}-{max(losses):.4f}, "
                        f"{self.speed.describe()} in all")

    @torch.no_grad()
    def evaluate(self, due: list[bool]) -> list[dict[str, Any] | None]:
        """Each member's mean validation loss on its own fixed batches, the token-varying share
        of its final stream on them, a synthetic task's accuracies (as
        `normlab.train.trainer.evaluate`; none for text) and the loss in bits per byte, for
        every member (those not `due` too: one forward of the stack)."""
        self.model.eval()
        n = len(self.active[0].val)
        totals = torch.zeros(len(self.active), dtype=torch.float64, device=self.device)
        share = TokenShare()
        data = self.active[0].data  # the members share their data (`stack_key`)
        accuracy = data.accuracy()
        weighted = data.masked_targets  # as train_run's token_weighted
        counted = torch.zeros_like(totals)
        with capture(self.model, FINAL_STREAM) as cap:
            for k in range(n):
                x = torch.stack([m.val[k][0] for m in self.active]).to(self.device)
                y = torch.stack([m.val[k][1] for m in self.active]).to(self.device)
                with self.autocast:
                    out = self.model(x, y)
                if weighted:
                    answered = (y != IGNORE).flatten(1).sum(1).double()
                    totals += out.loss.double() * answered
                    counted += answered
                else:
                    totals += out.loss
                if accuracy is not None:
                    accuracy.add(x, y, out.logits)
                share.add(cap[FINAL_STREAM])
        self.model.train()
        acc = accuracy.values() if accuracy is not None else [{} for _ in self.active]
        means = (totals / counted).tolist() if weighted else [t / n for t in totals.tolist()]
        return [{"val_loss": val, "token_share": tshare, **a, **bits_per_byte(m.data, val)}
                for m, val, tshare, a in zip(self.active, means, share.values(), acc,
                                             strict=True)]
