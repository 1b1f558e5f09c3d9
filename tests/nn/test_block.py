"""The one sublayer executor with plans no named placement produces (scales of exactly 2), the
norm settings it passes to every norm it builds, and the plan each block keeps."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from normlab.config import make_model_config
from normlab.nn import build_model, capture
from normlab.nn.block import Carry, Sublayer
from normlab.nn.layers import NO_CONTEXT
from normlab.nn.plan import SublayerPlan


class Double(nn.Module):
    """An MLP-like branch F(h) = 2h."""

    def forward(self, h):
        return 2 * h


def cfg(**kw):
    return make_model_config(**({"vocab_size": 32, "d_model": 8, "n_heads": 2, "n_blocks": 2,
                                 "max_seq_len": 8} | kw))


def test_scales_of_two_are_applied():
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    scaled_in = Sublayer(SublayerPlan("mlp", in_norm="identity", in_scale=2.0), cfg(),
                         Double()).double()
    out, carry = scaled_in(x, Carry(), NO_CONTEXT)
    torch.testing.assert_close(out, x + 2 * (2 * x))  # x + F(2 x)
    assert carry == Carry()
    scaled_skip = Sublayer(SublayerPlan("mlp", skip_scale=2.0), cfg(), Double()).double()
    torch.testing.assert_close(scaled_skip(x, Carry(), NO_CONTEXT)[0], 2 * x + 2 * x)  # 2x + F(x)


def test_every_norm_gets_the_configured_settings():
    model = build_model(cfg(norm="dyt", dyt_alpha=0.3, norm_eps=1e-3, placement="sandwich"))
    norms = [m for b in model.blocks for s in (b.attn, b.mlp) for m in (s.in_norm, s.out_norm)]
    assert len(norms) == 8 and all(m.alpha.item() == pytest.approx(0.3) for m in norms)
    ln = build_model(cfg(norm_eps=1e-3, norm_bias=False, placement="post"))
    posts = [s.post_norm for b in ln.blocks for s in (b.attn, b.mlp)]
    assert all(m.eps == 1e-3 and m.bias is None for m in posts)


def test_blocks_keep_their_plans():
    model = build_model(cfg(placement="mix", n_blocks=4))
    for block, plan in zip(model.blocks, model.plan.blocks, strict=True):
        assert block.plan is plan
        assert block.attn.plan is plan.attn and block.mlp.plan is plan.mlp


def test_a_block_maps_its_inputs_to_new_outputs():
    """A block is a function of `(x, carry, ctx)`: ResiDual's second stream and RealFormer's
    scores come in the carry and go out in a new one, which holds `d + y_attn + y_mlp` and the
    block's own attention scores; the carry passed in is left as it was."""
    model = build_model(cfg(placement="resi_dual", residual_attention=True)).double().eval()
    block = model.blocks[1]
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    carry = Carry(dual=torch.randn(2, 5, 8, dtype=torch.float64),
                  scores=torch.randn(2, 2, 5, 5, dtype=torch.float64))
    kept = [t.clone() for t in carry]
    with torch.no_grad(), capture(block, ["*.branch_added", "attn.branch_in"]) as cap:
        out, after = block(x, carry, NO_CONTEXT)
    assert all(torch.equal(t, k) for t, k in zip(carry, kept, strict=True))
    torch.testing.assert_close(after.dual, carry.dual + cap["attn.branch_added"]
                               + cap["mlp.branch_added"])
    with torch.no_grad():
        _, scores = block.attn.fn(cap["attn.branch_in"], NO_CONTEXT, carry.scores)
        again, again_carry = block(x, carry, NO_CONTEXT)
    assert torch.equal(after.scores, scores) and not torch.equal(scores, carry.scores)
    assert torch.equal(again, out) and all(
        torch.equal(a, b) for a, b in zip(again_carry, after, strict=True))
    # without ResiDual and RealFormer the carry stays empty
    pre = build_model(cfg(placement="pre")).blocks[0]
    assert pre(torch.randn(2, 5, 8), Carry(), NO_CONTEXT)[1] == Carry()


@pytest.mark.parametrize("placement", ["pre", "post", "sandwich", "resi_dual", "rezero", "hybrid",
                                       "peri"])
def test_an_absent_norm_is_none_everywhere(placement):
    """One meaning for a norm the plan leaves out: None, in the blocks and around them (no
    identity module standing in for it); a present norm is a module."""
    model = build_model(cfg(placement=placement))
    slots = [(model.embed_norm, model.plan.embed_norm), (model.final.norm, model.plan.final_norm)]
    slots += [(getattr(s, name), getattr(s.plan, name)) for b in model.blocks
              for s in (b.attn, b.mlp) for name in ("in_norm", "out_norm", "post_norm")]
    assert all((module is None) == (kind is None) for module, kind in slots)
    assert not any(isinstance(m, nn.Identity) for m in model.modules())
