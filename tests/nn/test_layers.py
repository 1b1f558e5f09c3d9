"""The shared sublayers (`normlab.nn.layers`) against their formulas, written out here: the
explicit attention path without a mask, uniform attention in each of its cases, RoPE's dtype,
biases and the QKV norms' epsilon as configured, dropout in training, GELU's tanh form, the
explicit path's size bound, and every table and mask on the tensors' own device (checked on
`meta`, which every build of torch has)."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

from normlab.config import ModelConfig
from normlab.nn import layers
from normlab.nn.layers import MLP, Attention, Context, apply_rope, rope_tables
from normlab.nn.taps import hooked


def cfg(**kw) -> ModelConfig:
    base = {"n_blocks": 1, "d_model": 16, "n_heads": 4, "max_seq_len": 8, "vocab_size": 32}
    return ModelConfig(**(base | kw))


def randomized(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter drawn at random (biases included: they start at 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return module


def heads(attn: Attention, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    B, T, d = x.shape
    q, k, v = attn.qkv(x).view(B, T, 3, attn.n_heads, attn.head_dim).unbind(2)
    return tuple(t.transpose(1, 2) for t in (q, k, v))


def test_linear_maps_have_biases_only_when_configured():
    for bias in (True, False):
        c = cfg(bias=bias)
        attn, mlp = Attention(c), MLP(c)
        for lin in (attn.qkv, attn.proj, mlp.fc_in, mlp.fc_out):
            assert (lin.bias is not None) == bias


def test_qkv_norms_take_the_configured_epsilon():
    attn = Attention(cfg(norm_eps=0.125), qkv_norm="rmsnorm")
    assert len(attn.qkv_norms) == 3
    assert all(n.eps == 0.125 for n in attn.qkv_norms)


@pytest.mark.parametrize("causal", [False, True])
def test_explicit_attention_without_a_mask_is_softmax_attention(causal):
    """The fused-GEMM branch (no key mask): an encoder's zero bias and a decoder's causal bias,
    against softmax(Q K^T / sqrt(d_k)) V written out, with 4 heads and 5 positions."""
    attn = randomized(Attention(cfg(kind="decoder" if causal else "encoder")))
    x = torch.randn(3, 5, 16)
    q, k, v = heads(attn, x)
    scores = q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim)
    if causal:
        scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), -math.inf)
    want = scores.softmax(-1) @ v
    got, scores = attn._explicit(q, k, v, None, 0.0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert scores is None  # no residual attention: nothing passed on


@pytest.mark.parametrize("setting", ["fused", "explicit", "uniform", "residual"])
def test_only_residual_attention_replaces_the_scores_it_is_handed(setting):
    """RealFormer's attention passes on `Q K^T / sqrt(d_k) + S_prev`; any other attention hands
    back the scores it was given, as they came (the fused kernel; the explicit path, taken for
    the hooked pattern, with a padding mask; uniform attention), so a block's carry is changed
    only where it is used."""
    kw = {"uniform": {"attention": "uniform"}, "residual": {"residual_attention": True}}
    attn = randomized(Attention(cfg(kind="encoder", **kw.get(setting, {}))))
    x = torch.randn(2, 5, 16)
    prev = torch.randn(2, 4, 5, 5)
    keys = torch.ones(2, 5, dtype=torch.bool)
    keys[1, 3:] = False
    ctx = Context(key_mask=keys[:, None, None, :]) if setting == "explicit" else Context()
    patterns = []
    pattern_hooked = (hooked(attn, {"pattern": lambda _m, _i, out: patterns.append(out)})
                      if setting == "explicit" else contextlib.nullcontext())
    with torch.no_grad(), pattern_hooked:
        _, scores = attn(x, ctx, prev)
    assert len(patterns) == (setting == "explicit")
    if setting != "residual":
        assert scores is prev
        return
    q, k, _ = heads(attn, x)
    torch.testing.assert_close(scores, q @ k.transpose(-2, -1) / math.sqrt(4) + prev)


def uniform_reference(v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Each query's output: the mean of V over the keys it may attend ([T, T] or [B, T, T])."""
    w = allowed.to(v.dtype)
    return (w / w.sum(-1, keepdim=True)) @ v


@pytest.mark.parametrize("case", ["causal", "encoder", "padded", "one key"])
def test_uniform_attention_is_the_mean_over_the_allowed_keys(case):
    """Uniform attention (Xiong et al.'s W^Q = W^K = 0) with a random V bias, in each case:
    causal (prefix means), bidirectional (the mean over all keys), padded keys, and a row with
    a single unpadded key."""
    kind = "decoder" if case == "causal" else "encoder"
    attn = randomized(Attention(cfg(kind=kind, attention="uniform")))
    B, T, d = 2, 5, 16
    x = torch.randn(B, T, d)
    v = x @ attn.qkv.weight[2 * d:].T + attn.qkv.bias[2 * d:]
    key_mask = None
    if case == "causal":
        allowed = torch.ones(T, T, dtype=torch.bool).tril()
    elif case == "encoder":
        allowed = torch.ones(T, T, dtype=torch.bool)
    else:
        keys = torch.ones(B, T, dtype=torch.bool)
        keys[1, (1 if case == "one key" else 3):] = False
        key_mask = keys[:, None, None, :]
        allowed = keys[:, None, :].expand(B, T, T)
    got = attn._uniform(x, key_mask)
    torch.testing.assert_close(got, uniform_reference(v, allowed), rtol=1e-5, atol=1e-6)


def test_rope_keeps_the_dtype_of_its_input():
    cos, sin = rope_tables(8, 4, 10000.0)
    x = torch.randn(2, 8, 4, dtype=torch.bfloat16)
    out = apply_rope(x, cos, sin)
    assert out.dtype == torch.bfloat16
    want = x.float() * cos + torch.cat([-x.float()[..., 2:], x.float()[..., :2]], -1) * sin
    torch.testing.assert_close(out.float(), want, rtol=0.02, atol=0.02)


def test_the_explicit_path_is_taken_up_to_its_size_bound_inclusive():
    limit = layers.EXPLICIT_ATTENTION_MAX_SCORES  # B * H * T * T scores
    q = torch.empty(limit // (64 * 64), 1, 64, 1, dtype=torch.bfloat16)
    assert q.shape[0] * 64 * 64 == limit
    assert layers.explicit_attention_pays(q)
    over = torch.empty(q.shape[0] + 1, 1, 64, 1, dtype=torch.bfloat16)
    assert not layers.explicit_attention_pays(over)


def test_bf16_on_cpu_takes_the_explicit_path_without_a_pattern_hook(monkeypatch):
    attn = Attention(cfg())
    calls = []
    real = Attention._explicit

    def spy(self, *args):
        calls.append(args[0].dtype)
        return real(self, *args)

    monkeypatch.setattr(Attention, "_explicit", spy)
    attn.bfloat16()(torch.randn(2, 5, 16, dtype=torch.bfloat16))
    assert calls == [torch.bfloat16]
    attn.float()(torch.randn(2, 5, 16))  # fp32: the fused kernel
    assert calls == [torch.bfloat16]


def test_attention_dropout_applies_in_training_only():
    attn = randomized(Attention(cfg(dropout=0.5, kind="encoder")))
    x = torch.randn(2, 6, 16)
    attn.resid_dropout.p = 0.0  # only the attention probabilities' dropout is left
    attn.eval()
    (a, _), (b, _) = attn(x), attn(x)
    torch.testing.assert_close(a, b)
    attn.train()
    torch.manual_seed(0)
    c, _ = attn(x)
    assert not torch.allclose(c, a, atol=1e-3)


def test_gelu_takes_its_configured_form():
    x = torch.linspace(-3, 3, 64)[:, None].expand(64, 16).contiguous()
    for approx in ("none", "tanh"):
        mlp = randomized(MLP(cfg(gelu_approx=approx)))
        want = mlp.fc_out(F.gelu(mlp.fc_in(x), approximate=approx))
        torch.testing.assert_close(mlp(x), want, rtol=0, atol=0)
    exact = MLP(cfg())
    tanh = MLP(cfg(gelu_approx="tanh"))
    tanh.load_state_dict(randomized(exact).state_dict())
    assert (exact(x) - tanh(x)).abs().max() > 1e-5  # the two forms differ visibly


@pytest.mark.parametrize("setting", [
    {"kind": "decoder"}, {"kind": "encoder"}, {"kind": "decoder", "attention": "uniform"},
    {"kind": "decoder", "positions": "rope"}])
def test_masks_and_tables_are_made_on_the_tensors_device(setting):
    """Every table and mask a forward makes (RoPE, the causal bias and mask, uniform
    attention's counts) on the device of its input, here `meta`: one made on the CPU instead
    fails the forward."""
    attn = Attention(cfg(**setting)).to("meta")
    x = torch.empty(2, 5, 16, device="meta")
    ctx = Context()
    if setting.get("positions") == "rope":
        ctx = Context(rope=rope_tables(8, attn.head_dim, 10000.0, device="meta"))
        assert all(t.device.type == "meta" for t in ctx.rope)
    q = torch.empty(2, 4, 5, 4, device="meta")
    assert attn(x, ctx)[0].device.type == "meta"
    if not attn.uniform:
        assert attn._explicit(q, q, q, None, 0.0)[0].device.type == "meta"
        attn.residual_attention = True  # the masked branch
        y, scores = attn._explicit(q, q, q, None, 0.0)
        assert y.device.type == "meta" and scores.device.type == "meta"


def test_the_causal_bias_is_made_on_the_device_of_the_scores(monkeypatch):
    """`causal_bias` makes its mask where it is asked to, and the explicit path asks for the
    device of q (a mask left on the CPU would fail beside CUDA scores)."""
    bias = layers.causal_bias(5, torch.float32, torch.device("meta"))
    assert bias.device.type == "meta" and bias.shape == (1, 5, 5)
    seen = []
    real = layers.causal_bias
    monkeypatch.setattr(layers, "causal_bias",
                        lambda T, dtype, device: seen.append(device) or real(T, dtype, device))
    q = torch.empty(2, 4, 5, 4, device="meta")
    Attention(cfg()).to("meta")._explicit(q, q, q, None, 0.0)
    assert seen == [q.device]
