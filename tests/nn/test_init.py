"""Each init scheme's spread, matrix by matrix, against its definition (normlab/nn/init.py):
normal N(0, std); gpt2_scaled's output projections at std/sqrt(2L); Glorot-uniform bounds per
fused slice; DeepNet's beta on V, proj and the MLP (not Q, K); DS-Init's 1/sqrt(l)."""

from __future__ import annotations

import math

import pytest
import torch

from normlab.config import make_model_config
from normlab.nn import build_model
from normlab.nn.init import init_weights

D, L = 64, 4


def model_for(scheme: str, std: float = 0.05, **kw):
    cfg = make_model_config(vocab_size=96, d_model=D, n_heads=4, n_blocks=L, max_seq_len=16,
                            placement=kw.pop("placement", "pre"), **kw)
    model = build_model(cfg, seed=0)
    with torch.no_grad():  # away from whatever the build did, so init_weights must set all
        for p in model.parameters():
            p.fill_(7.0)
    torch.manual_seed(1)
    init_weights(model, scheme, model.plan, std=std)
    return model


def spread(w: torch.Tensor) -> float:
    return w.double().std().item()


def uniform_bound(fan_in: int, fan_out: int) -> float:  # Glorot & Bengio 2010
    return math.sqrt(6.0 / (fan_in + fan_out))


def assert_uniform(w: torch.Tensor, bound: float) -> None:
    assert w.abs().max().item() <= bound * (1 + 1e-6)
    assert w.abs().max().item() > 0.98 * bound  # thousands of draws reach the edge
    assert spread(w) == pytest.approx(bound / math.sqrt(3), rel=0.06)


def maps(block):
    a, m = block.attn.fn, block.mlp.fn
    return a.qkv.weight, a.proj.weight, m.fc_in.weight, m.fc_out.weight


@pytest.mark.parametrize("scheme", ["normal", "gpt2_scaled", "xavier", "deepnorm", "admin",
                                    "ds_init"])
def test_shared_parts(scheme):
    model = model_for(scheme, std=0.05)
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            assert torch.all(p == 0), name
    assert spread(model.tok_emb.weight) == pytest.approx(0.05, rel=0.05)
    assert spread(model.pos_emb.weight) == pytest.approx(0.05, rel=0.1)
    assert model.tok_emb.weight.mean().abs().item() < 0.005


def test_untied_head_drawn_like_the_embedding():
    model = model_for("xavier", std=0.05, tie_embeddings=False)
    assert model.lm_head.weight is not model.tok_emb.weight
    assert spread(model.lm_head.weight) == pytest.approx(0.05, rel=0.05)
    tied = model_for("xavier", std=0.05)
    assert tied.lm_head.weight is tied.tok_emb.weight  # drawn once, as the embedding


def test_normal_and_gpt2_scaled():
    for block in model_for("normal", std=0.05).blocks:
        for w in maps(block):
            assert spread(w) == pytest.approx(0.05, rel=0.05)
    for block in model_for("gpt2_scaled", std=0.05).blocks:
        qkv, proj, fc_in, fc_out = maps(block)
        assert spread(qkv) == pytest.approx(0.05, rel=0.05)
        assert spread(fc_in) == pytest.approx(0.05, rel=0.05)
        for w in (proj, fc_out):  # GPT-2: residual projections at std / sqrt(2L)
            assert spread(w) == pytest.approx(0.05 / math.sqrt(2 * L), rel=0.05)


@pytest.mark.parametrize("scheme", ["xavier", "admin"])
def test_xavier_per_slice(scheme):
    for block in model_for(scheme).blocks:
        qkv, proj, fc_in, fc_out = maps(block)
        for part in qkv.chunk(3, dim=0):  # Q, K, V each a square map
            assert_uniform(part, uniform_bound(D, D))
        assert_uniform(proj, uniform_bound(D, D))
        assert_uniform(fc_in, uniform_bound(D, 4 * D))
        assert_uniform(fc_out, uniform_bound(4 * D, D))


def test_xavier_swiglu_slices():
    model = model_for("xavier", mlp="swiglu")
    fc_in = model.blocks[0].mlp.fn.fc_in.weight
    hidden = fc_in.shape[0] // 2
    for part in fc_in.chunk(2, dim=0):  # gate and value maps
        assert_uniform(part, uniform_bound(D, hidden))


def test_deepnorm_scales_v_proj_and_mlp_by_beta():
    model = model_for("deepnorm", placement="deepnorm")
    beta = model.plan.constants["deepnorm_beta"]
    assert beta == pytest.approx((8 * L) ** -0.25)
    for block in model.blocks:
        qkv, proj, fc_in, fc_out = maps(block)
        q, k, v = qkv.chunk(3, dim=0)
        assert_uniform(q, uniform_bound(D, D))  # Q and K keep their xavier scale
        assert_uniform(k, uniform_bound(D, D))
        assert_uniform(v, beta * uniform_bound(D, D))
        assert_uniform(proj, beta * uniform_bound(D, D))
        assert_uniform(fc_in, beta * uniform_bound(D, 4 * D))
        assert_uniform(fc_out, beta * uniform_bound(4 * D, D))


def test_ds_init_divides_by_sqrt_depth():
    for i, block in enumerate(model_for("ds_init").blocks):
        s = 1 / math.sqrt(i + 1)  # l = i + 1, 1-based
        qkv, proj, fc_in, fc_out = maps(block)
        for part in qkv.chunk(3, dim=0):
            assert_uniform(part, s * uniform_bound(D, D))
        assert_uniform(proj, s * uniform_bound(D, D))
        assert_uniform(fc_in, s * uniform_bound(D, 4 * D))
        assert_uniform(fc_out, s * uniform_bound(4 * D, D))


def test_unknown_scheme():
    model = build_model(make_model_config(vocab_size=96, d_model=16, n_heads=2, n_blocks=1,
                                          max_seq_len=8), seed=0)
    with pytest.raises(ValueError, match=r"^unknown init scheme 'kaiming'$"):
        init_weights(model, "kaiming", model.plan)


def test_default_std_is_0_02():
    model = build_model(make_model_config(vocab_size=96, d_model=D, n_heads=4, n_blocks=1,
                                          max_seq_len=16), seed=0)
    torch.manual_seed(0)
    init_weights(model, "normal", model.plan)
    assert spread(model.tok_emb.weight) == pytest.approx(0.02, rel=0.05)
    assert spread(model.blocks[0].attn.fn.qkv.weight) == pytest.approx(0.02, rel=0.05)


def centred(w: torch.Tensor) -> bool:
    return abs(w.double().mean().item()) < 0.1 * spread(w) + 1e-3


def test_draws_are_centred():
    for scheme in ("normal", "gpt2_scaled"):
        model = model_for(scheme, std=0.05, tie_embeddings=False)
        assert centred(model.lm_head.weight) and centred(model.tok_emb.weight)
        for block in model.blocks:
            assert all(centred(w) for w in maps(block)), scheme


def test_classifier_head_drawn_like_the_embedding():
    model = model_for("xavier", std=0.05, kind="encoder", n_classes=64)
    assert spread(model.classifier.weight) == pytest.approx(0.05, rel=0.1)
    assert centred(model.classifier.weight)
    assert torch.all(model.classifier.bias == 0)


def test_deepnorm_scheme_without_beta_is_plain_xavier():
    model = model_for("xavier")  # a pre-norm plan: no deepnorm_beta among its constants
    assert "deepnorm_beta" not in model.plan.constants
    torch.manual_seed(1)
    init_weights(model, "deepnorm", model.plan)
    for block in model.blocks:
        qkv, proj, fc_in, fc_out = maps(block)
        assert_uniform(qkv.chunk(3, dim=0)[2], uniform_bound(D, D))
        assert_uniform(fc_out, uniform_bound(4 * D, D))
