"""Placement plans as `normlab plan` prints them, for every placement: each sublayer's formula,
the constants, the embedding and output lines; the constants' formulas and the plan's errors.

The expected texts were checked by hand against docs/reference.md section 1 and the papers'
constants: DeepNet alpha = (2N)^(1/4) = 1.414, beta = (8N)^(-1/4) = 0.5 at N = 2; Admin's
closed-form omega sqrt(5/ln 5 - 1) = 1.451 for 4 sublayers; LNS 1/sqrt(2) = 0.7071 in block 2."""

from __future__ import annotations

import math
import re

import pytest

from normlab.config import make_model_config
from normlab.nn import build_plan
from normlab.nn.plan import SublayerPlan, admin_closed_form_omega, deepnorm_constants


def cfg(**kw):
    return make_model_config(**({"d_model": 16, "n_heads": 2} | kw))


GOLDEN = [
    ({'n_blocks': 2, 'placement': 'post'}, """\
placement post, 2 blocks, init xavier
x = Emb(tokens)
block   0 attn [post]  x = LN(x + Attn(x))
block   0 mlp  [post]  x = LN(x + MLP(x))
block   1 attn [post]  x = LN(x + Attn(x))
block   1 mlp  [post]  x = LN(x + MLP(x))
out = x"""),
    ({'n_blocks': 2, 'placement': 'peri', 'out_norm': 'rmsnorm'}, """\
placement peri, 2 blocks, init normal
x = LN(Emb(tokens))
block   0 attn [sandwich]  x = x + RMS(Attn(LN(x)))
block   0 mlp  [sandwich]  x = x + RMS(MLP(LN(x)))
block   1 attn [sandwich]  x = x + RMS(Attn(LN(x)))
block   1 mlp  [sandwich]  x = x + RMS(MLP(LN(x)))
out = LN(x)"""),
    ({'n_blocks': 2, 'placement': 'deepnorm'}, """\
placement deepnorm, 2 blocks, init deepnorm
constants: deepnorm_alpha=1.41421, deepnorm_beta=0.5
x = Emb(tokens)
block   0 attn [deepnorm]  x = LN(1.414*x + Attn(x))
block   0 mlp  [deepnorm]  x = LN(1.414*x + MLP(x))
block   1 attn [deepnorm]  x = LN(1.414*x + Attn(x))
block   1 mlp  [deepnorm]  x = LN(1.414*x + MLP(x))
out = x"""),
    ({'n_blocks': 2, 'placement': 'admin', 'admin_omega': 'closed_form'}, """\
placement admin, 2 blocks, init admin
constants: admin_omega=1.45144
x = Emb(tokens)
block   0 attn [admin]  x = LN(w*x + Attn(x))   [w learned per dim, w0=1.451]
block   0 mlp  [admin]  x = LN(w*x + MLP(x))   [w learned per dim, w0=1.451]
block   1 attn [admin]  x = LN(w*x + Attn(x))   [w learned per dim, w0=1.451]
block   1 mlp  [admin]  x = LN(w*x + MLP(x))   [w learned per dim, w0=1.451]
out = x"""),
    ({'n_blocks': 2, 'placement': 'resi_dual'}, """\
placement resi_dual, 2 blocks, init xavier
x = Emb(tokens);  a = x;  d = x
block   0 attn [resi_dual]  a = LN(a + Attn(a));  d = d + Attn(a)
block   0 mlp  [resi_dual]  a = LN(a + MLP(a));  d = d + MLP(a)
block   1 attn [resi_dual]  a = LN(a + Attn(a));  d = d + Attn(a)
block   1 mlp  [resi_dual]  a = LN(a + MLP(a));  d = d + MLP(a)
out = a + LN(d)"""),
    ({'n_blocks': 2, 'placement': 'siamese'}, """\
placement siamese, 2 blocks, init normal
x = Emb(tokens);  a = x;  d = x
block   0 attn [siamese]  h = LN(a);  y = Attn(LN(h + LN(d)));  a = h + 0.7071*y;  d = d + y
block   0 mlp  [siamese]  h = LN(a);  y = MLP(LN(h + LN(d)));  a = h + 0.7071*y;  d = d + y
block   1 attn [siamese]  h = LN(a);  y = Attn(LN(h + LN(d)));  a = h + 0.5*y;  d = d + y
block   1 mlp  [siamese]  h = LN(a);  y = MLP(LN(h + LN(d)));  a = h + 0.5*y;  d = d + y
out = LN(LN(a) + LN(d))"""),
    ({'n_blocks': 1, 'placement': 'siamese', 'norm': 'rmsnorm', 'final_norm': 'off'}, """\
placement siamese, 1 blocks, init normal
x = Emb(tokens);  a = x;  d = x
block   0 attn [siamese]  h = RMS(a);  y = Attn(RMS(h + RMS(d)));  a = h + 0.7071*y;  d = d + y
block   0 mlp  [siamese]  h = RMS(a);  y = MLP(RMS(h + RMS(d)));  a = h + 0.7071*y;  d = d + y
out = RMS(a) + RMS(d)"""),
    ({'n_blocks': 2, 'placement': 'b2t'}, """\
placement b2t, 2 blocks, init xavier
x = Emb(tokens)
block   0 attn [b2t]  x = LN(x + Attn(x))
block   0 mlp  [b2t]  x = LN(x + MLP(x) + x_block)
block   1 attn [b2t]  x = LN(x + Attn(x))
block   1 mlp  [b2t]  x = LN(x + MLP(x) + x_block)
out = x"""),
    ({'n_blocks': 2, 'placement': 'lns'}, """\
placement lns, 2 blocks, init normal
x = Emb(tokens)
block   0 attn [lns]  x = x + Attn(LN(x))
block   0 mlp  [lns]  x = x + MLP(LN(x))
block   1 attn [lns]  x = x + Attn(LN(x)*0.7071)
block   1 mlp  [lns]  x = x + MLP(LN(x)*0.7071)
out = LN(x)"""),
    ({'n_blocks': 2, 'placement': 'hybrid_star', 'norm': 'rmsnorm'}, """\
placement hybrid_star, 2 blocks, init gpt2_scaled
x = Emb(tokens)
block   0 attn [hybrid_star]  x = x + Attn[QKV-RMS](RMS(x))
block   0 mlp  [hybrid_star]  x = x + MLP(RMS(x))
block   1 attn [hybrid]  x = x + Attn[QKV-RMS](x)
block   1 mlp  [hybrid]  h = RMS(x);  x = h + MLP(h)
out = RMS(x)"""),
    ({'n_blocks': 2, 'placement': 'rezero'}, """\
placement rezero, 2 blocks, init xavier
x = Emb(tokens)
block   0 attn [rezero]  x = x + g*Attn(x)   [g0=0]
block   0 mlp  [rezero]  x = x + g*MLP(x)   [g0=0]
block   1 attn [rezero]  x = x + g*Attn(x)   [g0=0]
block   1 mlp  [rezero]  x = x + g*MLP(x)   [g0=0]
out = x"""),
    ({'n_blocks': 2, 'placement': 'skipinit', 'gate_init': 0.25}, """\
placement skipinit, 2 blocks, init xavier
x = Emb(tokens)
block   0 attn [skipinit]  x = x + g*Attn(x)   [g0=0.25]
block   0 mlp  [skipinit]  x = x + g*MLP(x)   [g0=0.25]
block   1 attn [skipinit]  x = x + g*Attn(x)   [g0=0.25]
block   1 mlp  [skipinit]  x = x + g*MLP(x)   [g0=0.25]
out = x"""),
    ({'n_blocks': 3, 'placement': 'mix', 'mix_switch': 1}, """\
placement mix, 3 blocks, init normal
constants: mix_switch_block=1
x = Emb(tokens)
block   0 attn [post]  x = LN(x + Attn(x))
block   0 mlp  [post]  x = LN(x + MLP(x))
block   1 attn [pre]  x = x + Attn(LN(x))
block   1 mlp  [pre]  x = x + MLP(LN(x))
block   2 attn [pre]  x = x + Attn(LN(x))
block   2 mlp  [pre]  x = x + MLP(LN(x))
out = LN(x)"""),
    ({'n_blocks': 2, 'placement': 'pre', 'final_norm': 'off'}, """\
placement pre, 2 blocks, init gpt2_scaled
x = Emb(tokens)
block   0 attn [pre]  x = x + Attn(LN(x))
block   0 mlp  [pre]  x = x + MLP(LN(x))
block   1 attn [pre]  x = x + Attn(LN(x))
block   1 mlp  [pre]  x = x + MLP(LN(x))
out = x"""),
    ({'n_blocks': 2, 'placement': 'custom', 'block_placements': ('post', 'pre')}, """\
placement custom, 2 blocks, init normal
x = Emb(tokens)
block   0 attn [post]  x = LN(x + Attn(x))
block   0 mlp  [post]  x = LN(x + MLP(x))
block   1 attn [pre]  x = x + Attn(LN(x))
block   1 mlp  [pre]  x = x + MLP(LN(x))
out = LN(x)"""),
]


@pytest.mark.parametrize("kw, text", GOLDEN, ids=[
    "-".join(str(v) for k, v in kw.items() if k != "n_blocks") for kw, _ in GOLDEN])
def test_plan_text(kw, text):
    plan = build_plan(cfg(**kw))
    assert plan.describe() == text
    assert str(plan) == text


@pytest.mark.parametrize("plan, text", [
    (SublayerPlan("attn", post_norm="dyt"), "x = DyT(x + Attn(x))"),
    (SublayerPlan("mlp", in_norm="layernorm", out_norm="identity"), "x = x + Id(MLP(LN(x)))"),
    (SublayerPlan("mlp", post_norm="batchnorm"), "x = BN(x + MLP(x))"),
    (SublayerPlan("attn", in_norm="rmsnorm", in_scale=0.5, skip_scale=2.0),
     "x = 2*x + Attn(RMS(x)*0.5)"),
])
def test_sublayer_formula(plan, text):
    assert plan.formula() == text


def test_constants():
    assert deepnorm_constants("decoder", 2) == pytest.approx((4 ** 0.25, 16 ** -0.25))
    assert deepnorm_constants("encoder", 6) == pytest.approx((12 ** 0.25, 48 ** -0.25))
    a, b = deepnorm_constants("encdec_encoder", 6, 3)
    assert (a, b) == pytest.approx((0.81 * (6 ** 4 * 3) ** (1 / 16),
                                    0.87 * (6 ** 4 * 3) ** (-1 / 16)))
    assert deepnorm_constants("encdec_decoder", 6) == pytest.approx((18 ** 0.25, 72 ** -0.25))
    with pytest.raises(ValueError, match=r"^encdec_encoder needs the decoder depth M$"):
        deepnorm_constants("encdec_encoder", 6)
    with pytest.raises(ValueError, match=r"^unknown DeepNorm architecture 'wide'$"):
        deepnorm_constants("wide", 6)
    assert admin_closed_form_omega(4) == pytest.approx(math.sqrt(5 / math.log(5) - 1))


def test_deepnorm_constants_follow_the_init_too():
    # DeepNet's init on a post-norm model needs beta though no block is a DeepNorm block
    plan = build_plan(cfg(n_blocks=2, placement="post", init="deepnorm"))
    assert plan.constants == pytest.approx({"deepnorm_alpha": 4 ** 0.25,
                                            "deepnorm_beta": 16 ** -0.25})
    assert build_plan(cfg(n_blocks=2, placement="post")).constants == {}


def test_admin_omega_before_profiling_is_one():
    plan = build_plan(cfg(n_blocks=2, placement="admin", admin_omega="profile"))
    assert plan.constants == {"admin_omega": 1.0}
    assert all(s.skip_scale == 1.0 and s.skip_learned for b in plan.blocks for s in b.sublayers)
    fixed = build_plan(cfg(n_blocks=2, placement="admin", admin_omega=0.7))
    assert fixed.constants == {"admin_omega": 0.7}


def test_unknown_block_placement():
    bad = cfg(n_blocks=1, placement="custom", block_placements=("post",)).model_copy(
        update={"block_placements": ("bogus",)})  # past the config's own check
    with pytest.raises(ValueError, match=r"^unknown placement 'bogus'$"):
        build_plan(bad)
    whole = bad.model_copy(update={"block_placements": ("mix",)})  # no block of its own
    with pytest.raises(ValueError, match=r"^placement 'mix' has no block of its own; its blocks "
                                         r"are other placements'$"):
        build_plan(whole)


def test_skip_normed_needs_an_input_norm():
    message = ("skip_normed takes the residual after in_norm: it needs an in_norm, and with a "
               "second stream (dual) a branch that reads both (dual_in_norm)")
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        SublayerPlan("mlp", skip_normed=True)
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        SublayerPlan("mlp", in_norm="layernorm", skip_normed=True, dual=True)
    assert SublayerPlan("mlp", in_norm="layernorm", skip_normed=True).skip_normed
    assert SublayerPlan("mlp", in_norm="layernorm", skip_normed=True, dual=True,
                        dual_in_norm="layernorm").skip_normed  # SiameseNorm's


@pytest.mark.parametrize(("fields", "needle"), [
    ({"dual_in_norm": "layernorm"}, "they need dual"),
    ({"stream_scale": 0.5}, "they need dual"),
    ({"mix_norm": "layernorm", "dual": True}, "it needs dual_in_norm"),
])
def test_siamese_fields_need_the_second_stream(fields, needle):
    with pytest.raises(ValueError, match=needle):
        SublayerPlan("attn", **fields)
