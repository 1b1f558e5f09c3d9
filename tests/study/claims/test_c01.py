"""Tests of C1 (Pre-Norm's stream grows with depth; Post-Norm's stays constant):
normlab/study/claims/c01_stream_growth.py, on the planted study (tests/fake_study.py) and on what
it measures.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from fake_study import SEEDS as PROBE_SEEDS
from fake_study import Planted
from planted_ladders import SEEDS, _rung_verdicts, _verdicts, planted_study

from normlab.study.claims import c01_stream_growth as c01
from normlab.study.context import MatchedPair, ProbedPair
from normlab.study.profiles import PROFILES


def test_c1_s_diagnostic_without_a_trained_pair_is_inconclusive_and_decides_nothing(tmp_path):
    ctx = planted_study(tmp_path, Planted())
    ctx.trained_probes = lambda: ProbedPair(MatchedPair(False, reason="not trained"))
    result = c01.measure(ctx)
    assert _verdicts(result)["pre trained grows faster"] == "inconclusive"
    assert result.verdict == "supported"


def test_c1_trained_growth_is_the_trained_stream_s_growth_minus_its_own_at_init(tmp_path):
    world = Planted(noise=0.0, trained={"pre_growth": 0.7})
    result = c01.measure(planted_study(tmp_path, world))
    pred = next(p for p in result.predictions if p["subject"] == "pre trained grows faster")
    assert pred["values"] == pytest.approx([0.7] * PROBE_SEEDS)
    assert next(r for r in result.ladder if r["key"] == "init")["predictions"][-1] == pred
    assert all(p["subject"] != pred["subject"] for r in result.ladder[:-1]
               for p in r["predictions"])  # on normlab's block only


def test_c1_s_mechanism_off_the_source_is_the_rung_s_own_branch_energies(tmp_path):
    """A planted model whose branch energies are known: on the GELU rung each block's attention
    adds 0.3d and its MLP 0.9d, so the mechanism predicts a stream growing by 1.2d per block; a
    stream that does is supported, one that grows by 1.2d on branches of 0.2d + 0.4d (a ratio
    of 2) is not, and branches of 1.0d + 0.6d (0.75) are again inside the mechanism's band
    though their sum is not Lemma 2's source value."""
    def at_gelu(attn: float, mlp: float) -> tuple[dict[str, Any], dict[str, Any], Any]:
        world = Planted(noise=0.0, gelu={"pre_inc": 1.2, "attn_sq": attn, "mlp_sq": mlp})
        result = c01.measure(planted_study(tmp_path, world))
        row = next(r for r in result.ladder if r["key"] == "gelu")
        pred = next(p for p in row["predictions"] if p["subject"] == "pre (mechanism)")
        return row, pred, result

    row, pred, result = at_gelu(0.3, 0.9)
    assert pred["values"] == pytest.approx([1.0] * SEEDS)
    assert pred["verdict"] == "supported" and row["verdict"] == "supported"
    assert result.numbers["pre_increment_over_branch_energies"][row["rung"]]["mean"] == \
        pytest.approx(1.0)
    row, pred, result = at_gelu(0.2, 0.4)
    assert pred["values"] == pytest.approx([2.0] * SEEDS)
    assert pred["verdict"] == "not supported"
    assert f"pre departs when {row['change']} ({row['rung']})" in result.departure
    assert result.verdict == "supported"  # the next rungs' own branches match their streams
    row, pred, _ = at_gelu(1.0, 0.6)
    assert pred["values"] == pytest.approx([0.75] * SEEDS) and pred["verdict"] == "supported"
    # the source rungs judge the increment itself, not the branches: 1.2 is in Lemma 2's bounds
    world = Planted(noise=0.0, source_b={"pre_inc": 1.2, "attn_sq": 0.2, "mlp_sq": 0.4})
    source_b = c01.measure(planted_study(tmp_path, world)).ladder[1]
    assert _rung_verdicts(source_b)["pre"] == "supported"


def test_c1_s_post_mechanism_off_the_source_is_the_rung_s_own_ffn_energy(tmp_path):
    """An FFN adding d (not Lemma 1's d/2) on the GELU rung: a norm input of 2d is what the
    mechanism predicts there (supported), Lemma 2's 3d/2 is not."""
    own = Planted(noise=0.0, gelu={"mlp_sq": 1.0})
    row = next(r for r in c01.measure(planted_study(tmp_path, own)).ladder if r["key"] == "gelu")
    assert _rung_verdicts(row)["post"] == "supported"
    lemma = Planted(noise=0.0, gelu={"mlp_sq": 1.0, "post_norm_in": 1.5})
    result = c01.measure(planted_study(tmp_path, lemma))
    row = next(r for r in result.ladder if r["key"] == "gelu")
    post = next(p for p in row["predictions"] if p["subject"] == "post (mechanism)")
    assert post["verdict"] == "not supported"
    assert post["values"] == pytest.approx([1.5 - 2.0 + 1.5] * SEEDS)


def test_c1_reports_the_growth_exponent_and_the_range_the_bounds_allow(tmp_path):
    L = max(PROFILES["quick"].init_depths)
    result = c01.measure(planted_study(tmp_path, Planted()))
    allowed = result.numbers["exponent_range_the_bounds_allow"]
    assert allowed == pytest.approx([1 - math.log(3) / math.log(L), 1 + math.log(3) / math.log(L)])
    # planted: E||x_l||^2 - E||x_0||^2 = d inc l, an exponent of 1 on every rung
    exps = result.numbers["growth_exponent_of_E_x_sq_at_init"]
    assert set(exps) == {r["rung"] for r in result.ladder}
    assert all(e["mean"] == pytest.approx(1.0, abs=0.02) for e in exps.values()), exps
    assert f"[{allowed[0]:.2f}, {allowed[1]:.2f}] at L = {L}" in result.caveat


def test_growth_exponent_needs_two_blocks_above_the_embedding():
    def stats(sq):
        return {"summary": {"embed_sq": 1.0}, "per_block": {"sq_norm": sq}}

    assert c01.growth_exponent_sq(stats([2.0, 3.0])) == pytest.approx(1.0)  # 1, 2 at l = 1, 2
    assert c01.growth_exponent_sq(stats([1.0, 2.0, 5.0])) == pytest.approx(
        math.log(4.0) / math.log(1.5))  # the block at the embedding's level is left out
    assert math.isnan(c01.growth_exponent_sq(stats([0.5, 2.0])))


def test_the_lemma_bounds_a_planted_increment_and_reject_a_violation(tmp_path):
    """Lemma 2's bounds are tested as bounds where the lemma is the prediction: on the
    uniform-attention source rung (its branches planted at the increment, so the stream alone
    moves the verdict)."""
    def source_b(inc: float) -> str:
        world = Planted(source_b={"pre_inc": inc, "attn_sq": inc / 2, "mlp_sq": inc / 2})
        row = c01.measure(planted_study(tmp_path, world)).ladder[1]
        assert row["key"] == "source_b"
        return _rung_verdicts(row)["pre"]

    assert source_b(1.4) == "supported"
    assert source_b(1.6) == "not supported"
    assert source_b(0.4) == "not supported"


def test_per_block_increment_and_norm_input_read_the_stated_quantities():
    stats = {"per_block": {"sq_norm": [3.0, 5.0, 7.0], "mlp_norm_input_sq": [3.0, 6.0, 9.0]},
             "summary": {"embed_sq": 2.0, "d_model": 2, "n_blocks": 3}}
    assert c01.per_block_increment(stats) == pytest.approx((7.0 - 2.0) / (3 * 2))
    assert c01.norm_input_over_d(stats) == pytest.approx(3.0)
