"""Tests of C10 (Post-LN transfers better after fine-tuning): normlab/study/claims/c10_transfer.py,
on the planted study (tests/fake_study.py) and on what it measures.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
from fake_study import SEEDS, FakeStudy
from planted_checkpoints import _ctx, _planted_ctx, _pretrained
from planted_runs import C10_GOOD, MAJORITY, _acc, roles, verdicts

from normlab.study.claims import c10_transfer, with_settings
from normlab.study.claims.c10_transfer import CLAIM as C10
from normlab.study.claims.c10_transfer import c10_predictions
from normlab.study.claims.common import make_claim, matched_pairs
from normlab.study.profiles import PROFILES
from normlab.study.schema import Pretrained
from normlab.study.verdict import NOT_TESTED


def _c10(accuracy: dict[str, dict[str, list[float]]] | None = None, **v: float):
    preds = c10_predictions(accuracy or _acc(random.Random(1), **v), MAJORITY)
    return make_claim("C10", "t", "s", "src", "m", preds, "paper", {}, [], needs=C10.needs)


def test_c10_every_prediction_and_premises_never_refute():
    assert verdicts(_c10(**C10_GOOD)) == ["supported"] * 5
    assert roles(_c10(**C10_GOOD)) == ["diagnostic"] * 2 + ["premise"] * 2 + ["claim"]
    assert _c10(**C10_GOOD).verdict == "supported"
    breaks = [{"scratch_pre": 0.3}, {"scratch_post": 0.3}, {"pretrained_pre": 0.45},
              {"scratch_post": 0.75}, {"pretrained_pre": 0.8}]
    for k, change in enumerate(breaks):
        result = _c10(**(C10_GOOD | change))
        expected = ["supported"] * 5
        expected[k] = "not supported"
        assert verdicts(result) == expected, k
        # learning from init is reported only; a broken transfer premise is about scale: C10
        # is not tested at this scale, never refuted
        assert result.verdict == ("supported" if k < 2 else
                                  "not supported" if k == 4 else NOT_TESTED), k
        if k in (2, 3):
            assert "Not tested at this scale" in result.note and result.needs == C10.needs


def test_c10_learning_from_init_is_reported_and_never_decides():
    # 0.43: above the majority (0.4), but by 0.03, less than the 0.05 that learning means; the
    # source does not presume the task is learned from init, so the claim is still decided
    result = _c10(**(C10_GOOD | {"scratch_pre": 0.43}))
    assert verdicts(result)[0] == "not supported" and result.predictions[0]["effect"][
        "expected"] == "> 0.05"
    assert result.predictions[0]["role"] == "diagnostic" and result.verdict == "supported"
    against = _c10(**(C10_GOOD | {"scratch_pre": 0.43, "pretrained_post": 0.55}))
    assert against.verdict == "not supported"


def test_c10_a_premise_with_no_spread_is_undecided():
    # every pre model scores exactly the same, from init and pretrained (a constant, e.g. one
    # class always): the transfer's interval has zero width, so the premise is not decided,
    # though it lies above 0 (a diagnostic, reported only, is read as it lies)
    accuracy = _acc(random.Random(1), **C10_GOOD)
    accuracy["scratch"]["pre"] = [0.5] * SEEDS
    accuracy["pretrained"]["pre"] = [0.6] * SEEDS
    result = _c10(accuracy)
    assert verdicts(result) == ["supported", "supported", "inconclusive", "supported",
                                "supported"]
    assert "interval of zero width" in result.predictions[2]["diagnosis"]
    assert result.verdict == "inconclusive" and "(pre transfer is not decided)" in \
        result.note


def test_c10_an_arm_at_an_edge_of_its_grid_leaves_the_claim_inconclusive():
    from normlab.study.claims.c10_transfer import unbracketed_is_inconclusive

    def tuned(post_pretrained: bool) -> dict:
        arm = {"best": 1e-3, "scores": {"0.0003": [0.5, -1], "0.001": [0.6, -1],
                                        "0.003": [0.5, -1]}, "extended": [], "bracketed": True}
        edge = arm | {"best": 3e-4, "bracketed": False}
        probe_edge = {p: edge for p in ("pre", "post")}  # diagnostics: named, never deciding
        return {"pretrained": {"pre": arm, "post": arm if post_pretrained else edge},
                "scratch": {"pre": arm, "post": arm}, "probe_pretrained": probe_edge}

    decided = unbracketed_is_inconclusive(_c10(**C10_GOOD), tuned(True))
    assert decided.verdict == "supported" and "Not bracketed" not in decided.note
    for world in (C10_GOOD, C10_GOOD | {"pretrained_post": 0.55}):
        result = unbracketed_is_inconclusive(_c10(**world), tuned(False))
        assert result.verdict == "inconclusive"
        assert "Not bracketed: post pretrained (best lr 0.0003 of [0.0003, 0.001, 0.003])" \
            in result.note and "probe" not in result.note
    short = unbracketed_is_inconclusive(_c10(**(C10_GOOD | {"pretrained_pre": 0.45})),
                                        tuned(False))
    assert short.verdict == NOT_TESTED  # not tested stays so: nothing was decided


def test_c10_with_and_without_transfer():
    opposite = C10_GOOD | {"pretrained_pre": 0.7, "pretrained_post": 0.6}
    assert _c10(**opposite).verdict == "not supported"
    no_transfer = C10_GOOD | {"pretrained_pre": 0.5, "pretrained_post": 0.5}
    result = _c10(**no_transfer)
    assert result.verdict == "inconclusive" and "pre transfer" in result.note


# the frozen linear probe (the long profile): pretrained checkpoints above the same
# architectures at init, post above pre
C10_PROBE = {"probe_pretrained_pre": 0.55, "probe_pretrained_post": 0.6,
             "probe_scratch_pre": 0.45, "probe_scratch_post": 0.45}


PROBE_ARMS = ("pretrained", "scratch", "probe_pretrained", "probe_scratch")


def _c10_probe(**v: float):
    rng = random.Random(1)
    accuracy = {arm: {p: [v[f"{arm}_{p}"] + 0.005 * rng.gauss(0, 1) for _ in range(SEEDS)]
                      for p in ("pre", "post")} for arm in PROBE_ARMS}
    return _c10(accuracy)


def test_c10_s_frozen_probe_is_reported_and_never_decides():
    """The frozen probe measures what the pretrained stream holds, which the source does not
    speak of: its transfer and its post - pre are diagnostics; the fine-tuning decides, either
    way, whatever the probe says."""
    good = _c10_probe(**C10_GOOD, **C10_PROBE)
    assert roles(good) == ["diagnostic"] * 2 + ["premise"] * 2 + ["claim"] + ["diagnostic"] * 3
    assert [p["subject"] for p in good.predictions][5:] == [
        "pre transfer, frozen probe", "post transfer, frozen probe", "post vs pre, frozen probe"]
    assert verdicts(good) == ["supported"] * 8 and good.verdict == "supported"
    breaks = [{"probe_pretrained_pre": 0.4}, {"probe_scratch_post": 0.65},
              {"probe_pretrained_post": 0.5}]
    for k, change in enumerate(breaks):
        result = _c10_probe(**C10_GOOD, **(C10_PROBE | change))
        expected = ["supported"] * 8
        expected[5 + k] = "not supported"
        assert verdicts(result) == expected, k
        assert result.verdict == "supported", k
    # fine-tuned post below pre refutes the claim even where the probe sides with the source
    refuted = _c10_probe(**(C10_GOOD | {"pretrained_pre": 0.7, "pretrained_post": 0.6}),
                         **C10_PROBE)
    assert verdicts(refuted)[7] == "supported" and refuted.verdict == "not supported"
    # and a premise of the fine-tuning that fails leaves it not tested, the probe or not
    short = _c10_probe(**(C10_GOOD | {"pretrained_pre": 0.45}), **C10_PROBE)
    assert short.verdict == NOT_TESTED


def test_c10_pairs_along_trajectories_at_each_placement_s_own_tuned_lr(tmp_path, monkeypatch):
    """With `c10_pairs="trajectories"` C10's checkpoints come from pre and post trained again
    at each one's own tuned lr, keeping their weights `deep_evals` times (the tuned cell's
    model, data and schedule: only evaluations and kept weights differ), paired per seed along
    the trajectories; a pair at or before the warmup is marked so that C10 leaves it out, and a
    seed whose run stalled hands over its outcome."""
    import normlab.study.experiments as ex

    p = with_settings(PROFILES["tiny"], c10_pairs="trajectories", steps=100, deep_evals=4,
                      warmup_frac=0.3, seeds=3)
    ctx = ex.StudyFolder(tmp_path, p, log=lambda _m: None)
    best = {"pre": 4e-3, "post": 1e-3}
    monkeypatch.setattr(ex.StudyFolder, "tuned", lambda self, family, *a, **k: SimpleNamespace(
        best_lr=best[family]))
    seen = []

    def fake_train(self, configs):
        seen.extend(configs)
        return [{"outcome": "stalled" if (c.model.placement, c.train.seed) == ("post", 2)
                 else "completed", "val_loss": 2.0} for c in configs]

    curves = {("pre", 0): [(25, 2.9), (50, 2.7), (75, 2.5), (None, 2.2)],
              ("post", 0): [(25, 3.0), (50, 2.8), (75, 2.52), (None, 2.4)],
              ("pre", 1): [(25, 2.4), (50, 2.1), (None, 2.0)],
              ("post", 1): [(25, 2.41), (50, 2.9), (None, 2.8)]}
    ids = {}
    monkeypatch.setattr(ex.StudyFolder, "train", fake_train)
    monkeypatch.setattr(ex, "trajectory", lambda run_dir: curves[ids[run_dir.name]])
    real_config = ex.StudyFolder.run_config

    def config(self, placement, lr, warmup, seed, *a, **k):
        cfg = real_config(self, placement, lr, warmup, seed, *a, **k)
        ids[cfg.run_id()] = (placement, seed)
        return cfg

    monkeypatch.setattr(ex.StudyFolder, "run_config", config)
    got = c10_transfer.c10_checkpoints(ctx)
    assert {(c.model.placement, c.train.lr, c.train.seed) for c in seen} == {
        (pl, best[pl], s) for pl in ("pre", "post") for s in range(3)}
    for c in seen:
        assert c.train.keep_checkpoints and c.train.eval_every == 25
        assert c.train.steps == 100 and c.train.warmup == p.warmup == 30
        plain = ex.StudyFolder.run_config(ctx, c.model.placement, c.train.lr, p.warmup,
                                          c.train.seed)
        assert c.model == plain.model and c.data == plain.data
        assert (c.train.lr, c.train.warmup, c.train.steps, c.train.batch_size) == (
            plain.train.lr, plain.train.warmup, plain.train.steps, plain.train.batch_size)
    by = {(c.placement, c.seed): c for c in got}
    assert (by["pre", 0].step, by["post", 0].step) == (75, 75)
    assert by["pre", 0].outcome == by["post", 0].outcome == "completed"
    assert by["pre", 0].val_loss == 2.5 and by["post", 0].val_loss == 2.52
    assert (by["pre", 1].step, by["post", 1].step) == (25, 25)  # matched only inside warmup
    assert by["pre", 1].outcome.startswith("inside warmup")
    assert by["post", 2].outcome == "stalled" and by["post", 2].step is None
    # deep runs keep their settings: the flag only adds what a deep run already has
    deep = ex.StudyFolder.run_config(ctx, "pre", 1e-3, 5, 0, blocks=p.deep_blocks)
    assert ex.StudyFolder.run_config(ctx, "pre", 1e-3, 5, 0, blocks=p.deep_blocks,
                                     trajectory=True).run_id() == deep.run_id()


def test_c10_s_prediction_words_are_the_recorded_ones(recorded_words):
    recorded_words("empirical_C10_predictions", _c10(**C10_GOOD))
    recorded_words("empirical_C10_no_transfer",
                   _c10(**(C10_GOOD | {"pretrained_pre": 0.5, "pretrained_post": 0.5})))
    recorded_words("empirical_C10_from_init_short", _c10(**(C10_GOOD | {"scratch_pre": 0.43})))
    recorded_words("empirical_C10_frozen_probe", _c10_probe(**C10_GOOD, **C10_PROBE))


def test_c10_tunes_the_lr_per_placement_on_validation_and_scores_the_test_set(tiny_pairs,
                                                                              tmp_path):
    from normlab.study.claims.c10_transfer import measure as c10

    ctx = _ctx(tmp_path, finetune_steps=3, finetune_batch_size=4, finetune_test_max=24,
               finetune_val_max=12, finetune_lrs=(1e-3, 3e-3), finetune_lr_extensions=0,
               finetune_train_eval_max=8, finetune_standardize=16, workers=1)
    result = c10(ctx, tiny_pairs)
    n = result.numbers
    assert n["settings"]["passage_bytes"] == 256
    for arm in ("pretrained", "scratch"):
        for p in ("pre", "post"):
            tuned = n["tuned_lr"][arm][p]
            assert len(tuned["scores"]) == 2 + len(tuned["extended"])
            best = f"{tuned['best']:g}"
            runs = n["runs"][arm][p][best]
            assert n["accuracy"][arm][p] == [runs[s]["test_accuracy"] for s in (0, 1)]
            assert all(r["settings"]["window"] == 64 for r in runs.values())  # 4 windows of 64
    # the model from init reads the passages as the pretrained one does, with the same budget
    assert n["runs"]["scratch"]["pre"][best][0]["settings"] == {
        **n["runs"]["pretrained"]["pre"][best][0]["settings"]}
    # 3 steps of fine-tuning show no transfer: the premises are not decided (2 seeds), so
    # nothing is (a premise refuted outright would make it "not tested at this scale")
    assert result.verdict == "inconclusive"
    assert "a premise of the test fails" in result.note
    assert [p["role"] for p in result.predictions] == (["diagnostic"] * 2 + ["premise"] * 2
                                                       + ["claim"])
    assert [p["scale"] for p in result.predictions] == [False] * 2 + [True] * 2 + [False]


def test_c10_s_frozen_probe_on_real_checkpoints_trains_each_lr_it_may_reach_once(tiny_pairs,
                                                                                 tmp_path):
    """With the probe on, every matched checkpoint and its architecture at init get a head on
    their frozen stream at every lr the probe's tuning may reach, in one pass each; the tuning
    then reads those runs (their files are the ones `finetune` reads), trains none more, and
    the probe's rows are diagnostics."""
    import json

    from normlab.study.claims.c10_transfer import lr_candidates
    from normlab.study.claims.c10_transfer import measure as c10

    probe_lrs = (1e-2, 1e-1)
    ctx = _ctx(tmp_path, finetune_steps=3, finetune_batch_size=4, finetune_test_max=24,
               finetune_val_max=12, finetune_lrs=(1e-3,), finetune_lr_extensions=1,
               finetune_train_eval_max=8, finetune_standardize=16, workers=1,
               finetune_probe=True, finetune_probe_lrs=probe_lrs)
    result = c10(ctx, tiny_pairs)
    n = result.numbers
    reach = lr_candidates(probe_lrs, 1)
    assert set(n["accuracy"]) == {"pretrained", "scratch", "probe_pretrained", "probe_scratch"}
    for arm in ("probe_pretrained", "probe_scratch"):
        for p in ("pre", "post"):
            tuned = n["tuned_lr"][arm][p]
            assert {float(k) for k in tuned["scores"]} <= {float(f"{v:g}") for v in reach}
            runs = n["runs"][arm][p][f"{tuned['best']:g}"]
            assert n["accuracy"][arm][p] == [runs[s]["test_accuracy"] for s in (0, 1)]
            assert all(r["settings"]["freeze"] and r["settings"]["window"] == 64
                       for r in runs.values())
    for c in tiny_pairs:  # one frozen run per lr reached, pretrained and at init: no more
        frozen = [json.loads(f.read_text()) for f in (c.run_dir / "finetune").glob("*.json")]
        frozen = [r for r in frozen if r["settings"]["freeze"]]
        assert sorted((r["from_init"], r["settings"]["lr"]) for r in frozen) == sorted(
            (init, lr) for init in (False, True) for lr in reach)
    assert [p["role"] for p in result.predictions] == (["diagnostic"] * 2 + ["premise"] * 2
                                                       + ["claim"] + ["diagnostic"] * 3)
    assert "frozen linear probe" in result.method and "never deciding" in result.method
    assert result.verdict == "inconclusive"  # 3 steps: the fine-tuning's premises undecided


def test_lr_candidates_hold_every_lr_tune_lr_may_ask_for():
    from normlab.study.claims.c10_transfer import lr_candidates, tune_lr

    grid = (1e-3, 1e-2, 1e-1)
    for extensions in (0, 1, 2, 3):
        reach = lr_candidates(grid, extensions)
        assert len(reach) == 3 + 2 * extensions and reach == sorted(reach)
        for score in (lambda lr: (lr, 0.0), lambda lr: (-lr, 0.0),
                      lambda lr: (-abs(math.log(lr / 1e-2)), 0.0)):
            asked: list[float] = []
            tune_lr(lambda lr, f=score, a=asked: a.append(lr) or f(lr), grid, extensions)
            assert set(asked) <= set(reach)  # the same floats, not merely close ones
    assert lr_candidates((1e-3,), 2) == [1e-3]  # one lr: tune_lr extends nothing


def test_tune_lr_extends_the_grid_past_a_winning_edge():
    from normlab.study.claims.c10_transfer import tune_lr

    peak = 0.01  # the score peaks at lr 1e-2, above the grid
    res = tune_lr(lambda lr: (-abs(math.log(lr / peak)), 0.0), (1e-4, 3e-4, 1e-3), 3)
    assert res["extended"] == pytest.approx([3e-3, 9e-3, 2.7e-2]) and res["bracketed"]
    assert res["best"] == pytest.approx(9e-3)
    capped = tune_lr(lambda lr: (lr, 0.0), (1e-4, 1e-3), 1)
    assert capped["extended"] == [pytest.approx(3e-3)] and not capped["bracketed"]


# per arm and placement: the accuracy of seed 0 and its step from seed to seed; the steps differ
# so that every per-seed difference varies (a premise whose values are all the same is not
# decided). The models from init beat the majority (0.4) by 10-16 points, pretraining adds
# 7-20 points, and post ends 10-11.5 points above pre.
C10_PLANTED = {"pretrained": {"pre": (0.6, 0.01), "post": (0.7, 0.015)},
               "scratch": {"pre": (0.5, 0.02), "post": (0.5, 0.02)}}


def _planted_finetune(acc=C10_PLANTED, tuned=None):
    from normlab.study.claims import c10_transfer

    def finetune(ctx, checkpoints, tolerance=None):
        pairs, left_out = matched_pairs(checkpoints, 0.05)
        seeds = sorted(pairs)
        return {"settings": c10_transfer.c10_settings(ctx), "seeds": seeds, "left_out": left_out,
                "tolerance": 0.05, "tuned_lr": tuned or {}, "runs": {},
                "accuracy": {arm: {p: [v + step * k for k in range(len(seeds))]
                                   for p, (v, step) in a.items()} for arm, a in acc.items()},
                "val_loss_pretrained": {}, "baseline": {"test_accuracy": 0.55},
                "chance": 1 / 3, "majority": 0.4}

    return finetune


@pytest.fixture
def planted_c10(monkeypatch):
    """C10 on planted fine-tuning accuracies (no fine-tuning)."""
    from normlab.study.claims import c10_transfer

    monkeypatch.setattr(c10_transfer, "c10_finetune", _planted_finetune())
    return c10_transfer


def test_c10_s_premises_are_about_scale_and_say_what_it_needs(planted_c10, tmp_path,
                                                              monkeypatch):
    """Through `measure`: a pretraining that does not help makes C10 "not tested at this scale"
    with the claim's `needs`, never "not supported"; models from init that do not beat the
    majority by 5 points are reported and decide nothing; with every premise holding, post
    below pre refutes, and an arm tuned at an edge of its grid leaves the claim inconclusive."""
    ctx = _planted_ctx(tmp_path)

    def run(**change):
        acc = {arm: dict(a) for arm, a in C10_PLANTED.items()}
        for key, value in change.items():
            arm, p = key.split("_")
            acc[arm][p] = value
        monkeypatch.setattr(planted_c10, "c10_finetune", _planted_finetune(acc))
        return planted_c10.measure(ctx, _pretrained())

    assert run().verdict == "supported" and run().needs == ""
    # 3 points above the majority (and every seed within 3.6): it learns, but not by 5 points
    weak = run(scratch_pre=(0.43, 0.002))
    assert weak.verdict == "supported" and weak.needs == ""
    from_init = {p["subject"]: p for p in weak.predictions}["pre from init"]
    assert from_init["verdict"] == "not supported" and from_init["role"] == "diagnostic"
    # pretraining hurts post: no transfer to compare
    hurt = run(pretrained_post=(0.45, 0.015))
    assert hurt.verdict == "not tested at this scale" and "post transfer" in hurt.note
    assert hurt.needs == planted_c10.CLAIM.needs
    assert ("Not tested at this scale: post transfer does not hold here, so the claim's own "
            f"predictions are reported, not decided. It needs {planted_c10.CLAIM.needs}.") \
        in hurt.note
    assert hurt.effect.name == "test accuracy pretrained - from init (same budget)"
    # pretraining at the line for pre: the premise is undecided, the claim inconclusive
    line = run(pretrained_pre=(0.48, 0.03))  # -2 to +2 points over pre from init
    assert line.verdict == "inconclusive" and line.needs == ""
    assert "(pre transfer is not decided)" in line.note
    # every premise holds and post ends below pre: refuted
    worse = run(pretrained_post=(0.55, 0.015), pretrained_pre=(0.65, 0.01))
    assert worse.verdict == "not supported" and worse.needs == ""
    assert worse.effect.name == "fine-tuned test accuracy post - pre"
    arm = {"best": 1e-3, "scores": {"0.0003": [0.5, -1.0], "0.001": [0.6, -1.0],
                                    "0.003": [0.5, -1.0]}, "extended": [], "bracketed": True}
    tuned = {"pretrained": {"pre": arm, "post": arm | {"best": 3e-4, "bracketed": False}},
             "scratch": {"pre": arm, "post": arm}}
    monkeypatch.setattr(planted_c10, "c10_finetune", _planted_finetune(tuned=tuned))
    edge = planted_c10.measure(ctx, _pretrained())
    assert edge.verdict == "inconclusive" and "Not bracketed: post pretrained" in edge.note


def test_c10_s_words_are_the_recorded_ones(planted_c10, tmp_path, recorded_words, stub_figures):
    import normlab.study.figures

    drawn = stub_figures(normlab.study.figures, ["plot_bars"])
    ctx = _planted_ctx(tmp_path)
    result = planted_c10.measure(ctx, _pretrained())
    recorded_words("external_C10", result, drawn)
    assert result.verdict == "supported"
    assert result.numbers["ngram_baseline_context"] == 0.55
    assert result.numbers["majority"] == 0.4 and result.numbers["chance"] == 1 / 3
    recorded_words("external_C10_no_pair", planted_c10.measure(ctx, _pretrained("diverged")))
    recorded_words("external_C10_not_run", planted_c10.measure(ctx, []))


def test_c10_settings_come_from_the_profile_and_refuse_short_passages(tmp_path):
    from normlab.study.claims.c10_transfer import c10_settings

    assert c10_settings(FakeStudy(tmp_path)) == {
        "steps": 150, "batch_size": 16, "warmup": 15, "passage_bytes": 256, "test_max": 512,
        "val_fraction": 0.1, "val_max": 512, "train_eval_max": 256, "standardize": 512}
    ctx = FakeStudy(tmp_path, settings={"finetune_steps": 30, "finetune_passage_bytes": 512})
    assert c10_settings(ctx)["warmup"] == 3 and c10_settings(ctx)["passage_bytes"] == 512
    short = FakeStudy(tmp_path, settings={"finetune_passage_bytes": 128})
    with pytest.raises(ValueError, match="at least 256 bytes, got 128"):
        c10_settings(short)


def test_c10_reads_passages_in_the_pretraining_window_only_when_it_divides_them(tiny_pairs):
    from normlab.study.claims.c10_transfer import _window

    run = tiny_pairs[0].run_dir  # learned positions, a context of 64
    assert _window(run, 256) == 64
    assert _window(run, 64) is None  # a passage that fits the context is read whole
    assert _window(run, 200) is None  # 200 is not a multiple of 64


# -- C10's fine-tuning on planted accuracies ------------------------------------------------------

@pytest.fixture
def planted_finetuning(monkeypatch):
    """normlab.finetune's functions replaced by planted accuracies: pretrained models peak at
    lr 1e-3 (post above pre); models from init score higher the larger the lr (the grid is
    extended past its top). Records every call."""
    import normlab.data.genre
    import normlab.finetune
    from normlab.study.claims import c10_transfer

    calls: dict[str, list] = {"finetune": [], "many": [], "window": []}

    def finetune(run_dir, **kw):
        calls["finetune"].append((Path(run_dir).name, kw))
        lr, seed, scratch = kw["lr"], kw["seed"], kw.get("from_init", False)
        pl = Path(run_dir).name.split("-")[0]
        if scratch:
            acc = 0.4 + 0.1 * math.log10(lr / 3e-4)
        else:
            acc = (0.7 if pl == "post" else 0.6) - 0.05 * abs(math.log10(lr / 1e-3))
        loss = None if lr == 3e-4 and not scratch else 1.0 + lr
        return {"test_accuracy": acc + 0.01 * seed, "val_accuracy": acc, "val_loss": loss,
                "train_accuracy": 0.9, "outcome": "completed", "time_s": 1.0,
                "settings": {"window": kw.get("window")}, "not": "kept"}

    def finetune_many(jobs, workers):
        calls["many"].append(([(Path(r).name, kw) for r, kw in jobs], workers))

    def window(run_dir, passage):
        calls["window"].append((Path(run_dir).name, passage))
        return 64

    monkeypatch.setattr(normlab.finetune, "finetune", finetune)
    monkeypatch.setattr(normlab.finetune, "finetune_many", finetune_many)
    monkeypatch.setattr(c10_transfer, "_window", window)
    monkeypatch.setattr(normlab.data.genre, "genre_task",
                        lambda task, passage_bytes, val_fraction: SimpleNamespace(
                            chance=1 / 3, majority=0.4, passage_bytes=passage_bytes))
    monkeypatch.setattr(normlab.data.genre, "naive_bayes_baseline",
                        lambda task, test_max: {"test_accuracy": 0.55, "test_max": test_max})
    return c10_transfer, calls


# the fine-tuning settings these tests start from (each test changes some)
FINETUNE = {"finetune_steps": 200, "finetune_batch_size": 32, "finetune_test_max": None,
            "finetune_lrs": (3e-4, 1e-3, 3e-3), "finetune_lr_extensions": 2, "workers": 1}


def _finetune_ctx(tmp_path, **profile):
    ctx = FakeStudy(tmp_path, settings=FINETUNE | profile)
    return ctx, ctx.logged, ctx.cached_names


def _pairs_at(gap: float) -> list[Pretrained]:
    return [Pretrained(pl, s, Path(f"/runs/{pl}-{s}"), 2.2 + (gap if pl == "post" else 0.0))
            for s in (0, 1) for pl in ("pre", "post")]


def test_c10_finetune_tunes_each_arm_on_its_own_grid_with_the_profile_s_defaults(
        planted_finetuning, tmp_path):
    _, calls = planted_finetuning
    ctx, logged, cached = _finetune_ctx(tmp_path, match_tolerance=0.1)
    res = c10_transfer.c10_finetune(ctx, _pairs_at(0.08))  # 0.08 apart: paired at 0.1 only
    assert res["seeds"] == [0, 1] and res["left_out"] == [] and res["tolerance"] == 0.1
    grid = [3e-4, 1e-3, 3e-3]  # the default grid, 2 extensions and 1 worker by default
    jobs, workers = calls["many"][0]
    assert workers == 1 and len(calls["many"]) == 1
    assert [(name, kw["lr"], kw.get("from_init", False)) for name, kw in jobs] == [
        (f"{pl}-{s}", lr, arm) for arm in (False, True) for pl in ("pre", "post")
        for lr in grid for s in (0, 1)]
    settings = c10_transfer.c10_settings(ctx)
    assert jobs[0][1] == {"task": "genre", "lr": 3e-4, "seed": 0, "device": "cpu", **settings}
    assert jobs[-1][1] == {"task": "genre", "lr": 3e-3, "seed": 1, "device": "cpu", **settings,
                           "from_init": True, "window": 64}
    assert ("post-1", 256) in calls["window"]
    tuned = res["tuned_lr"]
    assert tuned["pretrained"]["post"]["best"] == 1e-3 and tuned["pretrained"]["post"]["bracketed"]
    assert tuned["scratch"]["pre"]["extended"] == pytest.approx([9e-3, 2.7e-2])
    assert not tuned["scratch"]["pre"]["bracketed"]
    # the score is (mean validation accuracy, -mean validation loss); no loss counts as inf
    scores = tuned["pretrained"]["pre"]["scores"]
    assert scores["0.001"] == [pytest.approx(0.6), pytest.approx(-(1.0 + 1e-3))]
    assert scores["0.0003"][1] == -math.inf
    assert res["accuracy"]["pretrained"]["post"] == [pytest.approx(0.7), pytest.approx(0.71)]
    kept = res["runs"]["pretrained"]["post"]["0.001"][1]
    assert set(kept) == {"test_accuracy", "val_accuracy", "val_loss", "train_accuracy",
                         "outcome", "time_s", "settings"}
    assert res["runs"]["scratch"]["pre"]["0.003"][0]["settings"] == {"window": 64}
    assert res["val_loss_pretrained"]["post"] == [pytest.approx(2.28)] * 2
    assert (res["chance"], res["majority"]) == (1 / 3, 0.4)
    assert res["baseline"] == {"test_accuracy": 0.55, "test_max": None}
    assert cached == ["c10_baseline_256_0.1_None"]
    assert logged[0] == ("C10: fine-tuning 2 pair(s), pretrained and from init, at lrs "
                         "[0.0003, 0.001, 0.003] on 1 worker(s)")
    assert "C10: fine-tuning pre (pretrained) at lr 0.0003 (2 seeds)" in logged


def test_c10_finetune_reads_the_profile_s_grid_extensions_workers_and_tolerance(
        planted_finetuning, tmp_path):
    _, calls = planted_finetuning
    ctx, _, cached = _finetune_ctx(tmp_path, finetune_lrs=(1e-3, 3e-3),
                                   finetune_lr_extensions=1, workers=2, finetune_test_max=100)
    res = c10_transfer.c10_finetune(ctx, _pairs_at(0.08))  # the default tolerance, 0.05
    assert res["seeds"] == [] and res["tolerance"] == 0.05 and len(res["left_out"]) == 2
    # the baseline scores the same test passages as the fine-tuned models: at most test_max
    assert res["baseline"] == {"test_accuracy": 0.55, "test_max": 100}
    assert cached == ["c10_baseline_256_0.1_100"]
    res = c10_transfer.c10_finetune(ctx, _pairs_at(0.01))
    assert calls["many"][-1][1] == 2
    assert {kw["lr"] for _, kw in calls["many"][-1][0]} == {1e-3, 3e-3}
    assert res["tuned_lr"]["scratch"]["post"]["extended"] == pytest.approx([9e-3])
    assert c10_transfer.c10_finetune(ctx, _pairs_at(0.08), tolerance=0.1)["seeds"] == [0, 1]


def test_c10_finetune_s_probe_jobs_ask_every_lr_the_probe_may_reach_at_once(
        planted_finetuning, tmp_path):
    _, calls = planted_finetuning
    ctx, logged, _ = _finetune_ctx(tmp_path, finetune_probe=True, finetune_lr_extensions=1,
                                   finetune_probe_lrs=(1e-3, 1e-2, 1e-1))
    res = c10_transfer.c10_finetune(ctx, _pairs_at(0.01))
    jobs, _ = calls["many"][0]
    reach = c10_transfer.lr_candidates((1e-3, 1e-2, 1e-1), 1)
    assert reach == pytest.approx([1e-3 / 3, 1e-3, 1e-2, 1e-1, 0.3])
    probe_jobs = [(name, kw) for name, kw in jobs if "lrs" in kw]
    assert [(name, kw.get("from_init", False)) for name, kw in probe_jobs] == [
        (f"{pl}-{s}", init) for init in (False, True) for pl in ("pre", "post") for s in (0, 1)]
    assert all(kw["lrs"] == reach and kw["freeze"] is True and "lr" not in kw
               for _, kw in probe_jobs)
    assert all("freeze" not in kw for _, kw in jobs if "lrs" not in kw)  # fine-tuning as before
    assert len(jobs) - len(probe_jobs) == 2 * 2 * 3 * 2
    assert logged[1].startswith("C10: frozen linear probe of the same 2 pair(s)")
    # the planted pretrained peak at 1e-3 (the grid's low edge: one extension below, inside);
    # from init the larger the better (one extension above, still at the edge)
    tuned = res["tuned_lr"]
    assert tuned["probe_pretrained"]["post"]["best"] == 1e-3
    assert tuned["probe_pretrained"]["post"]["extended"] == [reach[0]]
    assert tuned["probe_scratch"]["pre"]["extended"] == [reach[-1]]
    assert not tuned["probe_scratch"]["pre"]["bracketed"]
    frozen = [kw for name, kw in calls["finetune"] if kw.get("freeze")]
    assert frozen and {kw["lr"] for kw in frozen} <= set(reach)
    assert set(res["accuracy"]) == {"pretrained", "scratch", "probe_pretrained", "probe_scratch"}
    # off (every profile but long): no probe
    calls["many"].clear()
    ctx, _, _ = _finetune_ctx(tmp_path)
    assert set(c10_transfer.c10_finetune(ctx, _pairs_at(0.01))["accuracy"]) == {
        "pretrained", "scratch"}
    assert not [kw for _, kw in calls["many"][0][0] if "lrs" in kw or "freeze" in kw]


def test_tune_lr_stops_at_an_inside_best_and_extends_down_from_a_winning_bottom_edge():
    from normlab.study.claims.c10_transfer import tune_lr

    inside = tune_lr(lambda lr: (-abs(math.log(lr / 1e-3)), 0.0), (3e-4, 1e-3, 3e-3))
    assert inside["extended"] == [] and inside["bracketed"] and inside["best"] == 1e-3
    low = tune_lr(lambda lr: (-lr, 0.0), (1e-3, 3e-3, 1e-2))  # the smaller the better
    assert low["extended"] == pytest.approx([1e-3 / 3, 1e-3 / 9])  # two by default
    assert not low["bracketed"] and low["best"] == pytest.approx(1e-3 / 9)
    assert list(low["scores"]) == ["0.000111111", "0.000333333", "0.001", "0.003", "0.01"]


def test_c10_reads_the_study_s_checkpoints_and_states_its_tolerance(planted_c10, tmp_path):
    ctx = _planted_ctx(tmp_path, match_tolerance=0.08)
    ctx.c10_checkpoints = _pretrained
    result = planted_c10.measure(ctx)
    assert result.verdict == "supported" and result.numbers["seeds"] == [0, 1, 2, 3]
    assert "(within 0.08 nats)" in result.method


def test_c10_settings_reads_every_fine_tuning_setting_the_profile_gives(tmp_path):
    from normlab.study.claims.c10_transfer import c10_settings

    given = {"finetune_steps": 40, "finetune_batch_size": 8, "finetune_warmup": 7,
             "finetune_passage_bytes": 384, "finetune_test_max": 50,
             "finetune_val_fraction": 0.2, "finetune_val_max": 128,
             "finetune_train_eval_max": 64, "finetune_standardize": 0}
    assert c10_settings(FakeStudy(tmp_path, settings=given)) == {
        "steps": 40, "batch_size": 8, "warmup": 7, "passage_bytes": 384, "test_max": 50,
        "val_fraction": 0.2, "val_max": 128, "train_eval_max": 64, "standardize": 0}
    # a run shorter than 10 steps still warms up for one step, not more
    assert c10_settings(FakeStudy(tmp_path, settings={"finetune_steps": 5}))["warmup"] == 1
