"""The sublayers every placement shares: multi-head attention and the MLP.

Both are functions of their inputs: the MLP maps `h` to its output; attention maps `h`, the
forward's `Context` (RoPE tables, padding mask) and the previous attention's pre-softmax scores
(RealFormer) to its output and the scores it passes on. Nothing is kept between calls.

Attention goes through `scaled_dot_product_attention` (fused kernels) unless RealFormer's residual
attention needs the raw scores, or the `pattern` tap is hooked, which take the explicit path.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from normlab.config import ModelConfig
from normlab.nn.norms import make_norm
from normlab.nn.taps import Tap, active, fire


class Context(NamedTuple):
    """What every attention of one forward reads, the same in every block (immutable)."""

    rope: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin: [T, head_dim]
    key_mask: torch.Tensor | None = None  # [B, 1, 1, T] bool, True where a key may be attended


NO_CONTEXT = Context()  # learned positions, no padding


def rope_tables(seq_len: int, head_dim: int, base: float, device=None) -> tuple[torch.Tensor, ...]:
    """cos/sin tables of rotary embeddings (RoFormer, arXiv 2104.09864), rotate-half layout."""
    even = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
    inv = 1.0 / base ** (even / head_dim)
    ang = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    """Multi-head self-attention; fused `qkv` projection, output projection `proj`.

    `qkv_norm` (HybridNorm, arXiv 2503.04598) normalizes Q, K and V right after the projection,
    each with its own norm of size head_dim shared by the heads (the released code's
    `q_norm`/`k_norm`/`v_norm`), before RoPE.
    `residual_attention` (RealFormer, He et al. 2020, arXiv 2012.11747) adds the previous block's
    pre-softmax scores to this block's: `S_l = Q K^T / sqrt(d_k) + S_{l-1}`. So the forward takes
    `S_{l-1}` (`prev_scores`, None in the first block) and returns `S_l` beside its output; an
    attention without it returns `prev_scores` as it came (None).

    Taps: `q`, `k`, `v` ([B, H, T, head_dim], after the QKV norms and RoPE: what the scores are
    computed from) and `pattern` (the softmax probabilities [B, H, T, T] before attention dropout,
    TransformerLens's `hook_pattern`). Hooking `pattern` switches to the explicit path, which
    materializes it; otherwise the fused kernel runs and the taps are not called.
    """

    def __init__(self, cfg: ModelConfig, qkv_norm: str | None = None) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.causal = cfg.causal
        self.uniform = cfg.attention == "uniform"
        self.residual_attention = cfg.residual_attention
        self.qkv = nn.Linear(d, 3 * d, bias=cfg.bias)
        self.proj = nn.Linear(d, d, bias=cfg.bias)
        self.attn_dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.qkv_norms = None
        if qkv_norm:
            self.qkv_norms = nn.ModuleList(
                make_norm(qkv_norm, self.head_dim, eps=cfg.norm_eps, bias=cfg.norm_bias)
                for _ in range(3)
            )
        for name in ("q", "k", "v", "pattern"):
            self.add_module(name, Tap())

    def forward(self, x: torch.Tensor, ctx: Context = NO_CONTEXT,
                prev_scores: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The attention output [B, T, d] and the scores the next attention adds (RealFormer;
        `prev_scores` unchanged otherwise)."""
        B, T, _ = x.shape
        if self.uniform:
            return self.resid_dropout(self.proj(self._uniform(x, ctx.key_mask))), prev_scores
        qkv = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim)
        q, k, v = qkv.unbind(2)
        if self.qkv_norms is not None:
            q, k, v = (norm(t) for norm, t in zip(self.qkv_norms, (q, k, v), strict=True))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, Dh]
        if ctx.rope is not None:
            cos, sin = ctx.rope
            q, k = apply_rope(q, cos[:T], sin[:T]), apply_rope(k, cos[:T], sin[:T])
        q, k, v = fire(self.q, q), fire(self.k, k), fire(self.v, v)
        p = self.attn_dropout if self.training else 0.0
        scores = prev_scores
        if self.residual_attention or explicit_attention_pays(q) or active(self.pattern):
            y, scores = self._explicit(q, k, v, ctx.key_mask, p, prev_scores)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=ctx.key_mask, dropout_p=p,
                is_causal=self.causal and ctx.key_mask is None,
            )
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.resid_dropout(self.proj(y)), scores

    def _uniform(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """Every allowed position weighted equally: softmax of all-zero scores, as with
        W^Q = W^K = 0 (Xiong et al. 2020, arXiv 2002.04745, Sec. 3.3). Only the V third of the
        fused projection is used; Q and K keep their slots so checkpoints share one layout."""
        d = x.shape[-1]
        bias = None if self.qkv.bias is None else self.qkv.bias[2 * d:]
        v = F.linear(x, self.qkv.weight[2 * d:], bias)  # [B, T, d]; heads do not matter here
        if key_mask is not None:  # padding (encoder): mean over the unpadded keys
            m = key_mask[:, 0, 0, :, None].to(v.dtype)  # [B, T, 1]
            return ((v * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp_min(1.0)
                    ).expand_as(v)
        if not self.causal:
            return v.mean(1, keepdim=True).expand_as(v)
        counts = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=v.dtype)[None, :, None]
        return v.cumsum(1) / counts

    def _explicit(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  key_mask: torch.Tensor | None, dropout_p: float,
                  prev_scores: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """softmax(Q K^T / sqrt(d_k) [+ S_prev] + mask) V as batched GEMMs, and the scores to
        pass on: `S = Q K^T / sqrt(d_k) + S_prev` with residual attention, else `prev_scores`."""
        B, H, T, Dh = q.shape
        scale = 1.0 / math.sqrt(Dh)
        if not self.residual_attention and key_mask is None:
            # scale and causal mask fused into one GEMM on [B*H, T, T]
            bias = (causal_bias(T, q.dtype, q.device) if self.causal
                    else q.new_zeros(1, 1, 1))
            scores = torch.baddbmm(bias, q.flatten(0, 1), k.flatten(0, 1).transpose(1, 2),
                                   alpha=scale)
            probs = fire(self.pattern, scores.softmax(dim=-1).view(B, H, T, T))
            att = F.dropout(probs.flatten(0, 1), p=dropout_p)
            return torch.bmm(att, v.flatten(0, 1)).view(B, H, T, Dh), prev_scores
        allowed = key_mask
        if self.causal:
            tri = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
            allowed = tri if allowed is None else allowed & tri
        scores = (q @ k.transpose(-2, -1)) * scale
        passed_on = prev_scores
        if self.residual_attention:
            if prev_scores is not None:
                scores = scores + prev_scores
            passed_on = scores
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        att = F.dropout(fire(self.pattern, scores.softmax(dim=-1)), p=dropout_p)
        return att @ v, passed_on


def causal_bias(T: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[1, T, T] additive mask: 0 where a query may attend to a key, -inf above the diagonal."""
    return torch.full((T, T), float("-inf"), dtype=dtype, device=device).triu(1)[None]


# CPU's fused attention kernel is slower in bf16 than two batched GEMMs with a softmax between them
# at training context lengths (benchmarks/bench_throughput.py times both at its shapes). The
# explicit path materializes the [B, H, T, T] scores, so it is taken only while they stay this
# small.
EXPLICIT_ATTENTION_MAX_SCORES = 1 << 24


def explicit_attention_pays(q: torch.Tensor) -> bool:
    B, H, T, _ = q.shape
    return (q.device.type == "cpu" and q.dtype == torch.bfloat16
            and B * H * T * T <= EXPLICIT_ATTENTION_MAX_SCORES)


class NoAttention(nn.Module):
    """The attention sublayer of `attention: none`: adds nothing, so a block is its MLP only."""

    def forward(self, x: torch.Tensor, ctx: Context = NO_CONTEXT,
                prev_scores: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return torch.zeros_like(x), prev_scores


class MLP(nn.Module):
    """Position-wise MLP: GELU (`fc_out(gelu(fc_in x))`), ReLU (Vaswani et al. 2017) or SwiGLU
    (Shazeer 2020, arXiv 2002.05202), whose `fc_in` holds the gate and the value halves side by
    side."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        f = cfg.ff_width
        self.swiglu = cfg.mlp == "swiglu"
        self.relu = cfg.mlp == "relu"
        self.gelu_approx = cfg.gelu_approx  # "tanh": GPT-2's gelu_new (Hendrycks & Gimpel 2016)
        self.fc_in = nn.Linear(cfg.d_model, 2 * f if self.swiglu else f, bias=cfg.bias)
        self.fc_out = nn.Linear(f, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc_in(x)
        if self.swiglu:
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        elif self.relu:
            h = F.relu(h)
        else:
            h = F.gelu(h, approximate=self.gelu_approx)
        return self.dropout(self.fc_out(h))
