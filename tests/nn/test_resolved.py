"""What a placement resolves its defaults to (`resolved_settings`), the analysed-setting lines that
`normlab plan` prints (`setting_lines`), and the embedding draws (`embedding_stds`): exact values
for each case, so a listing never shows a setting other than the one the model was built with."""

from __future__ import annotations

import math

import pytest

from normlab.config import ModelConfig, load_run_config, parse_config
from normlab.nn.init import embedding_stds
from normlab.nn.plan import (
    build_plan,
    deepnorm_constants,
    resolved_model_fields,
    resolved_run_fields,
    resolved_settings,
    setting_lines,
)


def cfg(**fields) -> ModelConfig:
    return parse_config(ModelConfig, {"d_model": 16, "n_heads": 2, "n_blocks": 4, **fields})


NONE = {"out_norm": None, "deepnorm_arch": None, "deepnorm_alpha": None, "deepnorm_beta": None,
        "admin_omega": None, "mix_switch": None, "gate_init": None}


@pytest.mark.parametrize(("fields", "want"), [
    ({"placement": "pre"}, {"init": "gpt2_scaled", "final_norm": "on", "embed_norm": False,
                            "d_ff": 64}),
    ({"placement": "post"}, {"init": "xavier", "final_norm": "off", "embed_norm": False,
                             "d_ff": 64}),
    ({"placement": "post", "final_norm": "on", "init": "normal", "d_ff": 24},
     {"init": "normal", "final_norm": "on", "embed_norm": False, "d_ff": 24}),
    ({"placement": "peri", "out_norm": "rmsnorm"},
     {"init": "normal", "final_norm": "on", "embed_norm": True, "d_ff": 64,
      "out_norm": "rmsnorm"}),
    ({"placement": "sandwich"}, {"init": "normal", "final_norm": "on", "embed_norm": False,
                                 "d_ff": 64, "out_norm": "layernorm"}),
    ({"placement": "mix", "mix_switch": 0.5},
     {"init": "normal", "final_norm": "on", "embed_norm": False, "d_ff": 64, "mix_switch": 2}),
    ({"placement": "rezero"}, {"init": "xavier", "final_norm": "off", "embed_norm": False,
                               "d_ff": 64, "gate_init": 0.0}),
    ({"placement": "skipinit"}, {"init": "xavier", "final_norm": "off", "embed_norm": False,
                                 "d_ff": 64, "gate_init": 0.5}),
])
def test_resolved_settings_per_placement(fields, want):
    assert resolved_settings(cfg(**fields)) == NONE | want


def test_resolved_deepnorm_and_admin_constants():
    a, b = deepnorm_constants("decoder", 4)
    got = resolved_settings(cfg(placement="deepnorm"))
    assert got == NONE | {"init": "deepnorm", "final_norm": "off", "embed_norm": False,
                          "d_ff": 64, "deepnorm_arch": "decoder", "deepnorm_alpha": a,
                          "deepnorm_beta": b}
    enc = resolved_settings(cfg(placement="deepnorm", kind="encoder"))
    assert enc["deepnorm_arch"] == "encoder"
    o1 = resolved_settings(cfg(placement="admin", admin_omega="o1"))
    assert o1["admin_omega"] == pytest.approx(math.sqrt(8)) and o1["init"] == "admin"
    assert resolved_settings(cfg(placement="admin", admin_omega="profile"))["admin_omega"] == \
        "profile"
    assert resolved_settings(cfg(placement="admin", admin_omega=2.5))["admin_omega"] == 2.5


def test_resolved_fields_replace_the_config_s_own():
    c = cfg(placement="pre")
    fields = resolved_model_fields(c)
    assert fields["init"] == "gpt2_scaled" and fields["final_norm"] == "on"
    assert fields["placement"] == "pre" and fields["d_model"] == 16
    run = load_run_config(None, ["model.placement=post", "model.d_model=16", "model.n_heads=2"])
    out = resolved_run_fields(run)
    assert out["model"]["init"] == "xavier" and out["train"] == run.to_dict()["train"]
    assert resolved_settings(c, build_plan(c)) == resolved_settings(c)


def test_setting_lines_say_each_analysed_setting_exactly():
    assert setting_lines(cfg()) == ()
    assert setting_lines(cfg(attention="uniform", mlp="relu", d_ff=16, embedding="unit",
                             tie_embeddings=False)) == (
        "attention: uniform (every allowed position weighted equally, as with W^Q = W^K = 0)",
        "MLP: relu, width 16",
        "embedding: unit (token and position tables of variance 1/2: x_0 ~ N(0, I_d))",
        "head: untied")
    assert setting_lines(cfg(attention="none", embedding="fairseq")) == (
        "attention: none (each block is its MLP sublayer only)",
        "embedding: fairseq (tokens N(0, d^-1/2) times sqrt(d); an untied head N(0, d^-1/2))")
    assert setting_lines(cfg(mlp="swiglu")) == ("MLP: swiglu, width 43",)
    assert setting_lines(cfg(kind="encoder", tie_embeddings=False)) == ()


@pytest.mark.parametrize(("embedding", "positions", "want"), [
    ("normal", True, (0.02, 0.02, 0.02)),
    ("unit", True, (2 ** -0.5, 2 ** -0.5, 0.02)),
    ("unit", False, (1.0, 2 ** -0.5, 0.02)),
    ("fairseq", True, (0.25, 0.02, 0.25)),
])
def test_embedding_stds(embedding, positions, want):
    assert embedding_stds(embedding, 16, 0.02, positions) == pytest.approx(want)


def test_an_unknown_embedding_is_an_error():
    with pytest.raises(ValueError, match="unknown embedding 'glove'"):
        embedding_stds("glove", 16, 0.02, True)


def test_an_absent_attention_sublayer_keeps_its_kind_and_gate_resolves_from_the_mlp_alone():
    plan = build_plan(cfg(attention="none", n_blocks=1))
    assert plan.blocks[0].attn.kind == "attn" and plan.blocks[0].attn.absent
    assert resolved_settings(cfg(placement="rezero", attention="none", n_blocks=1))[
        "gate_init"] == 0.0
