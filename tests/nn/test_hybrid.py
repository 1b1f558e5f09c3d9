"""HybridNorm and HybridNorm* (Zhuo et al. 2025, arXiv 2503.04598) against the authors' released
wiring, rebuilt here in plain torch.

The reference below follows `OLMoSequentialBlock.forward` of the released code
(github BryceZhuo/HybridNorm, `dense_model/olmo/model.py`) branch by branch, driven by the same
per-layer flags (`attn_norm`, `attn_residual`, `ffn_norm`, `ffn_residual`) that the released
`configs/exps/1.2B-dense-HybriedNorm.yaml` sets, with `norm_pos_special_config`
`{0: {'attn_norm': True, 'ffn_residual': False}}` for HybridNorm*. It takes normlab's weights by
name, never runs normlab's Block, Sublayer or Attention, and must consume every parameter.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from normlab.cli import app
from normlab.config import make_model_config
from normlab.nn import build_model

TOL = {"rtol": 1e-5, "atol": 1e-5}
V, T, B = 64, 7, 2

# The released 1.2B config's norm flags, and the README's HybridNorm* override for block 0.
RELEASED_FLAGS = {"attn_norm": False, "attn_residual": False, "ffn_norm": True,
                  "ffn_residual": True}
STAR_SPECIAL = {0: {"attn_norm": True, "ffn_residual": False}}

SHAPES = [
    pytest.param({}, id="layernorm-gelu-learned"),
    # the released model's kind: RMSNorm without bias, SwiGLU, RoPE, no linear biases
    pytest.param({"norm": "rmsnorm", "norm_bias": False, "mlp": "swiglu", "positions": "rope",
                  "bias": False}, id="rms-swiglu-rope"),
]


def make(placement: str, seed: int = 0, **kw):
    cfg = make_model_config(placement=placement, vocab_size=V, d_model=32, n_heads=4, n_blocks=4,
                            max_seq_len=16, **kw)
    model = build_model(cfg, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # norm gains and all biases away from 1 and 0, so a misplaced norm shows
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norm gains (the only 1-d weights) and biases
                base = 1.0 if name.endswith(".weight") else 0.0
                p.copy_(base + 0.3 * torch.randn(p.shape, generator=gen))
    return model


class Weights:
    """normlab's parameters by name; `take` marks each one used."""

    def __init__(self, model) -> None:
        self.params = {k: v.detach() for k, v in model.named_parameters()}
        self.unused = set(self.params)

    def take(self, name: str) -> torch.Tensor | None:
        if name not in self.params:
            return None
        self.unused.discard(name)
        return self.params[name]


def norm(x, w: Weights, prefix: str, kind: str, eps: float = 1e-5):
    weight, bias = w.take(prefix + ".weight"), w.take(prefix + ".bias")
    assert weight is not None, f"the released wiring has a norm at {prefix}; normlab has none"
    if kind == "rmsnorm":
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    else:
        mu = x.mean(-1, keepdim=True)
        y = (x - mu) * torch.rsqrt((x - mu).pow(2).mean(-1, keepdim=True) + eps)
    y = y * weight
    return y + bias if bias is not None else y


def linear(x, w: Weights, prefix: str):
    y = x @ w.take(prefix + ".weight").T
    bias = w.take(prefix + ".bias")
    return y + bias if bias is not None else y


def rotate(t, base: float = 10000.0):
    """RoPE, rotate-half layout (OLMo's RotaryEmbedding)."""
    dh, n = t.shape[-1], t.shape[-2]
    inv = 1.0 / base ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh)
    ang = torch.outer(torch.arange(n, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    half = torch.cat([-t[..., dh // 2:], t[..., : dh // 2]], dim=-1)
    return t * ang.cos() + half * ang.sin()


def attention(h, w: Weights, i: int, cfg):
    """OLMo's `att_proj` -> q, k, v; `q_norm`/`k_norm`/`v_norm` of size d/heads on each head;
    RoPE; causal softmax; `attn_out`."""
    b, t, d = h.shape
    nh, dh = cfg.n_heads, d // cfg.n_heads
    q, k, v = linear(h, w, f"blocks.{i}.attn.fn.qkv").split(d, dim=-1)
    q, k, v = (z.view(b, t, nh, dh).transpose(1, 2) for z in (q, k, v))
    q, k, v = (norm(z, w, f"blocks.{i}.attn.fn.qkv_norms.{j}", cfg.norm)
               for j, z in enumerate((q, k, v)))
    if cfg.positions == "rope":
        q, k = rotate(q), rotate(k)
    scores = q @ k.transpose(-2, -1) / math.sqrt(dh)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    att = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
    return linear(att, w, f"blocks.{i}.attn.fn.proj")


def ffn(x, w: Weights, i: int, cfg):
    """`ff_out(act(ff_proj(x)))`. OLMo's SwiGLU reads `x, gate = x.chunk(2)` (value rows first);
    normlab's fc_in holds the gate rows first, so its halves are swapped into `ff_proj`."""
    ff_proj = w.take(f"blocks.{i}.mlp.fn.fc_in.weight")
    bias = w.take(f"blocks.{i}.mlp.fn.fc_in.bias")
    if cfg.mlp == "swiglu":
        ff_proj = torch.cat(ff_proj.chunk(2, dim=0)[::-1])
        bias = None if bias is None else torch.cat(bias.chunk(2)[::-1])
    h = x @ ff_proj.T + (0 if bias is None else bias)
    if cfg.mlp == "swiglu":
        value, gate = h.chunk(2, dim=-1)
        h = F.silu(gate) * value
    else:
        h = F.gelu(h)
    return linear(h, w, f"blocks.{i}.mlp.fn.fc_out")


def released_logits(model, idx, special: dict | None = None, old_wiring: bool = False):
    """The released model's forward from normlab's weights. `old_wiring`: the wiring normlab had
    before, `x = x + Attn(x)`, `x = LN(x + MLP(x))`, no final norm (the control)."""
    cfg = model.cfg
    w = Weights(model)
    flags = {i: dict(RELEASED_FLAGS) for i in range(cfg.n_blocks)}
    for i, update in (special or {}).items():
        flags[i].update(update)
    x = w.take("tok_emb.weight")[idx]
    if cfg.positions == "learned":
        x = x + w.take("pos_emb.weight")[: idx.shape[1]]
    for i in range(cfg.n_blocks):
        f = flags[i]
        if old_wiring:
            x = x + attention(x, w, i, cfg)
            x = norm(x + ffn(x, w, i, cfg), w, f"blocks.{i}.mlp.in_norm", cfg.norm)
            continue
        # OLMoSequentialBlock.forward, its branches in order
        if f["attn_norm"]:
            if f["attn_residual"]:
                x = norm(x, w, f"blocks.{i}.attn.in_norm", cfg.norm)
                h = x
            else:
                h = norm(x, w, f"blocks.{i}.attn.in_norm", cfg.norm)
        else:
            h = x
        x = x + attention(h, w, i, cfg)
        if f["ffn_norm"]:
            if not f["ffn_residual"]:
                og_x = x
            x = norm(x, w, f"blocks.{i}.mlp.in_norm", cfg.norm)
            if f["ffn_residual"]:
                og_x = x
        else:
            og_x = x
        x = og_x + ffn(x, w, i, cfg)
    if not old_wiring:
        x = norm(x, w, "final.norm", cfg.norm)  # ln_f
    logits = x @ w.params["tok_emb.weight"].T  # weight tying
    return logits, w.unused


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("placement", "special"), [("hybrid", None),
                                                    ("hybrid_star", STAR_SPECIAL)])
def test_matches_released_wiring(placement, special, shape):
    model = make(placement, **shape)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got = model(idx).logits
        want, unused = released_logits(model, idx, special)
    assert not unused, f"normlab has parameters the released wiring lacks: {sorted(unused)}"
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_old_wiring_and_star_differ(shape):
    """Controls: the same weights through the old wiring, and HybridNorm* read as HybridNorm,
    give other logits, so the match above could fail."""
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))
    hybrid, star = make("hybrid", **shape), make("hybrid_star", **shape)
    with torch.no_grad():
        got = hybrid(idx).logits
        old, _ = released_logits(hybrid, idx, old_wiring=True)
        got_star = star(idx).logits
        star_as_hybrid, unused = released_logits(star, idx, None)
    assert (got - old).abs().max() > 1e-2
    assert unused == {"blocks.0.attn.in_norm.weight"} | (
        {"blocks.0.attn.in_norm.bias"} if "blocks.0.attn.in_norm.bias" in
        dict(star.named_parameters()) else set())
    assert (got_star - star_as_hybrid).abs().max() > 1e-2


def test_plan_prints_the_released_formula():
    runner = CliRunner()
    r = runner.invoke(app, ["plan", "--placement", "hybrid", "--blocks", "2"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "placement hybrid, 2 blocks, init gpt2_scaled"
    assert lines[1:] == [
        "x = Emb(tokens)",
        "block   0 attn [hybrid]  x = x + Attn[QKV-LN](x)",
        "block   0 mlp  [hybrid]  h = LN(x);  x = h + MLP(h)",
        "block   1 attn [hybrid]  x = x + Attn[QKV-LN](x)",
        "block   1 mlp  [hybrid]  h = LN(x);  x = h + MLP(h)",
        "out = LN(x)",
    ]
    r = runner.invoke(app, ["plan", "--placement", "hybrid_star", "--blocks", "2",
                            "--norm", "rmsnorm"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[2:5] == [
        "block   0 attn [hybrid_star]  x = x + Attn[QKV-RMS](RMS(x))",
        "block   0 mlp  [hybrid_star]  x = x + MLP(RMS(x))",
        "block   1 attn [hybrid]  x = x + Attn[QKV-RMS](x)",
    ]


def test_default_init_is_megatron():
    """Megatron's scheme (the released `init_fn: full_megatron`): every matrix N(0, std), the
    two output projections N(0, std/sqrt(2L))."""
    cfg = make_model_config(placement="hybrid", d_model=128, n_heads=4, n_blocks=8)
    model = build_model(cfg, seed=0)
    assert model.plan.init == "gpt2_scaled"
    std = cfg.init_std
    blk = model.blocks[3]
    out_std = torch.cat([blk.attn.fn.proj.weight.flatten(), blk.mlp.fn.fc_out.weight.flatten()])
    assert out_std.std().item() == pytest.approx(std / math.sqrt(2 * 8), rel=0.05)
    assert blk.attn.fn.qkv.weight.std().item() == pytest.approx(std, rel=0.05)


def test_norm_kind_rejected():
    from normlab.config import ConfigError

    with pytest.raises(ConfigError, match="norm: hybrid_star normalizes Q, K and V"):
        make_model_config(placement="hybrid_star", norm="dyt", d_model=16, n_heads=2)


def test_skip_normed_needs_an_input_norm():
    from normlab.nn.plan import SublayerPlan

    with pytest.raises(ValueError, match="skip_normed"):
        SublayerPlan("mlp", skip_normed=True)
    with pytest.raises(ValueError, match="skip_normed"):
        SublayerPlan("mlp", in_norm="layernorm", skip_normed=True, dual=True)
