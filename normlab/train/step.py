"""One optimizer step's arithmetic: the loss, gradient accumulation, the gradient norm and
clipping. A run's loop (`normlab.train.trainer`) and fine-tuning (`normlab.finetune.loop`) call
these from the hooks of the shared loop (`normlab.train.loop`), which does the bookkeeping
between them (divergence checks, block statistics, evaluation, checkpoints), so the numbers a
run's every record rests on live in a few small functions with their own tests
(`tests/train/test_step.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from normlab.data import BatchSampler
from normlab.data.khop import IGNORE
from normlab.train import distributed


@dataclass
class Accumulated:
    """What `accumulate_gradients` leaves besides the gradients themselves."""
    train_loss: float  # mean loss of the step's micro-batches (and of every rank's shard)
    captured: Any  # the capture context of micro-batch 0 (block statistics), else None


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group's lr to `lr`, times the group's `lr_scale` where it has one (CompleteP's
    groups inside the blocks, `normlab.train.optim.param_groups`)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"] if "lr_scale" in group else lr


def accumulate_gradients(net: torch.nn.Module, sampler: BatchSampler, step: int, grad_accum: int,
                         dist: distributed.Dist, device: torch.device,
                         autocast: contextlib.AbstractContextManager,
                         capture_ctx: contextlib.AbstractContextManager | None = None,
                         token_weighted: bool = False) -> Accumulated:
    """Forward and backward over step `step`'s `grad_accum` micro-batches (batches
    `step * grad_accum + micro` of `sampler`), each loss divided by `grad_accum` so the summed
    gradient is the mean over the step's sequences, as one batch `grad_accum` times larger
    would give. Under DDP the gradients are all-reduced on the last micro-batch only.
    `capture_ctx` wraps micro-batch 0's forward (block statistics read one micro-batch).

    `token_weighted` is for targets with ignored positions (-100: a synthetic task's), where
    shards and micro-batches hold different numbers of counted targets: each shard's mean loss
    is weighted by its share of the step's counted targets (times the number of ranks, whose
    gradients DDP averages), so the gradient and the loss are the mean over every counted target
    of the step, whatever the processes and the accumulation, as one process with one batch
    gives. (Every sequence of such a task has a counted target, so no shard is without one.)"""
    loss_sum = torch.zeros((), device=device)
    captured = None
    batches, total = None, 0
    if token_weighted:  # every rank draws the whole step, so each knows the total
        batches = [sampler.batch(step * grad_accum + micro) for micro in range(grad_accum)]
        total = sum(int((y != IGNORE).sum()) for _, y in batches)
    for micro in range(grad_accum):
        batch = sampler.batch(step * grad_accum + micro) if batches is None else batches[micro]
        x, y = dist.shard(*batch)
        weight = None if batches is None else dist.world_size * int((y != IGNORE).sum()) / total
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        ctx = capture_ctx if micro == 0 and capture_ctx is not None else contextlib.nullcontext()
        with dist.sync_context(net, sync=micro == grad_accum - 1):
            with ctx as cap, autocast:
                loss = net(x, y).loss
            (loss / grad_accum if weight is None else loss * weight).backward()
        loss_sum += loss.detach() if weight is None else loss.detach() * weight
        if micro == 0:
            captured = cap
    # DDP averaged the gradients, so the norm, clipping and divergence checks that follow see
    # the same values on every rank; the loss is averaged over ranks here to match.
    mean = dist.mean(loss_sum).item()
    return Accumulated(mean if token_weighted else mean / grad_accum, captured)


def gradient_norm(parameters: Iterable[torch.nn.Parameter]
                  ) -> tuple[list[torch.nn.Parameter], torch.Tensor]:
    """Those of `parameters` that received a gradient and the global L2 norm of those
    gradients. (A loop lists its model's parameters once: `Module.parameters()` walks every
    submodule, a millisecond a step at the study's size.)"""
    params = [p for p in parameters if p.grad is not None]
    return params, torch.nn.utils.get_total_norm([p.grad for p in params])


def clip_and_step(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter],
                  total_norm: torch.Tensor, grad_clip: float | None) -> None:
    """Scale the gradients to norm `grad_clip` when their norm exceeds it (the norm already
    computed, `gradient_norm`), take the optimizer step and free the gradients."""
    if grad_clip is not None:
        torch.nn.utils.clip_grads_with_norm_(params, grad_clip, total_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
