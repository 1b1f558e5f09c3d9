"""Tests of C12 (Deep Pre-LN layers are removable): normlab/study/claims/c12_removable_layers.py,
on the planted study (tests/fake_study.py) and on what it measures.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from fake_study import SEEDS, FakeStudy
from planted_checkpoints import _ctx, _planted_ctx, _pretrained

from normlab.study.claims import c12_removable_layers, with_settings
from normlab.study.claims import c12_removable_layers as c12
from normlab.study.claims.c12_removable_layers import (
    DROP_MARGIN,
    decide_c12,
    drop_cost_profile,
)
from normlab.study.claims.common import matched_pairs
from normlab.study.context import RunRecord, TunedGrid
from normlab.study.schema import Pretrained


def test_c12_rows_each_prediction():
    from normlab.study.claims.c12_removable_layers import c12_predictions, decide_c12

    rng = random.Random(3)

    def world(pre: float, post: float) -> dict[str, list[float]]:
        """Per-seed deep-half drop costs in nats."""
        return {"pre": [pre + 0.002 * rng.gauss(0, 1) for _ in range(SEEDS)],
                "post": [post + 0.002 * rng.gauss(0, 1) for _ in range(SEEDS)]}

    def rows(costs, init=None):
        return [(p.subject, p.role, p.verdict) for p in c12_predictions(costs, init)]

    supported = ("pre's deep blocks cost less than 0.02 nats to drop, and post's more than "
                 "pre's by more than 0.02")
    # pre's deep blocks nearly free, post's 0.15 nats: supported
    good = world(0.001, 0.15)
    assert rows(good) == [("pre", "claim", "supported"), ("post vs pre", "claim", "supported"),
                          ("post", "diagnostic", "supported")]
    decision = decide_c12(good)
    assert decision["verdict"] == "supported"
    assert decision["reason"] == supported
    assert [p.subject for p in decision["predictions"]] == ["pre", "post vs pre", "post"]
    # each claim prediction broken in turn: pre's cost not below the margin; post's not above
    # pre's by the margin
    for k, (pre, post) in enumerate([(0.1, 0.25), (0.001, 0.01)]):
        broken = world(pre, post)
        got = [v for _s, r, v in rows(broken) if r == "claim"]
        expected = ["supported", "supported"]
        expected[k] = "not supported"
        assert got == expected, k
        assert decide_c12(broken)["verdict"] == "not supported"
    assert decide_c12(world(0.1, 0.25))["reason"] == (
        "pre's deep blocks cost 0.02 nats or more to drop")
    assert decide_c12(world(0.001, 0.01))["reason"] == (
        "post's deep blocks do not cost 0.02 nats more than pre's")
    # post's own cost below the margin (pre's deep blocks lower the loss) breaks only the
    # diagnostic: still supported
    flat = world(-0.04, 0.01)
    assert rows(flat) == [("pre", "claim", "supported"), ("post vs pre", "claim", "supported"),
                          ("post", "diagnostic", "not supported")]
    assert decide_c12(flat)["verdict"] == "supported"
    assert decide_c12(flat)["reason"] == supported
    # the contrast at init is a diagnostic too, absent (0.01 nats: above 0, below the margin)
    # or present: still supported, the reason says which
    absent = "at init the contrast is absent (at or below 0.02 nats): learned"
    for init, verdict, said in ((world(0.03, 0.04), "not supported", absent),
                                (world(0.0, 0.15), "supported", "architectural, not learned")):
        assert rows(good, init)[3] == ("post vs pre at init", "diagnostic", verdict)
        decision = decide_c12(good, init)
        assert decision["verdict"] == "supported" and decision["reason"].endswith(said)



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
    # the premise: pre's consecutive angular distance over the deeper half of blocks 2..L,
    # read from the stream probe of the same model
    from normlab.probe import probe_model

    ang = probe_model(model, ctx.probe_batches(), ("stream",))["per_block"]["ang_prev"]
    assert len(ang) == 5 and res["pre_late_angles"][0] == pytest.approx(sum(ang[3:]) / 2)
    assert got["late_angle"] == res["pre_late_angles"][0]
    # a looser match leaves every pair out: inconclusive, and says why
    shifted = [dataclasses_replace(c, val_loss=c.val_loss + (0.5 if c.placement == "post"
                                                                 else 0)) for c in tiny_pairs]
    res = c12_own_models(ctx, shifted)
    assert res["verdict"] == "inconclusive" and len(res["left_out"]) == 2


def dataclasses_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


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
        angles = (c12_removable_layers.planted_angle + _noise(0.01, 4)[:n]).tolist()
        return decide_c12(costs, init) | {"per_seed": {}, "left_out": left_out,
                                          "deep_costs": costs, "init_deep_costs": init,
                                          "tolerance": 0.05, "pre_late_angles": angles}

    # pre's deeper half near-identical (the premise) unless a test plants it apart
    monkeypatch.setattr(c12_removable_layers, "planted_angle", 0.1, raising=False)

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
        ("near-identical blocks", "premise", "supported"),
        ("trained pairs", "premise", "supported"),
        ("pre", "claim", "supported"), ("post vs pre", "claim", "supported"),
        ("post", "diagnostic", "supported"),
        ("post vs pre at init", "diagnostic", "not supported")]
    assert res.predictions[0]["values"] == res.numbers["own_models"]["pre_late_angles"]
    assert res.predictions[1]["values"] == [3.0]  # pairs
    costs, init = _planted_costs(3)
    assert res.numbers["own_models"]["deep_costs"] == costs
    assert res.numbers["own_models"]["init_deep_costs"] == init
    assert res.effect.name == "deep-half drop cost (nats): post - pre"
    ctx.profile = with_settings(ctx.profile, c12_min_pairs=4)
    fewer = planted_c12.measure(ctx, _pretrained(seeds=3))
    assert "3 matched pair(s) of trained checkpoints along the trajectories, fewer than the 4" \
        in fewer.note
    # fewer pairs than the design asks for: the claim is not tested, its predictions reported
    assert fewer.verdict == "not tested at this scale" and fewer.needs.startswith(
        "pre and post models deep enough that pre's deeper half is near-identical")
    assert fewer.predictions[1]["verdict"] == "not supported"
    assert fewer.predictions[2]["verdict"] == "supported"
    # pre's deeper half not near-identical (0.4 > 0.2): not tested, whatever the costs say
    planted_c12.planted_angle = 0.4
    apart = planted_c12.measure(ctx, _pretrained(seeds=4))
    assert apart.predictions[0]["verdict"] == "not supported"
    assert apart.verdict == "not tested at this scale"
    assert "Not tested at this scale: near-identical blocks does not hold here" in apart.note


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
    assert res["reason"] == "1 matched pair(s); at least 2 are needed for an interval"
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
    read, devices = [], set()

    def own_drop_curve(run_dir, batches, step=None, *, at_init=False, device="cpu"):
        read.append((Path(run_dir).name, step, at_init, batches))
        devices.add(device)
        return {"drop_dloss": curve0 if at_init else curves[Path(run_dir).name], "n_blocks": 8}

    monkeypatch.setattr(c12_removable_layers, "own_drop_curve", own_drop_curve)
    angled = []
    monkeypatch.setattr(c12_removable_layers, "own_late_angle",
                        lambda run_dir, batches, step=None, *, device="cpu": angled.append(
                            (Path(run_dir).name, step, device)) or 0.1)
    ctx = _planted_ctx(tmp_path, match_tolerance=0.1)
    ctx.probe_batches = lambda: ["the probe batches"]
    ctx.device = "cuda"  # the study's device: every curve is measured there
    cached = []
    ctx.cached = lambda name, compute: cached.append(name) or compute()
    checkpoints = [Pretrained(pl, s, Path(f"/runs/{pl}-{s}"), 2.2 + (0.08 if pl == "post" else 0),
                              step=100 * s or None)
                   for s in range(3) for pl in ("pre", "post")]
    res = c12_removable_layers.c12_own_models(ctx, checkpoints)
    assert res["tolerance"] == 0.1  # the profile's
    assert cached == ["c12_drop_pre-0", "c12_drop_pre-0_init", "c12_angle_pre-0",
                      "c12_drop_post-0", "c12_drop_post-0_init",
                      "c12_drop_pre-1_step100", "c12_drop_pre-1_init", "c12_angle_pre-1_step100",
                      "c12_drop_post-1_step100", "c12_drop_post-1_init",
                      "c12_drop_pre-2_step200", "c12_drop_pre-2_init", "c12_angle_pre-2_step200",
                      "c12_drop_post-2_step200", "c12_drop_post-2_init"]
    # pre's deeper-half angle at the same checkpoint, on the study's device; kept pairs only
    assert angled == [("pre-0", None, "cuda"), ("pre-1", 100, "cuda"), ("pre-2", 200, "cuda")]
    assert res["pre_late_angles"] == [0.1]  # seed 2's pair: seeds 0 and 1 have no deep cost
    assert read[0] == ("pre-0", None, False, ["the probe batches"])
    assert read[1] == ("pre-0", None, True, ["the probe batches"])  # its model at step 0
    assert read[4][:3] == ("pre-1", 100, False) and read[5][:3] == ("pre-1", None, True)
    assert devices == {"cuda"}
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


def test_own_drop_curve_reads_the_kept_step_within_the_model_s_context(monkeypatch):
    import torch

    import normlab.probe.interventions
    import normlab.train
    from normlab.study.claims.c12_removable_layers import own_drop_curve

    loaded, dropped = [], []
    cfg = SimpleNamespace(model=SimpleNamespace(max_seq_len=4, n_blocks=3))
    m = torch.nn.Linear(1, 1)  # the trained model, as loaded
    monkeypatch.setattr(normlab.train, "load_trained_model",
                        lambda run_dir, step=None: loaded.append((run_dir, step)) or (cfg, m))
    monkeypatch.setattr(normlab.probe.interventions, "layer_drop",
                        lambda model, batches: dropped.append((model, batches))
                        or {"drop_dloss": [0.3, 0.1, 0.2]})
    x = torch.arange(16).reshape(2, 8)
    curve = own_drop_curve(Path("run"), [(x, x + 1)], step=100)
    assert curve == {"drop_dloss": [0.3, 0.1, 0.2], "n_blocks": 3}
    assert loaded == [(Path("run"), 100)]
    (model, batches), = dropped
    assert model is m and batches[0][0].tolist() == x[:, :4].tolist()
    assert batches[0][1].tolist() == (x + 1)[:, :4].tolist()


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


L = 12  # blocks of the deep models: their deeper half starts past block 6 ("large t")


DROP_SEEDS = 4


def _drop_curve(deep: float, interior: float = 0.1, first: float = 1.0, last: float = 0.5
           ) -> list[float]:
    """A drop-cost curve: heavy ends, `interior` for blocks 2-6 and `deep` for blocks 7-11."""
    return [first] + [interior] * 5 + [deep] * 5 + [last]


# -- C12 ---------------------------------------------------------------------------------------

def test_the_deep_half_cost_is_the_mean_of_the_deep_interior_blocks_in_nats():
    prof = drop_cost_profile([1.0, 0.2, 0.2, 0.2, 0.2, 0.2, 0.1, 0.2, 0.3, 0.4, 0.5, 9.0])
    assert prof["deep_blocks"] == [7, 8, 9, 10, 11]  # 1-based; the last block apart
    assert prof["deep_cost"] == pytest.approx(0.3)
    # a pre whose deep blocks cost nothing, or lower the loss: defined, not left out
    assert drop_cost_profile(_drop_curve(0.0, interior=0.0))["deep_cost"] == 0.0
    negative = drop_cost_profile(_drop_curve(-0.001, interior=-0.0005))
    assert negative["deep_cost"] == pytest.approx(-0.001)
    assert negative["depth_slope"] is None  # the old statistic had no unit there
    assert drop_cost_profile([1.0, math.nan] + [0.0] * 10)["deep_cost"] is None
    # 4 blocks: block 3 is the only deep interior block
    assert drop_cost_profile([1.0, 0.2, 0.05, 1.0])["deep_cost"] == pytest.approx(0.05)


def _world(pre: list[float], post: float, noise: float = 0.01, seed: int = 0
           ) -> dict[str, list[float]]:
    rng = random.Random(seed)
    return {"pre": list(pre), "post": [post + noise * rng.gauss(0, 1) for _ in pre]}


def test_c12_pre_s_deep_blocks_costing_nothing_is_the_claim_s_strongest_case():
    # exactly 0 in three seeds, slightly negative (dropping lowers the loss) in the fourth
    res = decide_c12(_world([0.0, 0.0, 0.0, -0.002], post=0.16))
    assert res["verdict"] == "supported"
    assert res["intervals"]["pre"]["n"] == res["intervals"]["post - pre"]["n"] == DROP_SEEDS
    assert [(p.subject, p.role, p.verdict) for p in res["predictions"]] == [
        ("pre", "claim", "supported"), ("post vs pre", "claim", "supported"),
        ("post", "diagnostic", "supported")]
    assert res["effect"].expected == f"> {DROP_MARGIN:g}"


def test_c12_both_placements_costing_the_same_is_not_supported():
    cheap = decide_c12(_world([0.001, 0.0, 0.002, 0.001], post=0.001, noise=0.001))
    assert [p.verdict for p in cheap["predictions"][:2]] == ["supported", "not supported"]
    assert cheap["verdict"] == "not supported"
    assert cheap["reason"] == "post's deep blocks do not cost 0.02 nats more than pre's"
    # both costly: pre's own prediction fails first
    dear = decide_c12(_world([0.15, 0.16, 0.14, 0.15], post=0.15))
    assert dear["predictions"][0].verdict == "not supported"
    assert dear["verdict"] == "not supported"
    assert dear["reason"] == "pre's deep blocks cost 0.02 nats or more to drop"


def test_c12_a_contrast_below_the_margin_is_not_a_contrast():
    # post's deep blocks cost 0.01 nats more than pre's, every seed: below the 0.02 margin
    res = decide_c12(_world([0.0] * DROP_SEEDS, post=0.01, noise=0.001))
    assert res["predictions"][1].verdict == "not supported" and res["verdict"] == "not supported"
    # an interval across the margin is not decided
    wide = decide_c12(_world([0.0] * DROP_SEEDS, post=0.02, noise=0.05, seed=3))
    assert wide["predictions"][1].verdict == "inconclusive" and wide["verdict"] == "inconclusive"
    assert decide_c12({"pre": [0.0], "post": [0.2]})["verdict"] == "inconclusive"


def test_c12_reports_the_contrast_at_init_and_calls_one_there_architectural():
    trained = _world([0.0] * DROP_SEEDS, post=0.16)
    same = decide_c12(trained, init=_world([0.05] * DROP_SEEDS, post=0.05, noise=0.001))
    assert same["predictions"][3].subject == "post vs pre at init"
    assert same["predictions"][3].role == "diagnostic"
    assert same["verdict"] == "supported" and same["reason"].endswith(
        "at init the contrast is absent (at or below 0.02 nats): learned")
    there = decide_c12(trained, init=_world([0.0] * DROP_SEEDS, post=0.2))
    assert there["verdict"] == "supported"  # the trained models decide; the note says why
    assert "present at init" in there["reason"] and "architectural, not learned" in \
        there["reason"]
    assert there["intervals"]["post - pre at init"]["n"] == DROP_SEEDS


class _Ctx:
    """What c12_own_models reads of a study: its profile, device, a cache and probe batches."""

    profile = SimpleNamespace(match_tolerance=0.05)
    device = "cpu"

    def __init__(self) -> None:
        self.cached_names: list[str] = []

    def cached(self, name, compute):
        self.cached_names.append(name)
        return compute()

    def probe_batches(self, seq_len=None):
        return []


def _pairs() -> list[Pretrained]:
    return [Pretrained(pl, s, Path(f"/runs/{pl}-{s}"), 2.5, step=400)
            for pl in ("pre", "post") for s in range(DROP_SEEDS)]


def test_c12_own_models_keeps_every_seed_the_old_median_rule_left_out(monkeypatch):
    """The recorded long study's case: pre's deep blocks cost 0 (three seeds) or lower the
    loss (one seed, whose median interior cost is below 0: the old statistic left it out)."""
    trained = {"pre-0": _drop_curve(0.0), "pre-1": _drop_curve(0.0), "pre-2": _drop_curve(0.0),
               "pre-3": _drop_curve(-0.002, interior=-0.0005)}
    trained |= {f"post-{s}": _drop_curve(0.15 + 0.01 * s, interior=0.2) for s in range(DROP_SEEDS)}

    def curve(run_dir, batches, step=None, *, at_init=False, device="cpu"):
        name = Path(run_dir).name
        return {"drop_dloss": _drop_curve(0.01) if at_init else trained[name], "n_blocks": L}

    monkeypatch.setattr(c12, "own_drop_curve", curve)
    monkeypatch.setattr(c12, "own_late_angle", lambda *a, **k: 0.1)
    ctx = _Ctx()
    res = c12.c12_own_models(ctx, _pairs())
    assert res["left_out"] == [] and sorted(res["per_seed"]) == list(range(DROP_SEEDS))
    assert res["per_seed"][3]["pre"]["depth_slope"] is None  # the old statistic: undefined
    assert res["deep_costs"]["pre"] == pytest.approx([0.0, 0.0, 0.0, -0.002])
    assert res["verdict"] == "supported"
    # each run's model at step 0 measured beside it, cached apart
    assert res["init_deep_costs"] == {"pre": [0.01] * DROP_SEEDS, "post": [0.01] * DROP_SEEDS}
    assert "c12_drop_pre-0_init" in ctx.cached_names and "c12_drop_pre-0_step400" in \
        ctx.cached_names
    assert "absent" in res["reason"]
    # a world where post's deep blocks cost what pre's do: not supported, every seed kept
    trained |= {f"post-{s}": _drop_curve(0.0, interior=0.2) for s in range(DROP_SEEDS)}
    flat = c12.c12_own_models(_Ctx(), _pairs())
    assert flat["verdict"] == "not supported" and flat["left_out"] == []


def test_c12_measure_decides_on_the_deep_half_cost(monkeypatch, tmp_path):
    from normlab.interop import CheckpointNotFound

    def curve(run_dir, batches, step=None, *, at_init=False, device="cpu"):
        pl = Path(run_dir).name.split("-")[0]
        deep = 0.0 if at_init or pl == "pre" else 0.15
        return {"drop_dloss": _drop_curve(deep), "n_blocks": L}

    def no_real(ctx):
        raise CheckpointNotFound("not in the local cache (planted)")

    monkeypatch.setattr(c12, "own_drop_curve", curve)
    angles = iter([0.1, 0.12, 0.09, 0.11])  # pre's deeper half, per pair: near-identical
    monkeypatch.setattr(c12, "own_late_angle", lambda *a, **k: next(angles))
    monkeypatch.setattr(c12, "c12_real_models", no_real)
    ctx = FakeStudy(tmp_path)
    ctx.probe_batches = lambda seq_len=None: []
    res = c12.measure(ctx, _pairs())
    assert res.verdict == "supported", res.note
    assert [p["subject"] for p in res.predictions] == [
        "near-identical blocks", "trained pairs", "pre", "post vs pre", "post",
        "post vs pre at init"]
    assert res.predictions[0]["values"] == [0.1, 0.12, 0.09, 0.11]
    assert res.numbers["pairs"] == DROP_SEEDS
    assert res.effect.name == "deep-half drop cost (nats): post - pre"
    assert res.numbers["own_models"]["init_deep_costs"]["post"] == [0.0] * DROP_SEEDS
