"""The decisions of C10 (fine-tuning transfer) and C12 (removable deep layers) on synthetic
measurements, the pairing at matched loss, and the drop-cost statistic."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from fake_study import FakeStudy

from normlab.study.claims import c10_transfer, c12_removable_layers
from normlab.study.claims.c12_removable_layers import (
    DROP_MARGIN,
    decide_c12,
    drop_cost_profile,
)
from normlab.study.claims.common import matched_pairs
from normlab.study.context import RunRecord, TunedGrid
from normlab.study.schema import Pretrained

SEEDS = 5


def _noise(scale: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, scale, SEEDS)


# -- C12 -------------------------------------------------------------------------------------------

def _curve(L: int, slope: float, first: float = 3.0, last: float = 2.0) -> list[float]:
    """A drop-cost curve with a linear interior trend (in units of its median) and heavy ends."""
    depth = (np.arange(L) + 0.5) / L
    interior = 0.2 * (1 + slope * (depth - 0.5))
    return [first, *interior[1:-1].tolist(), last]


def test_drop_cost_profile_reads_the_interior_trend_and_keeps_the_ends_apart():
    falling = drop_cost_profile(_curve(12, -1.2))
    assert falling["depth_slope"] == pytest.approx(-1.2, rel=0.05)
    assert (falling["first"], falling["last"]) == (3.0, 2.0)
    assert len(falling["interior"]) == 10
    flat = drop_cost_profile(_curve(12, 0.0, first=9.0, last=9.0))
    assert flat["depth_slope"] == pytest.approx(0.0, abs=1e-9)  # heavy ends do not count
    assert flat["removable_share"] == 0.0
    # a model's scale does not matter: the curve is divided by its own median
    scaled = drop_cost_profile([10 * c for c in _curve(12, -1.2)])
    assert scaled["depth_slope"] == pytest.approx(falling["depth_slope"])


def test_drop_cost_profile_s_slope_is_undefined_when_the_typical_block_costs_nothing():
    """The reported slope has no unit when the median interior block costs nothing; the deep
    half's cost, the statistic, is still defined there (0 nats), so the model is not left out."""
    res = drop_cost_profile([1.0, 0.0, -0.01, 0.0, 0.0, 1.0])
    assert res["depth_slope"] is None and res["median_interior"] == 0.0
    assert res["deep_blocks"] == [4, 5] and res["deep_cost"] == 0.0
    assert res["why_undefined"] is None
    few = drop_cost_profile([1.0, 0.5, 1.0])  # too few interior blocks, and none past 0.5
    assert few["depth_slope"] is None and few["deep_cost"] is None
    assert few["why_undefined"] == "no deep interior block in 3 blocks"


def _costs(pre: float, post: float, noise: float, seed: int = 0) -> dict[str, list[float]]:
    """Per-seed deep-half drop costs in nats around `pre` and `post`."""
    return {"pre": (pre + _noise(noise, seed)).tolist(),
            "post": (post + _noise(noise, seed + 1)).tolist()}


SUPPORTED = ("pre's deep blocks cost less than 0.02 nats to drop, and post's more than pre's by "
             "more than 0.02")


def test_c12_planted_effect_is_supported():
    res = decide_c12(_costs(pre=0.002, post=0.15, noise=0.005))
    assert res["verdict"] == "supported", res["reason"]
    assert res["effect"].estimate > DROP_MARGIN and res["effect"].n == SEEDS


def test_c12_planted_opposite_is_not_supported():
    # post's deep blocks cheap to drop, pre's dear
    res = decide_c12(_costs(pre=0.15, post=0.002, noise=0.005))
    assert res["verdict"] == "not supported"
    # both dear, post a little more: pre's deep blocks are not cheap
    flat = decide_c12(_costs(pre=0.1, post=0.12, noise=0.005))
    assert flat["verdict"] == "not supported" and "pre's deep blocks" in flat["reason"]


def test_c12_noise_is_inconclusive_and_says_what_it_could_detect():
    res = decide_c12(_costs(pre=0.01, post=0.03, noise=0.05, seed=3))
    assert res["verdict"] == "inconclusive"
    assert res["smallest_detectable"] > DROP_MARGIN  # an effect of the margin's size is not


def test_c12_pre_lowering_the_loss_and_post_cheap_on_its_own_is_supported():
    """Post's own cost is a diagnostic: pre's deep blocks cheap and post's cost above pre's by
    the margin decide, so a pre whose deep blocks lower the loss when dropped, against a post
    whose deep blocks cost less than the margin on their own, is supported."""
    res = decide_c12(_costs(pre=-0.04, post=0.01, noise=0.002))
    assert res["verdict"] == "supported"
    assert res["reason"] == SUPPORTED
    assert [(p.subject, p.role, p.verdict) for p in res["predictions"]] == [
        ("pre", "claim", "supported"), ("post vs pre", "claim", "supported"),
        ("post", "diagnostic", "not supported")]


def test_c12_post_s_own_cost_is_reported_and_never_decides():
    """Whatever post's own cost does (above the margin, at it, below it), the verdict is the
    two claim predictions'; breaking a claim prediction still refutes."""
    for post, diagnostic in ((0.1, "supported"), (0.02, "inconclusive"),
                             (-0.005, "not supported")):
        res = decide_c12(_costs(pre=-0.05, post=post, noise=0.005))
        assert res["predictions"][2].verdict == diagnostic, post
        assert res["verdict"] == "supported", post
    # the claim predictions still decide: pre's cost not below the margin, or post not above
    # pre by the margin
    assert decide_c12(_costs(pre=0.1, post=0.2, noise=0.005))["verdict"] == "not supported"
    assert decide_c12(_costs(pre=0.0, post=0.01, noise=0.005))["verdict"] == "not supported"


def test_c12_one_pair_is_inconclusive():
    assert decide_c12({"pre": [0.0], "post": [0.2]})["verdict"] == "inconclusive"


# -- pairing at matched loss ----------------------------------------------------------------

def test_pairs_are_formed_by_seed_at_matched_loss_and_stalled_sides_are_reported():
    cps = [Pretrained("pre", 0, Path("a"), 2.20), Pretrained("post", 0, Path("b"), 2.23),
           Pretrained("pre", 1, Path("c"), 2.20), Pretrained("post", 1, Path("d"), 2.40),
           Pretrained("pre", 2, Path("e"), 2.20),
           Pretrained("post", 2, Path("f"), 3.30, outcome="stalled"),
           Pretrained("pre", 3, Path("g"), 2.20)]
    pairs, left_out = matched_pairs(cps, tolerance=0.05)
    assert list(pairs) == [0]
    assert pairs[0]["post"].run_dir == Path("b")
    text = " | ".join(left_out)
    assert "seed 1" in text and "not within 0.05" in text
    assert "seed 2: post stalled" in text
    assert "seed 3: no post" in text


# -- the experiments on real (tiny) runs ----------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_pairs(tmp_path_factory):
    """Pre and post runs of 5 blocks (3 interior), 2 seeds, trained a few steps."""
    from normlab.config import load_run_config
    from normlab.train import train_run

    root = tmp_path_factory.mktemp("runs")
    out = []
    for placement in ("pre", "post"):
        for seed in (0, 1):
            cfg = load_run_config(None, [
                f"model.placement={placement}", "model.n_blocks=5", "model.d_model=32",
                "model.n_heads=2", "model.max_seq_len=64", "data.seq_len=64",
                "train.batch_size=8", "train.steps=6", "train.eval_every=0",
                "train.eval_batches=1", f"train.seed={seed}", "train.device=cpu"])
            s = train_run(cfg, root, progress=False)
            out.append(Pretrained(placement, seed, root / s["run_id"], 3.0))
    return out


def _ctx(tmp_path, **extra):
    from normlab.study.experiments import StudyFolder
    from normlab.study.profiles import PROFILES

    profile = SimpleNamespace(**(PROFILES["tiny"].to_dict() | extra))
    return StudyFolder(tmp_path, profile, log=lambda _: None)


def test_c12_own_models_measures_every_seed_with_layer_drop(tiny_pairs, tmp_path):
    from normlab.probe.interventions import layer_drop
    from normlab.study.claims.c12_removable_layers import c12_own_models
    from normlab.study.experiments import model_at_init
    from normlab.train import load_trained_model

    ctx = _ctx(tmp_path)
    res = c12_own_models(ctx, tiny_pairs)
    assert sorted(res["per_seed"]) == [0, 1] and res["left_out"] == []
    assert res["verdict"] in ("supported", "not supported", "inconclusive")
    # the curve is normlab's layer drop on the study's probe batches, first and last apart
    _, model = load_trained_model(tiny_pairs[0].run_dir)
    expected = layer_drop(model, ctx.probe_batches())["drop_dloss"]
    got = res["per_seed"][0]["pre"]
    assert got["costs"] == pytest.approx(expected)
    assert got["first"] == pytest.approx(expected[0]) and len(got["interior"]) == 3
    assert got["deep_cost"] == pytest.approx(expected[3])  # block 4 of 5, the one past 0.5
    assert res["deep_costs"]["pre"][0] == got["deep_cost"]
    # and on the run's own model at step 0, the same way
    at_init = layer_drop(model_at_init(tiny_pairs[0].run_dir), ctx.probe_batches())["drop_dloss"]
    assert got["init"]["costs"] == pytest.approx(at_init)
    assert res["init_deep_costs"]["pre"][0] == got["init"]["deep_cost"]
    # a looser match leaves every pair out: inconclusive, and says why
    shifted = [dataclasses_replace(c, val_loss=c.val_loss + (0.5 if c.placement == "post"
                                                                 else 0)) for c in tiny_pairs]
    res = c12_own_models(ctx, shifted)
    assert res["verdict"] == "inconclusive" and len(res["left_out"]) == 2


def dataclasses_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


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


# -- the words C10 and C12 show, on planted measurements -----------------------------------------

def _planted_ctx(tmp_path, **profile):
    return FakeStudy(tmp_path, settings=profile)


def _pretrained(outcome_post: str = "completed", seeds: int = 4) -> list[Pretrained]:
    return [Pretrained(pl, s, Path(f"/runs/{pl}-{s}"), 2.2,
                       outcome=outcome_post if pl == "post" else "completed")
            for pl in ("pre", "post") for s in range(seeds)]


def _no_real_models(ctx):
    from normlab.interop import CheckpointNotFound

    raise CheckpointNotFound("minilm is not in the local cache (planted)")


def _planted_costs(n: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    return ({"pre": (0.001 + _noise(0.002)[:n]).tolist(),
             "post": (0.15 + _noise(0.01, 1)[:n]).tolist()},
            {"pre": (0.03 + _noise(0.002, 2)[:n]).tolist(),
             "post": (0.03 + _noise(0.002, 3)[:n]).tolist()})


@pytest.fixture
def planted_c12(monkeypatch):
    """C12 on planted per-seed deep-half drop costs (pre's deep blocks nearly free, post's
    0.15 nats) and the same at init (0.03 nats both: no contrast there): its own models'
    decision is decide_c12's."""
    from normlab.study.claims import c12_removable_layers

    def own(ctx, checkpoints, tolerance=None, trained_from=0):
        pairs, left_out = matched_pairs(checkpoints, 0.05)
        n = len(pairs)
        costs, init = _planted_costs(n)
        return decide_c12(costs, init) | {"per_seed": {}, "left_out": left_out,
                                          "deep_costs": costs, "init_deep_costs": init,
                                          "tolerance": 0.05}

    monkeypatch.setattr(c12_removable_layers, "c12_own_models", own)
    monkeypatch.setattr(c12_removable_layers, "c12_real_models", _no_real_models)
    return c12_removable_layers


def test_c12_s_words_are_the_recorded_ones(planted_c12, tmp_path, recorded_words):
    ctx = _planted_ctx(tmp_path)
    recorded_words("external_C12", planted_c12.measure(ctx, _pretrained()))
    recorded_words("external_C12_two_pairs", planted_c12.measure(ctx, _pretrained(seeds=2)))
    recorded_words("external_C12_post_stalled",
                   planted_c12.measure(ctx, _pretrained(outcome_post="stalled")))
    recorded_words("external_C12_no_deep_models",
                   planted_c12.measure(_planted_ctx(tmp_path, deep_blocks=0), []))
    recorded_words("external_C12_none_provided", planted_c12.measure(ctx, []))


def test_c12_reports_the_deep_models_tuning_and_its_pairs(planted_c12, tmp_path):
    ctx = _planted_ctx(tmp_path)
    ctx.deep_grid = lambda pl: TunedGrid(pl, 100, (1e-3, 2e-3), {
        lr: (RunRecord("not reported", 0, "completed", 2.0 + lr, False),) for lr in (1e-3, 2e-3)},
        1e-3 if pl == "pre" else 2e-3, False, ("best lr at the edge",))
    res = planted_c12.measure(ctx, _pretrained(seeds=3))
    assert res.numbers["deep_tuned"] == {
        pl: {"lr": lr, "bracketed": False, "extensions": ["best lr at the edge"],
             "all_stalled": False, "mean_score": {"0.001": 2.001, "0.002": 2.002}}
        for pl, lr in (("pre", 1e-3), ("post", 2e-3))}
    assert res.numbers["pairs"] == 3
    assert res.verdict == "supported" and res.stalled == []
    assert res.note == (SUPPORTED + "; at init the contrast is absent (at or below 0.02 "
                        "nats): learned; real checkpoints not probed: minilm is not in the "
                        "local cache (planted)")
    # no contrast at init (planted): a diagnostic not supported, it leaves the verdict
    assert [(p["subject"], p["role"], p["verdict"]) for p in res.predictions] == [
        ("large t", "premise", "supported"), ("trained pairs", "premise", "supported"),
        ("pre", "claim", "supported"), ("post vs pre", "claim", "supported"),
        ("post", "diagnostic", "supported"),
        ("post vs pre at init", "diagnostic", "not supported")]
    assert [p["values"] for p in res.predictions[:2]] == [[7.0], [3.0]]  # block 7 of 12; pairs
    costs, init = _planted_costs(3)
    assert res.numbers["own_models"]["deep_costs"] == costs
    assert res.numbers["own_models"]["init_deep_costs"] == init
    assert res.effect.name == "deep-half drop cost (nats): post - pre"
    ctx.profile = replace(ctx.profile, c12_min_pairs=4)
    fewer = planted_c12.measure(ctx, _pretrained(seeds=3))
    assert "3 matched pair(s) of trained checkpoints along the trajectories, fewer than the 4" \
        in fewer.note
    # fewer pairs than the design asks for: the claim is not tested, its predictions reported
    assert fewer.verdict == "not tested at this scale" and fewer.needs.startswith(
        "pre and post models of 12 blocks or more, both trained past their warmup")
    assert fewer.predictions[1]["verdict"] == "not supported"
    assert fewer.predictions[2]["verdict"] == "supported"
    # models of 6 blocks: their deeper half is not "large t", whatever the costs say
    shallow = planted_c12.measure(_planted_ctx(tmp_path, deep_blocks=6), _pretrained(seeds=3))
    assert shallow.predictions[0]["values"] == [4.0]
    assert shallow.verdict == "not tested at this scale"
    assert "Not tested at this scale: large t does not hold here" in shallow.note


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


def _hf_result(name: str) -> dict:
    lm = name == "smollm2"
    L = 30 if lm else 6
    curve = _curve(L, -1.0 if lm else 0.0)
    return {"model": {"family": "llama" if lm else "bert", "placement": "pre" if lm else "post",
                      "norm": "rmsnorm" if lm else "layernorm", "n_blocks": L, "d_model": 576,
                      "objective": "causal" if lm else "masked", "not": "reported"},
            "drop": {"drop_dloss": curve if lm else None,
                     "drop_hidden_cos": [c / 10 for c in curve]},
            "per_block": {"norm": [1.0] * L, "norm_median": [0.9] * L, "norm_first": [9.0] * L,
                          "norm_all": [1.1] * L, "ang_prev": [0.3] * L},
            "summary": {"growth_exponent": 0.4, "growth_exponent_all_positions": 0.5,
                        "loss": 3.1 if lm else None}}


def test_c12_probes_both_real_checkpoints_as_an_illustration(tmp_path, monkeypatch):
    import normlab.interop
    import normlab.interop.figures
    from normlab.study.claims import c12_removable_layers

    asked, cached = [], []
    monkeypatch.setattr(normlab.interop, "run_hf_probe",
                        lambda name, **kw: asked.append((name, kw)) or _hf_result(name))
    monkeypatch.setattr(normlab.interop.figures, "comparison_figure",
                        lambda results, path: asked.append(("figure", len(results))) or path)
    ctx = _planted_ctx(tmp_path, real_passages=3)
    ctx.cached = lambda name, compute: cached.append(name) or compute()
    logged = []
    ctx.log = logged.append
    real = c12_removable_layers.c12_real_models(ctx)
    assert cached == ["real_v2_minilm", "real_v2_smollm2"]
    assert logged == ["probing the real checkpoint minilm", "probing the real checkpoint smollm2"]
    kw = {"n_batches": 3, "batch_size": 2, "seq_len": 64, "figures": False}
    assert asked == [("minilm", kw), ("smollm2", kw)]
    mini, smol = real["minilm"], real["smollm2"]
    assert mini["drop_cost"] == "drop_hidden_cos" and smol["drop_cost"] == "drop_dloss"
    assert smol["profile"] == drop_cost_profile(_hf_result("smollm2")["drop"]["drop_dloss"])
    assert mini["profile"] == drop_cost_profile(_hf_result("minilm")["drop"]["drop_hidden_cos"])
    assert smol["hidden_profile"]["depth_slope"] == pytest.approx(-1.0, rel=0.05)
    assert smol["model"] == {k: v for k, v in _hf_result("smollm2")["model"].items()
                             if k != "not"}
    assert (smol["stream_norm"], smol["stream_norm_median"], smol["stream_norm_position0"],
            smol["stream_norm_all_positions"]) == ([1.0] * 30, [0.9] * 30, [9.0] * 30,
                                                   [1.1] * 30)
    assert (smol["growth_exponent"], smol["growth_exponent_all_positions"], smol["loss"],
            smol["ang_prev"]) == (0.4, 0.5, 3.1, [0.3] * 30)
    assert smol["_raw"] == _hf_result("smollm2")
    # in the claim: reported without the raw results, drawn in one figure, no verdict on them
    monkeypatch.setattr(c12_removable_layers, "c12_real_models", lambda ctx: real)
    asked.clear()
    res = c12_removable_layers.measure(ctx, [])
    assert asked == [("figure", 2)]
    assert res.figures == ["figures/c12_real_models.svg"]
    assert res.numbers["real_models_illustration"]["smollm2"] == {
        k: v for k, v in smol.items() if k != "_raw"}
    assert res.verdict == "not run"
    assert res.note == "the study provided no matched pre/post models for C12"


# -- the rule's edges ---------------------------------------------------------------------------

def test_an_interval_touching_zero_is_above_or_below_only_when_the_edge_counts():
    from normlab.study.claims.common import _above, _below, _detectable

    touch_low = {"ci95": [0.0, 1.0], "n": 3}
    touch_high = {"ci95": [-1.0, 0.0], "n": 3}
    assert not _above(touch_low) and _above(touch_low, strict=False)
    assert not _below(touch_high) and _below(touch_high, strict=False)
    assert _above({"ci95": [0.5, 1.0], "n": 2}, threshold=0.4)
    assert not _above({"ci95": [0.5, 1.0], "n": 2}, threshold=0.5)
    assert _below({"ci95": [-1.0, 0.3], "n": 2}, threshold=0.4)
    assert not _below({"ci95": [-1.0, 0.4], "n": 2}, threshold=0.4)
    one_seed = {"n": 1}
    assert not _above({**one_seed, "ci95": [0.5, 1.0]}, strict=False)
    assert not _below({**one_seed, "ci95": [-1.0, -0.5]}, strict=False)
    undefined = {"ci95": [math.nan, math.nan], "n": 3}
    assert not _above(undefined, strict=False) and not _below(undefined, strict=False)
    assert _detectable({"ci95": [-0.5, 1.5], "n": 2}) == pytest.approx(1.0)
    assert _detectable({"ci95": [1.0, 1.0], "n": 1}) is None
    assert _detectable({"ci95": [math.nan, math.nan], "n": 3}) is None
    assert _detectable({"ci95": [-1e308, 1e308], "n": 4}) is None  # its width overflows


@pytest.mark.parametrize(("pre", "post", "verdict", "reason"), [
    (0.002, 0.15, "supported", SUPPORTED),
    (0.002, 0.0, "not supported", "post's deep blocks do not cost 0.02 nats more than pre's"),
    (0.1, 0.12, "not supported", "pre's deep blocks cost 0.02 nats or more to drop"),
    (-0.04, 0.01, "supported", SUPPORTED),
    (0.0, 0.02, "inconclusive",
     "an interval includes 0.02 nats: too few seeds for an effect of this size"),
])
def test_each_of_c12_s_outcomes_says_its_reason(pre, post, verdict, reason):
    noise = 0.05 if verdict == "inconclusive" else 0.002
    res = decide_c12(_costs(pre=pre, post=post, noise=noise, seed=3))
    assert (res["verdict"], res["reason"]) == (verdict, reason)
    planted = _costs(pre, post, noise, 3)
    diff = np.array(planted["post"]) - np.array(planted["pre"])
    assert res["intervals"]["post - pre"]["mean"] == pytest.approx(float(diff.mean()))
    assert res["intervals"]["pre"]["mean"] == pytest.approx(float(np.mean(planted["pre"])))
    assert res["intervals"]["post"]["n"] == SEEDS
    assert res["effect"].name == "deep-half drop cost (nats): post - pre"
    assert res["effect"].expected == "> 0.02"


def test_c12_needs_paired_costs_and_names_one_pair():
    with pytest.raises(ValueError, match=r"^decide_c12 needs the same number of pre and post "
                                         r"costs \(paired\)$"):
        decide_c12({"pre": [0.0, 0.001], "post": [0.15]})
    res = decide_c12({"pre": [0.0], "post": [0.15]})
    assert res["reason"] == "1 matched pair(s); at least 2 are needed"
    assert res["smallest_detectable"] is None


def test_drop_cost_profile_s_removable_share_counts_deep_interior_blocks_below_half_the_median():
    # interior t = 1..5, median 1; deep ((t + 0.5) / 7 > 0.5): t = 4 (0.2, cheap) and 5
    costs = [5.0, 1.0, 1.0, 1.0, 0.2, 1.0, 5.0]
    res = drop_cost_profile(costs)
    assert res["median_interior"] == 1.0 and res["n_blocks"] == 7
    assert res["deep_blocks"] == [5, 6] and res["deep_cost"] == pytest.approx(0.6)
    assert res["removable_share"] == pytest.approx(1 / 2)
    x = [(t + 0.5) / 7 for t in range(1, 6)]
    assert res["depth_slope"] == pytest.approx(float(np.polyfit(x, costs[1:6], 1)[0]))
    assert res["why_undefined"] is None and res["last"] == 5.0 and res["costs"] == costs
    broken = drop_cost_profile([1.0, 0.5, 0.5, 0.5, math.nan, 1.0])
    assert broken["why_undefined"] == "a non-finite drop cost" and broken["deep_cost"] is None
    one = drop_cost_profile([2.0])
    assert (one["first"], one["last"], one["interior"]) == (2.0, None, [])
    assert drop_cost_profile([])["first"] is None
    # a median interior cost of 0 leaves only the slope undefined, not the model
    free = drop_cost_profile([1.0, 0.0, -0.01, 0.0, 0.0, 1.0])
    assert free["why_undefined"] is None and free["deep_cost"] == 0.0
    assert free["depth_slope"] is None and free["removable_share"] is None


def test_c12_reports_a_side_that_stalled_in_every_seed(planted_c12, tmp_path):
    """Deep post models that all stalled are a result: the claim names the side as stalled and
    says so, and compares nothing; a side with one trained seed is not called stalled."""
    ctx = _planted_ctx(tmp_path)
    res = planted_c12.measure(ctx, _pretrained(outcome_post="stalled"))
    assert res.verdict == "not tested at this scale" and res.stalled == ["post"]
    assert "post stalled or diverged in every seed at its tuned lr: no pair to compare" in \
        res.note
    assert "0 matched pair(s) of trained checkpoints along the trajectories, fewer than the 3" \
        in res.note
    diverged = planted_c12.measure(ctx, _pretrained(outcome_post="diverged"))
    assert diverged.stalled == ["post"]
    one = [dataclasses_replace(c, outcome="stalled") if c.placement == "post" and c.seed == 0
           else c for c in _pretrained()]
    mixed = planted_c12.measure(ctx, one)
    assert mixed.stalled == [] and "stalled" not in mixed.note


def test_pairs_refuse_a_placement_c10_and_c12_do_not_compare():
    with pytest.raises(ValueError, match=r"one of \('pre', 'post'\), got 'sandwich' \(x\)"):
        matched_pairs([Pretrained("sandwich", 0, Path("x"), 2.0)], 0.05)


def test_c12_own_models_measures_each_checkpoint_once_at_its_step(tmp_path, monkeypatch):
    """The drop curve of each checkpoint is cached under its run and step, and that of its
    run's model at step 0 under its run; a pair whose curve has no defined deep-half cost is
    reported, kept in the per-seed numbers and left out of the rule, and a curve whose interior
    costs nothing is kept."""
    from normlab.study.claims import c12_removable_layers

    broken = [1.0, 0.0, math.nan, 0.0, 0.0, 1.0]  # a non-finite cost: no deep-half cost
    flat = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]  # its median interior cost is 0: kept, 0 nats
    curves = {"pre-0": _curve(8, -1.0), "post-0": broken, "pre-1": broken, "post-1": broken,
              "pre-2": flat, "post-2": _curve(8, 0.1)}
    curve0 = _curve(8, 0.0)  # every run's model at step 0
    read = []

    def own_drop_curve(run_dir, batches, step=None, *, at_init=False):
        read.append((Path(run_dir).name, step, at_init, batches))
        return {"drop_dloss": curve0 if at_init else curves[Path(run_dir).name], "n_blocks": 8}

    monkeypatch.setattr(c12_removable_layers, "own_drop_curve", own_drop_curve)
    ctx = _planted_ctx(tmp_path, match_tolerance=0.1)
    ctx.probe_batches = lambda: ["the probe batches"]
    cached = []
    ctx.cached = lambda name, compute: cached.append(name) or compute()
    checkpoints = [Pretrained(pl, s, Path(f"/runs/{pl}-{s}"), 2.2 + (0.08 if pl == "post" else 0),
                              step=100 * s or None)
                   for s in range(3) for pl in ("pre", "post")]
    res = c12_removable_layers.c12_own_models(ctx, checkpoints)
    assert res["tolerance"] == 0.1  # the profile's
    assert cached == ["c12_drop_pre-0", "c12_drop_pre-0_init", "c12_drop_post-0",
                      "c12_drop_post-0_init", "c12_drop_pre-1_step100", "c12_drop_pre-1_init",
                      "c12_drop_post-1_step100", "c12_drop_post-1_init",
                      "c12_drop_pre-2_step200", "c12_drop_pre-2_init",
                      "c12_drop_post-2_step200", "c12_drop_post-2_init"]
    assert read[0] == ("pre-0", None, False, ["the probe batches"])
    assert read[1] == ("pre-0", None, True, ["the probe batches"])  # its model at step 0
    assert read[4][:3] == ("pre-1", 100, False) and read[5][:3] == ("pre-1", None, True)
    assert res["deep_costs"] == {"pre": [0.0],
                                 "post": [drop_cost_profile(curves["post-2"])["deep_cost"]]}
    assert res["init_deep_costs"] == {p: [drop_cost_profile(curve0)["deep_cost"]]
                                      for p in ("pre", "post")}
    assert res["left_out"] == ["seed 0: post a non-finite drop cost",
                               "seed 1: pre a non-finite drop cost; post a non-finite drop "
                               "cost"]
    assert sorted(res["per_seed"]) == [0, 1, 2]
    assert res["per_seed"][0]["pre"]["depth_slope"] == pytest.approx(-1.0, rel=0.05)
    assert res["per_seed"][2]["pre"]["depth_slope"] is None  # kept all the same
    row = res["per_seed"][2]["post"]
    assert (row["val_loss"], row["run_id"], row["step"]) == (pytest.approx(2.28), "post-2", 200)
    assert row["costs"] == curves["post-2"] and row["init"]["costs"] == curve0
    decided = decide_c12(res["deep_costs"], res["init_deep_costs"])
    assert (res["verdict"], res["reason"]) == (decided["verdict"], decided["reason"])
    strict = c12_removable_layers.c12_own_models(ctx, checkpoints, tolerance=0.05)
    assert strict["tolerance"] == 0.05 and strict["deep_costs"] == {"pre": [], "post": []}
    # a pair matched only inside warmup (here before step 200) is no pair of trained models;
    # a checkpoint at the warmup's last step, or at a run's end (step None), is
    warm = c12_removable_layers.c12_own_models(ctx, checkpoints, trained_from=200)
    assert warm["left_out"][0] == ("seed 1: matched only inside warmup (pre step 100, post "
                                   "step 100; warmup 200 steps)")
    assert sorted(warm["per_seed"]) == [0, 2] and warm["deep_costs"] == res["deep_costs"]
    assert sorted(c12_removable_layers.c12_own_models(ctx, checkpoints, trained_from=201)[
        "per_seed"]) == [0]


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


def test_own_drop_curve_reads_the_kept_step_within_the_model_s_context(monkeypatch):
    import torch

    import normlab.probe.interventions
    import normlab.train
    from normlab.study.claims.c12_removable_layers import own_drop_curve

    loaded, dropped = [], []
    cfg = SimpleNamespace(model=SimpleNamespace(max_seq_len=4, n_blocks=3))
    monkeypatch.setattr(normlab.train, "load_trained_model",
                        lambda run_dir, step=None: loaded.append((run_dir, step)) or (cfg, "m"))
    monkeypatch.setattr(normlab.probe.interventions, "layer_drop",
                        lambda model, batches: dropped.append((model, batches))
                        or {"drop_dloss": [0.3, 0.1, 0.2]})
    x = torch.arange(16).reshape(2, 8)
    curve = own_drop_curve(Path("run"), [(x, x + 1)], step=100)
    assert curve == {"drop_dloss": [0.3, 0.1, 0.2], "n_blocks": 3}
    assert loaded == [(Path("run"), 100)]
    (model, batches), = dropped
    assert model == "m" and batches[0][0].tolist() == x[:, :4].tolist()
    assert batches[0][1].tolist() == (x + 1)[:, :4].tolist()


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


def test_predictions_refuse_lists_that_are_not_paired_by_seed():
    """C10's and C12's per-seed differences pair lists by seed: a list one seed short is an
    error, never a difference over the seeds both happen to have."""
    from normlab.study.claims.c10_transfer import c10_predictions
    from normlab.study.claims.c12_removable_layers import c12_predictions

    with pytest.raises(ValueError, match="shorter|longer"):
        c12_predictions({"pre": [0.0, 0.001, 0.002], "post": [0.15, 0.16]})
    with pytest.raises(ValueError, match="shorter|longer"):  # the costs at init as well
        c12_predictions({"pre": [0.0, 0.001], "post": [0.15, 0.16]},
                        {"pre": [0.03, 0.03], "post": [0.03]})
    paired = {"pretrained": {"pre": [0.6, 0.62, 0.61], "post": [0.7, 0.71, 0.69]},
              "scratch": {"pre": [0.5, 0.52, 0.51], "post": [0.5, 0.51, 0.52]}}
    assert len(c10_predictions(paired, 0.4)) == 5
    for arm, p in [("pretrained", "pre"), ("scratch", "pre"), ("pretrained", "post"),
                   ("scratch", "post")]:
        short = {a: dict(v) for a, v in paired.items()}
        short[arm][p] = short[arm][p][:2]
        with pytest.raises(ValueError, match="shorter|longer"):
            c10_predictions(short, 0.4)
    # each arm paired within its placement, but pre one seed short of post
    short = {a: {"pre": v["pre"][:2], "post": v["post"]} for a, v in paired.items()}
    with pytest.raises(ValueError, match="shorter|longer"):
        c10_predictions(short, 0.4)


def test_c12_reads_the_study_s_checkpoints_and_keeps_the_real_models_figure(
        planted_c12, tmp_path, monkeypatch):
    """Without ``checkpoints=``, C12 compares the models the study provides; the real models
    and the own models are both measured in the study's context, and the real models' figure
    stays in the result beside the verdict."""
    import normlab.interop.figures

    seen, own = [], c12_removable_layers.c12_own_models
    monkeypatch.setattr(c12_removable_layers, "c12_own_models",
                        lambda ctx, cps, tolerance=None, trained_from=0:
                        seen.append(("own", ctx, trained_from)) or own(ctx, cps))
    real = {"minilm": {"_raw": {"planted": True}, "n_blocks": 6}}
    monkeypatch.setattr(c12_removable_layers, "c12_real_models",
                        lambda ctx: seen.append(("real", ctx)) or real)
    monkeypatch.setattr(normlab.interop.figures, "comparison_figure", lambda results, path: path)
    ctx = _planted_ctx(tmp_path)
    ctx.c12_checkpoints = lambda: _pretrained(seeds=3)
    res = c12_removable_layers.measure(ctx)
    assert seen == [("real", ctx), ("own", ctx, ctx.profile.warmup)]  # warmup: not trained
    assert res.numbers["pairs"] == 3 and res.verdict == "supported"
    assert res.figures == ["figures/c12_real_models.svg"]
    assert res.numbers["real_models_illustration"] == {"minilm": {"n_blocks": 6}}


def test_c12_names_both_sides_when_both_stalled_and_says_when_no_models_came(planted_c12,
                                                                            tmp_path):
    ctx = _planted_ctx(tmp_path)
    both = planted_c12.measure(ctx, [dataclasses_replace(c, outcome="stalled")
                                 for c in _pretrained()])
    assert both.stalled == ["pre", "post"]
    assert "pre and post stalled or diverged in every seed at its tuned lr" in both.note
    # a study whose profile trains deep models but that provided none
    res = planted_c12.measure(_planted_ctx(tmp_path))
    assert res.verdict == "not run"
    assert res.note == ("real checkpoints not probed: minilm is not in the local cache "
                        "(planted); the study provided no matched pre/post models for C12")


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


def test_drop_cost_profile_s_ends_keys_and_half_median_edge():
    two = drop_cost_profile([3.0, 2.0])  # two blocks: a first and a last, no interior
    assert (two["first"], two["last"], two["interior"]) == (3.0, 2.0, [])
    short = drop_cost_profile([3.0, 1.0, 1.0, 2.0])  # 2 interior blocks: no slope
    assert {k: short[k] for k in ("median_interior", "depth_slope", "removable_share")} == {
        "median_interior": None, "depth_slope": None, "removable_share": None}
    assert short["deep_cost"] == 1.0  # block 3 of 4, the one past 0.5: the statistic stands
    # a deep interior block at exactly half the median is not below half of it
    edge = drop_cost_profile([5.0, 1.0, 1.0, 1.0, 0.5, 1.0, 5.0])
    assert edge["median_interior"] == 1.0 and edge["removable_share"] == 0.0


def test_pairs_go_on_past_a_left_out_seed_and_name_both_untrained_sides():
    ok = [Pretrained(pl, 1, Path(f"{pl}-1"), 2.0) for pl in ("pre", "post")]
    pairs, left_out = matched_pairs([Pretrained("pre", 0, Path("pre-0"), 2.0), *ok], 0.05)
    assert sorted(pairs) == [1] and left_out == ["seed 0: no post checkpoint"]
    both = [Pretrained("pre", 2, Path("pre-2"), 2.0, outcome="stalled"),
            Pretrained("post", 2, Path("post-2"), 2.0, outcome="diverged")]
    assert matched_pairs(both, 0.05)[1] == ["seed 2: pre stalled, post diverged"]
    # a gap of exactly the tolerance is within it (0.25 and the losses are exact in binary)
    edge = [Pretrained("pre", 3, Path("pre-3"), 2.0), Pretrained("post", 3, Path("post-3"), 2.25)]
    assert sorted(matched_pairs(edge, 0.25)[0]) == [3]


@pytest.mark.parametrize(("pre", "post", "verdict", "reason"), [
    # post exactly the margin above pre in every seed: the difference's interval is
    # [0.02, 0.02], at or below the margin
    ([0.0, 0.0, 0.0], [0.02, 0.02, 0.02], "not supported",
     "post's deep blocks do not cost 0.02 nats more than pre's"),
    # pre's cost exactly the margin in every seed: its interval [0.02, 0.02] lies at or above it
    ([0.02, 0.02, 0.02], [0.1, 0.11, 0.09], "not supported",
     "pre's deep blocks cost 0.02 nats or more to drop"),
    # post clearly above pre, but pre's own cost uncertain about the margin
    ([-0.01, 0.05, 0.0, 0.04], [0.09, 0.16, 0.11, 0.13], "inconclusive",
     "an interval includes 0.02 nats: too few seeds for an effect of this size"),
])
def test_c12_s_rule_at_its_edges(pre, post, verdict, reason):
    res = decide_c12({"pre": pre, "post": post})
    assert (res["verdict"], res["reason"]) == (verdict, reason)
