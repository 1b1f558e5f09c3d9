"""Diagnostics that name a failure mode of training: the token-varying share of the final stream,
and the `stalled` outcome of a run that ends without having learned any context.

**Token-varying share.** At each evaluation the stream the head reads (tap `final.out`: after the
final norm, if the model has one) is recorded on every validation token h_1..h_N (all batch rows
and positions). With the mean vector m = mean_n h_n,

    share = V / (V + |m|^2),   V = mean_n |h_n - m|^2   (the per-feature variances, summed)

V + |m|^2 is the mean squared norm mean_n |h_n|^2, so the share is the fraction of the stream's
energy that changes from token to token: 0 when every token maps to the same vector (the
predictions no longer depend on the input), 1 when the stream has no common component. The mean,
rather than zero, is the reference for V because a constant offset (a norm's bias, say) carries no
information about the input. Measured on Shakespeare bytes (6 blocks, width 64, batch 16 x 64,
lr 3e-3, 600 cosine steps): Pre-LN rises from 0.15 (step 50) through 0.56 (step 150) to 0.71;
Post-LN with 300 warmup steps passes 0.08 on the plateau (step 100) and ends at 0.76; Post-LN
without warmup collapses: 2e-11 at step 50, 6e-14 at the end, with the loss stuck at 3.324.

**Stalled.** A run that completes with a final validation loss not below the unigram entropy of
its training tokens (bytes, or the ids of its tokenizer: the baseline is the run's own) minus
`train.stall_margin` has learned nothing a context-free predictor would not; it is recorded
`stalled`, not `completed` (it is finished: a sweep or study does not train it again, and does
not compare its loss as if it had trained).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from normlab.train import distributed
from normlab.train.logging import read_metrics

FINAL_STREAM = "final.out"  # the tap the LM head reads


class TokenShare:
    """Accumulates the token-varying share of one or more streams over evaluation batches.

    `add(h)` takes a stream `[M, ..., d]` of M models (M = 1 for one model): each member's tokens
    are all the positions between its first and last axis. Per batch only the mean vector and the
    sum of squared deviations from it are kept (on the device, no host sync); batches, and ranks of
    a process group, are combined exactly in float64 (Chan et al. 1979's pairwise update), so a
    share of 1e-5 is not lost to the cancellation of two nearly equal second moments.
    """

    def __init__(self) -> None:
        self._parts: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (n, mean [M,d], m2 [M])

    def add(self, h: torch.Tensor) -> None:
        h = h.detach().float().flatten(1, -2)  # [M, n, d]
        mean = h.mean(1)
        m2 = (h - mean.unsqueeze(1)).square().sum((1, 2))
        self._parts.append((h.shape[1], mean, m2))

    def values(self, dist: distributed.Dist = distributed.SINGLE) -> list[float]:
        """The share of each member over everything added (over all ranks' tokens in a process
        group, whose shards are of equal size; every rank gets the same numbers)."""
        if not self._parts:
            raise ValueError("TokenShare: no stream was added")
        n = torch.tensor([p[0] for p in self._parts], dtype=torch.float64)
        means = torch.stack([p[1] for p in self._parts]).double().cpu()  # [K, M, d]
        m2 = torch.stack([p[2] for p in self._parts]).double().cpu()     # [K, M]
        weights = (n / n.sum()).view(-1, 1, 1)
        mean = dist.mean((weights * means).sum(0))                        # [M, d]
        spread = (n.view(-1, 1) * (means - mean).square().sum(-1)).sum(0)  # between batches
        var = dist.mean((m2.sum(0) + spread) / n.sum())                   # [M]
        total = var + mean.square().sum(-1)
        return torch.where(total > 0, var / total, torch.zeros_like(var)).tolist()


def stalled(val_loss: float | None, unigram_entropy: float, margin: float) -> bool:
    """Whether a final validation loss fails to beat the unigram entropy by `margin` nats (a
    missing or non-finite loss beats nothing)."""
    if val_loss is None or not math.isfinite(val_loss):
        return True
    return not val_loss < unigram_entropy - margin


def end_of_run(final: dict[str, Any], run_dir: Path, unigram_entropy: float, margin: float
               ) -> tuple[str, dict[str, Any]]:
    """(outcome, summary fields) of a run that trained all its steps: `stalled` or `completed`,
    with `unigram_entropy`, `stall_margin` and `token_share`.

    `final` holds the last evaluation's numbers; when it is empty (the run stopped between its
    last checkpoint and its summary, and was resumed with nothing left to train), they are read
    back from the last evaluation in metrics.jsonl and added to `final`.
    """
    if "val_loss" not in final:
        evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if "val_loss" in r]
        if evals:
            final.update({k: evals[-1][k] for k in ("val_loss", "token_share", "train_loss",
                                                    "val_bpb")
                          if k in evals[-1]})
    val = final.get("val_loss")
    outcome = "stalled" if stalled(val if isinstance(val, float) else None,
                                   unigram_entropy, margin) else "completed"
    return outcome, {"unigram_entropy": unigram_entropy, "stall_margin": margin,
                     "token_share": final.get("token_share")}
