"""Normalization layers by name: LayerNorm, RMSNorm, DyT, identity and (encoder-only) BatchNorm.

`make_norm(kind, dim, ...)` is the one place a norm is built, so every placement gets the same
implementation of each kind.
"""

from __future__ import annotations

import torch
from torch import nn


class DyT(nn.Module):
    """Dynamic Tanh, `gamma * tanh(alpha * x) + beta` with a learned scalar alpha.

    Zhu et al. 2025, "Transformers without Normalization" (arXiv 2503.10622); alpha starts at 0.5.
    """

    def __init__(self, dim: int, alpha: float = 0.5, bias: bool = True) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.alpha * x) * self.weight
        return y + self.bias if self.bias is not None else y


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm with statistics over batch and positions, features on the last axis.

    Only valid for bidirectional encoders: in a causal model the batch statistics would let a
    position see later tokens (the config rejects that combination).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return super().forward(x.reshape(-1, shape[-1])).reshape(shape)


def make_norm(
    kind: str, dim: int, *, eps: float = 1e-5, bias: bool = True, dyt_alpha: float = 0.5
) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    if kind == "dyt":
        return DyT(dim, alpha=dyt_alpha, bias=bias)
    if kind == "identity":
        return nn.Identity()
    if kind == "batchnorm":
        return TokenBatchNorm(dim, eps=eps)
    raise ValueError(f"unknown norm kind {kind!r}; use layernorm|rmsnorm|dyt|identity|batchnorm")
