"""The one Block: executes a `BlockPlan` for every placement.

The sublayer's forward is the spec (see `normlab.nn.plan`):

    h = in_norm(x) * in_scale
    y = gate * out_norm(F(h))
    r = h if skip_normed else x
    x = post_norm(skip * r + y [+ block input])
"""

from __future__ import annotations

import torch
from torch import nn

from normlab.config import ModelConfig
from normlab.nn.layers import MLP, Attention, ForwardState, NoAttention
from normlab.nn.norms import make_norm
from normlab.nn.plan import BlockPlan, SublayerPlan
from normlab.nn.taps import Tap


class Sublayer(nn.Module):
    """One residual sublayer (attention or MLP) with its norms, scales and taps."""

    def __init__(self, plan: SublayerPlan, cfg: ModelConfig, fn: nn.Module) -> None:
        super().__init__()
        self.plan = plan

        def norm(kind: str | None) -> nn.Module | None:
            if kind is None:
                return None
            return make_norm(kind, cfg.d_model, eps=cfg.norm_eps, bias=cfg.norm_bias,
                             dyt_alpha=cfg.dyt_alpha)

        self.stream_in = Tap()
        self.in_norm = norm(plan.in_norm)
        self.branch_in = Tap()
        self.fn = fn
        self.branch_raw = Tap()
        self.out_norm = norm(plan.out_norm)
        self.gate = None if plan.gate_init is None else nn.Parameter(torch.tensor(plan.gate_init))
        self.branch_added = Tap()
        # Admin's omega is a learned per-dimension vector; DeepNorm's alpha a constant.
        self.skip = (nn.Parameter(torch.full((cfg.d_model,), plan.skip_scale))
                     if plan.skip_learned else None)
        self.skip_scale = plan.skip_scale
        self.post_norm = norm(plan.post_norm)
        self.stream_out = Tap()

    def forward(self, x: torch.Tensor, state: ForwardState) -> torch.Tensor:
        x = self.stream_in(x)
        h = x if self.in_norm is None else self.in_norm(x)
        if self.plan.in_scale != 1.0:
            h = h * self.plan.in_scale
        y = self.branch_raw(self.fn(self.branch_in(h), state))
        if self.out_norm is not None:
            y = self.out_norm(y)
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
            s = s + state.block_input
        if self.plan.dual:
            state.dual = state.dual + y
        if self.post_norm is not None:
            s = self.post_norm(s)
        return self.stream_out(s)


class Block(nn.Module):
    """Attention sublayer then MLP sublayer, each wired by its plan."""

    def __init__(self, plan: BlockPlan, cfg: ModelConfig) -> None:
        super().__init__()
        self.plan = plan
        attention = (NoAttention() if plan.attn.absent
                     else Attention(cfg, plan.attn.qkv_norm))
        self.attn = Sublayer(plan.attn, cfg, attention)
        self.mlp = Sublayer(plan.mlp, cfg, MLP(cfg))

    def forward(self, x: torch.Tensor, state: ForwardState) -> torch.Tensor:
        state.block_input = x
        return self.mlp(self.attn(x, state), state)
