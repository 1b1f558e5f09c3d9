"""Normalization layers by name: LayerNorm, RMSNorm, DyT, Derf, identity and (encoder-only)
BatchNorm.

`make_norm(kind, dim, ...)` is the one place a norm is built, so every placement gets the same
implementation of each kind.

LayerNorm, RMSNorm, DyT and Derf carry taps (`normlab.nn.taps`): `input` (what the norm reads),
`out` (what it returns) and, for LayerNorm and RMSNorm, `scale`, the per-token factor [..., 1]
that divides the (centred) input: `1/sqrt(Var[x] + eps)` for LayerNorm (Ba et al. 2016,
arXiv 1607.06450), `1/sqrt(mean(x^2) + eps)` for RMSNorm (Zhang & Sennrich 2019,
arXiv 1910.07467), so that

    LayerNorm(x) = (x - mean(x)) * scale * weight + bias,   RMSNorm(x) = x * scale * weight.

DyT and Derf have no `scale`: `tanh(alpha x)` and `erf(alpha x + s)` act on each feature alone,
with learned scalars shared by every token; nothing is computed per token that freezing could
hold fixed (the input-dependent slope, `alpha (1 - tanh^2(alpha x))` for DyT, differs per feature
and is not a scale).
While `scale` is hooked the norm is computed explicitly from it (stats in float32 at least), so a
hook that returns a tensor replaces the scale (freezing it, for instance); otherwise the fused
kernel runs and the taps cost one check each.
"""

from __future__ import annotations

import torch
from torch import nn

from normlab.nn.taps import Tap, active, fire


def add_norm_taps(norm: nn.Module, scale: bool) -> None:
    """The `input`, (`scale`) and `out` taps of a norm module."""
    norm.add_module("input", Tap())
    if scale:
        norm.add_module("scale", Tap())
    norm.add_module("out", Tap())


def _stat_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def layernorm_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1/std per token, [..., 1] (biased variance, as LayerNorm), in float32 at least."""
    xf = x.to(_stat_dtype(x))
    return torch.rsqrt(xf.var(-1, keepdim=True, unbiased=False) + eps)


def rmsnorm_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1/rms per token, [..., 1], in float32 at least."""
    xf = x.to(_stat_dtype(x))
    return torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


class LayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` with the taps `input`, `scale`, `out` (the module doc)."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__(dim, eps=eps, bias=bias)
        add_norm_taps(self, scale=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = fire(self.input, x)
        if not active(self.scale):
            return fire(self.out, super().forward(x))
        xf = x.to(_stat_dtype(x))
        s = self.scale(layernorm_scale(x, self.eps))
        y = ((xf - xf.mean(-1, keepdim=True)) * s).to(x.dtype) * self.weight
        return fire(self.out, y + self.bias if self.bias is not None else y)


class RMSNorm(nn.RMSNorm):
    """`nn.RMSNorm` with the taps `input`, `scale`, `out` (the module doc)."""

    def __init__(self, dim: int, eps: float | None = None) -> None:
        super().__init__(dim, eps=eps)
        add_norm_taps(self, scale=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = fire(self.input, x)
        if not active(self.scale):
            return fire(self.out, super().forward(x))
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        s = self.scale(rmsnorm_scale(x, eps))
        y = (x.to(s.dtype) * s).to(x.dtype)
        return fire(self.out, y * self.weight if self.weight is not None else y)


class DyT(nn.Module):
    """Dynamic Tanh, `gamma * tanh(alpha * x) + beta` with a learned scalar alpha.

    Zhu et al. 2025, "Transformers without Normalization" (arXiv 2503.10622); alpha starts at 0.5.
    """

    def __init__(self, dim: int, alpha: float = 0.5, bias: bool = True) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        add_norm_taps(self, scale=False)  # no per-token scale (the module doc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = fire(self.input, x)
        y = torch.tanh(self.alpha * x) * self.weight
        return fire(self.out, y + self.bias if self.bias is not None else y)


class Derf(nn.Module):
    """Dynamic erf, `gamma * erf(alpha * x + s) + beta`: Chen, Lu, Zhu, Sun and Liu 2025,
    "Stronger Normalization-Free Transformers" (arXiv 2512.10938), Eq. (10), a point-wise
    drop-in for a norm layer like DyT.

    The paper introduces "Derf(x) = erf(alpha x + s), where erf(x) is the rescaled Gaussian
    cumulative distribution function", and its code (github.com/zlab-princeton/Derf, README:
    "alpha and s are learnable scalars") builds, as for DyT, a learnable scalar `alpha`
    (`alpha_init_value=0.5`), a learnable scalar shift `s` (`shift_init_value=0.0`) and the
    per-channel affine `gamma` (`weight`, ones) and `beta` (`bias`, zeros), and computes
    `weight * erf(alpha * x + shift) + bias`. This module matches it parameter for parameter
    (`alpha` and `shift` are 0-dimensional, as DyT's alpha here); `bias=False` drops beta.
    """

    def __init__(self, dim: int, alpha: float = 0.5, shift: float = 0.0,
                 bias: bool = True) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha)))
        self.shift = nn.Parameter(torch.tensor(float(shift)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        add_norm_taps(self, scale=False)  # no per-token scale (the module doc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = fire(self.input, x)
        y = torch.erf(self.alpha * x + self.shift) * self.weight
        return fire(self.out, y + self.bias if self.bias is not None else y)


POINTWISE_KINDS = ("dyt", "derf")  # norms that map each feature alone: no per-token statistics


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm with statistics over batch and positions, features on the last axis.

    Only valid for bidirectional encoders: in a causal model the batch statistics would let a
    position see later tokens (the config rejects that combination).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return super().forward(x.reshape(-1, shape[-1])).reshape(shape)


def normed(norm: nn.Module | None, x: torch.Tensor) -> torch.Tensor:
    """`norm(x)`; `x` itself where the plan puts no norm (an absent norm is None throughout
    `normlab.nn`: no module, no parameters, no taps)."""
    return x if norm is None else norm(x)


def make_norm(
    kind: str, dim: int, *, eps: float = 1e-5, bias: bool = True, dyt_alpha: float = 0.5,
    derf_alpha: float = 0.5, derf_shift: float = 0.0,
) -> nn.Module:
    """The norm of `kind` over the last `dim` features. `eps` is LayerNorm's, RMSNorm's and
    BatchNorm's; `bias` LayerNorm's, DyT's and Derf's beta; `dyt_alpha` DyT's initial alpha;
    `derf_alpha` and `derf_shift` Derf's initial alpha and s (the paper's 0.5 and 0)."""
    if kind == "layernorm":
        return LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps)
    if kind == "dyt":
        return DyT(dim, alpha=dyt_alpha, bias=bias)
    if kind == "derf":
        return Derf(dim, alpha=derf_alpha, shift=derf_shift, bias=bias)
    if kind == "identity":
        return nn.Identity()
    if kind == "batchnorm":
        return TokenBatchNorm(dim, eps=eps)
    raise ValueError(f"unknown norm kind {kind!r}; use "
                     "layernorm|rmsnorm|dyt|derf|identity|batchnorm")
