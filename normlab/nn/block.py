"""The one Block: executes a `BlockPlan` for every placement.

The sublayer's forward is the spec (see `normlab.nn.plan`):

    h = in_norm(x) * in_scale
    y = gate * out_norm(F(h))
    r = h if skip_normed else x
    x = post_norm(skip * r + y [+ block input])
    d = d + y                                   (ResiDual's second stream, when `dual`)

SiameseNorm's sublayer (`dual_in_norm`) has its branch read both streams, `F(mix_norm(h +
dual_in_norm(d)))`, and the stream take the branch times `stream_scale`, `x = h +
stream_scale * y`, where d takes it whole.

with the branch F's own norms and scales (QKV-norms, QK-norm, inner norm, head scale) inside
its module (`normlab.nn.layers`), built from the same plan.

The forward passes tensors, nothing else: a block maps `(x, carry, ctx)` to `(x, carry)`.

- `x` is the residual stream [B, T, d].
- `carry` (`Carry`, an immutable tuple of optional tensors) is what a block hands to the next
  besides the stream: the second stream `d` of ResiDual (Xie et al. 2023, arXiv 2304.14802) and
  SiameseNorm (Li et al. 2026, arXiv 2602.08064), started at the embedding, and RealFormer's
  pre-softmax attention scores (He et al. 2020, arXiv 2012.11747), None before the first block.
  A sublayer that changes one returns a new `Carry` (`_replace`); the one it was given is never
  modified. Both are None in the models that do not use them.
- `ctx` (`normlab.nn.layers.Context`) is what every attention reads and no block changes: the
  RoPE tables and the padding mask.
- B2T's block input (Takase et al. 2022, arXiv 2206.00330) lives within one block: the block
  passes its own input `x` to the MLP sublayer as `block_input` (and `ctx` to the attention
  sublayer only: the MLP reads neither).

So a block is a function of its arguments, and activation checkpointing recomputes it from the
same arguments (`normlab.nn.model.checkpointed_block`); a forward hook on `blocks.{i}` sees the
block's inputs as `args` and its `(x, carry)` as the output, and may return other ones (layer
drop returns the inputs, `normlab.probe.interventions`).

Two factors on the branch as added, `y`, before the sum: the plan's `branch_scale` (CompleteP's
depth multiplier) and the sublayer's `ramp`, ProRes's residual warmup (Chen et al. 2026, arXiv
2603.05369), which the trainer sets before every step from the step counter (`prores_ramps`,
`set_branch_ramps`); a model no trainer ramps has none (`ramp` None) and computes as before. An
nGPT sublayer (`plan.hypersphere`) computes `x = L2(x + a*(L2(F(x)) - L2(x)))` instead of the
sum, with the ramp on its eigen learning rate `a` (`normlab.nn.sphere`).

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
from normlab.nn.plan import NGPT_ALPHA_INIT, BlockPlan, SublayerPlan
from normlab.nn.sphere import SphereScale, base_scale, l2
from normlab.nn.taps import Tap


class Carry(NamedTuple):
    """What a block hands to the next besides the stream (see the module doc)."""

    dual: torch.Tensor | None = None  # ResiDual, SiameseNorm: the un-normalized second stream d
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
        # SiameseNorm: the second stream's norm and the norm of the sum the branch reads
        self.dual_in_norm = norm_for(plan.dual_in_norm, cfg)
        self.mix_norm = norm_for(plan.mix_norm, cfg)
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
        # nGPT's eigen learning rate, per channel (the authors' `attn_alpha`/`mlp_alpha`)
        self.eigen_lr = (SphereScale(cfg.d_model, NGPT_ALPHA_INIT, base_scale(cfg.d_model))
                         if plan.hypersphere else None)
        self.ramp: torch.Tensor | None = None  # ProRes: set by `set_branch_ramps`

    def forward(self, x: torch.Tensor, carry: Carry, ctx: Context = NO_CONTEXT,
                block_input: torch.Tensor | None = None) -> tuple[torch.Tensor, Carry]:
        """The stream after this sublayer and the carry it hands on; `ctx` is read by attention
        only, `block_input` (the block's input) by B2T's MLP sublayer only."""
        x = self.stream_in(x)
        if self.eigen_lr is not None:
            return self._on_sphere(x, carry, ctx)
        h = normed(self.in_norm, x)
        if self.plan.in_scale != 1.0:
            h = h * self.plan.in_scale
        read = h
        if self.dual_in_norm is not None:  # SiameseNorm: the branch reads both streams
            read = normed(self.mix_norm, h + self.dual_in_norm(carry.dual))
        if self.plan.kind == "attn":  # attention also reads ctx and passes its scores on
            y, scores = self.fn(self.branch_in(read), ctx, carry.scores)
            carry = carry._replace(scores=scores)
        else:
            y = self.fn(self.branch_in(read))
        y = normed(self.out_norm, self.branch_raw(y))
        if self.gate is not None:
            y = self.gate * y
        if self.plan.branch_scale != 1.0:
            y = self.plan.branch_scale * y
        if self.ramp is not None:
            y = self.ramp * y
        y = self.branch_added(y)
        r = h if self.plan.skip_normed else x
        y_x = y * self.plan.stream_scale if self.plan.stream_scale != 1.0 else y
        if self.skip is not None:
            s = self.skip * r + y_x
        elif self.skip_scale != 1.0:
            s = self.skip_scale * r + y_x
        else:
            s = r + y_x
        if self.plan.add_block_input:
            s = s + block_input
        if self.plan.dual:
            carry = carry._replace(dual=carry.dual + y)
        return self.stream_out(normed(self.post_norm, s)), carry

    def _on_sphere(self, x: torch.Tensor, carry: Carry, ctx: Context
                   ) -> tuple[torch.Tensor, Carry]:
        """nGPT's sublayer, the authors' `Block.forward`: `res = A_norm + lr * (B_norm -
        A_norm)`, `h = justnorm(res)`, `lr = |alpha * (alpha_init / alpha_scale)|`, `A_norm` the
        normalized input, `B_norm` the normalized branch output. The branch reads the input as
        it is (on the sphere already)."""
        if self.plan.kind == "attn":
            y, scores = self.fn(self.branch_in(x), ctx, carry.scores)
            carry = carry._replace(scores=scores)
        else:
            y = self.fn(self.branch_in(x))
        y = self.branch_raw(y)
        a = torch.abs(self.eigen_lr())
        if self.ramp is not None:
            a = self.ramp * a
        x_n = l2(x)
        step = self.branch_added(a * (l2(y) - x_n))
        return self.stream_out(l2(x_n + step)), carry


class Block(nn.Module):
    """Attention sublayer then MLP sublayer, each wired by its plan."""

    def __init__(self, plan: BlockPlan, cfg: ModelConfig) -> None:
        super().__init__()
        self.plan = plan
        a = plan.attn
        attention = (NoAttention() if a.absent
                     else Attention(cfg, a.qkv_norm, qk_norm=a.qk_norm, inner_norm=a.inner_norm,
                                    head_scale=a.head_scale, sphere=a.hypersphere))
        self.attn = Sublayer(a, cfg, attention)
        self.mlp = Sublayer(plan.mlp, cfg, MLP(cfg, inner_norm=plan.mlp.inner_norm,
                                               sphere=plan.mlp.hypersphere))

    def forward(self, x: torch.Tensor, carry: Carry, ctx: Context
                ) -> tuple[torch.Tensor, Carry]:
        a, carry = self.attn(x, carry, ctx)
        return self.mlp(a, carry, block_input=x)


# --- ProRes: the residual warmup of each block ------------------------------------------------

def prores_ramps(steps: int, n_blocks: int, step: int) -> list[float]:
    """ProRes's factor on the branches of each block at `step` (0-based: the optimizer steps
    done before it), Chen et al. 2026, "Progressive Residual Warmup for Language Model
    Pretraining" (arXiv 2603.05369), as the authors' code computes its default `linear`
    schedule (github dandingsky/ProRes, torchrun_main.py: `layerwise_warmup_steps =
    np.linspace(prores_warmup_steps // num_layers, prores_warmup_steps, num_layers)`,
    `alpha_list = np.clip(update_step / layerwise_warmup_steps, 0.0, 1.0)`): block l's
    branches ramp from 0 to 1 over `T_l` steps, the deepest over `steps`. A block whose `T_l` is
    0 (`steps < n_blocks`: the first) has no warmup, factor 1 (the authors' code would divide
    0 by 0). `steps` 0: every factor 1."""
    if steps <= 0:
        return [1.0] * n_blocks
    start = steps // n_blocks
    if n_blocks == 1:
        ends = [float(start)]
    else:  # numpy's linspace: start + i * ((stop - start) / (num - 1)), the last exactly stop
        delta = (steps - start) / (n_blocks - 1)
        ends = [start + i * delta for i in range(n_blocks - 1)] + [float(steps)]
    return [1.0 if end <= 0 else min(max(step / end, 0.0), 1.0) for end in ends]


@torch.no_grad()
def set_branch_ramps(model: nn.Module, ramps: list[float] | None) -> None:
    """Set each block's ProRes factor (`ramps`, one per block, on both its sublayers), or
    remove them (None). The factors are 0-dimensional tensors of the model's parameter dtype on
    its device, changed in place from step to step."""
    for i, block in enumerate(model.blocks):
        for sub in (block.attn, block.mlp):
            if ramps is None:
                sub.ramp = None
            elif sub.ramp is None:
                w = model.tok_emb.weight
                sub.ramp = torch.tensor(ramps[i], dtype=w.dtype, device=w.device)
            else:
                sub.ramp.fill_(ramps[i])
