"""Pin every normalization placement to its formula (docs/reference.md section 1).

Each placement's output is compared against an independent reference written here from the
formula: it reads the model's parameter tensors from the module tree but recomputes norms,
attention (softmax(QK^T/sqrt(dk) + causal mask) V), the MLP and the residual wiring by hand,
never through `Sublayer`/`Block`/`Attention` forwards. Norm gains/biases, linear biases, gates and
Admin's omegas are perturbed away from their init so that a misplaced or missing norm shows.

The case lists come from the registry (`normlab.placements`), so a placement added there is
tested here at once; its reference formula (`ref_stream`, `block_names`, `REF_UNNORMALIZED`) is
the one thing this file needs added (docs/design.md, "Adding a placement").
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import math  # noqa: E402
import typing  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from normlab.config import PLACEMENTS, ConfigError, ModelConfig, make_model_config  # noqa: E402
from normlab.nn import (  # noqa: E402
    admin_closed_form_omega,
    build_model,
    build_plan,
    capture,
    deepnorm_constants,
)
from normlab.nn.norms import TokenBatchNorm  # noqa: E402
from normlab.nn.plan import PLACEMENT_PLANS  # noqa: E402
from normlab.placements import BLOCK_PLACEMENTS, REGISTRY  # noqa: E402
from normlab.warnings import NormlabWarning  # noqa: E402

D, H, L, T, B, V = 16, 2, 3, 5, 2, 32
TOL = {"rtol": 1e-9, "atol": 1e-10}
# Placements whose formula cases need more than the name (a depth, a list of blocks): their own
# cases stand below each case list.
OWN_CASES = ("mix", "custom")


# --- building ---



def make_cfg(**kw):
    fields = {"vocab_size": V, "d_model": D, "n_heads": H, "n_blocks": L, "max_seq_len": 16,
              "dropout": 0.0}
    fields.update(kw)
    if fields.get("placement") == "custom" and "block_placements" not in fields:
        fields["block_placements"] = BLOCK_PLACEMENTS[: fields["n_blocks"]]
    return make_model_config(**fields)


def make_model(seed: int = 0, perturb_seed: int | None = 1, **kw):
    model = build_model(make_cfg(**kw), seed=seed).double()
    if perturb_seed is not None:
        perturb(model, perturb_seed)
    return model


@torch.no_grad()
def perturb(model: nn.Module, seed: int) -> None:
    """Move every parameter away from its init: matrices ~ N(0, 1/fan_in), embeddings ~ N(0, 1),
    norm gains ~ 1 + N(0, 0.3^2), biases ~ N(0, 0.2^2), gates ~ 0.3 + N(0, 0.05^2), omegas
    +- N(0, 0.2^2), running BatchNorm statistics random."""
    g = torch.Generator().manual_seed(seed)

    def noise(p: torch.Tensor) -> torch.Tensor:
        return torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)

    for name, p in model.named_parameters():
        if "emb" in name and p.dim() == 2:
            p.copy_(noise(p))
        elif p.dim() == 2:
            p.copy_(noise(p) / math.sqrt(p.shape[1]))
        elif name.endswith(".gate"):
            p.copy_(0.3 + 0.05 * noise(p))
        elif name.endswith(".skip"):
            p.add_(0.2 * noise(p))
        elif name.endswith(".alpha"):  # DyT
            p.copy_(0.5 + 0.1 * noise(p))
        elif name.endswith(".weight"):  # norm gains
            p.copy_(1.0 + 0.3 * noise(p))
        else:  # biases
            p.copy_(0.2 * noise(p))
    for m in model.modules():
        if isinstance(m, TokenBatchNorm):
            m.running_mean.copy_(0.3 * noise(m.running_mean))
            m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g,
                                                  dtype=torch.float64).to(m.running_var.dtype))


def tokens(seed: int = 2, b: int = B, t: int = T) -> torch.Tensor:
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


def assert_differs(a: torch.Tensor, b: torch.Tensor, min_diff: float = 1e-3) -> None:
    diff = (a - b).abs().max().item()
    assert diff > min_diff, f"expected tensors to differ, max |diff| = {diff:.3g}"


# --- references written from the formulas ---

def ref_norm(x: torch.Tensor, m: nn.Module | None, cfg, kind: str | None = None
             ) -> torch.Tensor:
    """The norm the config asks for here (`kind`, default `cfg.norm`), computed by hand from its
    formula with `cfg`'s eps and bias setting; only the parameter tensors come from the module,
    so a module of another kind than configured fails (wrong formula or missing parameters)."""
    assert m is not None, "the formula puts a norm here but the model has none"
    assert not isinstance(m, nn.Identity), "the formula puts a norm here but the model has none"
    kind = kind or cfg.norm
    eps, bias = cfg.norm_eps, cfg.norm_bias
    if kind == "layernorm":  # Ba et al. 2016
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        y = (x - mu) / torch.sqrt(var + eps) * m.weight
        return y + m.bias if bias else y
    if kind == "rmsnorm":  # Zhang & Sennrich 2019
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * m.weight
    if kind == "dyt":  # Zhu et al. 2025
        y = torch.tanh(m.alpha * x) * m.weight
        return y + m.bias if bias else y
    if kind == "batchnorm":  # eval mode: the running statistics
        assert not m.training
        return (x - m.running_mean) / torch.sqrt(m.running_var + eps) * m.weight + m.bias
    raise AssertionError(f"no reference for norm kind {kind!r}")


def ref_rope(t: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary embedding (rotate-half layout): pair (i, i + Dh/2) rotated by pos * base^(-2i/Dh)."""
    dh, n = t.shape[-1], t.shape[-2]
    inv = base ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(t.dtype), ang.sin().to(t.dtype)
    x1, x2 = t[..., : dh // 2], t[..., dh // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def ref_attn(attn: nn.Module, x: torch.Tensor, *, causal: bool = True, n_heads: int = H,
             qkv_norms=None, rope: bool = False, prev: torch.Tensor | None = None,
             cfg=None, qk_norms=None, inner_norm=None, head_scale=None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T / sqrt(dk) [+ S_prev] + mask) V, then the output projection.
    Returns (output, pre-softmax scores before masking). `qk_norms`: OLMo 2's norms of Q and K
    over the full width, before the split into heads; `inner_norm`: Sub-LN's norm of the
    concatenated heads before the output projection; `head_scale`: NormFormer's factor per
    head-wide slice of the projected output (fairseq's `c_attn`)."""
    b, t, d = x.shape
    dh = d // n_heads
    qkv = x @ attn.qkv.weight.T
    if attn.qkv.bias is not None:
        qkv = qkv + attn.qkv.bias
    q, k, v = qkv[..., :d], qkv[..., d: 2 * d], qkv[..., 2 * d:]
    if qk_norms is not None:  # OLMo 2: over all heads at once
        q, k = (ref_norm(z, m, cfg) for z, m in zip((q, k), qk_norms, strict=True))
    q, k, v = (z.reshape(b, t, n_heads, dh) for z in (q, k, v))
    if qkv_norms is not None:  # HybridNorm: per head, over head_dim
        q, k, v = (ref_norm(z, m, cfg) for z, m in zip((q, k, v), qkv_norms, strict=True))
    q, k, v = (z.transpose(1, 2) for z in (q, k, v))
    if rope:
        q, k = ref_rope(q), ref_rope(k)
    scores = q @ k.transpose(-2, -1) / math.sqrt(dh)
    if prev is not None:
        scores = scores + prev
    masked = scores
    if causal:
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        masked = scores.masked_fill(future, float("-inf"))
    y = torch.softmax(masked, dim=-1) @ v
    y = y.transpose(1, 2).reshape(b, t, d)
    if inner_norm is not None:
        y = ref_norm(y, inner_norm, cfg)
    y = y @ attn.proj.weight.T
    if attn.proj.bias is not None:
        y = y + attn.proj.bias
    if head_scale is not None:  # output feature j scaled by c[j // head_dim]
        y = y * head_scale.weight.repeat_interleave(dh)
    return y, scores


def ref_mlp(mlp: nn.Module, x: torch.Tensor, swiglu: bool = False, inner_norm=None,
            cfg=None) -> torch.Tensor:
    """fc_out(act(fc_in x)); `inner_norm` normalizes the activation before fc_out (Sub-LN's and
    NormFormer's `ffn_layernorm`)."""
    h = x @ mlp.fc_in.weight.T
    if mlp.fc_in.bias is not None:
        h = h + mlp.fc_in.bias
    if swiglu:
        gate, value = h.chunk(2, dim=-1)
        h = gate * torch.sigmoid(gate) * value
    else:
        h = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))  # exact GELU
    if inner_norm is not None:
        h = ref_norm(h, inner_norm, cfg)
    y = h @ mlp.fc_out.weight.T
    return y + mlp.fc_out.bias if mlp.fc_out.bias is not None else y


def block_names(placement: str, n_blocks: int, mix_k: int | None = None,
                custom: tuple[str, ...] | None = None) -> list[str]:
    if placement == "mix":
        k = math.floor(0.25 * n_blocks) if mix_k is None else mix_k
        return ["post"] * k + ["pre"] * (n_blocks - k)
    if placement == "peri":
        return ["sandwich"] * n_blocks
    if placement == "hybrid_star":
        return ["hybrid_star"] + ["hybrid"] * (n_blocks - 1)
    if placement == "custom":
        assert custom is not None
        return list(custom)
    return [placement] * n_blocks


# The block formulas below whose output stream is unnormalized: the model passes its stream
# through a final norm before the head when any of its blocks is one of them (ResiDual's output,
# `a + Norm(d)`, normalizes its second stream).
REF_UNNORMALIZED = ("pre", "sandwich", "lns", "hybrid", "hybrid_star", "olmo2", "subln",
                    "normformer")


def ref_final_norm(placement: str, names: list[str]) -> bool:
    """Whether the formulas put a norm before the head (`final_norm: auto`)."""
    return placement in ("resi_dual", "siamese") or any(n in REF_UNNORMALIZED for n in names)


def ref_stream(model: nn.Module, idx: torch.Tensor, placement: str, *, mix_k: int | None = None,
               custom: tuple[str, ...] | None = None, residual_attention: bool = False,
               rope: bool = False, causal: bool = True, swiglu: bool = False,
               final_norm: bool = True, qk_norm: bool = False) -> torch.Tensor:
    """The final stream of `placement`, from the formulas of docs/reference.md section 1
    (`final_norm=False`: the placement's final norm switched off by config; `qk_norm`: every
    attention normalizes Q and K over the full width, OLMo 2's QK-norm)."""
    cfg = model.cfg  # every norm's kind, eps and bias come from here, not from the built modules
    n_blocks = len(model.blocks)
    t = idx.shape[1]
    x = model.tok_emb.weight[idx]
    if not rope:
        x = x + model.pos_emb.weight[:t]
    if placement == "peri":  # Peri-LN normalizes the embedding output
        x = ref_norm(x, model.embed_norm, cfg)
    scores: list[torch.Tensor | None] = [None]

    def attn(sub, h, qkv_norm=False, inner_norm=False, head_scale=False):
        y, s = ref_attn(sub.fn, h, causal=causal, rope=rope,
                        qkv_norms=sub.fn.qkv_norms if qkv_norm else None,
                        prev=scores[0] if residual_attention else None, cfg=cfg,
                        qk_norms=sub.fn.qk_norms if qk_norm else None,
                        inner_norm=sub.fn.inner_norm if inner_norm else None,
                        head_scale=sub.fn.head_scale if head_scale else None)
        if residual_attention:
            scores[0] = s
        return y

    def mlp(sub, h, inner_norm=False):
        return ref_mlp(sub.fn, h, swiglu=swiglu, cfg=cfg,
                       inner_norm=sub.fn.inner_norm if inner_norm else None)

    def norm(m, h):
        return ref_norm(h, m, cfg)

    def out_norm(m, h):  # sandwich/peri's branch-output norm: its own kind when configured
        return ref_norm(h, m, cfg, cfg.out_norm)

    if placement == "resi_dual":
        a = d = x
        for blk in model.blocks:
            for sub, fn in ((blk.attn, attn), (blk.mlp, mlp)):
                y = fn(sub, a)
                a = norm(sub.post_norm, a + y)
                d = d + y
        return a + norm(model.final.norm, d)

    if placement == "siamese":  # SiameseNorm: both streams feed every branch
        a = d = x
        for l, blk in enumerate(model.blocks):
            for sub, fn in ((blk.attn, attn), (blk.mlp, mlp)):
                a = norm(sub.in_norm, a)
                y = fn(sub, norm(sub.mix_norm, a + norm(sub.dual_in_norm, d)))
                a, d = a + y / math.sqrt(2 * (l + 1)), d + y
        merged = norm(model.final.stream_norm, a) + norm(model.final.dual_norm, d)
        return norm(model.final.norm, merged) if final_norm else merged

    names = block_names(placement, n_blocks, mix_k, custom)
    alpha = (2 * n_blocks) ** 0.25  # DeepNet, decoder-only
    keel_alpha = 2 * n_blocks  # Keel: the number of sub-layers
    for l, (blk, name) in enumerate(zip(model.blocks, names, strict=True), start=1):
        at, ml = blk.attn, blk.mlp
        if name == "post":
            x = norm(at.post_norm, x + attn(at, x))
            x = norm(ml.post_norm, x + mlp(ml, x))
        elif name == "pre":
            x = x + attn(at, norm(at.in_norm, x))
            x = x + mlp(ml, norm(ml.in_norm, x))
        elif name == "sandwich":
            x = x + out_norm(at.out_norm, attn(at, norm(at.in_norm, x)))
            x = x + out_norm(ml.out_norm, mlp(ml, norm(ml.in_norm, x)))
        elif name == "deepnorm":
            x = norm(at.post_norm, alpha * x + attn(at, x))
            x = norm(ml.post_norm, alpha * x + mlp(ml, x))
        elif name == "admin":
            x = norm(at.post_norm, at.skip * x + attn(at, x))
            x = norm(ml.post_norm, ml.skip * x + mlp(ml, x))
        elif name == "b2t":
            h = norm(at.post_norm, x + attn(at, x))
            x = norm(ml.post_norm, h + mlp(ml, h) + x)
        elif name == "lns":
            s = 1.0 / math.sqrt(l)
            x = x + attn(at, norm(at.in_norm, x) * s)
            x = x + mlp(ml, norm(ml.in_norm, x) * s)
        elif name == "hybrid":  # the residual carries the normalized stream
            x = x + attn(at, x, qkv_norm=True)
            h = norm(ml.in_norm, x)
            x = h + mlp(ml, h)
        elif name == "hybrid_star":  # HybridNorm*'s first block: pre-norm with QKV norms
            x = x + attn(at, norm(at.in_norm, x), qkv_norm=True)
            x = x + mlp(ml, norm(ml.in_norm, x))
        elif name == "olmo2":  # OLMo 2: a norm on each branch output only
            x = x + out_norm(at.out_norm, attn(at, x))
            x = x + out_norm(ml.out_norm, mlp(ml, x))
        elif name == "keel":  # Keel: Norm(alpha*x + F(Norm(x)))
            x = norm(at.post_norm, keel_alpha * x + attn(at, norm(at.in_norm, x)))
            x = norm(ml.post_norm, keel_alpha * x + mlp(ml, norm(ml.in_norm, x)))
        elif name == "subln":  # Sub-LN: pre-norm plus a norm before each output map
            x = x + attn(at, norm(at.in_norm, x), inner_norm=True)
            x = x + mlp(ml, norm(ml.in_norm, x), inner_norm=True)
        elif name == "normformer":  # pre-norm; Norm(c * Attn); a norm after the MLP activation
            x = x + out_norm(at.out_norm, attn(at, norm(at.in_norm, x), head_scale=True))
            x = x + mlp(ml, norm(ml.in_norm, x), inner_norm=True)
        elif name in ("rezero", "skipinit"):
            x = x + at.gate * attn(at, x)
            x = x + ml.gate * mlp(ml, x)
        elif name == "ngpt":  # nGPT: on the unit sphere (tests/nn/test_placements_2026.py)
            from tests.nn.test_placements_2026 import ref_ngpt_attn, ref_ngpt_mlp, ref_ngpt_step

            x = ref_ngpt_step(at, x, ref_ngpt_attn(at.fn, x, causal=causal, rope=rope))
            x = ref_ngpt_step(ml, x, ref_ngpt_mlp(ml.fn, x, swiglu=swiglu))
        else:
            raise AssertionError(name)
    if final_norm and ref_final_norm(placement, names):
        x = norm(model.final.norm, x)
    return x


# --- every placement against its formula ---

# Every placement that the name alone describes, in the registry's order.
PLAIN = [p for p in PLACEMENTS if p not in OWN_CASES]


def _has_norms(placement: str) -> bool:
    subs = [s for b in build_plan(make_cfg(placement=placement)).blocks for s in b.sublayers]
    return any(s.in_norm or s.out_norm or s.post_norm or s.qkv_norm for s in subs)


FORMULA_CASES = [
    pytest.param({"placement": p}, id=p) for p in PLAIN
] + [
    pytest.param({"placement": "mix", "n_blocks": 4}, id="mix-L4"),
    pytest.param({"placement": "mix", "n_blocks": 8}, id="mix-L8"),
    pytest.param({"placement": "custom", "n_blocks": 10}, id="custom-all"),
    pytest.param({"placement": "custom", "n_blocks": 4,
                  "block_placements": ("lns", "hybrid", "post", "lns")}, id="custom-lns-first"),
    pytest.param({"placement": "skipinit", "gate_init": 0.7}, id="skipinit-gate"),
] + [
    pytest.param({"placement": p, "norm": "rmsnorm"}, id=f"{p}-rmsnorm")
    for p in PLAIN if _has_norms(p)  # not rezero and skipinit: no norm to change
] + [
    pytest.param({"placement": p, "norm": "dyt"}, id=f"{p}-dyt")
    for p in ("post", "pre", "sandwich", "deepnorm")
] + [
    pytest.param({"placement": p, "norm_bias": False}, id=f"{p}-nobias")
    for p in ("post", "pre", "hybrid", "hybrid_star")
] + [
    pytest.param({"placement": "sandwich", "out_norm": "rmsnorm"}, id="sandwich-out-rms"),
    pytest.param({"placement": "pre", "bias": False}, id="pre-nolinearbias"),
    pytest.param({"placement": "post", "norm_eps": 1e-2}, id="post-eps"),
]


@pytest.mark.parametrize("kw", FORMULA_CASES)
def test_placement_matches_formula(kw):
    model = make_model(**kw)
    idx = tokens()
    cfg = model.cfg
    ref = ref_stream(model, idx, cfg.placement, custom=cfg.block_placements)
    with torch.no_grad():
        out = model.stream(idx)
        logits = model(idx).logits
    torch.testing.assert_close(out, ref, **TOL)
    head = ref @ model.lm_head.weight.T
    if model.logit_scale is not None:  # nGPT's logit scale s_z (param * sqrt(d))
        head = head * (model.logit_scale.weight * math.sqrt(cfg.d_model))
    torch.testing.assert_close(logits, head, **TOL)


@pytest.mark.parametrize("placement", ["post", "pre", "deepnorm", "hybrid", "hybrid_star",
                                       "resi_dual"])
def test_residual_attention_matches_formula(placement):
    """RealFormer: S_l = Q K^T / sqrt(dk) + S_{l-1}, pre-softmax and before masking."""
    model = make_model(placement=placement, residual_attention=True)
    idx = tokens()
    ref = ref_stream(model, idx, placement, residual_attention=True)
    with torch.no_grad():
        out = model.stream(idx)
    torch.testing.assert_close(out, ref, **TOL)
    # The score residual matters: the plain formula gives something else.
    assert_differs(out, ref_stream(model, idx, placement, residual_attention=False))


@pytest.mark.parametrize("placement", ["pre", "post", "hybrid", "hybrid_star"])
def test_rope_matches_formula(placement):
    model = make_model(placement=placement, positions="rope")
    assert model.pos_emb is None
    idx = tokens()
    ref = ref_stream(model, idx, placement, rope=True)
    with torch.no_grad():
        out = model.stream(idx)
    # The model's rope tables are float32; the reference's float64.
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_swiglu_matches_formula():
    model = make_model(placement="pre", mlp="swiglu")
    idx = tokens()
    with torch.no_grad():
        out = model.stream(idx)
    torch.testing.assert_close(out, ref_stream(model, idx, "pre", swiglu=True), **TOL)


def test_loss_matches_reference_logits():
    model = make_model(placement="b2t")
    idx, targets = tokens(2), tokens(3)
    targets[0, 1] = -100
    ref_logits = ref_stream(model, idx, "b2t") @ model.lm_head.weight.T
    keep = targets.flatten() != -100
    ref_loss = -torch.log_softmax(ref_logits.flatten(0, 1), -1)[keep, targets.flatten()[keep]]
    with torch.no_grad():
        out = model(idx, targets)
    torch.testing.assert_close(out.loss.double(), ref_loss.mean(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n_blocks", [3, 4])
def test_gate_init(n_blocks):
    """ReZero starts its gates at 0, SkipInit at 1/sqrt(L); `gate_init` overrides both."""
    for placement, g0 in (("rezero", 0.0), ("skipinit", 1.0 / math.sqrt(n_blocks))):
        for cfg_g, expected in ((None, g0), (0.25, 0.25)):
            kw = {} if cfg_g is None else {"gate_init": cfg_g}
            model = build_model(make_cfg(placement=placement, n_blocks=n_blocks, **kw), seed=0)
            for blk in model.blocks:
                for sub in (blk.attn, blk.mlp):
                    assert sub.gate.shape == ()
                    assert float(sub.gate.detach()) == pytest.approx(expected, rel=1e-6)
                    assert sub.in_norm is None and sub.out_norm is None
                    assert sub.post_norm is None
    # ReZero at init is the identity map on the stream: every branch is gated off.
    model = build_model(make_cfg(placement="rezero", n_blocks=n_blocks), seed=0).double()
    idx = tokens()
    with torch.no_grad():
        emb = model.tok_emb.weight[idx] + model.pos_emb.weight[: idx.shape[1]]
        torch.testing.assert_close(model.stream(idx), emb, **TOL)


def test_mix_blocks_split_at_floor_quarter():
    for n_blocks, k in ((3, 0), (4, 1), (7, 1), (8, 2), (13, 3)):
        plan = build_plan(make_cfg(placement="mix", n_blocks=n_blocks))
        assert [b.placement for b in plan.blocks] == ["post"] * k + ["pre"] * (n_blocks - k)
    plan = build_plan(make_cfg(placement="mix", n_blocks=10, mix_switch=0.5))
    assert [b.placement for b in plan.blocks] == ["post"] * 5 + ["pre"] * 5


def test_reference_detects_a_misplaced_norm():
    """Sanity check of the harness: the pre reference does not match a post model, and the
    perturbation makes post vs deepnorm(alpha != 1) distinguishable."""
    idx = tokens()
    post = make_model(placement="post")
    with torch.no_grad():
        out = post.stream(idx)
    with pytest.raises(AssertionError):
        ref_stream(post, idx, "pre")  # post has no in_norm
    deep = make_model(placement="deepnorm")
    with torch.no_grad():
        deep_out = deep.stream(idx)
    # Same blocks (post-norm wiring), different alpha: the formulas must tell them apart.
    assert_differs(deep_out, ref_stream(deep, idx, "post"))
    assert_differs(out, ref_stream(post, idx, "deepnorm"))


# --- encoder ---

@pytest.mark.parametrize("pooling", ["mean", "first"])
@pytest.mark.parametrize("norm", ["layernorm", "batchnorm"])
def test_encoder_matches_formula(norm, pooling):
    model = make_model(kind="encoder", placement="pre", norm=norm, pooling=pooling, n_classes=4)
    model.eval()  # BatchNorm uses its (perturbed) running statistics
    idx = tokens()
    ref = ref_stream(model, idx, "pre", causal=False)
    pooled = ref.mean(1) if pooling == "mean" else ref[:, 0]
    with torch.no_grad():
        logits = model(idx).logits
        out = model.stream(idx)
    assert logits.shape == (B, 4)
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(
        logits, pooled @ model.classifier.weight.T + model.classifier.bias, **TOL)


@pytest.mark.parametrize("norm", ["batchnorm", "layernorm"])
def test_encoder_is_bidirectional(norm):
    model = make_model(kind="encoder", placement="post", norm=norm, n_classes=3)
    model.eval()
    idx = tokens(t=6)
    idx2 = idx.clone()
    idx2[:, -1] = (idx[:, -1] + 1) % V
    with torch.no_grad():
        out, out2 = model(idx), model(idx2)
        s, s2 = model.stream(idx), model.stream(idx2)
    assert out.logits.shape == (B, 3)
    assert_differs(out.logits, out2.logits, 1e-6)
    assert_differs(s[:, 0], s2[:, 0], 1e-6)  # an earlier position sees the later token


def test_encoder_batchnorm_trains():
    model = build_model(make_cfg(kind="encoder", norm="batchnorm", n_classes=3), seed=0)
    model.train()
    out = model(tokens(), torch.tensor([0, 2]))
    assert out.logits.shape == (B, 3)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert model.blocks[0].attn.in_norm.weight.grad is not None


# --- equivalences ---

def _logits(model, idx):
    with torch.no_grad():
        return model(idx).logits


def test_mix_k0_equals_pre():
    pre = make_model(placement="pre")
    mix = make_model(placement="mix", mix_switch=0, perturb_seed=None)
    assert [b.placement for b in mix.plan.blocks] == ["pre"] * L
    mix.load_state_dict(pre.state_dict())
    idx = tokens()
    torch.testing.assert_close(_logits(mix, idx), _logits(pre, idx), **TOL)


def test_mix_kL_equals_post():
    post = make_model(placement="post")
    mix = make_model(placement="mix", mix_switch=L, perturb_seed=None)
    assert [b.placement for b in mix.plan.blocks] == ["post"] * L
    assert mix.plan.final_norm is None
    mix.load_state_dict(post.state_dict())
    idx = tokens()
    torch.testing.assert_close(_logits(mix, idx), _logits(post, idx), **TOL)


def test_mix_partial_differs_from_pre_and_post():
    """With 0 < k < L, mix is neither pre nor post, even with the same shared weights."""
    pre = make_model(placement="pre", n_blocks=4)
    post = make_model(placement="post", n_blocks=4, perturb_seed=None)
    mix = make_model(placement="mix", n_blocks=4, perturb_seed=None)
    assert mix.plan.constants["mix_switch_block"] == 1
    post.load_state_dict(pre.state_dict(), strict=False)
    mix.load_state_dict(pre.state_dict(), strict=False)
    idx = tokens()
    assert_differs(_logits(mix, idx), _logits(pre, idx))
    assert_differs(_logits(mix, idx), _logits(post, idx))


def test_deepnorm_alpha_beta_one_equals_post():
    kw = {"init": "xavier", "perturb_seed": None}
    deep = make_model(placement="deepnorm", deepnorm_alpha=1.0, deepnorm_beta=1.0, **kw)
    post = make_model(placement="post", **kw)
    sd_d, sd_p = deep.state_dict(), post.state_dict()
    assert sd_d.keys() == sd_p.keys()
    for k in sd_d:
        torch.testing.assert_close(sd_d[k], sd_p[k], rtol=0, atol=0)
    idx = tokens()
    torch.testing.assert_close(_logits(deep, idx), _logits(post, idx), **TOL)
    # ... and with the paper's alpha it is not post.
    deep2 = make_model(placement="deepnorm", init="xavier", perturb_seed=None)
    deep2.load_state_dict(sd_p)
    assert_differs(_logits(deep2, idx), _logits(post, idx))


def test_deepnorm_init_with_beta_one_equals_post_xavier():
    deep = make_model(placement="deepnorm", deepnorm_alpha=1.0, deepnorm_beta=1.0,
                      perturb_seed=None)  # default init: deepnorm
    assert deep.plan.init == "deepnorm"
    post = make_model(placement="post", perturb_seed=None)  # default init: xavier
    assert post.plan.init == "xavier"
    idx = tokens()
    torch.testing.assert_close(_logits(deep, idx), _logits(post, idx), **TOL)


def test_lns_block1_equals_pre_block1():
    pre = make_model(placement="pre")
    lns = make_model(placement="lns", perturb_seed=None)
    lns.load_state_dict(pre.state_dict())
    idx = tokens()
    with torch.no_grad():
        with capture(pre, ["blocks.0.mlp.stream_out", "blocks.1.mlp.stream_out"]) as cp:
            pre(idx)
        with capture(lns, ["blocks.0.mlp.stream_out", "blocks.1.mlp.stream_out"]) as cl:
            lns(idx)
    torch.testing.assert_close(cl["blocks.0.mlp.stream_out"], cp["blocks.0.mlp.stream_out"],
                               **TOL)
    assert_differs(cl["blocks.1.mlp.stream_out"], cp["blocks.1.mlp.stream_out"])


def test_sandwich_identity_out_norm_equals_pre():
    pre = make_model(placement="pre")
    sw = make_model(placement="sandwich", out_norm="identity", perturb_seed=None)
    sw.load_state_dict(pre.state_dict())
    idx = tokens()
    torch.testing.assert_close(_logits(sw, idx), _logits(pre, idx), **TOL)


def test_peri_without_embed_norm_equals_sandwich():
    sw = make_model(placement="sandwich")
    peri = make_model(placement="peri", embed_norm=False, perturb_seed=None)
    peri.load_state_dict(sw.state_dict())
    idx = tokens()
    torch.testing.assert_close(_logits(peri, idx), _logits(sw, idx), **TOL)


def test_resi_dual_output_from_taps():
    model = make_model(placement="resi_dual")
    idx = tokens()
    with torch.no_grad(), capture(
        model, ["blocks.0.attn.stream_in", "blocks.*.*.branch_added",
                f"blocks.{L - 1}.mlp.stream_out", "final.out"]
    ) as cap:
        out = model.stream(idx)
    a_last = cap[f"blocks.{L - 1}.mlp.stream_out"]
    branches = [cap[f"blocks.{i}.{k}.branch_added"] for i in range(L) for k in ("attn", "mlp")]
    d_last = cap["blocks.0.attn.stream_in"] + sum(branches)
    expected = a_last + ref_norm(d_last, model.final.norm, model.cfg)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(cap["final.out"], expected, **TOL)
    assert_differs(out, ref_norm(a_last, model.final.norm, model.cfg))


# --- DeepNorm constants and init ---

DEPTHS = [1, 6, 12, 18, 100, 1000]


@pytest.mark.parametrize("n", DEPTHS)
def test_deepnorm_constants_closed_form(n):
    for arch in ("encoder", "decoder"):
        alpha, beta = deepnorm_constants(arch, n)
        assert alpha == pytest.approx((2 * n) ** (1 / 4), rel=1e-12)
        assert beta == pytest.approx((8 * n) ** (-1 / 4), rel=1e-12)
    for m in (1, 6, 12, 100):
        alpha, beta = deepnorm_constants("encdec_encoder", n, m)
        assert alpha == pytest.approx(0.81 * (n**4 * m) ** (1 / 16), rel=1e-12)
        assert beta == pytest.approx(0.87 * (n**4 * m) ** (-1 / 16), rel=1e-12)
    alpha, beta = deepnorm_constants("encdec_decoder", n, 6)
    assert alpha == pytest.approx((3 * n) ** (1 / 4), rel=1e-12)
    assert beta == pytest.approx((12 * n) ** (-1 / 4), rel=1e-12)


@pytest.mark.parametrize(("arch", "n", "m", "alpha", "beta"), [
    ("decoder", 6, None, 1.8612, 0.3799),  # 12^(1/4), 48^(-1/4)
    ("encoder", 6, None, 1.8612, 0.3799),
    ("encoder", 100, None, 3.7606, 0.1880),  # 200^(1/4), 800^(-1/4)
    ("encdec_encoder", 6, 6, 1.4179, 0.4970),  # 0.81 * 6^(5/16), 0.87 * 6^(-5/16)
    ("encdec_encoder", 12, 6, 1.6862, 0.4179),
    ("encdec_decoder", 6, 6, 2.0598, 0.3433),  # 18^(1/4), 72^(-1/4)
])
def test_deepnorm_constants_hand_values(arch, n, m, alpha, beta):
    a, b = deepnorm_constants(arch, n, m)
    assert a == pytest.approx(alpha, abs=1e-4)
    assert b == pytest.approx(beta, abs=1e-4)


def test_deepnorm_constants_reject_bad_input():
    with pytest.raises(ValueError):
        deepnorm_constants("encdec_encoder", 6)
    with pytest.raises(ValueError):
        deepnorm_constants("transformer", 6)


@pytest.mark.parametrize(("kw", "alpha", "beta"), [
    ({"n_blocks": 3}, 6 ** 0.25, 24 ** -0.25),
    ({"n_blocks": 6}, 12 ** 0.25, 48 ** -0.25),
    ({"n_blocks": 4, "kind": "encoder"}, 8 ** 0.25, 32 ** -0.25),
    ({"n_blocks": 6, "kind": "encoder", "deepnorm_arch": "encdec_encoder",
      "deepnorm_other_blocks": 12}, 0.81 * (6**4 * 12) ** (1 / 16),
     0.87 * (6**4 * 12) ** (-1 / 16)),
    ({"n_blocks": 6, "deepnorm_arch": "encdec_decoder", "deepnorm_other_blocks": 12},
     18 ** 0.25, 72 ** -0.25),
    ({"n_blocks": 6, "deepnorm_alpha": 2.5, "deepnorm_beta": 0.125}, 2.5, 0.125),
])
def test_deepnorm_plan_uses_constants(kw, alpha, beta):
    plan = build_plan(make_cfg(placement="deepnorm", **kw))
    assert plan.init == "deepnorm"
    assert plan.constants["deepnorm_alpha"] == pytest.approx(alpha, rel=1e-12)
    assert plan.constants["deepnorm_beta"] == pytest.approx(beta, rel=1e-12)
    for b in plan.blocks:
        for s in b.sublayers:
            assert s.skip_scale == pytest.approx(alpha, rel=1e-12)
            assert s.post_norm == "layernorm" and s.in_norm is None and s.out_norm is None
    assert plan.final_norm is None


def _xavier_std(fan_out: int, fan_in: int) -> float:
    return math.sqrt(2.0 / (fan_in + fan_out))


def test_deepnorm_init_scales_v_proj_mlp_by_beta():
    d, n_blocks = 256, 2
    cfg = make_cfg(placement="deepnorm", d_model=d, n_heads=4, n_blocks=n_blocks, max_seq_len=8)
    beta = (8 * n_blocks) ** -0.25  # 0.5
    model = build_model(cfg, seed=0)
    assert model.plan.constants["deepnorm_beta"] == pytest.approx(beta)
    sq = _xavier_std(d, d)
    ff = _xavier_std(4 * d, d)
    for blk in model.blocks:
        attn, mlp = blk.attn.fn, blk.mlp.fn
        w = attn.qkv.weight.detach()
        checks = [
            (w[:d], sq),  # Q: not scaled
            (w[d: 2 * d], sq),  # K: not scaled
            (w[2 * d:], beta * sq),  # V
            (attn.proj.weight.detach(), beta * sq),
            (mlp.fc_in.weight.detach(), beta * ff),
            (mlp.fc_out.weight.detach(), beta * ff),
        ]
        for t, std in checks:
            assert t.std().item() == pytest.approx(std, rel=0.03)
            # xavier *uniform*: |w| <= bound = sqrt(3) * std, and the bound is nearly reached
            bound = math.sqrt(3.0) * std
            assert t.abs().max().item() <= bound * (1 + 1e-6)
            assert t.abs().max().item() >= bound * 0.99
        assert attn.qkv.bias.abs().max().item() == 0.0


def test_xavier_init_does_not_scale_by_beta():
    d = 256
    model = build_model(make_cfg(placement="deepnorm", d_model=d, n_heads=4, n_blocks=2,
                                 init="xavier"), seed=0)
    w = model.blocks[0].attn.fn.qkv.weight.detach()
    assert w[2 * d:].std().item() == pytest.approx(_xavier_std(d, d), rel=0.03)


# --- Admin ---

@pytest.mark.parametrize("n", [1, 2, 6, 12, 24, 100, 1000])
def test_admin_closed_form_omega(n):
    assert admin_closed_form_omega(n) == pytest.approx(
        math.sqrt((n + 1) / math.log(n + 1) - 1), rel=1e-12)


def test_admin_closed_form_hand_values():
    assert admin_closed_form_omega(6) == pytest.approx(1.6116, abs=1e-4)  # 7/ln 7 - 1
    assert admin_closed_form_omega(12) == pytest.approx(2.0170, abs=1e-4)


@pytest.mark.parametrize("n_blocks", [3, 6])
def test_admin_model_starts_at_closed_form(n_blocks):
    model = make_model(placement="admin", n_blocks=n_blocks, perturb_seed=None)
    omega = math.sqrt((2 * n_blocks + 1) / math.log(2 * n_blocks + 1) - 1)
    assert model.plan.constants["admin_omega"] == pytest.approx(omega)
    for blk in model.blocks:
        for sub in (blk.attn, blk.mlp):
            assert isinstance(sub.skip, nn.Parameter) and sub.skip.shape == (D,)
            torch.testing.assert_close(sub.skip.detach(), torch.full((D,), omega,
                                                                     dtype=torch.float64))


def test_admin_fixed_omega():
    model = make_model(placement="admin", admin_omega=1.7, perturb_seed=None)
    assert all(float(s.skip.detach().min()) == float(s.skip.detach().max()) == pytest.approx(1.7)
               for b in model.blocks for s in (b.attn, b.mlp))


def test_admin_profile_omegas():
    model = build_model(make_cfg(placement="admin", admin_omega="profile", n_blocks=4), seed=0)
    omegas = []
    for blk in model.blocks:
        for sub in (blk.attn, blk.mlp):
            w = sub.skip.detach()
            assert float(w.min()) == float(w.max())  # one value per sublayer
            omegas.append(float(w[0]))
    assert len(omegas) == 8
    assert omegas[0] == pytest.approx(1.0)
    assert all(w >= 1.0 for w in omegas)
    assert all(b >= a for a, b in zip(omegas, omegas[1:], strict=False))
    assert omegas[-1] > 1.0 + 1e-6  # the profile did something


# --- causality ---

CAUSAL_CASES = [pytest.param({"placement": p}, id=p) for p in PLACEMENTS] + [
    pytest.param({"placement": p, "residual_attention": True}, id=f"{p}-realformer")
    for p in ("post", "pre", "hybrid", "resi_dual")
] + [
    pytest.param({"placement": p, "positions": "rope"}, id=f"{p}-rope")
    for p in ("post", "pre", "b2t", "peri")
] + [
    pytest.param({"placement": "custom", "n_blocks": 10, "residual_attention": True,
                  "positions": "rope"}, id="custom-realformer-rope"),
]


@pytest.mark.parametrize("kw", CAUSAL_CASES)
def test_decoder_is_causal(kw):
    if kw["placement"] == "custom":
        kw = {"n_blocks": 10, **kw}
    model = make_model(**kw)
    idx = tokens(t=6)
    base = _logits(model, idx)
    for t in range(idx.shape[1]):
        idx2 = idx.clone()
        idx2[:, t] = (idx[:, t] + 1) % V
        changed = _logits(model, idx2)
        torch.testing.assert_close(changed[:, :t], base[:, :t], rtol=0, atol=1e-12)
        assert_differs(changed[:, t:], base[:, t:], 1e-6)


# --- seeds ---

@pytest.mark.parametrize("placement", ["pre", "post", "admin", "skipinit"])
def test_same_seed_same_model(placement):
    kw = {"admin_omega": "profile"} if placement == "admin" else {}
    cfg = make_cfg(placement=placement, **kw)
    m1, m2, m3 = build_model(cfg, seed=5), build_model(cfg, seed=5), build_model(cfg, seed=6)
    s1, s2, s3 = m1.state_dict(), m2.state_dict(), m3.state_dict()
    assert s1.keys() == s2.keys() == s3.keys()
    for k in s1:
        assert torch.equal(s1[k], s2[k]), k
    assert any(not torch.equal(s1[k], s3[k]) for k in s1)
    assert not torch.equal(s1["tok_emb.weight"], s3["tok_emb.weight"])
    idx = tokens()
    with torch.no_grad():
        assert torch.equal(m1(idx).logits, m2(idx).logits)
        assert not torch.equal(m1(idx).logits, m3(idx).logits)


# --- config errors and warnings ---

@pytest.mark.parametrize(("kw", "field", "needle"), [
    ({"n_blocks": 0}, "n_blocks", "greater than or equal to 1"),
    ({"d_model": 16, "n_heads": 3}, "n_heads", "does not divide"),
    ({"bogus_key": 1}, "bogus_key", "unknown field"),
    ({"placement": "middle"}, "placement", "'middle'"),
    ({"norm": "batchnorm"}, "norm", "batchnorm"),
    ({"out_norm": "batchnorm", "placement": "sandwich"}, "norm", "batchnorm"),
    ({"placement": "hybrid", "norm": "dyt"}, "norm", "hybrid"),
    ({"placement": "hybrid", "norm": "derf"}, "norm", "hybrid"),
    ({"placement": "resi_dual", "final_norm": "off"}, "final_norm", "resi_dual"),
    ({"placement": "custom", "n_blocks": 3, "block_placements": ("pre", "post")},
     "block_placements", "3"),
    ({"placement": "mix", "mix_switch": 4, "n_blocks": 3}, "mix_switch", "outside"),
])
def test_config_errors_name_the_field(kw, field, needle):
    fields = {"d_model": 16, "n_heads": 2, **kw}
    with pytest.raises(ConfigError) as err:
        make_model_config(**fields)
    msg = str(err.value)
    assert f"{field}:" in msg
    assert needle in msg


def test_unknown_placement_lists_allowed_values():
    with pytest.raises(ConfigError) as err:
        make_model_config(placement="middle")
    msg = str(err.value)
    for p in PLACEMENTS:
        assert f"'{p}'" in msg


def test_batchnorm_encoder_is_accepted():
    cfg = make_model_config(kind="encoder", norm="batchnorm", d_model=16, n_heads=2)
    assert cfg.norm == "batchnorm"


def test_lns_with_gpt2_scaled_warns():
    with pytest.warns(NormlabWarning, match="lns"):
        build_model(make_cfg(placement="lns", init="gpt2_scaled"), seed=0)


def test_lns_default_init_does_not_warn():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = build_model(make_cfg(placement="lns"), seed=0)
    assert model.plan.init != "gpt2_scaled"
    assert not [w for w in caught if issubclass(w.category, NormlabWarning)]


# --- final norm ---

@pytest.mark.parametrize(("placement", "on"), [
    (p, ref_final_norm(p, block_names(p, L, custom=BLOCK_PLACEMENTS[:L]))) for p in PLACEMENTS
])
def test_final_norm_auto(placement, on):
    plan = build_plan(make_cfg(placement=placement))
    assert plan.final_norm == ("layernorm" if on else None)
    plan = build_plan(make_cfg(placement=placement, norm="rmsnorm"))
    assert plan.final_norm == ("rmsnorm" if on else None)
    model = build_model(make_cfg(placement=placement), seed=0)
    if on:
        assert isinstance(model.final.norm, nn.LayerNorm)
    else:  # an absent norm is None, as in the blocks
        assert model.final.norm is None


@pytest.mark.parametrize("placement", ["post", "pre", "rezero", "lns"])
def test_final_norm_override(placement):
    assert build_plan(make_cfg(placement=placement, final_norm="on")).final_norm == "layernorm"
    assert build_plan(make_cfg(placement=placement, final_norm="off")).final_norm is None


def test_final_norm_override_changes_output():
    idx = tokens()
    pre_off = make_model(placement="pre", final_norm="off")
    assert pre_off.final.norm is None
    with torch.no_grad():
        out = pre_off.stream(idx)
    # With the final norm off the model's output is the bare pre-norm stream.
    torch.testing.assert_close(out, ref_stream(pre_off, idx, "pre", final_norm=False), **TOL)
    pre_on = make_model(placement="pre")
    pre_on.load_state_dict(pre_off.state_dict(), strict=False)
    assert_differs(_logits(pre_on, idx), _logits(pre_off, idx))
    post_on = make_model(placement="post", final_norm="on")
    with torch.no_grad():
        out = post_on.stream(idx)
    ref = ref_norm(ref_stream(post_on, idx, "post"), post_on.final.norm, post_on.cfg)
    torch.testing.assert_close(out, ref, **TOL)


def test_embed_norm_only_for_peri():
    assert build_plan(make_cfg(placement="peri")).embed_norm == "layernorm"
    assert build_plan(make_cfg(placement="sandwich")).embed_norm is None
    assert build_plan(make_cfg(placement="pre", embed_norm=True)).embed_norm == "layernorm"
    assert build_plan(make_cfg(placement="peri", embed_norm=False)).embed_norm is None


# --- the registry ---

def test_registry_and_plans_name_the_same_placements():
    """The data of each placement (normlab.placements) and how its blocks are built
    (nn/plan.py's PLACEMENT_PLANS) are keyed by the same names, in the same order; the config
    allows exactly these."""
    assert list(PLACEMENT_PLANS) == list(REGISTRY) == list(PLACEMENTS)
    fields = ModelConfig.model_fields
    assert typing.get_args(fields["placement"].annotation) == PLACEMENTS
    listed = typing.get_args(fields["block_placements"].annotation)[0]  # tuple[Literal, ...]
    assert typing.get_args(typing.get_args(listed)[0]) == BLOCK_PLACEMENTS


@pytest.mark.parametrize("placement", BLOCK_PLACEMENTS)
def test_a_per_block_placement_is_its_own_block_at_every_depth(placement):
    """A placement usable in `block_placements` is one block on its own: a custom model of only
    its blocks has the placement's plan and final norm."""
    plans = PLACEMENT_PLANS[placement]
    assert plans.block is not None and plans.blocks is None and not plans.dual_stream
    assert not REGISTRY[placement].embed_norm
    own = build_plan(make_cfg(placement=placement))
    custom = build_plan(make_cfg(placement="custom", block_placements=(placement,) * L))
    assert custom.blocks == own.blocks
    assert custom.final_norm == own.final_norm


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_plan_defaults_are_the_registry_entry(placement):
    entry = REGISTRY[placement]
    plan = build_plan(make_cfg(placement=placement))
    assert plan.init == entry.default_init
    assert (plan.embed_norm is not None) == entry.embed_norm
    assert plan.dual_stream == PLACEMENT_PLANS[placement].dual_stream
    if not entry.final_norm:  # mix and custom may still get one from their blocks
        assert placement in OWN_CASES or plan.final_norm is None


def test_a_placement_without_a_block_of_its_own_is_refused_by_name():
    bad = make_cfg(placement="custom", n_blocks=1, block_placements=("post",)).model_copy(
        update={"block_placements": ("peri",)})  # past the config's own check
    with pytest.raises(ValueError, match=r"^placement 'peri' has no block of its own"):
        build_plan(bad)


def test_the_config_texts_name_the_registry_defaults():
    fields = ModelConfig.model_fields
    for p in PLACEMENTS:
        if REGISTRY[p].final_norm:
            assert p in fields["final_norm"].description
        assert p in fields["init"].description
    assert "peri: on" in fields["embed_norm"].description


def test_reference_page_names_every_placement_and_its_paper():
    """docs/reference.md section 1 has a row for each placement, citing its paper's arXiv id."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "reference.md").read_text()
    section = text.split("## 1. Placements", 1)[1].split("\n## ", 1)[0]
    for p in PLACEMENTS:
        row = next((line for line in section.splitlines() if line.startswith(f"| `{p}` |")),
                   None)
        assert row is not None, f"docs/reference.md section 1 has no row for {p}"
        assert REGISTRY[p].arxiv in row
