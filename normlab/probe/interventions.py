"""Interventions through hooks (claim C3, docs/reference.md section 2): merge test and layer drop.

Merge test, for t = 0..L-2: block t+1's sublayers read block t's branch inputs instead of their
own. Forward hooks on `blocks.{t+1}.{attn,mlp}.branch_in` return the values captured at
`blocks.{t}.{attn,mlp}.branch_in` in the same forward pass, so for pre-norm block t+1 computes
`F_{t+1}(Norm(x_t))` in place of `F_{t+1}(Norm(x_{t+1}))`: blocks t and t+1 act as one wider block
on the same input. Reported: `merge_dloss[t]` = loss(merged) - loss(original) and
`merge_kl[t]` = KL(original || merged) of the output distribution (nats, mean over positions).

Layer drop, for t = 0..L-1: block t returns its inputs (a forward hook on the Block), the stream
and the carry (ResiDual's second stream, RealFormer's attention scores) as they came in, so the
dropped block leaves no trace (B2T's block input never leaves the block). Reported:
`drop_dloss[t]`, `drop_kl[t]`.

The per-batch rows (`*_per_batch`) are kept: the effective-depth summary needs their spread.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from normlab.probe.hooks import eval_mode, hooked
from normlab.probe.measures import kl_divergence, model_loss

Batch = tuple[torch.Tensor, torch.Tensor]


def _outputs(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor
             ) -> tuple[torch.Tensor, float]:
    logits = model(idx).logits
    return logits, model_loss(model.cfg.kind, logits, targets).item()


def merge_hooks(t: int) -> dict[str, object]:
    """Hooks that make block t+1's sublayers read block t's branch inputs (see module doc)."""
    saved: dict[str, torch.Tensor] = {}

    def keep(kind: str):
        def hook(_m, _inp, h) -> None:
            saved[kind] = h
        return hook

    def replace(kind: str):
        def hook(_m, _inp, _h) -> torch.Tensor:
            return saved[kind]
        return hook

    table: dict[str, object] = {}
    for kind in ("attn", "mlp"):
        table[f"blocks.{t}.{kind}.branch_in"] = keep(kind)
        table[f"blocks.{t + 1}.{kind}.branch_in"] = replace(kind)
    return table


def drop_hooks(t: int) -> dict[str, object]:
    """The forward hook that makes block t return its inputs `(x, carry)` in place of its
    output (`normlab.nn.block`: a block maps `(x, carry, ctx)` to `(x, carry)`)."""

    def forward(_m, args, _out) -> tuple:
        return args[0], args[1]

    return {f"blocks.{t}": forward}


@torch.no_grad()
def merge_test(model: nn.Module, batches: Sequence[Batch]) -> dict[str, object]:
    """Merge test for every consecutive pair of blocks, averaged over batches."""
    pairs = range(len(model.blocks) - 1)
    return _scan(model, batches, "merge", [(merge_hooks(t), None) for t in pairs])


@torch.no_grad()
def layer_drop(model: nn.Module, batches: Sequence[Batch]) -> dict[str, object]:
    """Loss increase and KL(original || dropped) when each block is skipped, over batches."""
    return _scan(model, batches, "drop",
                 [(drop_hooks(t), None) for t in range(len(model.blocks))])


def _scan(model: nn.Module, batches: Sequence[Batch], prefix: str,
          interventions: list[tuple[dict, dict | None]]) -> dict[str, object]:
    """Loss change and KL(original || intervened) of each (forward hooks, pre-hooks) pair."""
    dloss, kl = [], []
    with eval_mode(model):
        for idx, targets in batches:
            base, base_loss = _outputs(model, idx, targets)
            row_l, row_k = [], []
            for fwd, pre in interventions:
                with hooked(model, fwd, pre):
                    logits, loss = _outputs(model, idx, targets)
                row_l.append(loss - base_loss)
                row_k.append(kl_divergence(base, logits))
            dloss.append(row_l)
            kl.append(row_k)
    return _rows(prefix, dloss, kl)


def _rows(prefix: str, dloss: list[list[float]], kl: list[list[float]]) -> dict[str, object]:
    def mean(rows: list[list[float]]) -> list[float]:
        if not rows or not rows[0]:
            return []
        return torch.tensor(rows, dtype=torch.float64).mean(0).tolist()

    return {f"{prefix}_dloss": mean(dloss), f"{prefix}_kl": mean(kl),
            f"{prefix}_dloss_per_batch": dloss, f"{prefix}_kl_per_batch": kl}
