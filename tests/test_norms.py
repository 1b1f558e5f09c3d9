"""The norm factory: each kind, its defaults (eps 1e-5, bias on, DyT's alpha 0.5) and the
arguments it passes through; DyT's and token BatchNorm's forward against their formulas."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from normlab.nn import norms
from normlab.nn.norms import DyT, TokenBatchNorm, make_norm


def test_defaults():
    ln = make_norm("layernorm", 8)
    # torch's norms with the analysis taps (.in, .scale, .out): normlab.nn.norms' subclasses
    assert type(ln) is norms.LayerNorm and isinstance(ln, nn.LayerNorm)
    assert ln.eps == 1e-5 and ln.bias is not None
    assert ln.normalized_shape == (8,)
    rms = make_norm("rmsnorm", 8)
    assert type(rms) is norms.RMSNorm and isinstance(rms, nn.RMSNorm)
    assert rms.eps == 1e-5 and rms.normalized_shape == (8,)
    dyt = make_norm("dyt", 8)
    assert type(dyt) is DyT and dyt.alpha.item() == 0.5 and dyt.bias is not None
    assert DyT(8).alpha.item() == 0.5 and DyT(8).bias is not None  # Zhu et al. 2025's alpha0
    bn = make_norm("batchnorm", 8)
    assert type(bn) is TokenBatchNorm and bn.eps == 1e-5 and bn.num_features == 8
    assert type(make_norm("identity", 8)) is nn.Identity


def test_arguments_pass_through():
    assert make_norm("layernorm", 4, eps=1e-3).eps == 1e-3
    assert make_norm("layernorm", 4, bias=False).bias is None
    assert make_norm("rmsnorm", 4, eps=1e-3).eps == 1e-3
    dyt = make_norm("dyt", 4, bias=False, dyt_alpha=0.25)
    assert dyt.bias is None and dyt.alpha.item() == 0.25 and dyt.weight.shape == (4,)
    assert make_norm("batchnorm", 4, eps=1e-3).eps == 1e-3


def test_unknown_kind():
    with pytest.raises(ValueError, match=r"^unknown norm kind 'group'; use "
                                         r"layernorm\|rmsnorm\|dyt\|identity\|batchnorm$"):
        make_norm("group", 4)


def test_dyt_forward():
    torch.manual_seed(0)
    dyt = DyT(6, alpha=0.7)
    with torch.no_grad():
        dyt.weight.normal_()
        dyt.bias.normal_()
    x = torch.randn(2, 3, 6)
    want = torch.tanh(0.7 * x) * dyt.weight + dyt.bias
    torch.testing.assert_close(dyt(x), want)
    plain = DyT(6, alpha=0.7, bias=False)
    torch.testing.assert_close(plain(x), torch.tanh(0.7 * x))


def test_token_batchnorm_uses_batch_and_positions():
    bn = TokenBatchNorm(4, eps=1e-5)
    x = torch.randn(3, 5, 4) * 3 + 1
    y = bn(x)
    flat = x.reshape(-1, 4)
    want = (flat - flat.mean(0)) / torch.sqrt(flat.var(0, unbiased=False) + 1e-5)
    assert y.shape == x.shape
    torch.testing.assert_close(y.reshape(-1, 4), want, rtol=1e-5, atol=1e-5)
