"""Tests of C13 (Intermediate heads need a norm under Pre-LN):
normlab/study/claims/c13_lens_norm.py, on the planted study (tests/fake_study.py) and on what it
measures.

C13 decided on the lens through a norm without parameters (`lens_free`), not through the
trained final norm, whose removal can hardly fail to cost; post's same gap reported beside pre's.
"""

from __future__ import annotations

import pytest
from fake_study import SEEDS, FakeStudy
from planted_probes import CLAIMS, _fill

from normlab.study.claims import c13_lens_norm as c13
from normlab.study.context import ProbedPair


class _Lens(FakeStudy):
    def trained_probes(self) -> ProbedPair:
        out = super().trained_probes()
        for p in ("pre", "post"):
            for s in out.seeds[p]:
                s.per_block["lens_raw"] = [4.0, 5.0, 6.0, 7.0, 8.0, 100.0]
                s.per_block["lens_normed"] = [3.0] * 6
                s.per_block["lens_free"] = [3.5] * 6
        return out


def test_c13_s_gap_is_the_mean_over_every_block_but_the_last(tmp_path):
    result = CLAIMS["C13"](_Lens(tmp_path, 0.0, "quick", **_fill({})))
    assert result.numbers["lens_gap"]["pre"]["mean"] == pytest.approx((1 + 2 + 3 + 4 + 5) / 5)
    assert result.numbers["lens_gap_free"]["pre"]["mean"] == pytest.approx(
        (0.5 + 1.5 + 2.5 + 3.5 + 4.5) / 5)


class _OneBlock(FakeStudy):
    def trained_probes(self) -> ProbedPair:
        out = super().trained_probes()
        for p in ("pre", "post"):
            for s in out.seeds[p]:
                s.per_block["lens_raw"], s.per_block["lens_normed"] = [5.0], [3.0]
                s.per_block["lens_free"] = [4.0]
        return out


def test_c13_s_gap_of_a_one_block_model_is_zero(tmp_path):
    numbers = CLAIMS["C13"](_OneBlock(tmp_path, 0.0, "quick", **_fill({}))).numbers
    for gap in (numbers["lens_gap"], numbers["lens_gap_free"]):
        assert gap["pre"]["mean"] == 0.0 and gap["post"]["mean"] == 0.0


def _study(tmp, noise: float = 0.01, **world: float) -> FakeStudy:
    return FakeStudy(tmp, noise, "quick", **{"lens_gap_pre": 0.0, "lens_gap_post": 0.0,
                                             **world})


def _verdicts(result) -> dict[str, str]:
    return {p["subject"]: p["verdict"] for p in result.predictions}


def test_a_gap_only_through_the_trained_norm_does_not_support_the_claim(tmp_path):
    """Raw loses 1 nat against the trained final norm but gains 0.3 against a norm without
    parameters: the norm's trained gain and bias, not the normalization, made the gap."""
    result = c13.measure(_study(tmp_path, lens_gap_pre=1.0, lens_free_gap_pre=-0.3))
    assert _verdicts(result) == {"pre": "not supported", "pre, trained final norm": "supported",
                                 "pre vs post": "not supported"}
    assert result.verdict == "not supported"
    roles = {p["subject"]: p["role"] for p in result.predictions}
    assert roles == {"pre": "claim", "pre, trained final norm": "diagnostic",
                     "pre vs post": "diagnostic"}


def test_the_normalization_alone_decides_whatever_the_trained_norm_does(tmp_path):
    result = c13.measure(_study(tmp_path, lens_gap_pre=-1.0, lens_free_gap_pre=0.5))
    assert _verdicts(result)["pre"] == "supported"
    assert _verdicts(result)["pre, trained final norm"] == "not supported"
    assert result.verdict == "supported"


def test_post_s_gap_is_reported_beside_pre_s_and_their_difference_per_seed(tmp_path):
    result = c13.measure(_study(tmp_path, 0.0, lens_free_gap_pre=0.5, lens_free_gap_post=0.2))
    free = result.numbers["lens_gap_free"]
    assert free["pre"]["mean"] == pytest.approx(0.5) and free["post"]["mean"] == pytest.approx(0.2)
    assert free["post"]["n"] == SEEDS
    contrast = next(p for p in result.predictions if p["subject"] == "pre vs post")
    assert contrast["values"] == pytest.approx([0.3] * SEEDS)
    # post's gap as large as pre's: the contrast fails, the claim (pre's own gap) stands
    same = c13.measure(_study(tmp_path, lens_free_gap_pre=0.5, lens_free_gap_post=0.8))
    assert _verdicts(same)["pre vs post"] == "not supported" and same.verdict == "supported"


class _Before(FakeStudy):
    """Probes recorded before `lens_free` was measured."""

    def trained_probes(self) -> ProbedPair:
        out = super().trained_probes()
        for p in ("pre", "post"):
            for s in out.seeds[p]:
                del s.per_block["lens_free"]
        return out


def test_probes_without_lens_free_leave_the_claim_undecided_and_say_why(tmp_path):
    ctx = _Before(tmp_path, 0.01, "quick", lens_gap_pre=1.0, lens_gap_post=0.0)
    result = c13.measure(ctx)
    assert _verdicts(result)["pre"] == "inconclusive"
    assert _verdicts(result)["pre, trained final norm"] == "supported"
    assert result.verdict == "inconclusive"
    assert "probe them again" in result.note
    assert result.numbers["lens_gap_free"]["pre"]["n"] == 0
