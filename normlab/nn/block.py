"""The one Block: executes a `BlockPlan` for every placement.

The sublayer's forward is the spec (see `normlab.nn.plan`):

    h = in_norm(x) * in_scale
    y = gate * out_norm(F(h))
    r = h if skip_normed else x
    x = post_norm(skip * r + y [+ block input])
    d = d + y                                   (ResiDual's second stream, when `dual`)

The forward passes tensors, nothing else: a block maps `(x, carry, ctx)` to `(x, carry)`.

- `x` is the residual stream [B, T, d].
- `carry` (`Carry`, an immutable tuple of optional tensors) is what a block hands to the next
  besides the stream: ResiDual's second stream `d` (Xie et al. 2023, arXiv 2304.14802), started
  at the embedding, and RealFormer's pre-softmax attention scores (He et al. 2020,
  arXiv 2012.11747), None before the first block. A sublayer that changes one returns a new
  `Carry` (`_replace`); the one it was given is never modified. Both are None in the models
  that do not use them.
- `ctx` (`normlab.nn.layers.Context`) is what every attention reads and no block changes: the
  RoPE tables and the padding mask.
- B2T's block input (Takase et al. 2022, arXiv 2206.00330) lives within one block: the block
  passes its own input `x` to the MLP sublayer as `block_input` (and `ctx` to the attention
  sublayer only: the MLP reads neither).

So a block is a function of its arguments, and activation checkpointing recomputes it from the
same arguments (`normlab.nn.model.checkpointed_block`); a forward hook on `blocks.{i}` sees the
block's inputs as `args` and its `(x, carry)` as the output, and may return other ones (layer
drop returns the inputs, `normlab.probe.interventions`).

An absent norm (`in_norm`, `out_norm`, `post_norm` where the plan has None) is None, as the
model's `embed_norm` and `final.norm`: no module, so no parameters and no taps (`normed`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from normlab.config import ModelConfig
from normlab.nn.layers import MLP, NO_CONTEXT, Attention, Context, NoAttention
from normlab.nn.norms import make_norm, normed
from normlab.nn.plan import BlockPlan, SublayerPlan
from normlab.nn.taps import Tap


class Carry(NamedTuple):
    """What a block hands to the next besides the stream (see the module doc)."""

    dual: torch.Tensor | None = None  # ResiDual: the un-normalized second stream d
    scores: torch.Tensor | None = None  # RealFormer: the last attention's pre-softmax scores


def norm_for(kind: str | None, cfg: ModelConfig) -> nn.Module | None:
    """The norm of `kind` with `cfg`'s settings, or None where the plan puts no norm."""
    if kind is None:
        return None
    return make_norm(kind, cfg.d_model, eps=cfg.norm_eps, bias=cfg.norm_bias,
                     dyt_alpha=cfg.dyt_alpha)


class Sublayer(nn.Module):
    """One residual sublayer (attention or MLP) with its norms, scales and taps."""

    def __init__(self, plan: SublayerPlan, cfg: ModelConfig, fn: nn.Module) -> None:
        super().__init__()
        self.plan = plan
        self.stream_in = Tap()
        self.in_norm = norm_for(plan.in_norm, cfg)
        self.branch_in = Tap()
        self.fn = fn
        self.branch_raw = Tap()
        self.out_norm = norm_for(plan.out_norm, cfg)
        self.gate = None if plan.gate_init is None else nn.Parameter(torch.tensor(plan.gate_init))
        self.branch_added = Tap()
        # Admin's omega is a learned per-dimension vector; DeepNorm's alpha a constant.
        self.skip = (nn.Parameter(torch.full((cfg.d_model,), plan.skip_scale))
                     if plan.skip_learned else None)
        self.skip_scale = plan.skip_scale
        self.post_norm = norm_for(plan.post_norm, cfg)
        self.stream_out = Tap()

    def forward(self, x: torch.Tensor, carry: Carry, ctx: Context = NO_CONTEXT,
                block_input: torch.Tensor | None = None) -> tuple[torch.Tensor, Carry]:
        """The stream after this sublayer and the carry it hands on; `ctx` is read by attention
        only, `block_input` (the block's input) by B2T's MLP sublayer only."""
        x = self.stream_in(x)
        h = normed(self.in_norm, x)
        if self.plan.in_scale != 1.0:
            h = h * self.plan.in_scale
        if self.plan.kind == "attn":  # attention also reads ctx and passes its scores on
            y, scores = self.fn(self.branch_in(h), ctx, carry.scores)
            carry = carry._replace(scores=scores)
        else:
            y = self.fn(self.branch_in(h))
        y = normed(self.out_norm, self.branch_raw(y))
        if self.gate is not None:
            y = self.gate * y
        y = self.branch_added(y)
        r = h if self.plan.skip_normed else x
        if self.skip is not None:
            s = self.skip * r + y
        elif self.skip_scale != 1.0:
            s = self.skip_scale * r + y
        else:
            s = r + y
        if self.plan.add_block_input:
            s = s + block_input
        if self.plan.dual:
            carry = carry._replace(dual=carry.dual + y)
        return self.stream_out(normed(self.post_norm, s)), carry


class Block(nn.Module):
    """Attention sublayer then MLP sublayer, each wired by its plan."""

    def __init__(self, plan: BlockPlan, cfg: ModelConfig) -> None:
        super().__init__()
        self.plan = plan
        attention = (NoAttention() if plan.attn.absent
                     else Attention(cfg, plan.attn.qkv_norm))
        self.attn = Sublayer(plan.attn, cfg, attention)
        self.mlp = Sublayer(plan.mlp, cfg, MLP(cfg))

    def forward(self, x: torch.Tensor, carry: Carry, ctx: Context
                ) -> tuple[torch.Tensor, Carry]:
        a, carry = self.attn(x, carry, ctx)
        return self.mlp(a, carry, block_input=x)
