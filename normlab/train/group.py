"""Train several runs of one model shape as one stacked model in one process.

Runs that differ only in train-side settings (lr, warmup, schedule, min_lr_ratio, weight decay,
betas, eps, clipping, seed, steps, spike detector, logging cadence) train together: one forward
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
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from normlab.config import RunConfig
from normlab.data import BatchSampler, RunData, load_run_data
from normlab.data.khop import IGNORE
from normlab.nn import build_model, capture
from normlab.nn.model import NormTransformer
from normlab.nn.plan import resolved_run_fields
from normlab.nn.stacked import StackedTransformer, unstackable_reason
from normlab.train.checkpoint import keep_weights, save_checkpoint
from normlab.train.diagnostics import FINAL_STREAM, TokenShare, end_of_run
from normlab.train.divergence import SpikeDetector, divergence_reason
from normlab.train.logging import MetricsLog, Progress, write_json_atomic
from normlab.train.machine import tune_cpu_allocator
from normlab.train.precision import (
    Precision,
    precision_context,
    recorded_precision,
    resolve_precision,
    warn_slow_bf16,
)
from normlab.train.rundir import hold_run
from normlab.train.schedules import lr_at
from normlab.train.stacked_adamw import StackedAdamW
from normlab.train.trainer import (
    _StopFlag,
    bits_per_byte,
    block_stat_tensors,
    block_stats_due,
    check_run_folder,
    checkpoint_state,
    eval_due,
    param_groups,
    record_failure,
    recover_run_folder,
    resolve_device,
    restore_checkpoint,
    run_meta,
    run_summary,
    throughput,
    write_run_config,
)

# Train settings every member of a group must share (the rest may differ per member).
SHARED_TRAIN = ("batch_size", "grad_accum", "eval_batches", "device", "precision")
# Options of a run that the stacked engine does not implement: name -> (what, the value that
# means "off").
UNSUPPORTED_TRAIN = {"grad_accum": ("gradient accumulation", 1),
                     "compile": ("torch.compile", False),
                     "activation_checkpointing": ("activation checkpointing", False)}


class GroupError(ValueError):
    """Runs that cannot be trained as one stacked group."""


def run_unstackable_reason(cfg: RunConfig) -> str | None:
    """Why the run of `cfg` cannot join a stacked group, or None when it can."""
    reason = unstackable_reason(cfg.model)
    if reason:
        return f"model: {reason}"
    for name, (what, off) in UNSUPPORTED_TRAIN.items():
        value = getattr(cfg.train, name, off)
        if value != off:
            return f"train.{name}={value} ({what} is not implemented by the stacked engine)"
    return None


def stack_key(cfg: RunConfig) -> str:
    """Runs with equal keys can train as one stacked model: the same model, data and shared train
    settings."""
    d = cfg.to_dict()
    return json.dumps({"model": d["model"], "data": d["data"],
                       "train": {k: d["train"][k] for k in SHARED_TRAIN}}, sort_keys=True)


@dataclass
class _Member:
    cfg: RunConfig
    run_dir: Path
    sampler: BatchSampler  # (or a synthetic task's sampler: the same interface)
    val: list
    model: NormTransformer | None
    optimizer_state: dict[str, dict[str, torch.Tensor]]
    spike: SpikeDetector
    metrics: MetricsLog
    step: int = 0
    start: int = 0
    best_val: float = float("inf")
    final: dict[str, Any] = field(default_factory=dict)
    repairs: list[str] = field(default_factory=list)  # said in its summary (see train_run)
    threads: int | None = None  # the CPU thread count its checkpoint recorded
    unigram_entropy: float = math.nan  # of the training bytes: the stall threshold's reference
    data: RunData | None = None  # the run's data (a synthetic task's has an accuracy metric)
    precision: Precision = Precision("fp32", "")  # what it trains in (see `train_group`)

    @property
    def run_id(self) -> str:
        return self.cfg.run_id()

    def hyper(self) -> dict[str, Any]:
        tc = self.cfg.train
        return {"lr": lr_at(self.step, tc), "weight_decay": tc.weight_decay,
                "beta1": tc.beta1, "beta2": tc.beta2, "eps": tc.eps}


def _setup(cfg: RunConfig, run_dir: Path, data: RunData, device: torch.device,
           repairs: list[str], precision: Precision) -> _Member:
    """Build one member as `train_run` would (same seed, init and batches) to train in
    `precision` and restore it from its checkpoint; the run folder gets its config.yaml."""
    tc = cfg.train
    sampler = data.sampler(tc.batch_size, cfg.data.seq_len, seed=tc.seed)
    val = data.val_batches(tc.batch_size, cfg.data.seq_len, tc.eval_batches, seed=tc.seed)
    model = build_model(cfg.model, seed=tc.seed, profile_batch=sampler.batch(0)[0]).to(device)
    optimizer = torch.optim.AdamW(param_groups(model, tc.weight_decay))
    spike = SpikeDetector(factor=tc.spike_factor, patience=tc.spike_patience)
    write_run_config(run_dir, cfg, run_meta(cfg, model, data, device, precision))
    data.save_tokenizer(run_dir)
    metrics = MetricsLog(run_dir / "metrics.jsonl", tb_dir=run_dir / "tb")
    restored = restore_checkpoint(run_dir, cfg, model, optimizer, spike, metrics)
    metrics.write_config(cfg.to_yaml(), restored.step)
    names = {p: n for n, p in model.named_parameters()}
    state = {names[p]: s for p, s in optimizer.state.items() if s}
    return _Member(cfg, run_dir, sampler, val, model, state, spike, metrics, restored.step,
                   restored.step, restored.best_val, dict(restored.final),
                   repairs + restored.repairs, restored.threads if restored.step else None,
                   unigram_entropy=data.unigram_entropy, data=data, precision=precision)


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
        # every member's lock (re-entered when a sweep worker holds them), in one order everywhere
        stale = {cfg.run_id(): held.enter_context(hold_run(Path(root) / cfg.run_id()))
                 for cfg in sorted(cfgs, key=lambda c: c.run_id())}
        for cfg in cfgs:
            run_dir = Path(root) / cfg.run_id()
            try:  # a stale lock cleared (warned as it was) is kept with the repairs
                repairs = [*filter(None, [stale[cfg.run_id()]]), *recover_run_folder(run_dir)]
                finished = check_run_folder(cfg, run_dir, "auto")
                if finished is not None:
                    summaries[cfg.run_id()] = finished
                else:
                    members.append(_setup(cfg, run_dir, data, device, repairs,
                                          precision_of(cfg, run_dir)))
            except Exception as e:  # this member's folder or checkpoint: it fails, the rest train
                summaries[cfg.run_id()] = record_failure(run_dir, cfg.run_id(),
                                                         type(e).__name__, str(e),
                                                         traceback.format_exc())
        # one stack per precision: members that begin now share the one decided for them (for
        # `auto`: measured once); a resumed member keeps what its folder recorded
        signalled = False  # a signal that stopped one stack stops the next one at once
        for precision in sorted({m.precision.precision for m in members}):
            stack = [m for m in members if m.precision.precision == precision]
            before = torch.get_num_threads()
            try:
                _match_group_threads(stack, device)
                done = _GroupLoop(stack, device, progress).run(interrupt_at, signalled)
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


class _GroupLoop:
    """The training loop of a group: the members still training are the rows of the stack, in
    the order of `active`; a member that finishes, diverges or stops leaves both."""

    def __init__(self, members: list[_Member], device: torch.device, progress: bool) -> None:
        self.active = members
        self.device = device
        self.group_size = len(members)
        self.template = copy.deepcopy(members[0].model)  # a member's shape, for its checkpoint
        self.template_opt = torch.optim.AdamW(param_groups(self.template, 0.0))
        decay_params = {id(p) for p in self.template_opt.param_groups[0]["params"]}
        decayed = {n for n, p in self.template.named_parameters() if id(p) in decay_params}
        self.model = StackedTransformer([m.model for m in members])
        self.optim = StackedAdamW(self.model, decayed, [m.optimizer_state for m in members])
        for m in members:
            m.model, m.optimizer_state = None, {}  # the stack holds them now
        tc = members[0].cfg.train
        self.tokens_per_step = tc.batch_size * members[0].cfg.data.seq_len
        self.precision = members[0].precision
        self.autocast = precision_context(self.precision.precision, device)
        if progress and tc.precision == "auto":
            print(f"{len(members)} stacked runs train in {self.precision.precision} "
                  f"({self.precision.reason})", file=sys.stderr, flush=True)
        warn_slow_bf16(members[0].cfg, self.precision.precision, device)
        self.summaries: dict[str, dict[str, Any]] = {}
        total = max(m.cfg.train.steps for m in members)
        self.bar = Progress(total, min(m.step for m in members),
                            f"{len(members)} stacked runs", every=tc.log_every, enabled=progress)
        # fed the time per member-step, so its tokens/s and MFU are those of the whole stack
        self.speed = throughput(members[0].cfg, self.precision.precision, self.tokens_per_step,
                                device, progress)
        self.t_start = time.perf_counter()

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

    def finish(self, m: _Member, outcome: str, reason: str | None = None,
               **extra: Any) -> None:
        if m.repairs:
            extra["repairs"] = m.repairs
        summary = run_summary(m.cfg, m.precision, outcome, m.step, m.best_val, m.final, reason,
                              engine="stacked", group_size=self.group_size, **extra)
        write_json_atomic(m.run_dir / "summary.json", summary)
        m.metrics.write_hparams(resolved_run_fields(m.cfg), summary)
        m.metrics.close()
        self.summaries[m.run_id] = summary

    def finish_trained(self, m: _Member, tokens_per_s: float | None) -> None:
        """End a member that trained all its steps: `completed`, or `stalled` as `train_run`
        decides it."""
        outcome, diagnosis = end_of_run(m.final, m.run_dir, m.unigram_entropy,
                                        m.cfg.train.stall_margin)
        self.finish(m, outcome, tokens_per_s=tokens_per_s, **diagnosis)

    def drop(self, rows: list[int]) -> list[int]:
        """Remove these members from the stack (they have finished, diverged or stopped);
        returns the rows kept, in order."""
        keep = [r for r in range(len(self.active)) if r not in set(rows)]
        if rows:
            self.active = [self.active[r] for r in keep]
            if keep:
                self.optim.keep(keep)
        return keep

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, interrupt_at: int | None, signalled: bool = False
            ) -> dict[str, dict[str, Any]]:
        for m in self.active:
            write_json_atomic(m.run_dir / "summary.json", {
                "run_id": m.run_id, "outcome": "running", "step": m.step,
                "steps_planned": m.cfg.train.steps, "engine": "stacked",
                "group_size": self.group_size})
        ended = [r for r, m in enumerate(self.active) if m.step >= m.cfg.train.steps]
        for r in ended:  # stopped after its last checkpoint, before its summary was written
            self.checkpoint(r)
            self.finish_trained(self.active[r], tokens_per_s=None)
        self.drop(ended)
        try:
            with _StopFlag() as stop:
                while self.active:
                    signalled = signalled or stop.signal is not None
                    stopping = [r for r, m in enumerate(self.active) if signalled
                                or (interrupt_at is not None and m.step >= interrupt_at)]
                    for r in stopping:
                        self.checkpoint(r)
                        self.finish(self.active[r], "interrupted",
                                    reason="signal" if signalled else "requested")
                    self.drop(stopping)
                    if self.active:
                        self.train_step()
        except Exception as e:  # failure is data: every member still training records it
            for m in self.active:
                if m.run_id not in self.summaries:  # (one that ended this step keeps its end)
                    self.finish(m, "failed", reason=type(e).__name__, message=str(e),
                                traceback=traceback.format_exc())
        finally:
            self.bar.close()
            for m in self.active:
                m.metrics.close()
        return self.summaries

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [m.sampler.batch(m.step) for m in self.active]
        x = torch.stack([p[0] for p in pairs]).to(self.device, non_blocking=True)
        y = torch.stack([p[1] for p in pairs]).to(self.device, non_blocking=True)
        return x, y

    def train_step(self) -> None:
        t0 = time.perf_counter()
        hyper = [m.hyper() for m in self.active]
        x, y = self.batch()
        stats_due = [block_stats_due(m.cfg.train, m.step + 1) for m in self.active]
        with (capture(self.model, "blocks.*.mlp.stream_out") if any(stats_due)
              else contextlib.nullcontext()) as cap, self.autocast:
            losses = self.model(x, y).loss
        losses.sum().backward()  # each member's gradient is that of its own loss
        stats = self.block_stats(cap) if any(stats_due) else None
        grads = self.optim.gather_grads()
        # one device-to-host copy for the losses and gradient norms of all members
        loss_list, norms = torch.stack([losses.detach().float(),
                                        torch.linalg.vector_norm(grads, dim=1)]).tolist()
        records = []
        diverged = []
        for r, (m, loss, norm, hp) in enumerate(zip(self.active, loss_list, norms, hyper,
                                                    strict=True)):
            m.step += 1
            record = {"step": m.step, "train_loss": loss, "lr": hp["lr"], "grad_norm": norm}
            reason = divergence_reason(loss, norm, m.spike)
            if reason is not None:  # the member stops here, before its update, as train_run does
                m.metrics.write(record | {"diverged": reason})
                m.final["train_loss"] = loss
                self.finish(m, "diverged", reason=reason)
                diverged.append(r)
            else:
                if stats_due[r]:  # gradients as computed, before clipping, as train_run
                    record.update(stats[r])
                records.append(record)
        if diverged:
            keep = self.drop(diverged)
            if not keep:
                return
            grads = grads[keep]
            norms, hyper = [norms[r] for r in keep], [hyper[r] for r in keep]
        self.optim.clip_(grads, norms, [m.cfg.train.grad_clip for m in self.active])
        self.optim.step(grads, hyper)
        self.optim.zero_grad()
        dt = time.perf_counter() - t0
        self.after_step(records, dt)

    def block_stats(self, cap) -> list[dict[str, float]]:
        """`normlab.train.trainer.block_stats` of each member, in one host sync."""
        names, grads, streams = block_stat_tensors(self.model, cap, members=True)
        columns = torch.cat([grads, streams]).t().tolist()
        return [dict(zip(names, col, strict=True)) for col in columns]

    def after_step(self, records: list[dict[str, Any]], dt: float) -> None:
        """Evaluation, logging, checkpoints and completion of each member after a step."""
        last = [m.step == m.cfg.train.steps for m in self.active]
        due = [eval_due(m.cfg.train, m.step) for m in self.active]
        val, share, acc = self.evaluate() if any(due) else (None, None, None)
        done = []
        for r, (m, record) in enumerate(zip(self.active, records, strict=True)):
            tc = m.cfg.train
            if due[r]:
                bpb = bits_per_byte(m.data, val[r]) if m.data is not None else {}
                record.update(val_loss=val[r], token_share=share[r], **acc[r], **bpb)
                m.best_val = min(m.best_val, val[r])
                m.final.update(val_loss=val[r], token_share=share[r], **acc[r], **bpb)
            m.final["train_loss"] = record["train_loss"]
            if (m.step % tc.log_every == 0 or last[r] or "val_loss" in record
                    or block_stats_due(tc, m.step)):
                m.metrics.write(record | {"time_s": dt, "tokens_per_s": self.tokens_per_step / dt})
            if last[r] or (tc.checkpoint_every and m.step % tc.checkpoint_every == 0):
                self.checkpoint(r)
                if tc.keep_checkpoints and not last[r]:
                    keep_weights(m.run_dir / "checkpoint", m.step)
            if last[r]:
                elapsed = time.perf_counter() - self.t_start
                self.finish_trained(m, self.tokens_per_step * (m.step - m.start) / elapsed)
                done.append(r)
        n = len(self.active)
        self.speed.update(dt / n)
        losses = [r["train_loss"] for r in records]
        self.bar.update(max(m.step for m in self.active),
                        f"{n} runs, loss {min(losses):.4f}-{max(losses):.4f}, "
                        f"{self.speed.describe()} in all")
        self.drop(done)

    @torch.no_grad()
    def evaluate(self) -> tuple[list[float], list[float], list[dict[str, float]]]:
        """Each member's mean validation loss on its own fixed batches, the token-varying share
        of its final stream on them, and a synthetic task's accuracies (as
        `normlab.train.trainer.evaluate`; empty for text)."""
        self.model.eval()
        n = len(self.active[0].val)
        totals = torch.zeros(len(self.active), dtype=torch.float64, device=self.device)
        share = TokenShare()
        data = self.active[0].data  # the members share their data (`stack_key`)
        accuracy = data.accuracy() if data is not None else None
        weighted = data is not None and data.masked_targets  # as train_run's token_weighted
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
        return means, share.values(), acc
