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


# -- the analysis taps: in, scale (1/std or 1/rms per token), out ----------------------------------

def _x(dtype=torch.float32, shape=(2, 3, 8), seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 3 + 1).to(dtype)


@pytest.mark.parametrize(("dtype", "stat"), [(torch.bfloat16, torch.float32),
                                             (torch.float32, torch.float32),
                                             (torch.float64, torch.float64)])
def test_scales_are_one_over_std_and_rms_per_token_in_float32_at_least(dtype, stat):
    x = _x(dtype)
    x64 = x.double()
    want_ln = 1 / (x64.var(-1, keepdim=True, unbiased=False) + 1e-3).sqrt()
    want_rms = 1 / (x64.pow(2).mean(-1, keepdim=True) + 1e-3).sqrt()
    for got, want in ((norms.layernorm_scale(x, 1e-3), want_ln),
                      (norms.rmsnorm_scale(x, 1e-3), want_rms)):
        assert got.dtype == stat and got.shape == (2, 3, 1)
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)


def _tapped(norm, x, hook=None):
    """The norm's output with its scale tap hooked (so the explicit path runs) and the three
    taps' values."""
    seen = {}
    handles = [getattr(norm, name).register_forward_hook(
        lambda _m, _i, out, name=name: seen.__setitem__(name, out)) for name in ("input", "out")]
    handles.append(norm.scale.register_forward_hook(
        hook or (lambda _m, _i, out: seen.__setitem__("scale", out))))
    try:
        return norm(x), seen
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_explicit_path_taken_for_the_scale_tap_equals_torchs_norm(kind, bias, dtype):
    norm = make_norm(kind, 8, eps=1e-3, bias=bias).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 8))
        if getattr(norm, "bias", None) is not None:
            norm.bias.copy_(torch.linspace(-1.0, 1.0, 8))
    x = _x(dtype)
    plain = norm(x)  # no tap hooked: torch's own kernel
    got, seen = _tapped(norm, x)
    torch.testing.assert_close(got, plain, rtol=1e-6, atol=1e-6)
    assert got.dtype == x.dtype
    torch.testing.assert_close(seen["input"], x, rtol=0, atol=0)
    torch.testing.assert_close(seen["out"], got, rtol=0, atol=0)
    scale_fn = norms.layernorm_scale if kind == "layernorm" else norms.rmsnorm_scale
    torch.testing.assert_close(seen["scale"], scale_fn(x, 1e-3), rtol=0, atol=0)


def test_bf16_layernorm_with_the_scale_tap_matches_the_kernel():
    norm = make_norm("layernorm", 8).to(torch.bfloat16)
    x = _x(torch.bfloat16)
    got, _ = _tapped(norm, x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), norm(x).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_a_hook_that_returns_a_scale_replaces_it(kind):
    norm = make_norm(kind, 8, eps=1e-3)
    x = _x()
    base, seen = _tapped(norm, x)
    doubled, _ = _tapped(norm, x, hook=lambda _m, _i, out: 2 * out)
    # the output is affine in the scale: weight * (x - mean) * s + bias
    shift = norm.bias if kind == "layernorm" else 0.0
    torch.testing.assert_close(doubled - shift, 2 * (base - shift), rtol=1e-5, atol=1e-5)


def test_rmsnorm_without_eps_uses_the_dtypes_epsilon():
    norm = make_norm("rmsnorm", 8)
    norm.eps = None
    x = _x() * 1e-4
    got, seen = _tapped(norm, x)
    torch.testing.assert_close(seen["scale"], norms.rmsnorm_scale(x, torch.finfo(x.dtype).eps))
    torch.testing.assert_close(got, norm(x), rtol=1e-5, atol=1e-6)


def test_dyt_has_input_and_out_taps_and_no_scale():
    dyt = make_norm("dyt", 8)
    assert not hasattr(dyt, "scale")
    seen = {}
    hs = [getattr(dyt, n).register_forward_hook(lambda _m, _i, o, n=n: seen.__setitem__(n, o))
          for n in ("input", "out")]
    x = _x()
    y = dyt(x)
    for h in hs:
        h.remove()
    torch.testing.assert_close(seen["input"], x)
    torch.testing.assert_close(seen["out"], y)
    torch.testing.assert_close(y, torch.tanh(0.5 * x))


def test_layernorm_keeps_its_eps_and_bias_setting():
    assert make_norm("layernorm", 8, eps=1e-3, bias=False).bias is None
    ln = norms.LayerNorm(8, eps=1e-3)
    assert ln.eps == 1e-3 and ln.bias is not None and hasattr(ln, "scale")


def test_the_tapped_norms_default_to_eps_1e_5():
    assert norms.LayerNorm(8).eps == 1e-5


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_bf16_explicit_path_computes_in_float32_and_returns_bf16(kind):
    norm = make_norm(kind, 8, eps=1e-3).to(torch.bfloat16)
    x = _x(torch.bfloat16)
    got, seen = _tapped(norm, x)
    assert got.dtype == torch.bfloat16
    xf, s = x.float(), seen["scale"]
    centred = xf - xf.mean(-1, keepdim=True) if kind == "layernorm" else xf
    want = (centred * s).to(torch.bfloat16) * norm.weight
    if kind == "layernorm":
        want = want + norm.bias
    torch.testing.assert_close(got, want, rtol=0, atol=0)
