"""Tests of C9 (Post-LN ends better when it trains (shallow models)):
normlab/study/claims/c09_post_ends_better.py, on the planted study (tests/fake_study.py) and on
what it measures.
"""

from __future__ import annotations

import pytest
from fake_study import FakeStudy
from planted_runs import C9_GOOD, CLAIMS, verdicts

from normlab.config import TrainConfig
from normlab.study.profiles import PROFILES
from normlab.study.verdict import NOT_TESTED


def test_c9_every_same_init_pairing(tmp_path):
    # the claim: post strictly better, pre - post > 0 (both Xavier); diagnostics: post at least
    # as good (non-inferior at 0.02, implied by the claim, so never broken alone), and the
    # GPT-2-scaled pairing
    result = CLAIMS["C9"](FakeStudy(tmp_path, 0.002, **C9_GOOD))
    assert [(p["subject"], p["role"], p["kind"]) for p in result.predictions] == [
        ("trained near convergence", "premise", "direction"),
        ("post better (both Xavier)", "claim", "direction"),
        ("post vs pre (both Xavier)", "diagnostic", "non_inferiority"),
        ("post vs pre (both GPT-2 scaled)", "diagnostic", "non_inferiority")]
    assert verdicts(result) == ["supported"] * 4 and result.verdict == "supported"
    worse = CLAIMS["C9"](FakeStudy(tmp_path, 0.002, **(C9_GOOD | {"val_pre_xavier_wsd": 2.1})))
    assert verdicts(worse) == ["supported", "not supported", "not supported", "supported"]
    assert worse.verdict == "not supported" and worse.effect.name == \
        worse.predictions[1]["quantity"]
    gpt2 = CLAIMS["C9"](FakeStudy(tmp_path, 0.002, **(C9_GOOD | {"val_post_gpt2_wsd": 2.4})))
    assert verdicts(gpt2) == ["supported"] * 3 + ["not supported"]
    assert gpt2.verdict == "supported"


@pytest.mark.parametrize(("post", "claim", "secondary", "verdict"), [
    (2.3, "inconclusive", "supported", "inconclusive"),  # a tie: at least as good, not better
    (2.31, "not supported", "supported", "not supported"),  # 0.01 worse: within the margin
    (2.2, "supported", "supported", "supported"),  # post clearly better
])
def test_c9_a_tie_does_not_support_post_better(post, claim, secondary, verdict, tmp_path):
    """B2T's 'outperforms' and the seed's 'ends better' are strict: a tie passes the
    non-inferiority row and leaves the claim undecided; post slightly worse but within the
    margin refutes the claim, though 'at least as good' still holds."""
    result = CLAIMS["C9"](FakeStudy(tmp_path, 0.002, **(C9_GOOD | {"val_post_wsd": post})))
    assert [p["verdict"] for p in result.predictions[1:3]] == [claim, secondary]
    assert result.verdict == verdict


def test_c9_is_not_tested_at_this_scale_when_the_runs_still_improve(tmp_path):
    # either side still falling in its stable phase
    for late in ({"stable_post_wsd": 0.1}, {"stable_pre_xavier_wsd": 0.1}):
        result = CLAIMS["C9"](FakeStudy(tmp_path, **C9_GOOD, **late))
        premise = result.predictions[0]
        assert (premise["subject"], premise["role"], premise["scale"]) == (
            "trained near convergence", "premise", True)
        assert premise["verdict"] == "not supported" and result.verdict == NOT_TESTED
        assert result.effect.name == premise["quantity"]  # the premise is what it rests on
        assert result.needs.startswith("runs trained near convergence")
        assert "Not tested at this scale: trained near convergence does not hold" in \
            result.note
        # the claim's own predictions are reported, not decided: a refuting world is no
        # different
        refuted = CLAIMS["C9"](FakeStudy(tmp_path, **(C9_GOOD | late
                                                       | {"val_pre_xavier_wsd": 2.1})))
        assert refuted.predictions[1]["verdict"] == "not supported"
        assert refuted.verdict == NOT_TESTED
    at_line = CLAIMS["C9"](FakeStudy(tmp_path, **C9_GOOD, stable_post_wsd=0.02))
    assert at_line.predictions[0]["verdict"] == "inconclusive"
    assert at_line.verdict == "inconclusive" and at_line.needs == ""
    assert "(trained near convergence is not decided)" in at_line.note
    near = CLAIMS["C9"](FakeStudy(tmp_path, **C9_GOOD))
    assert near.verdict == "supported" and near.needs == ""


def test_c9_s_gpt2_scaled_pairing_never_decides(tmp_path):
    subjects = ["trained near convergence", "post better (both Xavier)",
                "post vs pre (both Xavier)", "post vs pre (both GPT-2 scaled)"]
    for gpt2, verdict in ((2.4, "not supported"), (2.2, "supported")):
        for xavier, claim in ((2.3, "supported"), (2.1, "not supported")):
            world = C9_GOOD | {"val_post_gpt2_wsd": gpt2, "val_pre_xavier_wsd": xavier}
            result = CLAIMS["C9"](FakeStudy(tmp_path, **world))
            assert [p["subject"] for p in result.predictions] == subjects
            assert result.predictions[3]["role"] == "diagnostic"
            assert result.predictions[3]["verdict"] == verdict
            assert result.verdict == claim, (gpt2, xavier)
            assert "GPT-2 scaled" not in result.rule


def test_c9_paper_inits_are_context_and_crossed_families_are_tuned(tmp_path):
    # pre beats post only at the paper inits (two things differ): not what C9 decides
    world = C9_GOOD | {"val_pre_wsd": 2.3, "val_post_wsd": 2.2, "val_post_gpt2_wsd": 2.25}
    ctx = FakeStudy(tmp_path, **world)
    result = CLAIMS["C9"](ctx)
    assert [(p["subject"], p["role"]) for p in result.predictions] == [
        ("trained near convergence", "premise"), ("post better (both Xavier)", "claim"),
        ("post vs pre (both Xavier)", "diagnostic"),
        ("post vs pre (both GPT-2 scaled)", "diagnostic")]
    assert "paper_inits_context" in result.numbers
    families = {f for f, _ in ctx.tuned_calls}
    assert {"pre_xavier_wsd", "post_gpt2_wsd"} <= families  # tuned on their own grids
    quick = CLAIMS["C9"](FakeStudy(tmp_path, profile="quick", **C9_GOOD))
    assert [p["subject"] for p in quick.predictions] == [
        "trained near convergence", "post better (both Xavier)", "post vs pre (both Xavier)"]
    assert quick.verdict == "supported"
    assert CLAIMS["C9"](FakeStudy(tmp_path, **{k: 4.5 - v for k, v in C9_GOOD.items()})
                        ).verdict == "not supported"
    assert CLAIMS["C9"](FakeStudy(tmp_path, noise=3.0, **C9_GOOD)).verdict == "inconclusive"


def test_c9_is_not_tested_where_the_profile_trains_no_pair_under_the_source_s_init(tmp_path):
    """A profile whose same_inits leave out "xavier" (the long profile: none) trains nothing for
    C9 and says it is not tested at this scale, with the smallest design that would decide it."""
    from normlab.study.claims.c09_post_ends_better import CLAIM as C9

    for settings in ({"same_inits": ()}, {"same_inits": ("gpt2_scaled",)}):
        ctx = FakeStudy(tmp_path, settings=settings, **C9_GOOD)
        result = CLAIMS["C9"](ctx)
        assert ctx.tuned_calls == [] and ctx.prefetched == [] and ctx.requests == []
        assert [(p["subject"], p["role"], p["scale"], p["kind"], p["verdict"])
                for p in result.predictions] == [
            ("source's pairing trained", "premise", True, "setting", "not supported")]
        assert result.verdict == NOT_TESTED and result.needs == C9.needs
        assert result.effect.name == result.predictions[0]["quantity"]
        assert ("Not tested at this scale: source's pairing trained does not hold here, so "
                "the claim's own predictions are not measured. It needs runs trained near "
                "convergence") in result.note
        assert "C9 trains nothing here" in result.method
    # the needs say the design and its time on this CPU and on one GPU
    assert "16,000 steps" in C9.needs and "2.5 h on this 2-core CPU" in C9.needs
    assert "20 min on one GPU" in C9.needs
    long = CLAIMS["C9"](FakeStudy(tmp_path, profile="long", **C9_GOOD))
    assert long.verdict == NOT_TESTED and long.numbers["same_inits"] == []
    # where the pairing is trained, the premise is not reported (the claim's own are)
    assert "source's pairing trained" not in [
        p["subject"] for p in CLAIMS["C9"](FakeStudy(tmp_path, **C9_GOOD)).predictions]


def test_c9_s_premise_is_read_at_the_end_of_the_stable_phase_not_after_the_anneal(tmp_path):
    """Under wsd the final decay lowers the loss whether or not the run converged: the premise
    reads the quarter of the run before the decay. Planted: the last quarter of the run still
    falls 0.1 (the anneal), the stable phase has stopped falling: near convergence, and the
    claim decided; the stable phase still falling: not tested at this scale."""
    from normlab.train.schedules import stable_end

    p = PROFILES["standard"]
    annealed = {"late_post_wsd": 0.1, "late_pre_xavier_wsd": 0.1}
    ctx = FakeStudy(tmp_path, **C9_GOOD, **annealed)
    result = CLAIMS["C9"](ctx)
    assert result.predictions[0]["verdict"] == "supported" and result.verdict == "supported"
    end = stable_end(TrainConfig(steps=p.steps, schedule="wsd"))
    assert end == p.steps - round(0.2 * p.steps) == 320
    assert [r for r in ctx.requests if r["kind"] == "late"] == [
        {"kind": "late", "frac": 0.25, "end": end, "steps": None}] * 2
    assert result.numbers["schedule"] == {"name": "wsd", "decay_frac": 0.2,
                                          "stable_end_step": 320, "steps": p.steps,
                                          "premise_window": [220.0, 320]}
    still = CLAIMS["C9"](FakeStudy(tmp_path, **C9_GOOD, stable_post_wsd=0.05))
    assert still.predictions[0]["verdict"] == "not supported" and still.verdict == NOT_TESTED
    assert {f for f, _w in ctx.tuned_calls} == {"pre_xavier_wsd", "post_wsd", "pre_wsd",
                                                "post_gpt2_wsd"}


def test_c9_s_families_train_under_wsd_and_only_the_pairings_the_profile_names(tmp_path):
    from normlab.study.experiments import FAMILY_TRAIN, StudyFolder

    for profile, families in (("quick", {"pre_xavier_wsd", "post_wsd"}),
                              ("standard", {"pre_xavier_wsd", "post_wsd", "pre_wsd",
                                            "post_gpt2_wsd"}),
                              ("gpu", {"pre_xavier_wsd", "post_wsd"}), ("long", set())):
        ctx = StudyFolder(tmp_path / profile, PROFILES[profile], lambda m: None,
                          claims=["C9"])
        assert {f for f, _w in ctx.tuned_specs()} == families, profile
    ctx = StudyFolder(tmp_path / "q", PROFILES["quick"], lambda m: None, claims=["C9"])
    cfg = ctx.family_config("post_wsd", 1e-3, 60, 0)
    assert cfg.train.schedule == "wsd" and cfg.model.placement == "post"
    assert ctx.family_config("post", 1e-3, 60, 0).train.schedule == "cosine"
    assert ctx.family_config("pre_xavier_wsd", 1e-3, 60, 0).model.init == "xavier"
    assert set(FAMILY_TRAIN) == {"pre_wsd", "post_wsd", "pre_xavier_wsd", "post_gpt2_wsd"}


def test_c9_in_the_long_profile_s_study_folder_trains_nothing(tmp_path, monkeypatch):
    from normlab.study.experiments import StudyFolder

    ctx = StudyFolder(tmp_path, PROFILES["long"], lambda m: None, claims=["C9"])
    monkeypatch.setattr(ctx, "train", lambda configs: pytest.fail("C9 trained runs"))
    result = CLAIMS["C9"](ctx)
    assert result.verdict == NOT_TESTED and result.needs
    assert not (tmp_path / "runs").exists()
