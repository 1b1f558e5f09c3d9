"""The analysed settings of the theory papers, built on the shared code path and checked against
their stated formulas through the taps (float64, independent re-computation from the weights).

- uniform attention (Xiong et al. 2020, W^Q = W^K = 0): every allowed position weighted equally;
- no attention: each block is its MLP sublayer;
- the ReLU MLP of width d; fairseq's embedding (tokens x sqrt(d), untied head N(0, d^-1/2));
  the unit-variance embedding of Lemma 2 (x_0 ~ N(0, I_d));
- Admin's O(1) omega, omega^2 = n (admin-torch's `output_change_scale='O(1)'`).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from normlab.config import ConfigError, ModelConfig, parse_config
from normlab.nn import build_model, capture
from normlab.nn.plan import admin_closed_form_omega, build_plan

D, T = 16, 12


def source_model(**fields):
    data = {"d_model": D, "n_heads": 1, "n_blocks": 2, "max_seq_len": T, "mlp": "relu",
            "d_ff": D, "init": "xavier", **fields}
    return build_model(parse_config(ModelConfig, data), seed=3).double().eval()


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (3, T), generator=torch.Generator().manual_seed(seed))


def prefix_mean(v: torch.Tensor) -> torch.Tensor:
    """Causal uniform attention by a loop: position t averages positions 0..t."""
    return torch.stack([v[:, : t + 1].mean(1) for t in range(v.shape[1])], dim=1)


def layer_norm(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), eps=1e-5)


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_uniform_attention_is_the_prefix_mean_of_v_then_the_output_projection(placement):
    model = source_model(placement=placement, attention="uniform")
    with capture(model, ["blocks.1.attn.branch_in", "blocks.1.attn.branch_raw"]) as cap:
        model(tokens())
    attn = model.blocks[1].attn.fn
    h = cap["blocks.1.attn.branch_in"]
    v = h @ attn.qkv.weight[2 * D:].T + attn.qkv.bias[2 * D:]
    expected = prefix_mean(v) @ attn.proj.weight.T + attn.proj.bias
    torch.testing.assert_close(cap["blocks.1.attn.branch_raw"], expected, rtol=1e-10, atol=1e-10)


def test_uniform_attention_ignores_queries_and_keys():
    model = source_model(placement="pre", attention="uniform")
    before = model(tokens()).logits
    with torch.no_grad():
        for b in model.blocks:
            b.attn.fn.qkv.weight[: 2 * D].normal_()  # W^Q and W^K: no effect when uniform
    torch.testing.assert_close(model(tokens()).logits, before, rtol=0, atol=0)


def test_uniform_attention_of_an_encoder_averages_the_unpadded_positions():
    model = source_model(placement="pre", attention="uniform", kind="encoder")
    idx = tokens()
    mask = torch.ones_like(idx)
    mask[0, 7:] = 0
    with capture(model, ["blocks.0.attn.branch_in", "blocks.0.attn.branch_raw"]) as cap:
        model(idx, attention_mask=mask)
    attn = model.blocks[0].attn.fn
    v = cap["blocks.0.attn.branch_in"] @ attn.qkv.weight[2 * D:].T + attn.qkv.bias[2 * D:]
    mean0 = v[0, :7].mean(0)
    expected0 = mean0 @ attn.proj.weight.T + attn.proj.bias
    got = cap["blocks.0.attn.branch_raw"][0]
    torch.testing.assert_close(got, expected0.expand_as(got), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_no_attention_blocks_are_their_relu_mlp_only(placement):
    model = source_model(placement=placement, attention="none")
    with capture(model, ["blocks.0.attn.stream_in", "blocks.0.mlp.stream_out",
                         "blocks.0.attn.branch_added"]) as cap:
        model(tokens())
    x = cap["blocks.0.attn.stream_in"]
    mlp = model.blocks[0].mlp.fn

    def ffn(h):
        hidden = F.relu(h @ mlp.fc_in.weight.T + mlp.fc_in.bias)
        return hidden @ mlp.fc_out.weight.T + mlp.fc_out.bias

    expected = x + ffn(layer_norm(x)) if placement == "pre" else layer_norm(x + ffn(x))
    torch.testing.assert_close(cap["blocks.0.mlp.stream_out"], expected, rtol=1e-9, atol=1e-9)
    assert cap["blocks.0.attn.branch_added"].abs().max() == 0
    assert "Attn" not in str(model.plan)


def test_fairseq_embedding_scales_tokens_by_sqrt_d_and_an_untied_head_has_std_d_to_minus_half():
    model = source_model(placement="pre", embedding="fairseq", tie_embeddings=False, d_model=256,
                         max_seq_len=T)
    idx = tokens()
    with capture(model, "blocks.0.attn.stream_in") as cap:
        model(idx)
    expected = model.tok_emb.weight[idx] * math.sqrt(256) + model.pos_emb.weight[:T]
    torch.testing.assert_close(cap["blocks.0.attn.stream_in"], expected, rtol=1e-12, atol=1e-12)
    for table in (model.tok_emb.weight, model.lm_head.weight):
        assert table.std().item() == pytest.approx(256 ** -0.5, rel=0.03)
    assert model.pos_emb.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_unit_embedding_gives_x0_of_unit_variance_per_coordinate():
    model = source_model(placement="pre", embedding="unit", d_model=256)
    assert model.tok_emb.weight.var().item() == pytest.approx(0.5, rel=0.03)
    assert model.pos_emb.weight.var().item() == pytest.approx(0.5, rel=0.1)
    rope = source_model(placement="pre", embedding="unit", d_model=256, positions="rope",
                        attention="softmax", n_heads=2)
    assert rope.tok_emb.weight.var().item() == pytest.approx(1.0, rel=0.03)


@pytest.mark.parametrize(("attention", "n"), [("softmax", 2 * 5), ("none", 5)])
def test_admin_o1_omega_is_sqrt_n_over_the_sublayers_in_use(attention, n):
    cfg = parse_config(ModelConfig, {"placement": "admin", "n_blocks": 5, "admin_omega": "o1",
                                     "attention": attention, "d_model": D, "n_heads": 1})
    assert build_plan(cfg).constants["admin_omega"] == pytest.approx(math.sqrt(n), rel=1e-12)
    closed = parse_config(ModelConfig, {"placement": "admin", "n_blocks": 5,
                                        "attention": attention, "d_model": D, "n_heads": 1})
    assert build_plan(closed).constants["admin_omega"] == pytest.approx(
        admin_closed_form_omega(n), rel=1e-12)


def test_plan_prints_the_source_setting():
    text = str(build_plan(parse_config(ModelConfig, {
        "attention": "uniform", "mlp": "relu", "d_ff": 64, "d_model": 64, "embedding": "unit",
        "tie_embeddings": False})))
    for words in ("attention: uniform", "MLP: relu, width 64", "embedding: unit", "head: untied"):
        assert words in text


@pytest.mark.parametrize(("fields", "words"), [
    ({"attention": "uniform", "residual_attention": True}, "residual_attention"),
    ({"attention": "none", "placement": "hybrid"}, "attention: hybrid"),
    ({"attention": "uniform", "positions": "rope"}, "positions: rope"),
    ({"attention": "none", "placement": "b2t"}, "b2t"),
    ({"mlp": "relu", "gelu_approx": "tanh"}, "gelu_approx"),
    ({"attention": "softmax_"}, "attention"),
    ({"embedding": "xavier"}, "embedding"),
    ({"admin_omega": "O(1)"}, "admin_omega"),
])
def test_nonsense_source_settings_are_named(fields, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        parse_config(ModelConfig, {"d_model": 16, "n_heads": 2, **fields})


def test_an_analysed_setting_names_another_run_while_the_defaults_keep_old_ids():
    from normlab.config import load_run_config

    base = load_run_config(None, ["model.d_model=16", "model.n_heads=2"])
    data = base.to_dict()
    assert "attention" in data["model"]
    for fields in (["model.attention=uniform"], ["model.embedding=fairseq"]):
        other = load_run_config(None, ["model.d_model=16", "model.n_heads=2", *fields])
        assert other.run_id() != base.run_id()
    explicit = load_run_config(None, ["model.d_model=16", "model.n_heads=2",
                                      "model.attention=softmax", "model.embedding=normal"])
    assert explicit.run_id() == base.run_id()
