"""Tests of C2 (Pre-Norm's consecutive blocks become near-identical):
normlab/study/claims/c02_angular_distance.py, on the planted study (tests/fake_study.py) and on
what it measures.
"""

from __future__ import annotations

import pytest
from fake_study import FakeStudy
from planted_probes import CLAIMS, DEEP, _fill, _study, _Unmatched

from normlab.study.context import ProbedPair


def test_c2_breaks_each_claim_prediction_in_turn(tmp_path):
    # [pre's slope < 0, late(post) - late(pre) > 0]: pre's angles rising, post's rising more;
    # then pre's falling, post's falling more
    for k, slopes in enumerate([{"ang_slope_pre": 0.2, "ang_slope_post": 0.5},
                                {"ang_slope_pre": -0.2, "ang_slope_post": -0.5}]):
        result = CLAIMS["C2"](_study("C2", tmp_path, 0.01, **_fill(slopes)))
        expected = ["supported"] * 3
        expected[1 + k] = "not supported"
        assert [p["verdict"] for p in result.predictions][:3] == expected, k
        assert [p["role"] for p in result.predictions] == ["premise", "claim", "claim",
                                                           "diagnostic", "diagnostic"]
        assert result.verdict == "not supported"


def test_c2_reports_curse_of_depth_s_level_without_deciding_on_it(tmp_path):
    """Pre's deeper half against Curse of Depth's 0.2: a level in 30-layer LLMs, reported."""
    world = _fill({"ang_slope_pre": -0.2, "ang_slope_post": 0.1})
    high = CLAIMS["C2"](_study("C2", tmp_path, 0.01, **world))  # pre's deep half about 0.3
    low = CLAIMS["C2"](_study("C2", tmp_path, 0.01, **world, ang_level_pre=0.2))  # about 0.1
    for result, verdict in ((high, "not supported"), (low, "supported")):
        level = result.predictions[3]
        assert (level["subject"], level["role"], level["verdict"]) == (
            "pre, deeper half", "diagnostic", verdict)
        assert level["threshold_source"].startswith("Curse of Depth")
        assert result.verdict == "supported"  # the level never decides


def test_c2_is_decided_at_any_depth_and_unmatched_checkpoints_decide_nothing(tmp_path):
    """No premise about depth: the seed's mechanism predicts both directions at every depth,
    graded, so a 6-block model decides C2 (refuted here, both directions failing); checkpoints
    whose losses are not matched leave it undecided, never refuted."""
    world = _fill({"ang_slope_pre": 0.2, "ang_slope_post": -0.3})  # both predictions fail
    shallow = CLAIMS["C2"](FakeStudy(tmp_path, 0.01, "quick", **world))
    assert [p["subject"] for p in shallow.predictions] == [
        "matched loss", "pre", "post vs pre", "pre, deeper half", "post vs pre, same lr and step"]
    assert shallow.verdict == "not supported" and not shallow.needs
    far = {"matched": False, "tolerance": 0.05, "pre_lr": 1e-3, "post_lr": 4e-3,
           "pre_val_loss": 2.2, "post_val_loss": 2.4, "gap": 0.2}
    unmatched = CLAIMS["C2"](_Unmatched(tmp_path, far, drop=False, settings=DEEP,
                                        world=world))
    assert unmatched.predictions[0]["verdict"] == "not supported"
    assert unmatched.verdict == "inconclusive"
    edge = dict(far, gap=-0.05, post_val_loss=2.15, matched=True)  # |gap| = tolerance: matched
    assert CLAIMS["C2"](_Unmatched(tmp_path, edge, drop=False, settings=DEEP, world=world)
                        ).verdict == "not supported"
    # seeds are the units: cells matched on their means, with one seed 0.12 nats apart, are not
    one_seed = dict(edge, gap=0.03, seed_gaps=[0.0, 0.0, -0.12, 0.05, 0.02])
    split = CLAIMS["C2"](_Unmatched(tmp_path, one_seed, drop=False, settings=DEEP, world=world))
    assert split.predictions[0]["values"] == pytest.approx([0.0, 0.0, 0.12, 0.05, 0.02])
    assert (split.predictions[0]["verdict"], split.verdict) == ("not supported", "inconclusive")
    every = dict(one_seed, seed_gaps=[0.0, 0.01, -0.05, 0.05, 0.02])
    assert CLAIMS["C2"](_Unmatched(tmp_path, every, drop=False, settings=DEEP, world=world)
                        ).verdict == "not supported"


def test_c2_reports_trained_minus_each_runs_own_init(tmp_path):
    # post's planted trained distances are 0.4 on every late block; its models at step 0: 0.3
    result = CLAIMS["C2"](FakeStudy(tmp_path, 0.0, "quick", **_fill({})))
    change = result.numbers["late_angle_trained_minus_init"]
    assert change["post"]["mean"] == pytest.approx(0.1, abs=1e-9)
    assert result.numbers["late_angle_init"]["post"]["mean"] == pytest.approx(0.3, abs=1e-9)


class _Init(FakeStudy):
    def init_probes(self) -> ProbedPair:
        out = super().init_probes()
        for p in ("pre", "post"):
            for s in out.seeds[p]:
                s.per_block["ang_prev"] = [0.5, 0.1, 0.2, 0.3, 0.4, 0.5]
        return out


def test_c2_reads_the_init_angles_from_block_two_like_the_trained_ones(tmp_path):
    c2 = CLAIMS["C2"](_Init(tmp_path, 0.0, "quick", **_fill({}))).numbers
    # blocks 2..L: 0.1 .. 0.5, deeper half 0.3, 0.4, 0.5
    assert c2["late_angle_init"]["pre"]["mean"] == pytest.approx(0.4)
    assert c2["late_angle_trained_minus_init"]["post"]["mean"] == pytest.approx(0.4 - 0.4)


def test_c2_reports_the_same_lr_same_step_pair_beside_the_matched_one(tmp_path):
    """Pre and post trained at one lr and read at their last step: the contrast there is a
    diagnostic (placements compared, not lrs or stages), with the pair named in the note; it
    never moves the verdict, and without such a pair the note says why."""
    world = _fill({"ang_slope_pre": -0.2, "ang_slope_post": 0.1})
    agree = CLAIMS["C2"](_study("C2", tmp_path, 0.01, **world))
    apart = CLAIMS["C2"](_study("C2", tmp_path, 0.01, **world, same_ang_level_post=0.05))
    none = CLAIMS["C2"](_study("C2", tmp_path, 0.01, **world, no_same_lr=True))
    for result, verdict in ((agree, "supported"), (apart, "not supported")):
        same = result.predictions[-1]
        assert (same["subject"], same["role"], same["verdict"]) == (
            "post vs pre, same lr and step", "diagnostic", verdict)
        assert result.verdict == "supported"
        assert "Same lr and step (a diagnostic)" in result.note and "gap -0.200" in result.note
        assert set(result.numbers["late_angle_same_lr"]) == {"pre", "post"}
    assert not any("same lr" in p["subject"] for p in none.predictions)
    assert none.verdict == "supported" and "No same-lr pair: no lr of both grids" in none.note
