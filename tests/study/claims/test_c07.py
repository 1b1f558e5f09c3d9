"""Tests of C7 (DeepNet: Post-LN's early model update explodes without warmup):
normlab/study/claims/c07_deepnet_update.py, on the planted study (tests/fake_study.py) and on what
it measures.
"""

from __future__ import annotations

import math

import pytest
from fake_study import DEEPNET, Planted
from planted_ladders import SEEDS, _verdicts, planted_study

from normlab.study.claims import c07_deepnet_update as c07
from normlab.study.ladders import fairseq_ladder
from normlab.study.profiles import PROFILES


def test_c7_runs_at_the_smallest_lr_where_post_without_warmup_failed(tmp_path):
    grid = sorted(PROFILES["quick"].lrs)
    result = c07.measure(planted_study(tmp_path, Planted(), failing_lrs=tuple(grid[1:])))
    assert result.numbers["lr"]["C6"] == grid[1]
    assert "failed (stalled)" in result.numbers["lr"]["why"]
    never = c07.measure(planted_study(tmp_path, Planted()))
    assert never.numbers["lr"]["C6"] == grid[-1] and "at no lr" in never.numbers["lr"]["why"]


def test_c7_names_every_way_post_failed_at_c6_s_lr(tmp_path):
    grid = sorted(PROFILES["quick"].lrs)
    mixed = Planted(runs={"outcomes": ["stalled", "diverged"] * (SEEDS // 2)})
    result = c07.measure(planted_study(tmp_path, mixed, failing_lrs=(grid[2],)))
    assert result.numbers["lr"] == {
        "source": c07.SOURCE_LR, "C6": grid[2],
        "why": "the smallest lr of C6's grid at which post without warmup failed (diverged, "
               "stalled)"}
    never = c07.measure(planted_study(tmp_path, Planted())).numbers["lr"]["why"]
    assert never == "post without warmup failed at no lr of C6's grid: its largest lr"


def test_log_ratios_are_undefined_unless_both_sides_are_positive():
    got = c07._log_ratios([1.0, math.e, 0.0, -1.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0, 0.0, -2.0])
    assert got[:2] == [0.0, pytest.approx(1.0)]
    assert all(math.isnan(v) for v in got[2:])


def test_c7_s_ratio_is_decided_at_0_not_at_a_factor(tmp_path):
    """DeepNet gives no factor: post's first update 1.5 times DeepNorm's supports the claim."""
    result = c07.measure(planted_study(tmp_path, Planted(tied={"deepnorm": 1.0 / 1.5})))
    assert _verdicts(result)["post vs deepnorm"] == "supported"
    pred = next(p for p in result.predictions if p["subject"] == "post vs deepnorm")
    assert pred["effect"]["estimate"] == pytest.approx(math.log(1.5), abs=0.01)


# -- C7 in the linear regime -----------------------------------------------------------------

def _c7_labels(result) -> dict[str, str]:
    return {r["key"]: r["rung"] for r in result.ladder}


def test_c7_asks_for_the_saturating_diagnostic_then_the_linear_grid_then_the_depths(tmp_path):
    p = PROFILES["quick"]
    grid = sorted(p.lrs)
    ctx = planted_study(tmp_path, Planted(), failing_lrs=tuple(grid[1:]))
    c07.measure(ctx)
    source, *toward = fairseq_ladder(p.width, p.heads)[:-1]  # post's own init is Xavier
    own = c07.CLAIM.settings(p)
    depths = sorted(set(p.init_depths) | {own.update_blocks})
    assert ctx.requests[0] == {"kind": "runs", "family": "post", "lrs": grid, "warmup": 0}
    # the saturating measure, a diagnostic: the source's lr, then C6's
    assert ctx.requests[1] == {
        "kind": "update", "name": f"ladder_deepnet_{c07.DEEPNET_CACHE}",
        "rungs": [(source.key, source.fields, c07.SOURCE_LR),
                  ("lr", source.fields, grid[1])] + [(r.key, r.fields, grid[1])
                                                     for r in toward],
        "depths": sorted({L for L in p.init_depths if own.update_blocks >= L}
                         | {own.update_blocks}),
        "steps": 1, "warmup": own.update_steps}
    # the linearity check: every lr of the grid at the deepest depth, post and DeepNorm only
    variants = list(c07.LINEAR_VARIANTS)
    assert ctx.requests[2] == {
        "kind": "update", "name": f"ladder_deepnet_linear_grid_{c07.LINEAR_CACHE}",
        "rungs": [(f"{r.key}@{x:g}", r.fields, x) for r in (source, *toward)
                  for x in c07.LINEAR_LRS],
        "depths": [depths[-1]], "steps": 1, "warmup": 0, "variants": variants,
        "distance": False}
    # then the shallower depths at each rung's linear lr (the deepest is the check's own)
    assert ctx.requests[3] == {
        "kind": "update",
        "name": f"ladder_deepnet_linear_{c07.LINEAR_CACHE}_"
                + "-".join(f"{r.key}@5e-06" for r in (source, *toward)),
        "rungs": [(r.key, r.fields, 5e-6) for r in (source, *toward)],
        "depths": depths[:-1], "steps": 1, "warmup": 0, "variants": variants,
        "distance": False}
    assert len(ctx.requests) == 4


def test_c7_reads_each_rung_at_the_largest_lr_linear_within_the_tolerance(tmp_path):
    """Planted: the update per unit lr departs from linear by lr / nonlinear_lr (5e-4): 10% at
    5e-5 (outside 5%), 1% at 5e-6, which every rung is read at; a rung bending 10x sooner is
    read at 5e-7; a rung linear at no lr of the grid has no measurement, and the verdict on
    normlab's block is then undecided."""
    result = c07.measure(planted_study(tmp_path, Planted(noise=0.0)))
    lin = result.numbers["linear_regime"]
    labels = _c7_labels(result)
    assert lin["lr"] == {labels[k]: 5e-6 for k in labels}
    check = lin["check"][labels["source"]]
    assert check["5e-05"]["post, no warmup"]["mean"] == pytest.approx(1.1 / 1.01)
    assert check["5e-06"]["deepnorm, no warmup"]["mean"] == pytest.approx(1.01 / 1.001)
    assert lin["checked_at_blocks"] == 24 and lin["tolerance"] == 0.05
    # per unit lr at 24 blocks: post's planted size 1.0 times (1 + 5e-6 / 5e-4)
    per = lin["first_update_per_unit_lr"][labels["tied"]]["post, no warmup"]["24"]
    assert per["mean"] == pytest.approx(1.01)
    assert result.verdict == "supported"
    sooner = c07.measure(planted_study(tmp_path, Planted(tied={"nonlinear_lr": 5e-5})))
    assert sooner.numbers["linear_regime"]["lr"][labels["tied"]] == 5e-7
    assert sooner.numbers["linear_regime"]["lr"][labels["source"]] == 5e-6
    assert sooner.verdict == "supported"
    never = c07.measure(planted_study(tmp_path, Planted(tied={"nonlinear_lr": 1e-9})))
    assert never.numbers["linear_regime"]["lr"][labels["tied"]] is None
    assert set(_verdicts(never).values()) == {"inconclusive"}
    assert never.verdict == "inconclusive"
    assert "not measured" in never.predictions[0]["derivation"]


def test_c7_s_linear_lr_rule_takes_the_largest_lr_whose_mean_ratio_is_within_5_percent():
    ok, off = [1.0, 1.04, 1.05], [1.2, 1.2, 1.2]
    x1, x2, x3 = c07.LINEAR_LRS[:3]
    v = c07.LINEAR_VARIANTS
    assert c07.linear_lr({x1: {v[0]: ok, v[1]: ok}, x2: {v[0]: ok, v[1]: ok},
                          x3: {v[0]: ok, v[1]: ok}}) == x1
    # one variant off at the largest lr: the next
    assert c07.linear_lr({x1: {v[0]: ok, v[1]: off}, x2: {v[0]: ok, v[1]: ok},
                          x3: {v[0]: off, v[1]: off}}) == x2
    assert c07.linear_lr({x: {v[0]: off, v[1]: ok} for x in (x1, x2, x3)}) is None
    assert c07.linear_lr({x: {v[0]: [math.nan], v[1]: ok} for x in (x1, x2, x3)}) is None


def test_c7_s_verdict_does_not_read_the_saturating_measure(tmp_path):
    """Post's first update at the rungs' own lrs planted at 30 at every depth, past half the
    init-to-init distance (10): saturated everywhere, reported as such, and the verdict in the
    linear regime is the planted world's."""
    world = Planted(**{k: {"post": 30.0, "post_depth": 0.0, "post_linear": 1.0,
                           "post_depth_linear": 1.0}
                       for k in ("source", "lr", "gelu", "tied")})
    result = c07.measure(planted_study(tmp_path, world))
    sat = result.numbers["saturating_measure"]
    assert set(map(tuple, sat["unsaturated_depths"].values())) == {()}
    assert all(v["saturated"] for v in sat["saturation_at_the_first_step"].values())
    assert result.verdict == "supported"
    assert all(v == "supported" for v in _verdicts(result).values())


def test_c7_deepnorm_growing_like_n_to_the_0_56_fails_the_bounded_law(tmp_path):
    """The numbers the linear regime gave on normlab's block: post's first update growing like
    N^1.32 and DeepNorm's like N^0.56. Bounded is a slope in the O(1) law's band: DeepNorm's
    fails it there (the source rung keeps the laws), and the claim is not supported; post's
    growth holds."""
    world = Planted(tied={"post_depth_linear": 1.32, "deepnorm_depth_linear": 0.56})
    result = c07.measure(planted_study(tmp_path, world))
    assert result.calibration == "passed"
    v = _verdicts(result)
    assert v["deepnorm: depth"] == "not supported" and v["post: depth"] == "supported"
    assert v["post vs deepnorm: depth"] == "supported"
    dn = next(p for p in result.predictions if p["subject"] == "deepnorm: depth")
    assert dn["effect"]["estimate"] == pytest.approx(0.56, abs=0.02)
    assert result.verdict == "not supported"


@pytest.mark.parametrize("slope, verdict", [(0.35, "not supported"), (0.15, "supported")])
def test_c7_reads_bounded_as_the_o1_band_so_a_logarithmic_growth_is_not_bounded(
        tmp_path, slope, verdict):
    """"Bounded" is O(1): DeepNorm's slope must lie nearer 0 than ln N's slope over the depths
    measured (C8's nearest-law bands). Over the quick profile's 3-24 blocks ln N has slope
    0.507, so the band ends at 0.253: a slope of 0.35 (about ln N's growth), which the former
    midpoint of 1/2 let pass, is not bounded; 0.15 is."""
    from normlab.study.claims.ladder import log_law_slope, nearest_law_bands

    world = Planted(tied={"post_depth_linear": 1.0, "deepnorm_depth_linear": slope})
    result = c07.measure(planted_study(tmp_path, world))
    dn = next(p for p in result.predictions if p["subject"] == "deepnorm: depth")
    depths = result.numbers["linear_regime"]["depths"]
    edge = round(nearest_law_bands(log_law_slope(depths))["O(1)"][1], 3)
    assert depths == [3, 6, 12, 24] and edge == 0.253
    assert dn["effect"]["expected"] == f"< {edge:g}" and dn["verdict"] == verdict


def test_c7_reports_warmup_s_and_pre_s_ratios_and_the_saturation_at_the_first_step(tmp_path):
    # planted: post's first update is 1.0 (L / 24) without warmup
    scale = c07.CLAIM.settings(PROFILES["quick"]).update_blocks / 24
    world = Planted(noise=0.0, **{k: {"post_warmup": 0.02} for k in ("source", "lr")})
    result = c07.measure(planted_study(tmp_path, world))
    lr_label = f"lr {result.numbers['lr']['C6']:g}"
    source = result.ladder[0]["rung"]
    warm = result.numbers["log_ratio_no_warmup_over_warmup"]
    assert warm[source]["mean"] == pytest.approx(math.log(scale / 0.02))
    assert warm[result.ladder[-1]["rung"]]["mean"] == pytest.approx(math.log(scale / 0.01))
    pre = result.numbers["log_ratio_post_over_pre_no_warmup"][lr_label]
    assert pre["mean"] == pytest.approx(math.log(scale / DEEPNET["pre"]))
    sat = result.numbers["saturating_measure"]["saturation_at_the_first_step"][source]
    assert sat["first_update_post"]["mean"] == pytest.approx(scale)
    assert sat["init_distance"]["mean"] == pytest.approx(10.0)
    assert sat["saturated"] is False
    dn = result.numbers["saturating_measure"]["log_ratio_post_over_deepnorm"][source]
    assert dn["mean"] == pytest.approx(math.log(scale / DEEPNET["deepnorm"]))
    assert result.numbers["lr"]["source"] == c07.SOURCE_LR
    # exactly half the distance is saturated already; strictly past it, saturated
    half = Planted(noise=0.0, source={"post": 5.0, "post_depth": 0.0})
    got = c07.measure(planted_study(tmp_path, half)).numbers["saturating_measure"]
    assert got["unsaturated_depths"][source] == []
    assert got["saturation_at_the_first_step"][source]["saturated"] is False
    big = Planted(noise=0.0, source={"post": 20.0 / scale})  # 20 > half the distance (5)
    assert c07.measure(planted_study(tmp_path, big)).numbers["saturating_measure"][
        "saturation_at_the_first_step"][source]["saturated"] is True
