"""embeddings -> blocks -> final norm -> LM head (decoder) or classifier head (encoder).

One model class for every placement: `build_model(cfg)` resolves the placement into a plan and
the blocks execute it. Decoder and encoder share the same blocks; the encoder is bidirectional and
pools the final stream into a sequence-classification head.

`stream` passes tensors from block to block, `x, carry = block(x, carry, ctx)` (the
`normlab.nn.block` module doc): `ctx` holds what every attention reads (RoPE tables, padding
mask), `carry` the second stream of ResiDual and SiameseNorm and RealFormer's scores; the head
reads `head_input(x, carry)`. A norm the plan leaves out (`embed_norm`, `final.norm`) is None,
as in the blocks.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from normlab.config import ModelConfig
from normlab.nn.analysis import NormSpec, norm_spec, residual_sum_problem
from normlab.nn.block import Block, Carry, norm_for
from normlab.nn.hooked import HookedMixin
from normlab.nn.init import init_weights
from normlab.nn.layers import Context, rope_tables
from normlab.nn.norms import normed
from normlab.nn.plan import HARMFUL_INIT, ModelPlan, build_plan
from normlab.nn.sphere import SphereScale, base_scale, renormalize_matrices
from normlab.nn.taps import Tap, capture
from normlab.warnings import NormlabWarning


class ModelOutput(NamedTuple):
    logits: torch.Tensor
    loss: torch.Tensor | None


class NormTransformer(HookedMixin, nn.Module):
    def __init__(self, cfg: ModelConfig, plan: ModelPlan | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.plan = plan if plan is not None else build_plan(cfg)
        d = cfg.d_model
        self.tok_emb = nn.Embedding(cfg.vocab_size, d)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, d) if cfg.positions == "learned" else None
        if cfg.positions == "rope":
            cos, sin = rope_tables(cfg.max_seq_len, cfg.head_dim, cfg.rope_base)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.embed_norm = norm_for(self.plan.embed_norm, cfg)
        self.blocks = nn.ModuleList(Block(bp, cfg) for bp in self.plan.blocks)
        self.final = nn.Module()
        self.final.input = Tap()
        self.final.norm = norm_for(self.plan.final_norm, cfg)
        # SiameseNorm: each stream's norm before the final norm reads their sum
        self.final.stream_norm = norm_for(self.plan.dual_out_norm, cfg)
        self.final.dual_norm = norm_for(self.plan.dual_out_norm, cfg)
        self.final.out = Tap()
        if cfg.kind == "decoder":
            self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)
            if cfg.tie_embeddings:
                self.lm_head.weight = self.tok_emb.weight
        else:
            self.classifier = nn.Linear(d, cfg.n_classes, bias=True)
        # nGPT's logit scale s_z (the authors' `sz`: init 1, scale 1/sqrt(d)), a decoder's
        self.logit_scale = (SphereScale(cfg.vocab_size, 1.0, base_scale(d))
                            if self.plan.hypersphere and cfg.kind == "decoder" else None)

        init_weights(self, self.plan.init, self.plan, std=cfg.init_std,
                     embedding=cfg.embedding)
        renormalize_matrices(self)  # nGPT's matrices start on the sphere (nothing otherwise)
        reason = HARMFUL_INIT.get((cfg.placement, self.plan.init))
        if reason:
            warnings.warn(
                f"init {self.plan.init!r} with placement {cfg.placement!r}: {reason}",
                NormlabWarning, stacklevel=2,
            )

    # ------------------------------------------------------------------------------------------
    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[-1]
        if self.cfg.max_seq_len < T:
            raise ValueError(f"sequence length {T} exceeds max_seq_len={self.cfg.max_seq_len}")
        x = self.tok_emb(idx)
        if self.cfg.embedding == "fairseq":  # Vaswani et al.'s sqrt(d) scale (fairseq embed_scale)
            x = x * math.sqrt(self.cfg.d_model)
        if self.pos_emb is not None:
            x = x + self._positions(T)
        return normed(self.embed_norm, self.drop(x))

    def _positions(self, length: int) -> torch.Tensor:
        """Learned position embeddings of the first `length` positions, to add to the tokens'."""
        return self.pos_emb.weight[:length]

    def stream(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None
               ) -> torch.Tensor:
        """The final normalized stream [B, T, d] that the head reads."""
        key_mask = None
        if attention_mask is not None:
            if self.cfg.causal:
                raise ValueError("attention_mask (padding) is only supported for kind=encoder")
            key_mask = attention_mask.bool()[:, None, None, :]
        ctx = Context(rope=(self.rope_cos, self.rope_sin) if self.pos_emb is None else None,
                      key_mask=key_mask)
        x = self.embed(idx)
        carry = Carry(dual=x if self.plan.dual_stream else None)
        recompute = self.activation_checkpointing and torch.is_grad_enabled()
        for block in self.blocks:
            x, carry = (checkpointed_block(block, x, carry, ctx) if recompute
                        else block(x, carry, ctx))
        return self.final.out(self.head_input(self.final.input(x), carry))

    def head_input(self, x: torch.Tensor, carry: Carry) -> torch.Tensor:
        """What the head reads, from the stream `x` and `carry` after the last block (or, for
        the logit lens, after any block): `Norm(x)`; ResiDual's `a + Norm(d)`; SiameseNorm's
        `Norm(Norm(a) + Norm(d))`. A norm the plan leaves out is skipped."""
        if self.plan.dual_out_norm is not None:
            return normed(self.final.norm,
                          self.final.stream_norm(x) + self.final.dual_norm(carry.dual))
        if self.plan.dual_stream:
            return x + normed(self.final.norm, carry.dual)
        return normed(self.final.norm, x)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Decoder: next-token logits [B, T, V], loss against `targets` [B, T] (-100 ignored).
        Encoder: class logits [B, C] pooled over (unpadded) positions, loss against labels [B]."""
        x = self.stream(idx, attention_mask)
        if self.cfg.kind == "decoder":
            logits = self.lm_head(x)
            if self.logit_scale is not None:  # nGPT: `logits = sz * logits`
                logits = self.logit_scale() * logits
            loss = None
            if targets is not None:
                loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(),
                                       ignore_index=-100)
            return ModelOutput(logits, loss)
        if self.cfg.pooling == "first":
            pooled = x[:, 0]
        elif attention_mask is not None:
            m = attention_mask.to(x.dtype)[..., None]
            pooled = (x * m).sum(1) / m.sum(1).clamp_min(1.0)
        else:
            pooled = x.mean(1)
        logits = self.classifier(pooled)
        loss = F.cross_entropy(logits.float(), targets) if targets is not None else None
        return ModelOutput(logits, loss)

    activation_checkpointing = False  # see `checkpointed_block`; set by the trainer

    # -- what the residual-stream analysis reads (`normlab.nn.analysis`) -----------------------
    def residual_sum_problem(self) -> str | None:
        return residual_sum_problem(self.plan)

    def analysis_norm(self, site: str) -> NormSpec | None:
        """The norm reading the stream at `site`: `final` or `blocks.{i}.{attn|mlp}` (its input
        norm; LNS's `in_scale` after it is not part of it)."""
        if site == "final":
            if self.plan.dual_out_norm is not None:
                raise ValueError("the final norm of SiameseNorm reads the sum of both streams, "
                                 "each normalized, not the stream the blocks write (the head "
                                 "reads Norm(Norm(a) + Norm(d)))")
            if self.plan.dual_stream:
                raise ValueError("the final norm of ResiDual reads the second stream d, not the "
                                 "stream the blocks write (the head reads a + Norm(d))")
            return norm_spec(self.final.norm, self.plan.final_norm, "final.norm")
        sub = self.get_submodule(site)
        return norm_spec(sub.in_norm, sub.plan.in_norm, f"{site}.in_norm")

    def analysis_unembed(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.cfg.kind != "decoder":
            raise ValueError("logit attribution needs a decoder's LM head; this model is "
                             f"kind={self.cfg.kind} (a classifier pools the stream first)")
        return self.lm_head.weight, self.lm_head.bias

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def checkpointed_block(block: Block, x: torch.Tensor, carry: Carry, ctx: Context
                       ) -> tuple[torch.Tensor, Carry]:
    """`block(x, carry, ctx)` under activation checkpointing: only the block's inputs are kept and
    its activations are recomputed in the backward pass (Chen et al. 2016, arXiv 1604.06174), so
    memory grows with one block's activations plus one stream per block, not with all of them.

    A block is a function of its arguments (ResiDual's second stream and RealFormer's scores
    come in `carry` and go out in the returned one), so the recomputation sees exactly the
    values the forward saw.
    """
    return checkpoint(block, x, carry, ctx, use_reentrant=False)


@torch.no_grad()
def profile_admin_omega(model: NormTransformer, idx: torch.Tensor) -> list[float]:
    """Admin's profiling pass: set each sublayer's omega from one batch.

    With omega = 1, run the batch and record the variance of every branch as added; sublayer i
    gets `omega_i = sqrt(1 + sum_{j<i} Var[F_j])`, the variance a Pre-LN stream would have
    accumulated there (Liu et al. 2020, arXiv 2004.08249, Sec. 4.2). The leading 1 stands for the
    unit-variance embedding of the fairseq setting Admin was profiled in, so omega >= 1 and grows
    with depth like the closed form. Returns the omegas in sublayer order.
    """
    subs = [s for b in model.blocks for s in (b.attn, b.mlp) if s.skip is not None]
    if not subs:
        raise ValueError("profile_admin_omega needs a model with Admin sublayers")
    for s in subs:
        s.skip.fill_(1.0)
    was_training = model.training
    model.eval()
    with capture(model, "blocks.*.branch_added") as cap:
        model(idx)
    model.train(was_training)
    total = 1.0
    omegas = []
    for i, block in enumerate(model.blocks):
        for kind in ("attn", "mlp"):
            if getattr(block, kind).plan.absent:  # attention: none adds nothing to profile
                continue
            omegas.append(math.sqrt(total))
            total += cap[f"blocks.{i}.{kind}.branch_added"].float().var().item()
    for s, w in zip(subs, omegas, strict=True):
        s.skip.fill_(w)
    return omegas


def build_model(cfg: ModelConfig, *, seed: int | None = 0,
                profile_batch: torch.Tensor | None = None) -> NormTransformer:
    """Build (and seed) the model of `cfg`. Admin with `admin_omega=profile` runs its profiling
    pass on `profile_batch`, or on random tokens drawn from the seed when none is given."""
    if seed is not None:
        torch.manual_seed(seed)
    model = NormTransformer(cfg)
    if cfg.admin_omega == "profile" and any(s.skip is not None for b in model.blocks
                                            for s in (b.attn, b.mlp)):
        if profile_batch is None:
            gen = torch.Generator().manual_seed(0 if seed is None else seed)
            profile_batch = torch.randint(0, cfg.vocab_size, (8, min(64, cfg.max_seq_len)),
                                          generator=gen)
        profile_admin_omega(model, profile_batch)
    return model
