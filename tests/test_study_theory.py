"""The theory claims' decisions on planted ladders: a world where every source statement holds on
every rung supports every prediction; breaking one prediction on one rung makes exactly that
prediction "not supported" there, and the ladder names that rung as the departure; breaking it in
the source's own setting turns the claim into "calibration failed"; noise leaves the calibration
inconclusive. The derived predictions are checked on planted laws (a + b ln n gives the O(log n)
band; a bound violated is not supported).

A fake study context serves the cached ladders from a few planted parameters per rung, so each
rule is tested without building a model.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from normlab.study import theory
from normlab.study.ladders import fairseq_ladder, xiong_ladder
from normlab.study.profiles import PROFILES

SEEDS = 6

# What the sources state, per placement, in the planted parameters' terms.
XIONG = {"pre_inc": 1.0, "post_norm_in": 1.5, "pre_mech": 0.0, "post_slope": 0.0,
         "post_trend": 1.0, "pre_trend": 0.0}
ADMIN = {"post": "n", "pre": "log", "admin": "log", "admin_o1": "const"}
DEEPNET = {"post": 1.0, "deepnorm": 0.05, "pre": 0.1, "post_depth": 1.0, "deepnorm_depth": 0.0}


class Planted:
    """Per rung key, parameters overriding the source-consistent defaults; noise per value."""

    def __init__(self, noise: float = 0.005, **by_rung: dict[str, Any]) -> None:
        self.noise, self.by_rung = noise, by_rung
        self.rng = random.Random(0)

    def param(self, rung: str, key: str, default: Any) -> Any:
        return self.by_rung.get(rung, {}).get(key, default)

    def jitter(self, value: float) -> float:
        return value * math.exp(self.noise * self.rng.gauss(0.0, 1.0))


class FakeContext:
    """Serves the ladders a claim asks `init_ladder` / `update_ladder` for, made for exactly the
    rungs, placements, depths and measurements asked (a claim that asks for the wrong ones reads
    data that is not there), and records each request in `requests`."""

    def __init__(self, tmp: Path, world: Planted, failing_lrs: tuple[float, ...] = ()) -> None:
        self.out, self.world, self.failing_lrs = tmp, world, failing_lrs
        self.fig_dir = tmp / "figures"
        self.fig_dir.mkdir(exist_ok=True)
        self.profile = PROFILES["quick"]
        self.log = lambda _m: None
        self.requests: list[dict[str, Any]] = []

    def cached(self, name: str, compute) -> Any:
        raise AssertionError(f"the theory claims read their ladders through init_ladder and "
                             f"update_ladder, not ctx.cached ({name})")

    def init_ladder(self, name: str, rungs, placements, depths, perturb: bool = False,
                    stats: bool = True) -> dict[str, Any]:
        self.requests.append({"kind": "init", "name": name, "rungs": list(rungs),
                              "placements": list(placements), "depths": list(depths),
                              "perturb": perturb, "stats": stats})
        if name.startswith("ladder_admin"):
            return self._admin(rungs, placements, depths, perturb)
        return self._xiong(rungs, placements, depths, stats)

    def update_ladder(self, name: str, rungs, depths, steps: int, warmup: int
                      ) -> dict[str, Any]:
        self.requests.append({"kind": "update", "name": name,
                              "rungs": [(r.key, r.fields, lr) for r, lr in rungs],
                              "depths": list(depths),
                              "steps": steps, "warmup": warmup})
        return self._deepnet([r.key for r, _ in rungs], depths)

    def depths(self) -> list[int]:
        return sorted(set(self.profile.init_depths) | {theory.FIG3_DEPTH})

    # -- Xiong's ladder: C1, C4, C5 ------------------------------------------------------------
    def _stats(self, rung: str, placement: str, L: int) -> dict[str, Any]:
        w, d = self.world, 64.0
        inc = w.param(rung, "pre_inc", 0.5 if rung == "source_a" else XIONG["pre_inc"])
        if placement == "pre":
            sq = [d * (1 + w.jitter(inc) * (l + 1)) for l in range(L)]
            # the mechanism: grad ~ E||x_L||^-1/2-power, times L^(planted departure)
            grad = (sq[-1] / d) ** -0.5 * L ** w.param(rung, "pre_mech", XIONG["pre_mech"])
            trend = w.param(rung, "pre_trend", XIONG["pre_trend"])
            norm_in = [d * 3.0] * L
        else:
            sq = [d] * L
            grad = L ** w.param(rung, "post_slope", XIONG["post_slope"])
            trend = w.param(rung, "post_trend", XIONG["post_trend"])
            norm_in = [d * w.jitter(w.param(rung, "post_norm_in", XIONG["post_norm_in"]))] * L
        trend = w.param(rung, f"{placement}_trend@{L}", trend)  # a trend at one depth only
        trend = trend + w.noise * 20 * w.rng.gauss(0.0, 1.0)
        fc = [math.exp(trend * i / max(1, L - 1)) for i in range(L)]
        return {"per_block": {"sq_norm": sq, "mlp_norm_input_sq": norm_in, "fc_out_grad": fc},
                "summary": {"embed_sq": d, "final_in_sq": sq[-1],
                            "last_fc_out_grad": w.jitter(grad), "d_model": 64, "n_blocks": L}}

    def _xiong(self, rungs, placements, depths, stats: bool) -> dict[str, Any]:
        return {r.key: {pl: [{"n_blocks": L, "seed": s}
                             | ({"stats": self._stats(r.key, pl, L)} if stats else {})
                             for s in range(SEEDS) for L in depths]
                        for pl in placements} for r in rungs}

    # -- Admin's ladder: C8 ----------------------------------------------------------------------
    def _admin(self, rungs, placements, depths, perturb: bool) -> dict[str, Any]:
        laws = {"n": lambda n: float(n), "log": math.log, "const": lambda n: 1.0}
        out = {}
        for r in rungs:
            out[r.key] = {}
            for pl in placements:
                f = laws[self.world.param(r.key, pl, ADMIN[pl])]
                out[r.key][pl] = [{"n_blocks": L, "seed": s}
                                  | ({"perturb_change": self.world.jitter(f(2 * L))}
                                     if perturb else {})
                                  for s in range(SEEDS) for L in depths]
        return out

    # -- DeepNet's ladder: C7 --------------------------------------------------------------------
    def _deepnet(self, keys: list[str], depths) -> dict[str, Any]:
        w = self.world
        out = {}
        for key in keys:
            def series(name: str, depth_key: str | None, key=key) -> list[dict[str, Any]]:
                size = w.param(key, name, DEEPNET.get(name, 0.01))
                slope = w.param(key, depth_key, DEEPNET[depth_key]) if depth_key else 0.0
                return [{"n_blocks": L, "seed": s,
                         "update": [0.0, w.jitter(size * (L / 24) ** slope)]}
                        for L in depths for s in range(SEEDS)]
            out[key] = {"lr": 1e-3, "series": {
                "post, no warmup": series("post", "post_depth"),
                "post, warmup": series("post_warmup", None),
                "deepnorm, no warmup": series("deepnorm", "deepnorm_depth"),
                "pre, no warmup": series("pre", None)},
                "init_distance": [{"n_blocks": L, "seed": s,
                                   "distance": w.param(key, f"distance@{L}", 10.0)}
                                  for L in depths for s in range(SEEDS)]}
        return out

    def runs(self, family: str, lrs: list[float], warmup: int) -> dict[float, Any]:
        self.requests.append({"kind": "runs", "family": family, "lrs": list(lrs),
                              "warmup": warmup})
        if family != "post" or warmup != 0:
            raise AssertionError(f"C7 reads C6's post runs without warmup, not {family} "
                                 f"with warmup {warmup}")
        outcomes = self.world.param("runs", "outcomes", ["stalled"] * SEEDS)
        return {lr: [{"seed": s, "failed": lr in self.failing_lrs,
                      "outcome": outcomes[s] if lr in self.failing_lrs else "completed"}
                     for s in range(SEEDS)] for lr in lrs}

    def trained_probes(self) -> dict[str, Any]:
        return {"pair": {"matched": False, "reason": "not trained in this test"}}


@pytest.fixture(autouse=True)
def figure_calls(stub_figures):
    return stub_figures(theory, ["plot_ladder"])


@pytest.fixture(autouse=True)
def _ladders_from_the_fake_context(monkeypatch):
    """The claims' ladder requests go to the fake context, which serves what they ask for."""
    monkeypatch.setattr(theory, "init_ladder", lambda ctx, *a, **k: ctx.init_ladder(*a, **k))
    monkeypatch.setattr(theory, "update_ladder",
                        lambda ctx, *a, **k: ctx.update_ladder(*a, **k))


CLAIMS = {"C1": theory.c1, "C4": theory.c4, "C5": theory.c5, "C7": theory.c7, "C8": theory.c8}
# Per claim, each prediction's subject and a planted value that breaks it (on any rung).
BREAKS: dict[str, dict[str, dict[str, Any]]] = {
    "C1": {"pre": {"pre_inc": 2.0}, "post": {"post_norm_in": 2.2}},
    "C4": {"post": {"post_slope": 0.35}, "pre": {"pre_mech": 0.35},
           "pre vs post": {"post_slope": -0.24, "pre_mech": 0.24}},
    "C5": {"post vs pre": {"pre_trend": 3.0}, "post": {"post_trend": -0.5, "pre_trend": -1.0}},
    "C7": {"post vs deepnorm": {"deepnorm": 1.0},
           "post: depth": {"post_depth": -1.0, "deepnorm_depth": -1.5},
           "post vs deepnorm: depth": {"deepnorm_depth": 2.0}},
    "C8": {"post": {"post": "log", "pre": "const"}, "pre": {"pre": "const"},
           "admin": {"admin": "const"}, "admin O(1)": {"admin_o1": "log"},
           "post vs pre": {"post": "log", "pre": "n"}},
}


# Breaks that must move more than one prediction (the predictions share a measurement).
COUPLED: dict[tuple[str, str], tuple[str, ...]] = {
    ("C5", "post"): ("post",),
    ("C8", "post vs pre"): ("post", "pre", "post vs pre"),
    ("C8", "post"): ("post", "pre"),
    ("C7", "post: depth"): ("post: depth",),
}


def _final_key(cid: str) -> str:
    return "deep" if cid == "C5" else "init" if cid in ("C1", "C4", "C8") else "tied"


def _source_keys(cid: str) -> list[str]:
    return ["source_a", "source_b"] if cid in ("C1", "C4", "C5") else ["source"]


def _verdicts(result) -> dict[str, str]:
    return {p["subject"]: p["verdict"] for p in result.predictions}


@pytest.mark.draws
@pytest.mark.parametrize("cid", sorted(CLAIMS))
def test_source_statements_everywhere_support_every_prediction_on_every_rung(cid, tmp_path):
    result = CLAIMS[cid](FakeContext(tmp_path, Planted()))
    assert result.calibration == "passed", [(r["rung"], r["verdict"]) for r in result.ladder]
    assert all(r["verdict"] == "supported" for r in result.ladder), [
        (r["rung"], [(p["subject"], p["verdict"]) for p in r["predictions"]])
        for r in result.ladder]
    assert result.verdict == "supported"
    assert result.departure.endswith(": contradicted on no rung")
    assert "departs" not in result.departure
    assert result.figures == [f"figures/{cid.lower()}_ladder.svg"]
    assert (tmp_path / result.figures[0]).read_text().startswith("<?xml")


@pytest.mark.parametrize(("cid", "subject"), [(c, s) for c in BREAKS for s in BREAKS[c]])
def test_each_prediction_broken_in_turn_on_normlab_s_block(cid, subject, tmp_path):
    key = _final_key(cid)
    if cid == "C5":  # the deep rung reads the last rung's measurements at the deepest model
        key = "init"
    result = CLAIMS[cid](FakeContext(tmp_path, Planted(**{key: BREAKS[cid][subject]})))
    verdicts = _verdicts(result)
    expected = {s: "not supported" if s in COUPLED.get((cid, subject), (subject,)) else
                "supported" for s in verdicts}
    assert verdicts == expected
    assert result.calibration == "passed"
    assert result.verdict == "not supported"
    first = next(r for r in result.ladder if r["key"] == key)
    assert f"{subject} departs when {first['change']} ({first['rung']})" in result.departure


@pytest.mark.parametrize("cid", sorted(CLAIMS))
def test_a_prediction_broken_in_the_source_setting_fails_the_calibration(cid, tmp_path):
    subject, change = next(iter(BREAKS[cid].items()))
    world = Planted(**{k: change for k in _source_keys(cid) + ["lr"]})
    result = CLAIMS[cid](FakeContext(tmp_path, world))
    assert result.calibration == "failed"
    assert result.verdict == "calibration failed"
    assert "Calibration failed" in result.note


def test_one_reading_that_holds_passes_the_calibration_and_names_the_departure(tmp_path):
    result = theory.c1(FakeContext(tmp_path, Planted(source_b={"pre_inc": 2.0})))
    assert result.calibration == "passed (source, reading A: FFN only)"
    assert "pre departs when uniform attention added" in result.departure


def test_a_planted_departure_is_attributed_to_its_rung(tmp_path):
    result = theory.c4(FakeContext(tmp_path, Planted(gelu={"post_slope": 0.6},
                                                     tied={"post_slope": 0.6},
                                                     init={"post_slope": 0.6})))
    assert "post departs when a 4d GELU MLP" in result.departure


@pytest.mark.parametrize("cid", sorted(CLAIMS))
def test_noise_leaves_the_calibration_inconclusive(cid, tmp_path):
    result = CLAIMS[cid](FakeContext(tmp_path, Planted(noise=3.0)))
    assert result.calibration in ("inconclusive", "failed") or result.verdict != "supported"
    assert result.verdict in ("inconclusive", "calibration failed", "not supported")


def test_c7_runs_at_the_smallest_lr_where_post_without_warmup_failed(tmp_path):
    grid = sorted(PROFILES["quick"].lrs)
    result = theory.c7(FakeContext(tmp_path, Planted(), failing_lrs=tuple(grid[1:])))
    assert result.numbers["lr"]["C6"] == grid[1]
    assert "failed (stalled)" in result.numbers["lr"]["why"]
    never = theory.c7(FakeContext(tmp_path, Planted()))
    assert never.numbers["lr"]["C6"] == grid[-1] and "at no lr" in never.numbers["lr"]["why"]


# -- what each claim asks for, says and reports ------------------------------------------------

@pytest.mark.parametrize("cid", sorted(CLAIMS))
def test_the_claim_s_words_are_the_recorded_ones(cid, tmp_path, recorded_words, figure_calls):
    recorded_words(f"theory_{cid}", CLAIMS[cid](FakeContext(tmp_path, Planted())),
                   figure_calls)


def test_the_calibration_s_failed_and_inconclusive_words_are_the_recorded_ones(tmp_path,
                                                                                recorded_words):
    broken = Planted(source_a={"pre_inc": 2.0}, source_b={"pre_inc": 2.0})
    recorded_words("theory_C1_calibration_failed", theory.c1(FakeContext(tmp_path, broken)))
    recorded_words("theory_C1_noise", theory.c1(FakeContext(tmp_path, Planted(noise=3.0))))


def test_c1_c4_and_c5_share_one_sweep_of_xiong_s_ladder(tmp_path):
    p = PROFILES["quick"]
    asked = []
    for cid in ("C1", "C4", "C5"):
        ctx = FakeContext(tmp_path, Planted())
        CLAIMS[cid](ctx)
        asked += ctx.requests
    sweep = {"kind": "init", "name": f"ladder_xiong_{theory.CACHE_VERSION}",
             "rungs": xiong_ladder(p.width, p.heads),
             "placements": ["pre", "post"],
             "depths": sorted(set(p.init_depths) | {theory.FIG3_DEPTH}),
             "perturb": False, "stats": True}
    assert asked == [sweep] * 3


def test_c8_asks_for_admin_s_perturbation_on_fairseq_s_ladder_and_nothing_else(tmp_path):
    p = PROFILES["quick"]
    ctx = FakeContext(tmp_path, Planted())
    theory.c8(ctx)
    assert ctx.requests == [{"kind": "init", "name": f"ladder_admin_{theory.CACHE_VERSION}",
                             "rungs": fairseq_ladder(p.width, p.heads),
                             "placements": ["post", "pre", "admin", "admin_o1"],
                             "depths": list(p.init_depths), "perturb": True, "stats": False}]


def test_c7_asks_for_one_first_step_at_the_source_lr_then_at_c6_s(tmp_path):
    p = PROFILES["quick"]
    grid = sorted(p.lrs)
    ctx = FakeContext(tmp_path, Planted(), failing_lrs=tuple(grid[1:]))
    theory.c7(ctx)
    source, *toward = fairseq_ladder(p.width, p.heads)[:-1]  # post's own init is Xavier
    assert ctx.requests[0] == {"kind": "runs", "family": "post", "lrs": grid, "warmup": 0}
    assert ctx.requests[1:] == [{
        "kind": "update", "name": f"ladder_deepnet_{theory.DEEPNET_CACHE}",
        "rungs": [(source.key, source.fields, theory.SOURCE_LR),
                  ("lr", source.fields, grid[1])] + [(r.key, r.fields, grid[1])
                                                     for r in toward],
        "depths": sorted({L for L in p.init_depths if p.update_blocks >= L}
                         | {p.update_blocks}),
        "steps": 1, "warmup": p.update_steps}]


def _fit(xs, ys) -> float:
    return theory.loglog_fit([(x, y, 0) for x, y in zip(xs, ys, strict=True)],
                             n_boot=0)["slope"]


def test_c1_reports_the_growth_exponent_and_the_range_the_bounds_allow(tmp_path):
    L = max(PROFILES["quick"].init_depths)
    result = theory.c1(FakeContext(tmp_path, Planted()))
    allowed = result.numbers["exponent_range_the_bounds_allow"]
    assert allowed == pytest.approx([1 - math.log(3) / math.log(L), 1 + math.log(3) / math.log(L)])
    # planted: E||x_l||^2 - E||x_0||^2 = d inc l, an exponent of 1 on every rung
    exps = result.numbers["growth_exponent_of_E_x_sq_at_init"]
    assert set(exps) == {r["rung"] for r in result.ladder}
    assert all(e["mean"] == pytest.approx(1.0, abs=0.02) for e in exps.values()), exps
    assert f"[{allowed[0]:.2f}, {allowed[1]:.2f}] at L = {L}" in result.caveat


def test_c4_reports_each_placement_s_planted_slope(tmp_path):
    depths = PROFILES["quick"].init_depths
    result = theory.c4(FakeContext(tmp_path, Planted(init={"post_slope": 0.35,
                                                           "pre_mech": 0.1})))
    last = result.numbers["slopes"][result.ladder[-1]["rung"]]
    stream = _fit(depths, [1 + L for L in depths])  # planted E||x_L||^2 / d = 1 + L
    assert last["post"]["mean"] == pytest.approx(0.35, abs=0.01)
    assert last["pre E||x_L||^2"]["mean"] == pytest.approx(stream, abs=0.01)
    assert last["pre"]["mean"] == pytest.approx(-0.5 * stream + 0.1, abs=0.01)
    first = result.numbers["slopes"][result.ladder[0]["rung"]]
    assert first["post"]["mean"] == pytest.approx(0.0, abs=0.01)


def test_c5_reports_each_placement_s_planted_trend(tmp_path):
    result = theory.c5(FakeContext(tmp_path, Planted(noise=0.0, init={"pre_trend": 0.4})))
    init = next(r["rung"] for r in result.ladder if r["key"] == "init")
    assert result.numbers["pre_trend"][init]["mean"] == pytest.approx(0.4, abs=1e-9)
    assert result.numbers["post_trend"][init]["mean"] == pytest.approx(1.0, abs=1e-9)


def test_c8_reports_the_law_bands_and_each_placement_s_slope(tmp_path):
    depths = PROFILES["quick"].init_depths
    result = theory.c8(FakeContext(tmp_path, Planted()))
    s_log = theory.log_law_slope([2 * L for L in depths])
    assert result.numbers["slope_of_ln_n_over_these_depths"] == pytest.approx(s_log)
    assert result.numbers["law_bands"] == {k: list(v) for k, v in
                                           theory.nearest_law_bands(s_log).items()}
    last = result.numbers["slopes"][result.ladder[-1]["rung"]]
    assert last["post"]["mean"] == pytest.approx(1.0, abs=0.01)
    assert last["pre"]["mean"] == pytest.approx(s_log, abs=0.01)
    assert last["admin"]["mean"] == pytest.approx(s_log, abs=0.01)
    assert last["admin_o1"]["mean"] == pytest.approx(0.0, abs=0.01)


def test_c7_reports_warmup_s_and_pre_s_ratios_and_the_saturation_at_the_first_step(tmp_path):
    p = PROFILES["quick"]
    scale = p.update_blocks / 24  # planted: post's first update is 1.0 (L / 24) without warmup
    world = Planted(noise=0.0, **{k: {"post_warmup": 0.02} for k in ("source", "lr")})
    result = theory.c7(FakeContext(tmp_path, world))
    source, lr = result.ladder[0]["rung"], result.ladder[1]["rung"]
    warm = result.numbers["log_ratio_no_warmup_over_warmup"]
    assert warm[source]["mean"] == pytest.approx(math.log(scale / 0.02))
    assert warm[result.ladder[-1]["rung"]]["mean"] == pytest.approx(math.log(scale / 0.01))
    pre = result.numbers["log_ratio_post_over_pre_no_warmup"][lr]
    assert pre["mean"] == pytest.approx(math.log(scale / DEEPNET["pre"]))
    sat = result.numbers["saturation_at_the_first_step"][source]
    assert sat["first_update_post"]["mean"] == pytest.approx(scale)
    assert sat["init_distance"]["mean"] == pytest.approx(10.0)
    assert sat["saturated"] is (scale > 5.0)
    assert result.numbers["lr"]["source"] == theory.SOURCE_LR
    big = Planted(noise=0.0, source={"post": 20.0 / scale})  # 20 > half the distance (5)
    assert theory.c7(FakeContext(tmp_path, big)).numbers["saturation_at_the_first_step"][
        source]["saturated"] is True


def test_c7_names_every_way_post_failed_at_c6_s_lr(tmp_path):
    grid = sorted(PROFILES["quick"].lrs)
    mixed = Planted(runs={"outcomes": ["stalled", "diverged"] * (SEEDS // 2)})
    result = theory.c7(FakeContext(tmp_path, mixed, failing_lrs=(grid[2],)))
    assert result.numbers["lr"] == {
        "source": theory.SOURCE_LR, "C6": grid[2],
        "why": "the smallest lr of C6's grid at which post without warmup failed (diverged, "
               "stalled)"}
    never = theory.c7(FakeContext(tmp_path, Planted())).numbers["lr"]["why"]
    assert never == "post without warmup failed at no lr of C6's grid: its largest lr"


def test_c7_reads_the_init_distance_at_each_depth_and_saturates_strictly_past_half(tmp_path):
    p = PROFILES["quick"]
    rungs = ("source", "lr", "gelu", "tied")
    # post's first update 15 (L / 24): 7.5 at 12 blocks, below half a distance of 100 there only
    far = Planted(noise=0.0, **{k: {"post": 15.0, "post_depth": 1.0, "distance@12": 100.0}
                                for k in rungs})
    assert set(theory.c7(FakeContext(tmp_path, far)).numbers["depth_of_the_ratios"].values()
               ) == {12}
    # exactly half the distance is saturated already: no depth to read the ratio at
    half = Planted(noise=0.0, **{k: {"post": 5.0, "post_depth": 0.0} for k in rungs})
    result = theory.c7(FakeContext(tmp_path, half))
    assert set(result.numbers["depth_of_the_ratios"].values()) == {None}
    source = result.ladder[0]["rung"]
    assert result.numbers["saturation_at_the_first_step"][source]["saturated"] is False
    above = Planted(noise=0.0, source={"post": 8.0, "post_depth": 0.0,
                                       f"distance@{p.update_blocks}": 10.0, "distance@3": 1.0})
    sat = theory.c7(FakeContext(tmp_path, above)).numbers["saturation_at_the_first_step"][source]
    assert sat["saturated"] is True and sat["init_distance"]["mean"] == pytest.approx(10.0)


def test_log_ratios_are_undefined_unless_both_sides_are_positive():
    got = theory._log_ratios([1.0, math.e, 0.0, -1.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0, 0.0, -2.0])
    assert got[:2] == [0.0, pytest.approx(1.0)]
    assert all(math.isnan(v) for v in got[2:])


def test_growth_exponent_needs_two_blocks_above_the_embedding():
    def stats(sq):
        return {"summary": {"embed_sq": 1.0}, "per_block": {"sq_norm": sq}}

    assert theory.growth_exponent_sq(stats([2.0, 3.0])) == pytest.approx(1.0)  # 1, 2 at l = 1, 2
    assert theory.growth_exponent_sq(stats([1.0, 2.0, 5.0])) == pytest.approx(
        math.log(4.0) / math.log(1.5))  # the block at the embedding's level is left out
    assert math.isnan(theory.growth_exponent_sq(stats([0.5, 2.0])))


def _row(rung: str, calibration: bool, verdict: str, **subjects: str) -> dict[str, Any]:
    return {"rung": rung, "change": f"{rung} changed", "calibration": calibration,
            "verdict": verdict, "predictions": [{"subject": k.replace("_", " "), "verdict": v}
                                                for k, v in subjects.items()]}


def test_calibration_status_names_the_readings_that_hold():
    rows = [_row("a", True, "supported"), _row("b", True, "not supported"),
            _row("c", True, "supported"), _row("block", False, "not supported")]
    assert theory.calibration_status(rows) == {
        "status": "passed (a; c)", "held": ["a", "c"], "contradicted": ["b"],
        "rungs": ["a", "b", "c"]}
    assert theory.calibration_status(rows[:1])["status"] == "passed"
    assert theory.calibration_status([rows[1], _row("d", True, "inconclusive")])["status"] == \
        "failed"
    assert theory.calibration_status([_row("d", True, "inconclusive")])["status"] == \
        "inconclusive"


def test_departure_names_each_prediction_s_first_contradicted_rung_after_the_source():
    rows = [_row("src", True, "supported", pre="supported", post="supported",
                 pre_vs_post="supported"),
            _row("mlp", False, "not supported", pre="not supported", post="supported",
                 pre_vs_post="supported"),
            _row("init", False, "not supported", pre="not supported", post="not supported",
                 pre_vs_post="supported")]
    assert theory.departure(rows) == ("pre departs when mlp changed (mlp); post departs when "
                                      "init changed (init); pre vs post: contradicted on no rung")
    assert theory.departure([_row("src", True, "inconclusive", pre="inconclusive")]) == ""


# -- the derived predictions on planted laws -------------------------------------------------------

NS = [2 * L for L in (3, 6, 12, 24, 48)]


def _slope(values: list[float]) -> float:
    return theory.loglog_fit([(n, v, 0) for n, v in zip(NS, values, strict=True)],
                             n_boot=0)["slope"]


@pytest.mark.parametrize(("a", "b"), [(0.0, 1.0), (1.0, 1.0), (0.5, 2.0)])
def test_a_planted_log_law_falls_in_the_log_band(a, b):
    bands = theory.nearest_law_bands(theory.log_law_slope(NS))
    lo, hi = bands["O(log n)"]
    assert lo <= _slope([a + b * math.log(n) for n in NS]) <= hi


def test_planted_linear_and_constant_laws_fall_in_their_own_bands():
    bands = theory.nearest_law_bands(theory.log_law_slope(NS))
    assert bands["O(n)"][0] <= _slope([3.0 + 2.0 * n for n in NS]) <= bands["O(n)"][1]
    assert bands["O(1)"][0] <= _slope([5.0] * len(NS)) <= bands["O(1)"][1]
    # the bands meet halfway between the laws' slopes 0, s_log and 1
    assert bands["O(1)"][1] == bands["O(log n)"][0]
    assert bands["O(log n)"][1] == bands["O(n)"][0]
    assert theory.log_law_slope(NS) == pytest.approx(0.337, abs=0.01)


def test_the_lemma_bounds_a_planted_increment_and_reject_a_violation(tmp_path):
    inside = theory.c1(FakeContext(tmp_path, Planted(init={"pre_inc": 1.4})))
    assert _verdicts(inside)["pre"] == "supported"
    above = theory.c1(FakeContext(tmp_path, Planted(init={"pre_inc": 1.6})))
    assert _verdicts(above)["pre"] == "not supported"
    below = theory.c1(FakeContext(tmp_path, Planted(init={"pre_inc": 0.4})))
    assert _verdicts(below)["pre"] == "not supported"


def test_per_block_increment_and_norm_input_read_the_stated_quantities():
    stats = {"per_block": {"sq_norm": [3.0, 5.0, 7.0], "mlp_norm_input_sq": [3.0, 6.0, 9.0]},
             "summary": {"embed_sq": 2.0, "d_model": 2, "n_blocks": 3}}
    assert theory.per_block_increment(stats) == pytest.approx((7.0 - 2.0) / (3 * 2))
    assert theory.norm_input_over_d(stats) == pytest.approx(3.0)


def test_law_bands_meet_halfway_between_the_laws_slopes():
    bands = theory.nearest_law_bands(0.4)
    assert bands == {"O(1)": pytest.approx((-0.2, 0.2)), "O(log n)": pytest.approx((0.2, 0.7)),
                     "O(n)": pytest.approx((0.7, 1.3))}


def test_c7_reads_its_ratio_at_the_deepest_depth_where_post_is_unsaturated(tmp_path):
    # post's first update, 15 (L / 24), passes half the init-to-init distance (5) beyond 6 blocks
    world = Planted(**{k: {"post": 15.0, "post_depth": 1.0} for k in ("source", "lr", "gelu",
                                                                      "tied")})
    result = theory.c7(FakeContext(tmp_path, world))
    assert set(result.numbers["depth_of_the_ratios"].values()) == {6}
    flat = Planted(**{k: {"post": 30.0, "post_depth": 0.0} for k in ("source", "lr", "gelu",
                                                                     "tied")})
    saturated = theory.c7(FakeContext(tmp_path, flat))
    assert set(saturated.numbers["depth_of_the_ratios"].values()) == {None}
    assert _verdicts(saturated)["post vs deepnorm"] == "inconclusive"


def test_c5_reads_the_figure_s_depth_and_its_depth_rung_the_deepest_model(tmp_path):
    """C5 is Fig. 3, a 6-layer model: every rung reads the 6-block models, and the depth rung
    alone reads the profile's deepest. Planted: post's trend falls at every depth but 6 in the
    source setting (the calibration must still pass), and on normlab's block at the deepest
    depth only (only the depth rung may fail)."""
    depths = FakeContext(tmp_path, Planted()).depths()
    deepest = max(PROFILES["quick"].init_depths)
    away = {f"post_trend@{L}": -1.0 for L in depths if L != theory.FIG3_DEPTH}
    world = Planted(source_a=away, source_b=away, init={f"post_trend@{deepest}": -1.0})
    result = theory.c5(FakeContext(tmp_path, world))
    assert result.calibration == "passed" and result.verdict == "not supported"
    by_rung = {r["key"]: {p["subject"]: p["verdict"] for p in r["predictions"]}
               for r in result.ladder}
    assert all(v["post"] == "supported" for k, v in by_rung.items() if k != "deep"), by_rung
    assert by_rung["deep"]["post"] == "not supported"
    deep = next(r for r in result.ladder if r["key"] == "deep")
    assert deep["rung"] == f"normlab's block at {deepest} blocks"
    assert f"{deepest} blocks instead of the source's {theory.FIG3_DEPTH}" in deep["change"]
    assert result.numbers["post_trend"][deep["rung"]]["mean"] < 0
    assert result.numbers["post_trend"]["normlab's block (own inits)"]["mean"] > 0
    # the predictions' words, as the report shows them
    first = next(r for r in result.ladder if r["key"] == "source_a")
    quantities = {p["subject"]: (p["quantity"], p["paper"]) for p in first["predictions"]}
    assert quantities == {
        "post": ("trend of log ||grad W^2|| over relative depth",
                 "Fig. 3: 'the scale of the expected gradients grows along with the layer index "
                 "for the Post-LN Transformer'"),
        "post vs pre": ("trend(post) - trend(pre)",
                        "Fig. 3: 'the scale almost keeps the same for different layers in the "
                        "Pre-LN Transformer'")}
