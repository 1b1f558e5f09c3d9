"""Tests of C8 (Admin: output sensitivity to weight perturbation grows with depth):
normlab/study/claims/c08_admin_sensitivity.py, on the planted study (tests/fake_study.py) and on
what it measures.
"""

from __future__ import annotations

import math

import pytest
from fake_study import Planted
from planted_ladders import _verdicts, planted_study

from normlab.probe.fits import loglog_fit
from normlab.study.claims import c08_admin_sensitivity as c08
from normlab.study.claims import ladder
from normlab.study.claims.ladder import log_law_slope, nearest_law_bands
from normlab.study.ladders import fairseq_ladder
from normlab.study.profiles import PROFILES


def test_c8_s_mechanism_off_the_source_is_the_rung_s_own_branch_over_input_energies(tmp_path):
    """On normlab's block an output change growing like n is what the mechanism predicts when
    the rung's own branch-over-input sum grows like n too (supported), not when that sum grows
    like log n."""
    own = c08.measure(planted_study(tmp_path, Planted(init={"pre": "n", "pre_mech": "n"})))
    assert _verdicts(own)["pre"] == "supported"
    assert own.numbers["mechanism_slopes"][own.ladder[-1]["rung"]]["pre"]["mean"] == \
        pytest.approx(1.0, abs=0.01)
    log = c08.measure(planted_study(tmp_path, Planted(init={"pre": "n"})))
    assert _verdicts(log)["pre"] == "not supported"


def test_c8_asks_for_admin_s_perturbation_and_init_stats_on_fairseq_s_ladder(tmp_path):
    p = PROFILES["quick"]
    ctx = planted_study(tmp_path, Planted())
    c08.measure(ctx)
    assert ctx.requests == [{"kind": "init", "name": f"ladder_admin_{ladder.CACHE_VERSION}",
                             "rungs": fairseq_ladder(p.width, p.heads),
                             "placements": ["post", "pre", "admin", "admin_o1"],
                             "depths": list(p.init_depths), "perturb": True, "stats": True,
                             "seeds": p.init_seeds}]


def test_c8_reports_the_law_bands_and_each_placement_s_slope(tmp_path):
    depths = PROFILES["quick"].init_depths
    result = c08.measure(planted_study(tmp_path, Planted()))
    s_log = log_law_slope([2 * L for L in depths])
    assert result.numbers["slope_of_ln_n_over_these_depths"] == pytest.approx(s_log)
    assert result.numbers["law_bands"] == {k: list(v) for k, v in
                                           nearest_law_bands(s_log).items()}
    last = result.numbers["slopes"][result.ladder[-1]["rung"]]
    assert last["post"]["mean"] == pytest.approx(1.0, abs=0.01)
    assert last["pre"]["mean"] == pytest.approx(s_log, abs=0.01)
    assert last["admin"]["mean"] == pytest.approx(s_log, abs=0.01)
    assert last["admin_o1"]["mean"] == pytest.approx(0.0, abs=0.01)


# -- the derived predictions on planted laws -------------------------------------------------------

NS = [2 * L for L in (3, 6, 12, 24, 48)]


def _slope(values: list[float]) -> float:
    return loglog_fit([(n, v, 0) for n, v in zip(NS, values, strict=True)],
                             n_boot=0)["slope"]


@pytest.mark.parametrize(("a", "b"), [(0.0, 1.0), (1.0, 1.0), (0.5, 2.0)])
def test_a_planted_log_law_falls_in_the_log_band(a, b):
    bands = nearest_law_bands(log_law_slope(NS))
    lo, hi = bands["O(log n)"]
    assert lo <= _slope([a + b * math.log(n) for n in NS]) <= hi


def test_planted_linear_and_constant_laws_fall_in_their_own_bands():
    bands = nearest_law_bands(log_law_slope(NS))
    assert bands["O(n)"][0] <= _slope([3.0 + 2.0 * n for n in NS]) <= bands["O(n)"][1]
    assert bands["O(1)"][0] <= _slope([5.0] * len(NS)) <= bands["O(1)"][1]
    # the bands meet halfway between the laws' slopes 0, s_log and 1
    assert bands["O(1)"][1] == bands["O(log n)"][0]
    assert bands["O(log n)"][1] == bands["O(n)"][0]
    assert log_law_slope(NS) == pytest.approx(0.337, abs=0.01)


def test_law_bands_meet_halfway_between_the_laws_slopes():
    bands = nearest_law_bands(0.4)
    assert bands == {"O(1)": pytest.approx((-0.2, 0.2)), "O(log n)": pytest.approx((0.2, 0.7)),
                     "O(n)": pytest.approx((0.7, 1.3))}
