"""Tests of C4 (Xiong Theorem 1: the last layer's gradient vs depth):
normlab/study/claims/c04_last_layer_gradient.py, on the planted study (tests/fake_study.py) and on
what it measures.
"""

from __future__ import annotations

import pytest
from fake_study import Planted
from planted_ladders import planted_study

from normlab.probe.fits import loglog_fit
from normlab.study.claims import c04_last_layer_gradient as c04
from normlab.study.profiles import PROFILES


def _fit(xs, ys) -> float:
    return loglog_fit([(x, y, 0) for x, y in zip(xs, ys, strict=True)],
                             n_boot=0)["slope"]


def test_c4_reports_each_placement_s_planted_slope(tmp_path):
    depths = PROFILES["quick"].init_depths
    result = c04.measure(planted_study(tmp_path, Planted(init={"post_slope": 0.35,
                                                           "pre_mech": 0.1})))
    last = result.numbers["slopes"][result.ladder[-1]["rung"]]
    stream = _fit(depths, [1 + L for L in depths])  # planted E||x_L||^2 / d = 1 + L
    assert last["post"]["mean"] == pytest.approx(0.35, abs=0.01)
    assert last["pre E||x_L||^2"]["mean"] == pytest.approx(stream, abs=0.01)
    assert last["pre"]["mean"] == pytest.approx(-0.5 * stream + 0.1, abs=0.01)
    first = result.numbers["slopes"][result.ladder[0]["rung"]]
    assert first["post"]["mean"] == pytest.approx(0.0, abs=0.01)


def test_c4_s_gap_off_the_source_is_minus_half_the_rung_s_own_stream_slope(tmp_path):
    """On a rung whose Pre-LN stream barely grows (E||x_L||^2 / d = 1 + 0.01 L, slope about
    0.02) the final norm's Jacobian barely moves pre's gradient: the mechanism predicts a gap
    near 0, not the theorem's -1/2, and pre and post level with each other are supported."""
    result = c04.measure(planted_study(tmp_path, Planted(gelu={"pre_inc": 0.01})))
    row = next(r for r in result.ladder if r["key"] == "gelu")
    stream = result.numbers["slopes"][row["rung"]]["pre E||x_L||^2"]["mean"]
    assert stream == pytest.approx(_fit([3, 6, 12, 24], [1 + 0.01 * L for L in (3, 6, 12, 24)]),
                                   abs=0.01)
    gap = next(p for p in row["predictions"] if p["subject"] == "pre vs post")
    assert gap["verdict"] == "supported"
    assert gap["effect"]["estimate"] == pytest.approx(0.0, abs=0.02)
    assert f"{-0.5 * stream:+.3g} (mean over seeds)" in gap["derivation"]
    assert result.verdict == "supported"
