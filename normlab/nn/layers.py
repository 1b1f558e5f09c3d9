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
from normlab.nn.sphere import SphereScale, base_scale, l2
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

    The norms after the projection, before RoPE, are of one kind of machinery (`qkv_norms`,
    `qk_norms`: one norm per projected tensor, built by `make_norm`):
    `qkv_norm` (HybridNorm, arXiv 2503.04598) normalizes Q, K and V, each with its own norm of
    size head_dim shared by the heads (the released code's `q_norm`/`k_norm`/`v_norm`);
    `qk_norm` (OLMo 2, arXiv 2501.00656) normalizes Q and K, each with its own norm of size d over
    all heads at once, before the split into heads (Hugging Face's `Olmo2Attention`:
    `q_norm(q_proj(x))`, a norm of `num_attention_heads * head_dim`). Over d, a head's query is
    scaled by the statistics of every head, unlike a per-head QK-norm. Both may be set: the
    full-width norms come first.
    `inner_norm` (Sub-LN, arXiv 2210.06423; torchscale's `inner_attn_ln`) normalizes the
    concatenated heads [.., d] before the output projection. `head_scale` (NormFormer, arXiv
    2110.09456; fairseq's `c_attn`) multiplies the output, after the projection, by a learned
    factor per head-wide slice (`HeadScale`).
    `sphere` (nGPT, arXiv 2410.01131; the authors' `Block.forward`): after RoPE, Q and K are each
    put on the unit sphere per head and scaled by the learned `s_qk` (`qk_scale`, [d] viewed as
    [heads, head_dim]), and the softmax scale is sqrt(head_dim), not 1/sqrt(head_dim).
    `residual_attention` (RealFormer, He et al. 2020, arXiv 2012.11747) adds the previous block's
    pre-softmax scores to this block's: `S_l = Q K^T / sqrt(d_k) + S_{l-1}`. So the forward takes
    `S_{l-1}` (`prev_scores`, None in the first block) and returns `S_l` beside its output; an
    attention without it returns `prev_scores` as it came (None).

    Taps: `q`, `k`, `v` ([B, H, T, head_dim], after the Q, K, V norms and RoPE: what the scores are
    computed from) and `pattern` (the softmax probabilities [B, H, T, T] before attention dropout,
    TransformerLens's `hook_pattern`). Hooking `pattern` switches to the explicit path, which
    materializes it; otherwise the fused kernel runs and the taps are not called.
    """

    def __init__(self, cfg: ModelConfig, qkv_norm: str | None = None, *,
                 qk_norm: str | None = None, inner_norm: str | None = None,
                 head_scale: bool = False, sphere: bool = False) -> None:
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
        self.qkv_norms = projection_norms(qkv_norm, self.head_dim, 3, cfg)
        self.qk_norms = projection_norms(qk_norm, d, 2, cfg)
        self.inner_norm = None if inner_norm is None else make_norm(
            inner_norm, d, eps=cfg.norm_eps, bias=cfg.norm_bias, dyt_alpha=cfg.dyt_alpha)
        self.head_scale = HeadScale(self.n_heads) if head_scale else None
        # nGPT: s_qk (the authors' `sqk`: init 1, scale 1/sqrt(d)); softmax scale sqrt(head_dim)
        self.qk_scale = SphereScale(d, 1.0, base_scale(d)) if sphere else None
        self.softmax_scale = (d / self.n_heads) ** 0.5 if sphere else None
        for name in ("q", "k", "v", "pattern"):
            self.add_module(name, Tap())

    def forward(self, x: torch.Tensor, ctx: Context = NO_CONTEXT,
                prev_scores: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The attention output [B, T, d] and the scores the next attention adds (RealFormer;
        `prev_scores` unchanged otherwise)."""
        B, T, _ = x.shape
        if self.uniform:
            return self._output(self._uniform(x, ctx.key_mask)), prev_scores
        qkv = self.qkv(x).view(B, T, 3, -1)
        q, k, v = qkv.unbind(2)
        q, k = normed_each(self.qk_norms, (q, k))  # OLMo 2: over the full width d
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim) for t in (q, k, v))
        q, k, v = normed_each(self.qkv_norms, (q, k, v))  # HybridNorm: per head
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, Dh]
        if ctx.rope is not None:
            cos, sin = ctx.rope
            q, k = apply_rope(q, cos[:T], sin[:T]), apply_rope(k, cos[:T], sin[:T])
        if self.qk_scale is not None:  # nGPT: s_qk * L2(q), s_qk * L2(k), per head after RoPE
            s = self.qk_scale().view(self.n_heads, 1, self.head_dim)
            q, k = s * l2(q), s * l2(k)
        q, k, v = fire(self.q, q), fire(self.k, k), fire(self.v, v)
        p = self.attn_dropout if self.training else 0.0
        scores = prev_scores
        if self.residual_attention or explicit_attention_pays(q) or active(self.pattern):
            y, scores = self._explicit(q, k, v, ctx.key_mask, p, prev_scores)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=ctx.key_mask, dropout_p=p,
                is_causal=self.causal and ctx.key_mask is None, scale=self.softmax_scale,
            )
        return self._output(y.transpose(1, 2).reshape(B, T, -1)), scores

    def _output(self, y: torch.Tensor) -> torch.Tensor:
        """The concatenated heads [B, T, d] through the inner norm, the output projection and
        the head scale."""
        if self.inner_norm is not None:
            y = self.inner_norm(y)
        y = self.proj(y)
        if self.head_scale is not None:
            y = self.head_scale(y)
        return self.resid_dropout(y)

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
        scale = 1.0 / math.sqrt(Dh) if self.softmax_scale is None else self.softmax_scale
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


def projection_norms(kind: str | None, dim: int, count: int, cfg: ModelConfig
                     ) -> nn.ModuleList | None:
    """`count` norms of `kind` and size `dim` for the projected Q, K (and V), or None."""
    if not kind:
        return None
    return nn.ModuleList(make_norm(kind, dim, eps=cfg.norm_eps, bias=cfg.norm_bias)
                         for _ in range(count))


def normed_each(norms: nn.ModuleList | None, tensors: tuple[torch.Tensor, ...]
                ) -> tuple[torch.Tensor, ...]:
    """Each tensor through its own norm of `norms`; the tensors as they are where None."""
    if norms is None:
        return tensors
    return tuple(norm(t) for norm, t in zip(norms, tensors, strict=True))


class HeadScale(nn.Module):
    """NormFormer's head scale (Shleifer et al. 2021, arXiv 2110.09456): a learned factor per
    head, starting at 1, on a [..., d] tensor viewed as [..., heads, d/heads], as fairseq's
    `c_attn` (`torch.einsum("tbhd,h->tbhd", x, self.c_attn)`)."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n_heads))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.weight.shape[-1]
        return (x.unflatten(-1, (h, -1)) * self.weight[:, None]).flatten(-2)


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
    side. `inner_norm` normalizes the activation (width d_ff) before `fc_out`: Sub-LN's
    `ffn_layernorm` (torchscale, arXiv 2210.06423) and NormFormer's (fairseq, arXiv
    2110.09456), both after the activation and its dropout. `sphere` (nGPT, arXiv 2410.01131):
    the first map's output times the learned `s_uv` (`uv_scale`, the authors' `suv`: init 1,
    scale 1, times sqrt(d)) before the activation; with SwiGLU it scales the gate half and the
    value half each by its own entries (the authors' `u` is normlab's value half, `v` its
    gate)."""

    def __init__(self, cfg: ModelConfig, inner_norm: str | None = None,
                 sphere: bool = False) -> None:
        super().__init__()
        f = cfg.ff_width
        self.swiglu = cfg.mlp == "swiglu"
        self.relu = cfg.mlp == "relu"
        self.gelu_approx = cfg.gelu_approx  # "tanh": GPT-2's gelu_new (Hendrycks & Gimpel 2016)
        self.fc_in = nn.Linear(cfg.d_model, 2 * f if self.swiglu else f, bias=cfg.bias)
        self.fc_out = nn.Linear(f, cfg.d_model, bias=cfg.bias)
        self.inner_norm = None if inner_norm is None else make_norm(
            inner_norm, f, eps=cfg.norm_eps, bias=cfg.norm_bias, dyt_alpha=cfg.dyt_alpha)
        self.dropout = nn.Dropout(cfg.dropout)
        self.uv_scale = (SphereScale(self.fc_in.out_features, 1.0, 1.0, cfg.d_model ** 0.5)
                         if sphere else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc_in(x)
        if self.uv_scale is not None:
            h = self.uv_scale() * h
        if self.swiglu:
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        elif self.relu:
            h = F.relu(h)
        else:
            h = F.gelu(h, approximate=self.gelu_approx)
        if self.inner_norm is not None:
            h = self.inner_norm(h)
        return self.dropout(self.fc_out(h))
