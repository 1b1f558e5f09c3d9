"""The placements added for 2025-2026 (olmo2, keel, subln, normformer) and the `qk_norm` option,
each pinned to its authors' code where it can be run here, and to its formula where it cannot.

Their reference formulas stand with every other placement's in tests/nn/test_placements.py
(`ref_stream`), whose registry-driven cases (formula, causality, final norm, custom twin) run
for them; this file adds what is particular to them:

- `olmo2` with `qk_norm`: a random Hugging Face `transformers` OLMo 2 model (`Olmo2ForCausalLM`,
  built from a small `Olmo2Config` in code, no download) copied into normlab gives the same
  logits;
- `qk_norm` with other placements, and that it normalizes over the full width, not per head;
- Keel's alpha, Sub-LN's init gain (torchscale's `Decoder.__init__`), NormFormer's head scale
  where fairseq applies it;
- the new `SublayerPlan` fields in a placement of your own, and the stacked model.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from optional_packages import needs  # noqa: E402

from normlab.config import ConfigError, RunConfig, make_model_config  # noqa: E402
from normlab.nn import build_model, build_plan, capture  # noqa: E402
from normlab.nn.plan import SublayerPlan, keel_alpha, subln_gain  # noqa: E402
from normlab.nn.stacked import StackedTransformer  # noqa: E402
from tests.nn.test_placements import (  # noqa: E402
    TOL,
    H,
    L,
    assert_differs,
    make_cfg,
    make_model,
    ref_attn,
    ref_stream,
    tokens,
)

NEW = ("olmo2", "keel", "subln", "normformer")


# --- qk_norm ---

@pytest.mark.parametrize("placement", ["pre", "post", "olmo2", "hybrid", "normformer", "subln"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_qk_norm_matches_formula(placement, norm):
    model = make_model(placement=placement, norm=norm, qk_norm=True)
    idx = tokens()
    with torch.no_grad():
        out = model.stream(idx)
    torch.testing.assert_close(out, ref_stream(model, idx, placement, qk_norm=True), **TOL)
    assert_differs(out, ref_stream(model, idx, placement))  # the QK-norms matter


@pytest.mark.parametrize("placement", ["olmo2", "pre"])
def test_qk_norm_with_rope_matches_formula(placement):
    model = make_model(placement=placement, norm="rmsnorm", qk_norm=True, positions="rope",
                       mlp="swiglu", bias=False)
    idx = tokens()
    with torch.no_grad():
        out = model.stream(idx)
    ref = ref_stream(model, idx, placement, qk_norm=True, rope=True, swiglu=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)  # float32 RoPE tables


def test_qk_norm_is_over_the_full_width_not_per_head():
    """OLMo 2's QK-norm normalizes each token's whole query (all heads, size d) by one statistic;
    a per-head QK-norm (size d/heads) would normalize each head by its own."""
    model = make_model(placement="olmo2", norm="rmsnorm", qk_norm=True)
    attn = model.blocks[0].attn.fn
    assert [tuple(n.weight.shape) for n in attn.qk_norms] == [(16,), (16,)]
    assert attn.qkv_norms is None
    idx = tokens()
    with torch.no_grad(), capture(model, ["blocks.0.attn.branch_in", "blocks.0.attn.fn.q"]) as c:
        model(idx)
    h, q = c["blocks.0.attn.branch_in"], c["blocks.0.attn.fn.q"]  # q: [B, H, T, d/H]
    proj = (h @ attn.qkv.weight.T + attn.qkv.bias)[..., :16]
    w, eps = attn.qk_norms[0].weight, attn.qk_norms[0].eps
    full = proj / torch.sqrt((proj * proj).mean(-1, keepdim=True) + eps) * w
    heads = proj.unflatten(-1, (H, -1))
    per_head = (heads / torch.sqrt((heads * heads).mean(-1, keepdim=True) + eps)).flatten(-2) * w
    torch.testing.assert_close(q.transpose(1, 2).flatten(-2), full, **TOL)
    assert_differs(q.transpose(1, 2).flatten(-2), per_head)


def test_qk_norm_is_off_by_default_and_keeps_run_ids():
    cfg = make_model_config()
    assert cfg.qk_norm is False
    run = RunConfig()
    data = run.to_dict()
    assert "qk_norm" in data["model"]  # recorded, but hashed only when set
    on = RunConfig.model_validate({"model": {"qk_norm": True}})
    assert on.run_id() != run.run_id()
    same = RunConfig.model_validate({"model": {"qk_norm": False}})
    assert same.run_id() == run.run_id()


def test_qk_norm_in_every_block_and_the_plan_says_so():
    plan = build_plan(make_cfg(placement="custom", n_blocks=4, qk_norm=True, norm="rmsnorm",
                               block_placements=("post", "keel", "subln", "normformer")))
    assert all(b.attn.qk_norm == "rmsnorm" and b.mlp.qk_norm is None for b in plan.blocks)
    assert "Attn[QK-RMS]" in plan.describe()


@pytest.mark.parametrize(("kw", "needle"), [
    ({"qk_norm": True, "norm": "dyt"}, "qk_norm: normalizes Q and K (OLMo 2), which dyt"),
    ({"qk_norm": True, "attention": "uniform"}, "qk_norm: normalizes Q and K inside softmax"),
    ({"placement": "x", "norm": "dyt", "placement_def": {"attn": {"qk_norm": True}}},
     "placement_def normalizes Q and K (qk_norm), which dyt"),
    ({"placement": "x", "placement_def": {"mlp": {"qk_norm": True}}},
     "qk_norm: Q and K are the attention's; set it under attn"),
    ({"placement": "x", "placement_def": {"mlp": {"head_scale": True}}},
     "head_scale: the heads are the attention's; set it under attn"),
])
def test_config_refuses_what_the_new_fields_cannot_do(kw, needle):
    with pytest.raises(ConfigError, match=None) as err:
        make_model_config(d_model=16, n_heads=2, **kw)
    assert needle in str(err.value)


def test_sublayer_plan_keeps_attention_fields_on_attention():
    for field in ({"qk_norm": "rmsnorm"}, {"head_scale": True}, {"qkv_norm": "layernorm"}):
        with pytest.raises(ValueError, match="an attn sublayer's only"):
            SublayerPlan("mlp", **field)


# --- OLMo 2 against Hugging Face transformers ---

@needs("transformers")
@pytest.mark.parametrize("n_blocks", [1, 3])
def test_olmo2_matches_hugging_face_olmo2(n_blocks):
    """A random `Olmo2ForCausalLM` (every weight, norm gains included, drawn away from its init)
    copied into normlab's olmo2 with qk_norm, RMSNorm (eps 1e-6), SwiGLU, RoPE (theta 500000),
    no biases and an untied head gives its logits."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    d, heads, ff, vocab, theta, eps = 32, 4, 48, 64, 500000.0, 1e-6
    hf_cfg = Olmo2Config(vocab_size=vocab, hidden_size=d, intermediate_size=ff,
                         num_hidden_layers=n_blocks, num_attention_heads=heads,
                         num_key_value_heads=heads, max_position_embeddings=16,
                         rms_norm_eps=eps, rope_parameters={"rope_type": "default",
                                                            "rope_theta": theta},
                         attention_bias=False, tie_word_embeddings=False, hidden_act="silu",
                         attention_dropout=0.0, pad_token_id=None, attn_implementation="eager")
    torch.manual_seed(0)
    hf = Olmo2ForCausalLM(hf_cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 1:  # RMSNorm gains
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))

    cfg = make_model_config(placement="olmo2", qk_norm=True, norm="rmsnorm", norm_eps=eps,
                            mlp="swiglu", d_ff=ff, positions="rope", rope_base=theta,
                            bias=False, tie_embeddings=False, vocab_size=vocab, d_model=d,
                            n_heads=heads, n_blocks=n_blocks, max_seq_len=16, dropout=0.0)
    ours = build_model(cfg, seed=0).eval()
    assert ours.plan.final_norm == "rmsnorm"
    state = {"tok_emb.weight": hf.model.embed_tokens.weight, "lm_head.weight": hf.lm_head.weight,
             "final.norm.weight": hf.model.norm.weight}
    for i, layer in enumerate(hf.model.layers):
        at, ml, p = layer.self_attn, layer.mlp, f"blocks.{i}"
        state |= {
            f"{p}.attn.fn.qkv.weight": torch.cat([at.q_proj.weight, at.k_proj.weight,
                                                  at.v_proj.weight]),
            f"{p}.attn.fn.proj.weight": at.o_proj.weight,
            f"{p}.attn.fn.qk_norms.0.weight": at.q_norm.weight,
            f"{p}.attn.fn.qk_norms.1.weight": at.k_norm.weight,
            f"{p}.attn.out_norm.weight": layer.post_attention_layernorm.weight,
            f"{p}.mlp.fn.fc_in.weight": torch.cat([ml.gate_proj.weight, ml.up_proj.weight]),
            f"{p}.mlp.fn.fc_out.weight": ml.down_proj.weight,
            f"{p}.mlp.out_norm.weight": layer.post_feedforward_layernorm.weight,
        }
    assert set(state) == set(ours.state_dict()), set(ours.state_dict()) ^ set(state)
    ours.load_state_dict({k: v.detach().clone() for k, v in state.items()})
    idx = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = hf(idx).logits
        got = ours(idx).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # Without the QK-norms (or with them per head) it is another model.
    plain = build_model(cfg.model_copy(update={"qk_norm": False}), seed=0).eval()
    plain.load_state_dict({k: v.detach().clone() for k, v in state.items()
                           if "qk_norms" not in k})
    with torch.no_grad():
        assert_differs(plain(idx).logits, want)


# --- Keel ---

@pytest.mark.parametrize(("kw", "alpha"), [
    ({"n_blocks": 3}, 6.0),
    ({"n_blocks": 5}, 10.0),
    ({"n_blocks": 4, "attention": "none"}, 4.0),  # the sublayers in use
    ({"placement": "custom", "n_blocks": 2, "block_placements": ("pre", "keel")}, 4.0),
])
def test_keel_alpha_is_the_number_of_sublayers(kw, alpha):
    plan = build_plan(make_cfg(**{"placement": "keel", **kw}))
    assert plan.constants["keel_alpha"] == alpha == keel_alpha(
        (1 if kw.get("attention") == "none" else 2) * kw["n_blocks"])
    keel = [b for b in plan.blocks if b.placement == "keel"]
    assert keel and (plan.final_norm is None) == (plan.placement == "keel")
    for b in keel:
        for s in b.sublayers:
            if not s.absent:
                assert (s.in_norm, s.post_norm, s.skip_scale) == ("layernorm", "layernorm", alpha)
    assert "keel_alpha" not in build_plan(make_cfg(placement="post")).constants


# --- Sub-LN ---

@pytest.mark.parametrize("n_blocks", [1, 2, 6])
def test_subln_gain(n_blocks):
    assert subln_gain(n_blocks) == pytest.approx(math.sqrt(math.log(2 * n_blocks)), rel=1e-12)
    plan = build_plan(make_cfg(placement="subln", n_blocks=n_blocks))
    assert plan.init == "subln"
    assert plan.constants["subln_gain"] == pytest.approx(math.sqrt(math.log(2 * n_blocks)))


def test_subln_init_scales_v_proj_and_mlp_by_the_gain():
    """torchscale multiplies `v_proj`, `out_proj`, `fc1` and `fc2` by sqrt(log 2L); Q and K keep
    their scale; normlab draws them from xavier first."""
    d, n_blocks = 256, 4
    model = build_model(make_cfg(placement="subln", d_model=d, n_heads=4, n_blocks=n_blocks,
                                 max_seq_len=8), seed=0)
    gain = math.sqrt(math.log(2 * n_blocks))
    sq, ff = math.sqrt(2.0 / (2 * d)), math.sqrt(2.0 / (5 * d))
    for blk in model.blocks:
        w = blk.attn.fn.qkv.weight.detach()
        for t, std in ((w[:d], sq), (w[d: 2 * d], sq), (w[2 * d:], gain * sq),
                       (blk.attn.fn.proj.weight.detach(), gain * sq),
                       (blk.mlp.fn.fc_in.weight.detach(), gain * ff),
                       (blk.mlp.fn.fc_out.weight.detach(), gain * ff)):
            assert t.std().item() == pytest.approx(std, rel=0.03)
        assert tuple(blk.attn.fn.inner_norm.weight.shape) == (d,)
        assert tuple(blk.mlp.fn.inner_norm.weight.shape) == (4 * d,)


def test_subln_inner_norms_sit_before_the_output_maps():
    """The attention's inner norm reads the concatenated heads (the input of `proj`), the MLP's
    the activation (the input of `fc_out`)."""
    model = make_model(placement="subln")
    idx = tokens()
    seen = {}
    hooks = [model.blocks[0].attn.fn.proj.register_forward_pre_hook(
                 lambda m, a: seen.__setitem__("proj", a[0])),
             model.blocks[0].mlp.fn.fc_out.register_forward_pre_hook(
                 lambda m, a: seen.__setitem__("fc_out", a[0])),
             model.blocks[0].attn.fn.inner_norm.register_forward_hook(
                 lambda m, a, o: seen.__setitem__("attn_inner", o)),
             model.blocks[0].mlp.fn.inner_norm.register_forward_hook(
                 lambda m, a, o: seen.__setitem__("mlp_inner", o))]
    with torch.no_grad():
        model(idx)
    for h in hooks:
        h.remove()
    torch.testing.assert_close(seen["proj"], seen["attn_inner"], rtol=0, atol=0)
    torch.testing.assert_close(seen["fc_out"], seen["mlp_inner"], rtol=0, atol=0)


# --- NormFormer ---

def test_normformer_head_scale_is_fairseqs():
    """fairseq's `c_attn` multiplies the output of `self_attn` (after `out_proj`, bias
    included) viewed as [heads, head_dim], before `attn_ln`: a head's factor scales its slice of
    the projected output. The paper's equation scales the heads before W^O, another function."""
    model = make_model(placement="normformer")
    attn = model.blocks[0].attn.fn
    c = attn.head_scale.weight
    assert c.shape == (H,)
    x = torch.randn(2, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        y, _ = attn(x)
        unscaled, _ = ref_attn(attn, x)
        torch.testing.assert_close(y, (unscaled.view(2, 5, H, -1) * c[:, None]).flatten(-2),
                                   **TOL)
        # the paper's HeadScaleMHA: Concat(c_i h_i) W^O
        pre = attn.proj.weight * c.repeat_interleave(16 // H)[None, :]
        paper, _ = ref_attn(_with_proj(attn, pre), x)
    assert_differs(y, paper)
    # at init every factor is 1
    fresh = build_model(make_cfg(placement="normformer"), seed=0)
    assert all(torch.equal(b.attn.fn.head_scale.weight.detach(), torch.ones(H, dtype=torch.float32))
               for b in fresh.blocks)


def _with_proj(attn, weight):
    class View(torch.nn.Module):
        pass

    v = View()
    v.qkv = attn.qkv
    v.proj = torch.nn.Linear(weight.shape[1], weight.shape[0]).double()
    with torch.no_grad():
        v.proj.weight.copy_(weight)
        v.proj.bias.copy_(attn.proj.bias)
    return v


def test_normformer_norm_kinds():
    plan = build_plan(make_cfg(placement="normformer", out_norm="rmsnorm"))
    at, ml = plan.blocks[0].sublayers
    assert (at.in_norm, at.out_norm, at.head_scale, at.inner_norm) == (
        "layernorm", "rmsnorm", True, None)
    assert (ml.in_norm, ml.out_norm, ml.inner_norm) == ("layernorm", None, "layernorm")
    assert plan.init == "xavier" and plan.final_norm == "layernorm"


# --- placements of your own with the new fields ---

TWINS = {
    "olmo2": {"attn": {"out_norm": True}, "mlp": {"out_norm": True}, "final_norm": True},
    "subln": {"attn": {"in_norm": True, "inner_norm": True},
              "mlp": {"in_norm": True, "inner_norm": True}, "init": "subln"},
    "normformer": {"attn": {"in_norm": True, "out_norm": True, "head_scale": True},
                   "mlp": {"in_norm": True, "inner_norm": True}, "init": "xavier"},
    "keel": {"attn": {"in_norm": True, "post_norm": True, "skip_scale": 2.0 * L},
             "mlp": {"in_norm": True, "post_norm": True, "skip_scale": 2.0 * L}},
}


@pytest.mark.parametrize("placement", NEW)
def test_a_placement_of_your_own_builds_each_new_placement(placement):
    """The new plan fields are open to a placement of your own: the definition below is the
    placement, plan and output."""
    own = build_plan(make_cfg(placement=placement, qk_norm=True))
    mine_cfg = make_cfg(placement="mine", qk_norm=True, placement_def=TWINS[placement])
    mine = build_plan(mine_cfg)
    assert [b.sublayers for b in mine.blocks] == [b.sublayers for b in own.blocks]
    assert (mine.init, mine.final_norm) == (own.init, own.final_norm)
    a = make_model(placement=placement, qk_norm=True)
    b = make_model(placement="mine", qk_norm=True, placement_def=TWINS[placement],
                   perturb_seed=None)
    b.load_state_dict(a.state_dict())
    idx = tokens()
    with torch.no_grad():
        torch.testing.assert_close(b.stream(idx), a.stream(idx), **TOL)


def test_a_definition_may_set_qk_norm_itself():
    plan = build_plan(make_cfg(placement="mine", norm="rmsnorm",
                               placement_def={"attn": {"in_norm": True, "qk_norm": True},
                                              "mlp": {"in_norm": True}}))
    assert all(b.attn.qk_norm == "rmsnorm" for b in plan.blocks)


# --- stacked ---

@pytest.mark.parametrize(("placement", "kw"), [
    ("olmo2", {"qk_norm": True, "norm": "rmsnorm", "mlp": "swiglu", "positions": "rope"}),
    ("keel", {}), ("subln", {}), ("normformer", {"qk_norm": True}),
])
def test_stacked_model_is_its_members(placement, kw):
    cfg = make_model_config(placement=placement, n_blocks=2, d_model=16, n_heads=2,
                            max_seq_len=8, **kw)
    x, y = torch.randint(0, 256, (2, 2, 8)), torch.randint(0, 256, (2, 2, 8))
    members = [build_model(cfg, seed=s) for s in range(2)]
    with torch.no_grad():  # move norm gains and head scales away from 1
        for m in members:
            for name, p in m.named_parameters():
                if p.dim() == 1 and name.endswith("weight"):
                    p.add_(0.3 * torch.randn(p.shape))
    stacked = StackedTransformer([build_model(cfg, seed=s) for s in range(2)])
    with torch.no_grad():
        for name, p in stacked.named_parameters():
            for i, m in enumerate(members):
                p[i].copy_(dict(m.named_parameters())[name].reshape(p[i].shape))
    out = stacked(x, y)
    out.loss.sum().backward()
    for i, m in enumerate(members):
        ref = m(x[i], y[i]).loss
        ref.backward()
        assert out.loss[i].item() == pytest.approx(ref.item(), abs=1e-5)
        for name, p in m.named_parameters():
            got = dict(stacked.named_parameters())[name].grad[i].reshape(p.shape)
            assert torch.allclose(got, p.grad, rtol=1e-4, atol=1e-6), name


def test_new_placements_print_their_formulas():
    text = {p: build_plan(make_cfg(placement=p)).describe() for p in NEW}
    assert "x = x + LN(Attn(x))" in text["olmo2"] and "out = LN(x)" in text["olmo2"]
    assert "x = LN(6*x + Attn(LN(x)))" in text["keel"] and "keel_alpha=6" in text["keel"]
    assert "x = x + Attn[inner-LN](LN(x))" in text["subln"]
    assert "x = x + MLP[inner-LN](LN(x))" in text["subln"]
    assert "x = x + LN(Attn[head-scale](LN(x)))" in text["normformer"]
