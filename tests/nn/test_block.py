"""The one sublayer executor with plans no named placement produces (scales of exactly 2), the
norm settings it passes to every norm it builds, and the plan each block keeps."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from normlab.config import make_model_config
from normlab.nn import build_model
from normlab.nn.block import Sublayer
from normlab.nn.layers import ForwardState
from normlab.nn.plan import SublayerPlan


class Double(nn.Module):
    """A branch F(h) = 2h that ignores the forward state."""

    def forward(self, h, state):
        return 2 * h


def cfg(**kw):
    return make_model_config(**({"vocab_size": 32, "d_model": 8, "n_heads": 2, "n_blocks": 2,
                                 "max_seq_len": 8} | kw))


def test_scales_of_two_are_applied():
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    state = ForwardState()
    scaled_in = Sublayer(SublayerPlan("mlp", in_norm="identity", in_scale=2.0), cfg(),
                         Double()).double()
    torch.testing.assert_close(scaled_in(x, state), x + 2 * (2 * x))  # x + F(2 x)
    scaled_skip = Sublayer(SublayerPlan("mlp", skip_scale=2.0), cfg(), Double()).double()
    torch.testing.assert_close(scaled_skip(x, state), 2 * x + 2 * x)  # 2 x + F(x)


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
