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
        expected = ["supported"] * 4
        expected[2 + k] = "not supported"
        assert [p["verdict"] for p in result.predictions] == expected, k
        assert [p["role"] for p in result.predictions] == ["premise", "premise", "claim",
                                                           "claim"]
        assert result.verdict == "not supported"


def test_c2_at_6_blocks_is_not_tested_and_unmatched_checkpoints_decide_nothing(tmp_path):
    """'When t is large': the deeper half of a 6-block model starts at block 4, not past block
    6, so the claim is not tested at this scale, whatever its predictions say; checkpoints
    whose losses are not matched leave it undecided, never refuted."""
    world = _fill({"ang_slope_pre": 0.2, "ang_slope_post": -0.3})  # both predictions fail
    shallow = CLAIMS["C2"](FakeStudy(tmp_path, 0.01, "quick", **world))
    premise = shallow.predictions[0]
    assert (premise["subject"], premise["verdict"], premise["values"]) == (
        "large t", "not supported", [4.0])
    assert shallow.verdict == "not tested at this scale"
    assert shallow.needs.startswith("trained pre and post models of 12 blocks or more")
    assert "Not tested at this scale: large t does not hold here" in shallow.note
    assert CLAIMS["C2"](FakeStudy(tmp_path, 0.01, "quick", settings={"train_blocks": 13},
                                  **world)).predictions[0]["values"] == [7.0]
    assert CLAIMS["C2"](FakeStudy(tmp_path, 0.01, "quick", settings={"train_blocks": 11},
                                  **world)).verdict == "not tested at this scale"
    far = {"matched": False, "tolerance": 0.05, "pre_lr": 1e-3, "post_lr": 4e-3,
           "pre_val_loss": 2.2, "post_val_loss": 2.4, "gap": 0.2}
    unmatched = CLAIMS["C2"](_Unmatched(tmp_path, far, drop=False, settings=DEEP,
                                        world=world))
    assert [p["verdict"] for p in unmatched.predictions[:2]] == ["supported", "not supported"]
    assert unmatched.verdict == "inconclusive"
    edge = dict(far, gap=-0.05, post_val_loss=2.15, matched=True)  # |gap| = tolerance: matched
    assert CLAIMS["C2"](_Unmatched(tmp_path, edge, drop=False, settings=DEEP, world=world)
                        ).verdict == "not supported"
    # seeds are the units: cells matched on their means, with one seed 0.12 nats apart, are not
    one_seed = dict(edge, gap=0.03, seed_gaps=[0.0, 0.0, -0.12, 0.05, 0.02])
    split = CLAIMS["C2"](_Unmatched(tmp_path, one_seed, drop=False, settings=DEEP, world=world))
    assert split.predictions[1]["values"] == pytest.approx([0.0, 0.0, 0.12, 0.05, 0.02])
    assert (split.predictions[1]["verdict"], split.verdict) == ("not supported", "inconclusive")
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
