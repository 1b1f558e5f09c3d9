"""Tests of C6a (At a common peak lr, Post-LN needs warmup and Pre-LN does not) and C6b (Pre-LN
needs no warmup even at its own best lr; Post-LN does):
normlab/study/claims/c06a_warmup_common_lr.py, normlab/study/claims/c06b_warmup_own_lr.py, on the
planted study (tests/fake_study.py) and on what it measures.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from fake_study import SEEDS, FakeStudy
from planted_runs import C6_GOOD, C6B_GOOD, CLAIMS, check_each_prediction, roles, verdicts

from normlab.study.claims.c06a_warmup_common_lr import common_lrs
from normlab.study.context import RunRecord, TunedGrid


def test_c6a_every_prediction_at_every_common_lr(tmp_path):
    # the premise (a common lr where post needs warmup), then per lr: post's cost (reported;
    # above the 0.02 margin it makes the lr one the claim is decided at), pre's cost
    # non-inferior at 0.02, pre without - post with non-inferior at 0.02; post's tuned lr (2e-3
    # here: post's lowest loss) comes first
    good = C6_GOOD | {"best_lr_post": 2e-3}  # post's tuned lr, whatever a break plants
    result = CLAIMS["C6a"](FakeStudy(tmp_path, **good))
    assert verdicts(result) == ["supported"] * 7 and result.verdict == "supported"
    assert roles(result) == ["premise"] + ["diagnostic", "claim", "claim"] * 2
    assert [p["subject"] for p in result.predictions][:2] == [
        "post needs warmup at a common lr", "post, lr 0.002 (post's tuned)"]
    assert all(p["threshold_source"].startswith("Xiong") for p in result.predictions)
    assert [p["kind"] for p in result.predictions] == ["setting"] + [
        "direction", "non_inferiority", "non_inferiority"] * 2
    assert result.numbers["decided_lrs"] == [2e-3, 1e-3]
    claim_rows = [2, 3, 5, 6]
    for k, change in zip(claim_rows, [{"val_pre@0.002": 2.0}, {"val_post@0.002": 2.0},
                                      {"val_pre@0.001": 2.0}, {"val_post@0.001": 2.0}],
                         strict=True):
        broken = CLAIMS["C6a"](FakeStudy(tmp_path, **(good | change)))
        assert roles(broken) == roles(result), change
        assert verdicts(broken) == ["not supported" if i == k else "supported"
                                    for i in range(7)], (change, broken.predictions)
        assert broken.verdict == "not supported"


# post's cost of dropping warmup 0.005 nats: below the 0.02 margin, nothing needs warmup
_NO_NEED = {"val_post": 2.2, "val_post_nowarmup": 2.205, "best_lr_post": 2e-3}


def test_c6a_is_not_decided_where_post_needs_no_warmup(tmp_path):
    # pre without warmup 0.09 worse than post with it at every lr, the refutation the old rule
    # read: here post's own cost is below the margin everywhere, so it is not about warmup
    world = _NO_NEED | {"val_pre": 2.3, "val_pre_nowarmup": 2.29}
    result = CLAIMS["C6a"](FakeStudy(tmp_path, noise=0.002, **world))
    premise = result.predictions[0]
    assert (premise["subject"], premise["role"], premise["verdict"]) == (
        "post needs warmup at a common lr", "premise", "not supported")
    assert result.verdict == "inconclusive" and result.numbers["decided_lrs"] == []
    assert [p["role"] for p in result.predictions if p["role"] == "claim"] == []
    vs = [p for p in result.predictions if p["subject"].startswith("pre without")]
    assert [p["verdict"] for p in vs] == ["not supported"] * 2  # reported, not deciding
    assert all(p["subject"].endswith(", post not shown to need warmup") for p in vs)
    assert "Not decided at 0.002, 0.001: post's cost of dropping warmup there" in result.note
    assert "(post needs warmup at a common lr does not hold)" in result.note
    # post's cost at the line (0.02 [about 0.018, 0.022]): not shown to exceed it, not decided
    at_line = CLAIMS["C6a"](FakeStudy(tmp_path, noise=0.002, **(
        world | {"val_post_nowarmup": 2.22})))
    assert at_line.predictions[1]["verdict"] == "inconclusive"
    assert at_line.verdict == "inconclusive" and at_line.numbers["decided_lrs"] == []


@pytest.mark.parametrize(("pre", "verdict"), [
    ({}, "supported"),  # pre comparable at the lr where post needs warmup
    ({"val_pre_nowarmup@0.001": 2.29}, "not supported"),  # and 0.09 worse there
    # 0.09 worse only at 2e-3, where post needs no warmup: reported, not deciding
    ({"val_pre_nowarmup@0.002": 2.29}, "supported"),
])
def test_c6a_is_decided_at_the_lr_where_post_needs_warmup(pre, verdict, tmp_path):
    world = _NO_NEED | {"val_post_nowarmup@0.001": 3.0, "val_pre": 2.2,
                        "val_pre_nowarmup": 2.2} | pre
    result = CLAIMS["C6a"](FakeStudy(tmp_path, noise=0.002, **world))
    assert result.numbers["common_lrs"] == [2e-3, 1e-3]
    assert result.numbers["decided_lrs"] == [1e-3]
    assert result.predictions[0]["verdict"] == "supported"
    by_subject = {p["subject"]: p["role"] for p in result.predictions}
    assert by_subject["pre without vs post with warmup, lr 0.001"] == "claim"
    assert by_subject["pre without vs post with warmup, lr 0.002 (post's tuned), post not "
                      "shown to need warmup"] == "diagnostic"
    assert result.verdict == verdict, result.predictions
    assert "Not decided at 0.002:" in result.note


@pytest.mark.parametrize(("pre_cost", "vs", "expected"), [
    (0.0, 0.0, ["supported", "supported"]),  # equivalent: no cost, no difference
    (0.01, 0.01, ["supported", "supported"]),  # worse, but within the 0.02 margin
    (0.05, 0.0, ["not supported", "supported"]),  # pre's cost beyond the margin
    (0.0, 0.05, ["supported", "not supported"]),  # pre without worse than post with
])
def test_c6a_pre_is_non_inferior_at_the_margin(pre_cost, vs, expected, tmp_path):
    # post with warmup at 2.2, pre with warmup at 2.2 + vs - pre_cost, pre without at
    # 2.2 + vs: pre's cost is pre_cost, pre without - post with is vs
    world = {"val_post": 2.2, "val_post_nowarmup": 3.0, "val_pre": 2.2 + vs - pre_cost,
             "val_pre_nowarmup": 2.2 + vs, "best_lr_post": 2e-3}
    result = CLAIMS["C6a"](FakeStudy(tmp_path, noise=0.002, **world))
    got = [v for p, v in zip(result.predictions, verdicts(result), strict=True)
           if p["kind"] == "non_inferiority"]
    assert got == expected * 2, [(p["subject"], p["effect"]) for p in result.predictions]
    assert result.verdict == ("supported" if expected == ["supported"] * 2 else "not supported")
    pre = result.predictions[2]
    assert pre["subject"].startswith("pre, lr 0.002")
    assert pre["effect"]["expected"] == "< 0.02" and "margin 0.02" in pre["rule"]


def test_c6a_opposite_and_noise(tmp_path):
    # post needs warmup, pre without it ends 0.8 worse: refuted
    opposite = {"val_post": 2.2, "val_post_nowarmup": 3.0, "val_pre": 2.2,
                "val_pre_nowarmup": 3.0}
    assert CLAIMS["C6a"](FakeStudy(tmp_path, **opposite)).verdict == "not supported"
    # post better without warmup: no lr where it needs warmup, so nothing is decided
    reversed_ = {"val_post": 2.2, "val_post_nowarmup": 2.1, "val_pre": 2.2,
                 "val_pre_nowarmup": 3.0}
    assert CLAIMS["C6a"](FakeStudy(tmp_path, **reversed_)).verdict == "inconclusive"
    noisy = CLAIMS["C6a"](FakeStudy(tmp_path, noise=3.0, **C6_GOOD))
    assert noisy.verdict == "inconclusive" and "too few seeds" in noisy.diagnosis


def test_c6a_compares_only_where_both_placements_train():
    ok = (RunRecord("ok", 0, "completed", 2.0, False),)
    bad = (RunRecord("bad", 0, "diverged", 5.5, True),)
    pre = TunedGrid("pre", 100, (1e-3, 2e-3, 4e-3), {1e-3: ok, 2e-3: ok, 4e-3: bad}, 4e-3, False)
    post = TunedGrid("post", 100, (5e-4, 1e-3, 2e-3, 4e-3),
                     {1e-3: ok, 2e-3: ok, 4e-3: ok, 5e-4: ok}, 2e-3, True)
    assert common_lrs(pre, post) == [0.002, 0.001]  # post's tuned first; 4e-3 failed for pre


# post without warmup diverges at its best lr with warmup (2e-3) and trains at 1e-3
_POST_TRAINS_BELOW = {"best_lr_post": 2e-3, "fails_post_nowarmup": 0,
                      "fails_post_nowarmup@0.002": 5}


def test_c6b_every_prediction(tmp_path):
    check_each_prediction("C6b", C6B_GOOD, [
        {"fails_post_nowarmup": 0},  # post trains without warmup (and ends worse)
        # pre's best cell without warmup 0.1 worse than its best with (the fake's grid made to
        # pick 1e-3 over a better 2e-3: only then can pre's best over lr fail alone, as the
        # best over lr is never worse than the cell at pre's best lr)
        {"best_lr_pre": 2e-3, "best_lr_pre_nowarmup": 1e-3, "val_pre_nowarmup@0.001": 2.3},
        # pre trained from the start at its best lr with warmup (2e-3) 0.1 worse than with
        # warmup there, its best without warmup (1e-3) still comparable
        {"best_lr_pre": 2e-3, "val_pre_nowarmup@0.002": 2.3},
        # post's own best without warmup (1e-3) beats its best with: its cost (-0.2) below
        # pre's (-0.1), though it diverges at its best lr
        _POST_TRAINS_BELOW | {"val_post_nowarmup@0.001": 2.0},
    ], tmp_path, diagnostics=[
        # post's cost -0.1 (< 0), above pre's -0.3: the claim holds, the diagnostic does not
        _POST_TRAINS_BELOW | {"val_post_nowarmup@0.001": 2.1, "val_pre_nowarmup": 1.9},
    ])


@pytest.mark.parametrize(("world", "verdict"), [
    ({"fails_post_nowarmup": 5}, "supported"),  # every seed diverged
    ({"fails_post_nowarmup": 0}, "not supported"),  # none did
    ({"fails_post_nowarmup": 3}, "inconclusive"),  # 3 of 5: Wilson [0.23, 0.88] holds 1/2
    # read at post's own best lr with warmup, not wherever it diverges
    (_POST_TRAINS_BELOW, "supported"),
    (_POST_TRAINS_BELOW | {"best_lr_post": 1e-3}, "not supported"),
])
def test_c6b_post_diverges_is_a_failure_rate_at_post_s_best_lr(world, verdict, tmp_path):
    result = CLAIMS["C6b"](FakeStudy(tmp_path, **(C6_GOOD | world)))
    rate = result.predictions[0]
    assert (rate["subject"], rate["kind"], rate["role"]) == ("post diverges", "failure_rate",
                                                             "claim")
    assert rate["verdict"] == verdict, rate["effect"]
    best = result.numbers["post_without_warmup_at_its_best_lr"]
    assert best["lr"] == result.numbers["tuning_with_warmup"]["post"]["best_lr"]
    assert rate["effect"]["estimate"] == best["outcomes"].count("diverged") / SEEDS
    if verdict == "not supported":
        assert result.verdict == "not supported"
    if verdict == "inconclusive":
        assert result.verdict == "inconclusive" and "3 of 5 seeds failed" in rate["diagnosis"]


@pytest.mark.parametrize(("cost", "verdict"), [(0.0, "supported"), (0.01, "supported"),
                                                (0.05, "not supported")])
def test_c6b_pre_is_non_inferior_at_the_margin(cost, verdict, tmp_path):
    # equivalent (0), worse within the margin (0.01), worse beyond it (0.05)
    world = C6B_GOOD | {"val_pre_nowarmup": 2.2 + cost}
    result = CLAIMS["C6b"](FakeStudy(tmp_path, noise=0.002, **world))
    pre = result.predictions[1]
    assert (pre["subject"], pre["kind"]) == ("pre", "non_inferiority")
    assert pre["verdict"] == verdict, pre["effect"]
    assert result.verdict == verdict


def test_c6b_tunes_each_placement_without_warmup_on_its_own_grid(tmp_path):
    ctx = FakeStudy(tmp_path, **C6B_GOOD)
    CLAIMS["C6b"](ctx)
    assert {("pre", 0), ("post", 0), ("pre", ctx.profile.warmup),
            ("post", ctx.profile.warmup)} <= set(ctx.tuned_calls)
    # noise decides no rule, but for chance: each of pre's two non-inferiority rows is decided
    # in about 2.5% of draws each way, so about 90% of the noisy world's draws stay undecided
    noisy = [CLAIMS["C6b"](FakeStudy(tmp_path, noise=3.0, seed=k, **C6B_GOOD)).verdict
             for k in range(40)]
    assert noisy.count("inconclusive") >= 32, noisy


@pytest.mark.parametrize(("cost", "verdict"), [
    (0.0, "supported"), (0.01, "supported"),  # comparable: within the 0.02 margin
    (0.05, "not supported"),  # beyond it
    (math.log(256) - 2.2, "not supported"),  # every seed diverged at that lr
])
def test_c6b_pre_trains_at_its_best_lr_from_the_start(cost, verdict, tmp_path):
    """'Can train with large learning rates from the start': pre without warmup at the lr it
    is tuned to with warmup, against pre with warmup there, non-inferior at 0.02 nats; a worse
    cell at another lr does not count."""
    world = C6B_GOOD | {"best_lr_pre": 2e-3, "val_pre_nowarmup@0.002": 2.2 + cost,
                        "val_pre_nowarmup@0.001": 2.2}
    if cost > 1:
        world |= {"fails_pre_nowarmup@0.002": 5}
    result = CLAIMS["C6b"](FakeStudy(tmp_path, noise=0.002, **world))
    row = result.predictions[2]
    assert (row["subject"], row["kind"], row["role"]) == (
        "pre at its best lr (0.002)", "non_inferiority", "claim")
    assert row["verdict"] == verdict, row["effect"]
    assert result.predictions[1]["verdict"] == "supported"  # the best over lr: comparable
    assert result.verdict == verdict
    at = result.numbers["pre_without_warmup_at_its_best_lr"]
    assert at["lr"] == result.numbers["tuning_with_warmup"]["pre"]["best_lr"] == 2e-3
    assert at["cost"]["mean"] == pytest.approx(row["effect"]["estimate"])
    # 0.1 worse without warmup only at 1e-3, not pre's best lr: not what the row reads
    other = CLAIMS["C6b"](FakeStudy(tmp_path, noise=0.002, **(
        C6B_GOOD | {"best_lr_pre": 2e-3, "val_pre_nowarmup@0.001": 2.3})))
    assert other.predictions[2]["verdict"] == "supported"


def test_c6a_trains_the_no_warmup_runs_of_both_placements_in_one_go(tmp_path):
    ctx = FakeStudy(tmp_path, noise=0.0, **C6_GOOD)  # post's tuned lr: the first of equals, 1e-3
    CLAIMS["C6a"](ctx)
    assert ctx.prefetched == [[("pre", [1e-3, 2e-3], 0), ("post", [1e-3, 2e-3], 0)]]
    stalled = FakeStudy(tmp_path, **C6_GOOD, stalled_post=1.0)
    CLAIMS["C6a"](stalled)
    assert stalled.prefetched == []


class _NoCommonLr(FakeStudy):
    """Pre's seeds fail at 1e-3, post's at 2e-3: no lr where both trained with warmup."""

    def _records(self, family: str, lr: float, warmup: int) -> list[RunRecord]:
        out = super()._records(family, lr, warmup)
        if warmup and (family, lr) in (("pre", 1e-3), ("post", 2e-3)):
            out[0] = replace(out[0], outcome="diverged", failed=True)
        return out


def test_c6a_says_when_no_lr_of_the_grid_has_both_placements_trained(tmp_path, recorded_words,
                                                                     figure_calls):
    ctx = _NoCommonLr(tmp_path, **C6_GOOD)
    result = CLAIMS["C6a"](ctx)
    assert result.predictions == [] and result.numbers["common_lrs"] == []
    assert result.note == ("No lr of the grid where both placements trained with warmup: no "
                           "common lr to compare at.")
    assert ctx.prefetched == [] and figure_calls == []
    recorded_words("empirical_C6a_no_common_lr", result, figure_calls)
    edge = CLAIMS["C6a"](_NoCommonLr(tmp_path, **C6_GOOD, unbracketed_post=1.0))
    assert edge.note.startswith("Not bracketed: post (best lr ")
    assert edge.note.endswith(" its grid after the profile's extensions, so its tuned loss may "
                              "be lower still. No lr of the grid where both placements trained "
                              "with warmup: no common lr to compare at.")


def test_c6a_says_when_only_its_seed_count_leaves_an_lr_undecided():
    """The quick study's case: post's cost of dropping warmup lies above the margin in every
    seed (+0.38, +0.14, +0.45) while 3 seeds' interval straddles it: too few seeds, said so;
    not said where a seed lies at or below the margin, or where the cost is decided."""
    from normlab.study.claims.c06a_warmup_common_lr import CLAIM, _too_few_seeds

    def gate(values):
        return CLAIM.predict("post, {lr}", values, subject="post, lr 0.0015")

    quick = gate([0.382, 0.137, 0.449])
    assert quick.verdict == "inconclusive"
    said = _too_few_seeds(1.5e-3, quick)
    assert said.startswith(" At lr 0.0015 every seed's cost lies above the margin (+0.382, "
                           "+0.137, +0.449), yet 3 seeds leave the interval too wide")
    assert f"{quick.mde:.3f} nats): too few seeds" in said
    assert _too_few_seeds(1.5e-3, gate([0.382, 0.02, 0.449])) == ""  # a seed at the margin
    assert gate([0.38, 0.40, 0.42]).verdict == "supported"
    assert _too_few_seeds(1.5e-3, gate([0.38, 0.40, 0.42])) == ""


def test_c6a_asks_about_the_seed_count_at_every_undecided_lr(tmp_path, monkeypatch):
    from normlab.study.claims import c06a_warmup_common_lr as c6a

    asked = []
    monkeypatch.setattr(c6a, "_too_few_seeds", lambda lr, gate: asked.append(
        (lr, gate.subject)) or f" [said at {lr:g}]")
    result = CLAIMS["C6a"](FakeStudy(tmp_path, noise=0.002, **_NO_NEED))
    assert asked == [(2e-3, "post, lr 0.002 (post's tuned)"), (1e-3, "post, lr 0.001")]
    assert "reported, not decided. [said at 0.002] [said at 0.001]" in result.note
