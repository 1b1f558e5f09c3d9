"""The norm factory: each kind, its defaults (eps 1e-5, bias on, DyT's alpha 0.5, Derf's alpha 0.5
and shift 0) and the arguments it passes through; DyT's, Derf's and token BatchNorm's forward
against their formulas; Derf against x-transformers' module and in models, stacked or not."""

from __future__ import annotations

import math

import pytest
import torch
from optional_packages import needs
from torch import nn

from normlab.nn import norms
from normlab.nn.norms import Derf, DyT, TokenBatchNorm, make_norm


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
                                         r"layernorm\|rmsnorm\|dyt\|derf\|identity\|batchnorm$"):
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


# -- Derf: Chen et al. 2025 (arXiv 2512.10938) ----------------------------------------------------

def test_derf_defaults_are_the_authors():
    """zlab-princeton/Derf's `Dynamic_erf`: scalar alpha 0.5, scalar shift 0, weight ones and bias
    zeros over the channels."""
    derf = make_norm("derf", 8)
    assert type(derf) is Derf and not hasattr(derf, "scale")
    assert derf.alpha.shape == () and derf.alpha.item() == 0.5
    assert derf.shift.shape == () and derf.shift.item() == 0.0
    assert torch.equal(derf.weight, torch.ones(8)) and torch.equal(derf.bias, torch.zeros(8))
    assert sorted(n for n, _ in derf.named_parameters()) == ["alpha", "bias", "shift", "weight"]
    other = make_norm("derf", 4, bias=False, derf_alpha=0.25, derf_shift=-0.1, dyt_alpha=3.0)
    assert other.bias is None and other.alpha.item() == 0.25
    assert other.shift.item() == pytest.approx(-0.1) and other.weight.shape == (4,)


def _derf_by_hand(x, alpha, shift, gamma, beta):
    """`gamma * erf(alpha * x + s) + beta` element by element with math.erf, in float64."""
    flat = x.double().reshape(-1, x.shape[-1]).tolist()
    rows = [[g * math.erf(alpha * v + shift) + b for v, g, b in zip(row, gamma, beta, strict=True)]
            for row in flat]
    return torch.tensor(rows, dtype=torch.float64).reshape(x.shape)


def test_derf_forward_is_the_papers_formula():
    g = torch.Generator().manual_seed(0)
    derf = Derf(6, alpha=0.7, shift=0.2).double()
    with torch.no_grad():
        derf.weight.copy_(torch.randn(6, generator=g))
        derf.bias.copy_(torch.randn(6, generator=g))
    alpha, shift = derf.alpha.item(), derf.shift.item()
    assert (alpha, shift) == (pytest.approx(0.7), pytest.approx(0.2))
    x = torch.randn(2, 3, 6, generator=g, dtype=torch.float64) * 2
    want = _derf_by_hand(x, alpha, shift, derf.weight.tolist(), derf.bias.tolist())
    torch.testing.assert_close(derf(x), want, rtol=1e-12, atol=1e-12)
    plain = Derf(6, alpha=0.7, shift=0.2, bias=False).double()
    torch.testing.assert_close(plain(x), _derf_by_hand(x, alpha, shift, [1.0] * 6, [0.0] * 6),
                               rtol=1e-12, atol=1e-12)


def test_derf_has_input_and_out_taps():
    derf = make_norm("derf", 8)
    seen = {}
    hs = [getattr(derf, n).register_forward_hook(lambda _m, _i, o, n=n: seen.__setitem__(n, o))
          for n in ("input", "out")]
    x = _x()
    y = derf(x)
    for h in hs:
        h.remove()
    torch.testing.assert_close(seen["input"], x)
    torch.testing.assert_close(seen["out"], y)
    torch.testing.assert_close(y, torch.erf(0.5 * x))


@needs("x_transformers")
@pytest.mark.parametrize("unit_offset", [False, True])
def test_derf_takes_x_transformers_weights_and_computes_the_same(unit_offset):
    """x-transformers' `Derf` (`use_derf=True`) stores alpha, s, gamma and beta (alpha and gamma
    less 1 with `unit_offset`); copied into normlab's module, the outputs agree."""
    from x_transformers.x_transformers import Derf as XDerf

    g = torch.Generator().manual_seed(1)
    theirs = XDerf(8, init_alpha=0.5, init_bias=0.0, unit_offset=unit_offset)
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    offset = 1.0 if unit_offset else 0.0
    ours = make_norm("derf", 8)
    with torch.no_grad():
        ours.alpha.copy_(theirs.alpha + offset)
        ours.shift.copy_(theirs.s)
        ours.weight.copy_(theirs.gamma + offset)
        ours.bias.copy_(theirs.beta)
    x = _x(shape=(2, 5, 8))
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-6, atol=1e-6)
    # and x-transformers' own defaults are the paper's: alpha 0.5, s 0, gamma 1, beta 0
    fresh = XDerf(8)
    assert fresh.alpha.item() == 0.5 and fresh.s.item() == 0.0
    torch.testing.assert_close(fresh(x), make_norm("derf", 8)(x))


@pytest.mark.parametrize("placement", ["pre", "post", "sandwich", "resi_dual"])
def test_a_derf_model_puts_derf_wherever_the_placement_puts_a_norm(placement):
    from normlab.config import make_model_config
    from normlab.nn import build_model

    cfg = make_model_config(placement=placement, n_blocks=2, d_model=16, n_heads=2,
                            max_seq_len=8, norm="derf")
    model = build_model(cfg, seed=0)
    kinds = {type(m) for m in model.modules()
             if isinstance(m, (Derf, DyT, nn.LayerNorm, nn.RMSNorm, TokenBatchNorm))}
    assert kinds == {Derf}
    out = model(torch.randint(0, 256, (2, 8)), torch.randint(0, 256, (2, 8)))
    assert torch.isfinite(out.loss)


def test_stacked_derf_models_are_their_members():
    """The stacked engine stacks Derf's alpha and shift per member: each member's loss and
    gradients are its own model's."""
    from normlab.config import make_model_config
    from normlab.nn import build_model
    from normlab.nn.stacked import StackedTransformer, unstackable_reason

    cfg = make_model_config(placement="sandwich", n_blocks=2, d_model=16, n_heads=2,
                            max_seq_len=8, norm="derf")
    assert unstackable_reason(cfg) is None

    def built(seed):
        model = build_model(cfg, seed=seed)
        g = torch.Generator().manual_seed(100 + seed)
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, Derf):
                    for p in (m.alpha, m.shift, m.weight, m.bias):
                        p.add_(0.2 * torch.randn(p.shape, generator=g))
        return model

    members = [built(s) for s in range(2)]
    stacked = StackedTransformer([built(s) for s in range(2)])
    x, y = torch.randint(0, 256, (2, 2, 8)), torch.randint(0, 256, (2, 2, 8))
    out = stacked(x, y)
    out.loss.sum().backward()
    params = dict(stacked.named_parameters())
    assert any(name.endswith(".shift") for name in params)
    for i, member in enumerate(members):
        ref = member(x[i], y[i]).loss
        ref.backward()
        assert out.loss[i].item() == pytest.approx(ref.item(), abs=1e-5)
        for name, p in member.named_parameters():
            got = params[name].grad[i].reshape(p.shape)
            assert torch.allclose(got, p.grad, rtol=1e-4, atol=1e-6), name
