"""The training loop: a run is a pure function of its `RunConfig`, recorded in its own folder.

    runs/<run_id>/config.yaml      resolved config plus versions, device, dtype
    runs/<run_id>/metrics.jsonl    one JSON object per logged step
    runs/<run_id>/summary.json     outcome: completed | stalled | diverged | failed | interrupted
    runs/<run_id>/checkpoint/      safetensors + JSON (see `normlab.train.checkpoint`)
    runs/<run_id>/tb/              TensorBoard events

Before every optimizer step the loss and gradient norm must be finite and the loss must not be in
a sustained spike; otherwise the run ends `diverged` with the step and the reason. A resumed run
reproduces the uninterrupted run's metrics bit for bit on CPU: batches are a function of the step,
and the checkpoint holds the RNG, optimizer and detector states. Each evaluation also records the
token-varying share of the final stream, and a run that ends no better than the unigram entropy
of its data is `stalled` (see `normlab.train.diagnostics`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Literal

import torch
import yaml

import normlab
from normlab.config import ConfigError, RunConfig, TrainConfig, parse_config
from normlab.data import BatchSampler, eval_batches, load_text_data
from normlab.machine import tune_cpu_allocator
from normlab.nn import build_model, capture
from normlab.nn.model import NormTransformer
from normlab.train import distributed
from normlab.train.checkpoint import load_checkpoint, save_checkpoint
from normlab.train.diagnostics import FINAL_STREAM, TokenShare, end_of_run
from normlab.train.divergence import SpikeDetector, divergence_reason
from normlab.train.logging import MetricsLog, Progress, read_json, write_json_atomic
from normlab.train.schedules import lr_at

FINISHED = ("completed", "stalled", "diverged")  # results: never trained again


class RunFolderError(RuntimeError):
    """A run folder that cannot be used as asked (exists with another config, nothing to resume)."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: cuda requested but no CUDA device is available; use auto")
    return torch.device(name)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on weight matrices only; none on norms, biases, gates, embeddings."""
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        is_embedding = "emb" in name
        (decay if p.dim() >= 2 and not is_embedding else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def read_run_config(run_dir: Path) -> RunConfig:
    path = run_dir / "config.yaml"
    if not path.exists():
        raise RunFolderError(f"{run_dir}: not a run folder (config.yaml missing)")
    data = yaml.safe_load(path.read_text()) or {}
    data.pop("meta", None)
    return parse_config(RunConfig, data)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    return read_json(run_dir / "summary.json")


def check_run_folder(cfg: RunConfig, run_dir: Path, resume: str) -> dict[str, Any] | None:
    """What `run_dir` allows before anything is written: the summary of a finished run (nothing
    to train), None to train or resume; `RunFolderError` when it holds another run, exists with
    `resume="never"`, or has no checkpoint with `resume="require"`."""
    if (run_dir / "config.yaml").exists():
        on_disk = read_run_config(run_dir)
        if on_disk.run_id() != cfg.run_id():
            raise RunFolderError(f"{run_dir}: holds run {on_disk.run_id()}, not {cfg.run_id()}")
        summary = read_summary(run_dir)
        if summary and summary.get("outcome") in FINISHED:
            return summary
        if resume == "never":
            raise RunFolderError(f"{run_dir}: exists; resume it with `normlab train --resume "
                                 f"{run_dir}` or delete it")
    if resume == "require" and not (run_dir / "checkpoint" / "trainer_state.json").exists():
        raise RunFolderError(f"{run_dir}: no checkpoint to resume from")
    return None


def run_meta(cfg: RunConfig, model: NormTransformer, data: Any, device: torch.device
             ) -> dict[str, Any]:
    """The `meta` section of a run's config.yaml: versions, device, dtype, resolved plan."""
    return {"run_id": cfg.run_id(), "normlab": normlab.__version__,
            "torch": str(torch.__version__), "device": str(device),
            "dtype": "bfloat16-autocast" if cfg.train.precision == "bf16" else "float32",
            "init": model.plan.init, "final_norm": model.plan.final_norm,
            "constants": model.plan.constants, "params": model.num_params(),
            "train_works": data.train_works, "val_works": data.val_works}


def write_run_config(run_dir: Path, cfg: RunConfig, meta: dict[str, Any]) -> None:
    """config.yaml (the resolved config plus `meta`), written once, atomically."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / "config.yaml").exists():
        return
    tmp = run_dir / "config.yaml.tmp"
    tmp.write_text(cfg.to_yaml() + yaml.safe_dump({"meta": meta}, sort_keys=False))
    tmp.replace(run_dir / "config.yaml")


def restore_checkpoint(run_dir: Path, cfg: RunConfig, model: torch.nn.Module,
                       optimizer: torch.optim.Optimizer, spike: SpikeDetector,
                       metrics: MetricsLog, resume: str = "auto") -> tuple[int, float]:
    """Continue from the run's checkpoint when there is one (and `resume` is not "never"):
    restores model, optimizer and spike detector in place and cuts metrics.jsonl back to the
    checkpoint's step. Returns (step, best validation loss); (0, inf) for a fresh start."""
    ckpt_dir = run_dir / "checkpoint"
    if resume != "never" and (ckpt_dir / "trainer_state.json").exists():
        state = load_checkpoint(ckpt_dir, model, optimizer, expected_config_hash=cfg.run_id())
        spike.load_state_dict(state["spike"])
        metrics.truncate_after(state["step"])
        return state["step"], state["best_val_loss"]
    if (run_dir / "metrics.jsonl").exists():
        metrics.truncate_after(0)  # an earlier attempt died before its first checkpoint
    return 0, float("inf")


def run_summary(cfg: RunConfig, outcome: str, step: int, best_val: float,
                final: dict[str, Any], reason: str | None = None, **extra: Any
                ) -> dict[str, Any]:
    """The content of summary.json when a run stops (see the module docstring)."""
    return {"run_id": cfg.run_id(), "outcome": outcome, "step": step, "reason": reason,
            "steps_planned": cfg.train.steps,
            "best_val_loss": best_val if best_val < float("inf") else None, **final, **extra}


def record_failure(run_dir: Path, run_id: str, reason: str, message: str,
                   tb: str | None = None) -> dict[str, Any]:
    """Write `failed` into the run's summary (keeping its step); the run stays resumable."""
    old = read_summary(run_dir) or {}
    summary = {**{k: v for k, v in old.items() if k not in ("outcome", "reason", "message")},
               "run_id": run_id, "outcome": "failed", "step": old.get("step", 0),
               "reason": reason, "message": message}
    if tb:
        summary["traceback"] = tb
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "summary.json", summary)
    return summary


def eval_due(tc: TrainConfig, step: int) -> bool:
    """Whether the run evaluates after `step`: every `eval_every` steps and after the last."""
    return bool(tc.eval_every and step % tc.eval_every == 0) or step == tc.steps


def precision_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Around forward passes: bf16 autocast (matrix work in bfloat16, fp32 weights), or nothing."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


class _StopFlag:
    """SIGINT/SIGTERM set a flag; the loop checkpoints and stops at the next step boundary."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        self.signal = signum

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def train_run(
    cfg: RunConfig,
    root: Path | str = "runs",
    *,
    resume: Literal["auto", "require", "never"] = "auto",
    progress: bool = True,
    interrupt_at: int | None = None,
) -> dict[str, Any]:
    """Train (or resume, or just report) the run of `cfg` under `root`; returns its summary.

    A finished run (completed or diverged) is not trained again. `resume="auto"` continues from a
    checkpoint when one exists; `"require"` insists on one; `"never"` refuses an existing folder.
    `interrupt_at` stops after that many steps as a signal would (for tests and demos).
    Inside a process group, every rank calls this and trains its shard of each batch (see
    `normlab.train.distributed`); rank 0 alone writes the run folder.
    """
    tc = cfg.train
    # Everything that can be rejected is checked before anything is written.
    data = load_text_data(cfg.data.source, val_fraction=cfg.data.val_fraction,
                          seed=cfg.data.split_seed)
    dist = distributed.current()
    device = dist.train_device(resolve_device(tc.device))
    if device.type == "cpu":
        tune_cpu_allocator()
    distributed.check_divisible(tc.batch_size, dist.world_size)
    run_id = cfg.run_id()
    run_dir = Path(root) / run_id
    ckpt_dir = run_dir / "checkpoint"
    finished = check_run_folder(cfg, run_dir, resume)
    if finished is not None:
        return finished

    sampler = BatchSampler(data.train, tc.batch_size, cfg.data.seq_len, seed=tc.seed)
    val = eval_batches(data.val, tc.batch_size, cfg.data.seq_len, tc.eval_batches, seed=tc.seed)
    model = build_model(cfg.model, seed=tc.seed, profile_batch=sampler.batch(0)[0]).to(device)
    # the fused kernel: one pass over each parameter instead of a dozen elementwise ops
    optimizer = torch.optim.AdamW(param_groups(model, tc.weight_decay), lr=tc.lr,
                                  betas=(tc.beta1, tc.beta2), eps=tc.eps,
                                  fused=device.type in ("cpu", "cuda"))
    spike = SpikeDetector(factor=tc.spike_factor, patience=tc.spike_patience)
    model.activation_checkpointing = tc.activation_checkpointing
    net = dist.wrap(model)
    if tc.compile:  # compiled lazily: the first step pays (its time_s in metrics.jsonl)
        net = torch.compile(net)

    dist.barrier()  # every rank has read the folder's state before rank 0 writes to it
    if dist.main:
        write_run_config(run_dir, cfg, run_meta(cfg, model, data, device)
                         | {"world_size": dist.world_size})

    metrics = MetricsLog(run_dir / "metrics.jsonl", tb_dir=run_dir / "tb", enabled=dist.main)
    start, best_val = restore_checkpoint(run_dir, cfg, model, optimizer, spike, metrics, resume)

    def checkpoint(step: int) -> None:
        if dist.main:
            save_checkpoint(ckpt_dir, model, optimizer, {
                "step": step, "best_val_loss": best_val, "spike": spike.state_dict(),
                "config_hash": run_id})

    def finish(outcome: str, step: int, reason: str | None = None, **extra: Any) -> dict:
        summary = run_summary(cfg, outcome, step, best_val, final, reason,
                              world_size=dist.world_size, **extra)
        if dist.main:
            write_json_atomic(run_dir / "summary.json", summary)
        if outcome != "failed":  # ranks in step: none returns before the folder is complete
            dist.barrier()  # (after a failure the others may be inside another collective)
        return summary

    final: dict[str, Any] = {}
    bar = Progress(tc.steps, start, run_id, every=tc.log_every, enabled=progress and dist.main)
    tokens_per_step = tc.batch_size * tc.grad_accum * cfg.data.seq_len
    autocast = precision_context(tc.precision, device)
    if dist.main:
        write_json_atomic(run_dir / "summary.json", {
            "run_id": run_id, "outcome": "running", "step": start, "steps_planned": tc.steps,
            "world_size": dist.world_size})
    t_run = time.perf_counter()
    try:
        with _StopFlag() as stop:
            step = start
            while step < tc.steps:
                # 2: a signal on some rank, 1: interrupt_at; the max over ranks stops all alike
                stop_code = dist.max(2 if stop.signal is not None else int(
                    interrupt_at is not None and step >= interrupt_at))
                if stop_code:
                    checkpoint(step)
                    return finish("interrupted", step, reason="signal" if stop_code == 2 else
                                  "requested")
                t0 = time.perf_counter()
                lr = lr_at(step, tc)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                stats_now = tc.block_stats_every and (step + 1) % tc.block_stats_every == 0
                loss_sum = torch.zeros((), device=device)
                cap_ctx = (capture(model, "blocks.*.mlp.stream_out") if stats_now
                           else contextlib.nullcontext())
                for micro in range(tc.grad_accum):
                    x, y = dist.shard(*sampler.batch(step * tc.grad_accum + micro))
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    with dist.sync_context(net, sync=micro == tc.grad_accum - 1):
                        with cap_ctx if micro == 0 else contextlib.nullcontext() as cap, autocast:
                            loss = net(x, y).loss
                        (loss / tc.grad_accum).backward()
                    loss_sum += loss.detach()
                    if micro == 0:
                        captured = cap
                # DDP averaged the gradients, so the norm, clipping and divergence checks below
                # see the same values on every rank; the loss is averaged here to match.
                train_loss = dist.mean(loss_sum).item() / tc.grad_accum
                params = [p for p in model.parameters() if p.grad is not None]
                total_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
                grad_norm = total_norm.item()
                step += 1
                record: dict[str, Any] = {"step": step, "train_loss": train_loss, "lr": lr,
                                          "grad_norm": grad_norm}
                reason = divergence_reason(train_loss, grad_norm, spike)
                if reason is not None:
                    metrics.write(record | {"diverged": reason})
                    final.update(train_loss=train_loss)
                    return finish("diverged", step, reason=reason)
                if stats_now:  # before the step: gradients as computed, before clipping
                    record.update(block_stats(model, captured, dist))
                if tc.grad_clip is not None:
                    torch.nn.utils.clip_grads_with_norm_(params, tc.grad_clip, total_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                dt = time.perf_counter() - t0
                last = step == tc.steps
                if eval_due(tc, step):
                    record.update(evaluate(model, val, autocast, dist))
                    best_val = min(best_val, record["val_loss"])
                    final.update(val_loss=record["val_loss"], token_share=record["token_share"])
                final["train_loss"] = train_loss
                if step % tc.log_every == 0 or last or "val_loss" in record or stats_now:
                    metrics.write(record | {"time_s": dt, "tokens_per_s": tokens_per_step / dt})
                if tc.checkpoint_every and step % tc.checkpoint_every == 0 and not last:
                    checkpoint(step)
                bar.update(step, f"loss {train_loss:.3f} lr {lr:.2e} "
                                 f"{tokens_per_step / dt:,.0f} tok/s")
            checkpoint(step)
            elapsed = time.perf_counter() - t_run
            done = step - start
            outcome, diagnosis = end_of_run(final, run_dir, data.train.unigram_entropy,
                                            tc.stall_margin)
            return finish(outcome, step, **diagnosis,
                          tokens_per_s=tokens_per_step * done / elapsed if done else None)
    except Exception as e:  # failure is data: the run folder says what happened
        return finish("failed", locals().get("step", start), reason=type(e).__name__,
                      message=str(e), traceback=traceback.format_exc())
    finally:
        bar.close()
        metrics.close()


@torch.no_grad()
def evaluate(model: NormTransformer, batches, autocast,
             dist: distributed.Dist = distributed.SINGLE) -> dict[str, float]:
    """`val_loss`, the mean validation loss, and `token_share`, the token-varying share of the
    stream the head reads (`normlab.train.diagnostics`), from the same forward passes. In a
    process group each rank evaluates its shard of every batch and both are over all ranks, the
    same numbers on all of them."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total = 0.0
    share = TokenShare()
    with capture(model, FINAL_STREAM) as cap:
        for batch in batches:
            x, y = dist.shard(*batch)
            with autocast:
                total += model(x.to(device), y.to(device)).loss.item()
            share.add(cap[FINAL_STREAM].unsqueeze(0))
    model.train(was_training)
    loss = dist.mean(torch.tensor(total, dtype=torch.float64)).item() / len(batches)
    return {"val_loss": loss, "token_share": share.values(dist)[0]}


def block_stats(model: NormTransformer, cap,
                dist: distributed.Dist = distributed.SINGLE) -> dict[str, float]:
    """Per block: gradient norm of the attention and MLP parameters, stream norm after the block
    (mean over tokens of the per-token L2 norm; over all ranks' tokens in a process group)."""
    out = {}
    for i, block in enumerate(model.blocks):
        for part in ("attn", "mlp"):
            grads = [p.grad for p in getattr(block, part).parameters() if p.grad is not None]
            if grads:
                out[f"blocks.{i}.{part}.grad_norm"] = torch.nn.utils.get_total_norm(grads).item()
        act = cap.activations.get(f"blocks.{i}.mlp.stream_out") if cap is not None else None
        if act is not None:
            out[f"blocks.{i}.stream_norm"] = dist.mean(act.float().norm(dim=-1).mean()).item()
    return out


def train_many_step(cfg: RunConfig, root: Path | str, **kwargs: Any) -> dict[str, Any]:
    """`train_run` for a caller that trains several runs in a row: a signal that interrupted this
    run (after its checkpoint) also stops the caller, by raising KeyboardInterrupt."""
    summary = train_run(cfg, root, **kwargs)
    if summary["outcome"] == "interrupted" and summary.get("reason") == "signal":
        raise KeyboardInterrupt(f"run {summary['run_id']} interrupted at step {summary['step']}")
    return summary
