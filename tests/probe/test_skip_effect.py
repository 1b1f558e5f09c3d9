"""Skip effects (Csordás, Manning and Potts 2025, arXiv 2505.13898): the relative contribution of
each block, the skip-effect matrix and the output change, checked against the same numbers
computed here without the probe's hooks: the forward is run block by block by hand and a block
is skipped by not calling it; the branches come from `capture`, and for pre-norm also from the
paper's own definition, the difference of consecutive residual streams."""

from __future__ import annotations

import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from test_probe import _app  # noqa: E402  (the `normlab probe` app of the probe tests)
from typer.testing import CliRunner  # noqa: E402

from normlab.config import make_model_config  # noqa: E402
from normlab.nn import build_model, capture  # noqa: E402
from normlab.nn.block import Carry  # noqa: E402
from normlab.nn.layers import Context  # noqa: E402
from normlab.probe import (  # noqa: E402
    hooks_left,
    probe_model,
    skip_effect,
    stream_stats,
    text_batches,
)

EPS = 1e-6  # the authors' clamp of a contribution's norm


@pytest.fixture(scope="module")
def batches():
    return text_batches(n_batches=2, batch_size=2, seq_len=16)


def _model(placement: str, n_blocks: int = 4, **kw):
    cfg = make_model_config(placement=placement, n_blocks=n_blocks, d_model=16, n_heads=2,
                            max_seq_len=32, **kw)
    return build_model(cfg, seed=1).eval()


@torch.no_grad()
def _by_hand(model, idx, skip: int | None = None):
    """The forward block by block, block `skip` left out: (each block's input stream, each
    block's contribution read with `capture` (zero for the skipped block), the output
    probabilities, each block's output stream)."""
    L = len(model.blocks)
    ctx = Context(rope=(model.rope_cos, model.rope_sin) if model.pos_emb is None else None)
    with capture(model, "blocks.*.branch_added") as cap:
        x = model.embed(idx)
        carry = Carry(dual=x if model.plan.dual_stream else None)
        inputs, outputs = [], []
        for j, block in enumerate(model.blocks):
            inputs.append(x)
            if j != skip:
                x, carry = block(x, carry, ctx)
            outputs.append(x)
        norm = model.final.norm
        if model.plan.dual_stream:
            out = x + (carry.dual if norm is None else norm(carry.dual))
        else:
            out = x if norm is None else norm(x)
    logits = model.lm_head(out) if model.cfg.kind == "decoder" else model.classifier(out.mean(1))
    contrib = [torch.zeros_like(inputs[0]) if j == skip else
               cap[f"blocks.{j}.attn.branch_added"] + cap[f"blocks.{j}.mlp.branch_added"]
               for j in range(L)]
    return inputs, contrib, torch.softmax(logits.float(), -1), outputs


def _relative(new: torch.Tensor, old: torch.Tensor) -> float:
    """Max over tokens of ||old - new|| / max(||old||, 1e-6), as the authors' code."""
    return ((old - new).norm(dim=-1) / old.norm(dim=-1).clamp(min=EPS)).max().item()


def _expected(model, batches):
    L = len(model.blocks)
    effect = [[0.0] * L for _ in range(L)]
    output = [0.0] * L
    rel = [0.0] * L
    for idx, _ in batches:
        xs, cs, p, _ = _by_hand(model, idx)
        for j in range(L):
            rel[j] += (cs[j].norm(dim=-1) / xs[j].norm(dim=-1)).mean().item() / len(batches)
        for i in range(L):
            _, cs2, q, _ = _by_hand(model, idx, skip=i)
            for j in range(L):
                effect[i][j] = max(effect[i][j], _relative(cs2[j], cs[j]))
            output[i] = max(output[i], (q - p).norm(dim=-1).max().item())
    return effect, output, rel


@pytest.mark.parametrize(("placement", "kind"), [
    ("pre", "decoder"), ("post", "decoder"), ("resi_dual", "decoder"), ("deepnorm", "decoder"),
    ("sandwich", "decoder"), ("b2t", "decoder"), ("pre", "encoder")])
def test_skip_effect_is_the_by_hand_computation(placement, kind):
    model = _model(placement, kind=kind)
    bs = text_batches(n_batches=2, batch_size=2, seq_len=16, kind=kind, n_classes=3)
    got = skip_effect(model, bs)
    effect, output, rel = _expected(model, bs)
    L = len(model.blocks)
    for i in range(L):
        assert got["skip_effect"][i] == pytest.approx(effect[i], rel=1e-4, abs=1e-6), i
        later = got["skip_effect_later"][i]
        assert (math.isnan(later) if i == L - 1
                else later == pytest.approx(max(effect[i][i + 1:]), rel=1e-4))
        # blocks before the skipped one run as before; the skipped one's contribution is gone
        assert all(v == 0.0 for v in got["skip_effect"][i][:i])
        assert got["skip_effect"][i][i] == 1.0
    assert got["skip_output"] == pytest.approx(output, rel=1e-4, abs=1e-7)
    assert got["rel_contribution"] == pytest.approx(rel, rel=1e-5)
    assert not hooks_left(model)


def test_pre_norm_contributions_are_the_differences_of_the_residual_stream(batches):
    """Under pre-norm the stream is the sum of the contributions, `h_{l+1} = h_l + a_l + m_l`:
    the paper's own definition, differences of consecutive residual streams with no tap at all,
    gives the same matrix, and `rel_contribution` is `rel_update`."""
    model = _model("pre")
    L = len(model.blocks)
    effect = [[0.0] * L for _ in range(L)]
    for idx, _ in batches:
        ins, _, _, outs = _by_hand(model, idx)
        base = [o - x for x, o in zip(ins, outs, strict=True)]
        for i in range(L):
            ins2, _, _, outs2 = _by_hand(model, idx, skip=i)
            for j in range(L):
                effect[i][j] = max(effect[i][j], _relative(outs2[j] - ins2[j], base[j]))
    got = skip_effect(model, batches)
    for i in range(L):
        assert got["skip_effect"][i] == pytest.approx(effect[i], rel=1e-3, abs=1e-5), i
    assert got["rel_contribution"] == pytest.approx(stream_stats(model, batches)["rel_update"],
                                                    rel=1e-4)


def test_a_block_that_adds_nothing_changes_nothing_when_skipped(batches):
    model = _model("pre")
    with torch.no_grad():
        for lin in (model.blocks[1].attn.fn.proj, model.blocks[1].mlp.fn.fc_out):
            lin.weight.zero_()
            lin.bias.zero_()
    got = skip_effect(model, batches)
    assert got["rel_contribution"][1] == 0.0
    assert got["skip_output"][1] == 0.0
    assert got["skip_effect"][1] == [0.0] * 4  # nothing removed, nothing after it changes


def test_the_skip_probe_is_asked_for_and_its_rows_go_per_block(batches):
    model = _model("resi_dual", n_blocks=3)
    default = probe_model(model, batches)
    assert "skip_effect" not in default["per_block"]
    res = probe_model(model, batches, ("skip",))
    pb = res["per_block"]
    assert set(pb) == {"rel_contribution", "skip_effect", "skip_effect_later", "skip_output"}
    assert len(pb["skip_effect"]) == 3 and all(len(row) == 3 for row in pb["skip_effect"])


def test_normlab_probe_prints_and_writes_the_skip_effects(tmp_path):
    out = tmp_path / "probe"
    r = CliRunner().invoke(_app(), [
        "probe", "--placement", "resi_dual", "--blocks", "3", "--width", "16", "--heads", "2",
        "--batches", "1", "--batch-size", "2", "--seq-len", "8", "--probes", "skip",
        "--out", str(out)], terminal_width=200)
    assert r.exit_code == 0, r.output
    for header in ("contrib", "skip later", "skip out"):
        assert header in r.output
    report = json.loads((out / "probe.json").read_text())
    pb = report["runs"][0]["result"]["per_block"]
    assert len(pb["skip_effect"]) == 3 and pb["skip_effect_later"][-1] is None  # NaN -> null
    assert (out / "matrix_skip_effect.png").exists() and (out / "block_skip_output.png").exists()
