"""The theory claims' decisions on planted ladders: a world where every source statement holds on
every rung supports every prediction; breaking one claim prediction on one rung makes exactly that
prediction "not supported" there, and the ladder names that rung as the departure; breaking it in
the source's own setting turns the claim into "calibration failed"; breaking a diagnostic leaves
the verdict as it was; noise leaves the calibration inconclusive. The derived predictions are
checked on planted laws (a + b ln n gives the O(log n) band; a bound violated is not supported)
and on planted mechanisms (a rung's own branch energies give the increment its stream must show).

A fake study context serves the cached ladders from a few planted parameters per rung, so each
rule is tested without building a model.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from fake_study import DEEPNET, LADDER_SEEDS, FakeStudy, Planted
from fake_study import SEEDS as PROBE_SEEDS

from normlab.probe.fits import loglog_fit
from normlab.study.claims import c01_stream_growth as c01
from normlab.study.claims import c04_last_layer_gradient as c04
from normlab.study.claims import c05_gradient_by_layer as c05
from normlab.study.claims import c07_deepnet_update as c07
from normlab.study.claims import c08_admin_sensitivity as c08
from normlab.study.claims import ladder
from normlab.study.context import MatchedPair, ProbedPair
from normlab.study.ladders import fairseq_ladder, xiong_ladder
from normlab.study.profiles import PROFILES
from normlab.study.verdict import base_subject

SEEDS = LADDER_SEEDS


def planted_study(tmp: Path, world: Planted, failing_lrs: tuple[float, ...] = ()) -> FakeStudy:
    """The fake study serving `world`'s ladders (and C6's post runs failing at `failing_lrs`)."""
    return FakeStudy(tmp, profile="quick", world=world, failing_lrs=failing_lrs)


@pytest.fixture(autouse=True)
def figure_calls(stub_figures):
    return stub_figures(ladder, ["plot_ladder"])


CLAIMS = {"C1": c01.measure, "C4": c04.measure, "C5": c05.measure, "C7": c07.measure,
          "C8": c08.measure}
# Per claim, each claim prediction's subject and a planted change that breaks it, on normlab's
# block and in the source setting alike (off the source rungs C1's and C8's "pre" is the
# mechanism, "pre (mechanism)": the change breaks the source's bound and the mechanism both).
BREAKS: dict[str, dict[str, dict[str, Any]]] = {
    # pre: a stream growing by 2d per block, its branches adding d (a ratio of 2)
    "C1": {"pre": {"pre_inc": 2.0}, "pre grows linearly": {"pre_power": 2.0},
           "post": {"post_norm_in": 2.2}, "post flat": {"post_norm_slope": 0.6}},
    # off the source "pre vs post" is slope(pre) - slope(post) + slope(E||x_L||^2) / 2, that is
    # pre_mech - post_slope; on the source rungs it is that plus 1/2 - slope(E||x_L||^2) / 2
    # (0.10 and 0.06 here): each break keeps the other two inside +- 0.25 on every rung
    "C4": {"post": {"post_slope": 0.35, "pre_mech": 0.2},
           "pre": {"pre_mech": 0.3, "post_slope": 0.2},
           "pre vs post": {"post_slope": -0.2, "pre_mech": 0.2}},
    # post: falling, above a pre that falls more but stays within the flat margin (0.25);
    # pre flat: pre falling by 0.6 over the model, which post's rise still clears
    "C5": {"post": {"post_trend": -0.1, "pre_trend": -0.2}, "pre flat": {"pre_trend": -0.6}},
    "C7": {"post vs deepnorm": {"deepnorm": 2.0},
           "post: depth": {"post_depth": -1.0, "deepnorm_depth": -1.5},
           "deepnorm: depth": {"deepnorm_depth": 0.7},
           "post vs deepnorm: depth": {"post_depth": 0.2, "deepnorm_depth": 0.4}},
    # post: sqrt n is below O(n)'s band and still above pre's log; pre: a constant output change
    # (below O(log n) on the source, against a log-law mechanism elsewhere); post vs pre: pre's
    # output change and its mechanism both n^1.5, above post's n
    "C8": {"post": {"post": "sqrt"}, "pre": {"pre": "const"},
           "post vs pre": {"pre": "n1.5", "pre_mech": "n1.5"}},
}
# Per claim, each diagnostic's subject and the planted change (per rung key) that breaks it.
DIAGNOSTICS: dict[str, dict[str, dict[str, dict[str, Any]]]] = {
    "C1": {"pre trained grows faster": {"trained": {"pre_growth": -0.5}}},
    # post rising by 0.1, pre by 0.2 (inside the flat margin): post below pre
    "C5": {"post vs pre": {"init": {"post_trend": 0.1, "pre_trend": 0.2}}},
    "C8": {"admin": {"init": {"admin": "const"}},
           "admin O(1)": {"init": {"admin_o1": "log"}}},
}


# Breaks that must move more than one prediction (the predictions share a measurement): in the
# source setting pre's O(log n) band lies below post's O(n) order, so pre above post leaves it.
SOURCE_COUPLED: dict[tuple[str, str], tuple[str, ...]] = {
    ("C8", "post vs pre"): ("pre", "post vs pre"),
}


def _final_key(cid: str) -> str:
    """The rung the verdict is read on: normlab's block (C5: at the figure's depth, 6 blocks,
    the rung before the deep one; C7: the fairseq ladder without its own-init rung)."""
    return "tied" if cid == "C7" else "init"


def _source_keys(cid: str) -> list[str]:
    return ["source_a", "source_b"] if cid in ("C1", "C4", "C5") else ["source"]


# by the subject as the source rung names it: off the source rungs C1's "pre (mechanism)" is
# the same prediction as its source rung's "pre"
def _verdicts(result) -> dict[str, str]:
    return {base_subject(p["subject"]): p["verdict"] for p in result.predictions}


def _rung_verdicts(row: dict[str, Any]) -> dict[str, str]:
    return {base_subject(p["subject"]): p["verdict"] for p in row["predictions"]}


def _roles(result) -> dict[str, str]:
    return {base_subject(p["subject"]): p["role"] for p in result.predictions}


@pytest.mark.draws
@pytest.mark.parametrize("cid", sorted(CLAIMS))
def test_source_statements_everywhere_support_every_prediction_on_every_rung(cid, tmp_path):
    result = CLAIMS[cid](planted_study(tmp_path, Planted()))
    assert result.calibration == "passed", [(r["rung"], r["verdict"]) for r in result.ladder]
    assert all(p["verdict"] == "supported" for r in result.ladder for p in r["predictions"]), [
        (r["rung"], [(p["subject"], p["verdict"]) for p in r["predictions"]])
        for r in result.ladder]
    assert all(r["verdict"] == "supported" for r in result.ladder)
    assert result.verdict == "supported"
    assert result.departure.endswith(": contradicted on no rung")
    assert "departs" not in result.departure
    assert result.figures == [f"figures/{cid.lower()}_ladder.svg"]
    assert (tmp_path / result.figures[0]).read_text().startswith("<?xml")


def test_every_claim_prediction_has_a_break_and_every_diagnostic_a_break(tmp_path):
    """BREAKS and DIAGNOSTICS cover each claim's predictions on normlab's block, by role."""
    for cid, measure in CLAIMS.items():
        roles = _roles(measure(planted_study(tmp_path, Planted())))
        assert set(BREAKS[cid]) == {s for s, r in roles.items() if r == "claim"}, cid
        assert set(DIAGNOSTICS.get(cid, {})) == {s for s, r in roles.items()
                                                 if r == "diagnostic"}, cid


@pytest.mark.parametrize(("cid", "subject"), [(c, s) for c in BREAKS for s in BREAKS[c]])
def test_each_prediction_broken_in_turn_on_normlab_s_block(cid, subject, tmp_path):
    key = _final_key(cid)
    result = CLAIMS[cid](planted_study(tmp_path, Planted(**{key: BREAKS[cid][subject]})))
    verdicts = _verdicts(result)
    expected = {s: "not supported" if s == subject else "supported" for s in verdicts}
    assert verdicts == expected
    assert result.calibration == "passed"
    assert result.verdict == "not supported"
    first = next(r for r in result.ladder if r["key"] == key)
    assert _rung_verdicts(first) == expected  # the verdict is read on this rung
    assert f"{subject} departs when {first['change']} ({first['rung']})" in result.departure


@pytest.mark.parametrize(("cid", "subject"), [(c, s) for c in BREAKS for s in BREAKS[c]])
def test_each_prediction_broken_in_turn_in_the_source_setting_fails_the_calibration(
        cid, subject, tmp_path):
    world = Planted(**{k: BREAKS[cid][subject] for k in _source_keys(cid) + ["lr"]})
    result = CLAIMS[cid](planted_study(tmp_path, world))
    broken = SOURCE_COUPLED.get((cid, subject), (subject,))
    for row in (r for r in result.ladder if r["calibration"]):
        verdicts = _rung_verdicts(row)
        assert verdicts == {s: "not supported" if s in broken else "supported"
                            for s in verdicts}, row["rung"]
    assert result.calibration == "failed"
    assert result.verdict == "calibration failed"
    assert "Calibration failed" in result.note


@pytest.mark.parametrize(("cid", "subject"),
                         [(c, s) for c in DIAGNOSTICS for s in DIAGNOSTICS[c]])
def test_a_broken_diagnostic_is_reported_and_leaves_the_verdict_unchanged(cid, subject,
                                                                          tmp_path):
    result = CLAIMS[cid](planted_study(tmp_path, Planted(**DIAGNOSTICS[cid][subject])))
    verdicts = _verdicts(result)
    assert verdicts == {s: "not supported" if s == subject else "supported" for s in verdicts}
    assert _roles(result)[subject] == "diagnostic"
    assert result.calibration == "passed"
    assert result.verdict == "supported"


def test_admin_s_diagnostics_broken_in_the_source_setting_leave_the_calibration(tmp_path):
    world = Planted(source={"admin": "const", "admin_o1": "log"})
    result = c08.measure(planted_study(tmp_path, world))
    source = _rung_verdicts(result.ladder[0])
    assert source["admin"] == source["admin O(1)"] == "not supported"
    assert result.ladder[0]["verdict"] == "supported"
    assert result.calibration == "passed" and result.verdict == "supported"


def test_c1_s_diagnostic_without_a_trained_pair_is_inconclusive_and_decides_nothing(tmp_path):
    ctx = planted_study(tmp_path, Planted())
    ctx.trained_probes = lambda: ProbedPair(MatchedPair(False, reason="not trained"))
    result = c01.measure(ctx)
    assert _verdicts(result)["pre trained grows faster"] == "inconclusive"
    assert result.verdict == "supported"


def test_c1_trained_growth_is_the_trained_stream_s_growth_minus_its_own_at_init(tmp_path):
    world = Planted(noise=0.0, trained={"pre_growth": 0.7})
    result = c01.measure(planted_study(tmp_path, world))
    pred = next(p for p in result.predictions if p["subject"] == "pre trained grows faster")
    assert pred["values"] == pytest.approx([0.7] * PROBE_SEEDS)
    assert next(r for r in result.ladder if r["key"] == "init")["predictions"][-1] == pred
    assert all(p["subject"] != pred["subject"] for r in result.ladder[:-1]
               for p in r["predictions"])  # on normlab's block only


def test_c1_s_mechanism_off_the_source_is_the_rung_s_own_branch_energies(tmp_path):
    """A planted model whose branch energies are known: on the GELU rung each block's attention
    adds 0.3d and its MLP 0.9d, so the mechanism predicts a stream growing by 1.2d per block; a
    stream that does is supported, one that grows by 1.2d on branches of 0.2d + 0.4d (a ratio
    of 2) is not, and branches of 1.0d + 0.6d (0.75) are again inside the mechanism's band
    though their sum is not Lemma 2's source value."""
    def at_gelu(attn: float, mlp: float) -> tuple[dict[str, Any], dict[str, Any], Any]:
        world = Planted(noise=0.0, gelu={"pre_inc": 1.2, "attn_sq": attn, "mlp_sq": mlp})
        result = c01.measure(planted_study(tmp_path, world))
        row = next(r for r in result.ladder if r["key"] == "gelu")
        pred = next(p for p in row["predictions"] if p["subject"] == "pre (mechanism)")
        return row, pred, result

    row, pred, result = at_gelu(0.3, 0.9)
    assert pred["values"] == pytest.approx([1.0] * SEEDS)
    assert pred["verdict"] == "supported" and row["verdict"] == "supported"
    assert result.numbers["pre_increment_over_branch_energies"][row["rung"]]["mean"] == \
        pytest.approx(1.0)
    row, pred, result = at_gelu(0.2, 0.4)
    assert pred["values"] == pytest.approx([2.0] * SEEDS)
    assert pred["verdict"] == "not supported"
    assert f"pre departs when {row['change']} ({row['rung']})" in result.departure
    assert result.verdict == "supported"  # the next rungs' own branches match their streams
    row, pred, _ = at_gelu(1.0, 0.6)
    assert pred["values"] == pytest.approx([0.75] * SEEDS) and pred["verdict"] == "supported"
    # the source rungs judge the increment itself, not the branches: 1.2 is in Lemma 2's bounds
    world = Planted(noise=0.0, source_b={"pre_inc": 1.2, "attn_sq": 0.2, "mlp_sq": 0.4})
    source_b = c01.measure(planted_study(tmp_path, world)).ladder[1]
    assert _rung_verdicts(source_b)["pre"] == "supported"


def test_c1_s_post_mechanism_off_the_source_is_the_rung_s_own_ffn_energy(tmp_path):
    """An FFN adding d (not Lemma 1's d/2) on the GELU rung: a norm input of 2d is what the
    mechanism predicts there (supported), Lemma 2's 3d/2 is not."""
    own = Planted(noise=0.0, gelu={"mlp_sq": 1.0})
    row = next(r for r in c01.measure(planted_study(tmp_path, own)).ladder if r["key"] == "gelu")
    assert _rung_verdicts(row)["post"] == "supported"
    lemma = Planted(noise=0.0, gelu={"mlp_sq": 1.0, "post_norm_in": 1.5})
    result = c01.measure(planted_study(tmp_path, lemma))
    row = next(r for r in result.ladder if r["key"] == "gelu")
    post = next(p for p in row["predictions"] if p["subject"] == "post (mechanism)")
    assert post["verdict"] == "not supported"
    assert post["values"] == pytest.approx([1.5 - 2.0 + 1.5] * SEEDS)


def test_c8_s_mechanism_off_the_source_is_the_rung_s_own_branch_over_input_energies(tmp_path):
    """On normlab's block an output change growing like n is what the mechanism predicts when
    the rung's own branch-over-input sum grows like n too (supported), not when that sum grows
    like log n."""
    own = c08.measure(planted_study(tmp_path, Planted(init={"pre": "n", "pre_mech": "n"})))
    assert _verdicts(own)["pre"] == "supported"
    assert own.numbers["mechanism_slopes"][own.ladder[-1]["rung"]]["pre"]["mean"] == \
        pytest.approx(1.0, abs=0.01)
    log = c08.measure(planted_study(tmp_path, Planted(init={"pre": "n"})))
    assert _verdicts(log)["pre"] == "not supported"


def test_one_reading_that_holds_passes_the_calibration_and_names_the_departure(tmp_path):
    result = c01.measure(planted_study(tmp_path, Planted(source_b={"pre_inc": 2.0})))
    assert result.calibration == "passed (source, reading A: FFN only)"
    assert "pre departs when uniform attention added" in result.departure


def test_a_planted_departure_is_attributed_to_its_rung(tmp_path):
    result = c04.measure(planted_study(tmp_path, Planted(gelu={"post_slope": 0.6},
                                                     tied={"post_slope": 0.6},
                                                     init={"post_slope": 0.6})))
    assert "post departs when a 4d GELU MLP" in result.departure


@pytest.mark.parametrize("cid", sorted(CLAIMS))
def test_noise_leaves_the_calibration_inconclusive(cid, tmp_path):
    result = CLAIMS[cid](planted_study(tmp_path, Planted(noise=3.0)))
    assert result.calibration in ("inconclusive", "failed") or result.verdict != "supported"
    assert result.verdict in ("inconclusive", "calibration failed", "not supported")


def test_c7_runs_at_the_smallest_lr_where_post_without_warmup_failed(tmp_path):
    grid = sorted(PROFILES["quick"].lrs)
    result = c07.measure(planted_study(tmp_path, Planted(), failing_lrs=tuple(grid[1:])))
    assert result.numbers["lr"]["C6"] == grid[1]
    assert "failed (stalled)" in result.numbers["lr"]["why"]
    never = c07.measure(planted_study(tmp_path, Planted()))
    assert never.numbers["lr"]["C6"] == grid[-1] and "at no lr" in never.numbers["lr"]["why"]


# -- what each claim asks for, says and reports ------------------------------------------------

@pytest.mark.parametrize("cid", sorted(CLAIMS))
def test_the_claim_s_words_are_the_recorded_ones(cid, tmp_path, recorded_words, figure_calls):
    recorded_words(f"theory_{cid}", CLAIMS[cid](planted_study(tmp_path, Planted())),
                   figure_calls)


def test_the_calibration_s_failed_and_inconclusive_words_are_the_recorded_ones(tmp_path,
                                                                                recorded_words):
    broken = Planted(source_a={"pre_inc": 2.0}, source_b={"pre_inc": 2.0})
    recorded_words("theory_C1_calibration_failed", c01.measure(planted_study(tmp_path, broken)))
    recorded_words("theory_C1_noise", c01.measure(planted_study(tmp_path, Planted(noise=3.0))))


def test_c1_c4_and_c5_share_one_sweep_of_xiong_s_ladder(tmp_path):
    p = PROFILES["quick"]
    asked = []
    for cid in ("C1", "C4", "C5"):
        ctx = planted_study(tmp_path, Planted())
        CLAIMS[cid](ctx)
        asked += ctx.requests
    sweep = {"kind": "init", "name": f"ladder_xiong_{ladder.CACHE_VERSION}",
             "rungs": xiong_ladder(p.width, p.heads),
             "placements": ["pre", "post"],
             "depths": sorted(set(p.init_depths) | {ladder.FIG3_DEPTH}),
             "perturb": False, "stats": True, "seeds": p.init_seeds}
    # C5 adds the figure's depth alone at its own seed count, on the same rungs
    fig3 = sweep | {"name": f"ladder_xiong_fig3_{ladder.CACHE_VERSION}_{p.c5_seeds}seeds",
                    "depths": [ladder.FIG3_DEPTH], "seeds": p.c5_seeds}
    assert asked == [sweep] * 3 + [fig3]


def test_c8_asks_for_admin_s_perturbation_and_init_stats_on_fairseq_s_ladder(tmp_path):
    p = PROFILES["quick"]
    ctx = planted_study(tmp_path, Planted())
    c08.measure(ctx)
    assert ctx.requests == [{"kind": "init", "name": f"ladder_admin_{ladder.CACHE_VERSION}",
                             "rungs": fairseq_ladder(p.width, p.heads),
                             "placements": ["post", "pre", "admin", "admin_o1"],
                             "depths": list(p.init_depths), "perturb": True, "stats": True,
                             "seeds": p.init_seeds}]


def _fit(xs, ys) -> float:
    return loglog_fit([(x, y, 0) for x, y in zip(xs, ys, strict=True)],
                             n_boot=0)["slope"]


def test_c1_reports_the_growth_exponent_and_the_range_the_bounds_allow(tmp_path):
    L = max(PROFILES["quick"].init_depths)
    result = c01.measure(planted_study(tmp_path, Planted()))
    allowed = result.numbers["exponent_range_the_bounds_allow"]
    assert allowed == pytest.approx([1 - math.log(3) / math.log(L), 1 + math.log(3) / math.log(L)])
    # planted: E||x_l||^2 - E||x_0||^2 = d inc l, an exponent of 1 on every rung
    exps = result.numbers["growth_exponent_of_E_x_sq_at_init"]
    assert set(exps) == {r["rung"] for r in result.ladder}
    assert all(e["mean"] == pytest.approx(1.0, abs=0.02) for e in exps.values()), exps
    assert f"[{allowed[0]:.2f}, {allowed[1]:.2f}] at L = {L}" in result.caveat


def test_c4_reports_each_placement_s_planted_slope(tmp_path):
    depths = PROFILES["quick"].init_depths
    result = c04.measure(planted_study(tmp_path, Planted(init={"post_slope": 0.35,
                                                           "pre_mech": 0.1})))
    last = result.numbers["slopes"][result.ladder[-1]["rung"]]
    stream = _fit(depths, [1 + L for L in depths])  # planted E||x_L||^2 / d = 1 + L
    assert last["post"]["mean"] == pytest.approx(0.35, abs=0.01)
    assert last["pre E||x_L||^2"]["mean"] == pytest.approx(stream, abs=0.01)
    assert last["pre"]["mean"] == pytest.approx(-0.5 * stream + 0.1, abs=0.01)
    first = result.numbers["slopes"][result.ladder[0]["rung"]]
    assert first["post"]["mean"] == pytest.approx(0.0, abs=0.01)


def test_c5_reports_each_placement_s_planted_trend(tmp_path):
    result = c05.measure(planted_study(tmp_path, Planted(noise=0.0, init={"pre_trend": 0.4})))
    init = next(r["rung"] for r in result.ladder if r["key"] == "init")
    assert result.numbers["pre_trend"][init]["mean"] == pytest.approx(0.4, abs=1e-9)
    assert result.numbers["post_trend"][init]["mean"] == pytest.approx(1.0, abs=1e-9)


def test_c8_reports_the_law_bands_and_each_placement_s_slope(tmp_path):
    depths = PROFILES["quick"].init_depths
    result = c08.measure(planted_study(tmp_path, Planted()))
    s_log = c08.log_law_slope([2 * L for L in depths])
    assert result.numbers["slope_of_ln_n_over_these_depths"] == pytest.approx(s_log)
    assert result.numbers["law_bands"] == {k: list(v) for k, v in
                                           c08.nearest_law_bands(s_log).items()}
    last = result.numbers["slopes"][result.ladder[-1]["rung"]]
    assert last["post"]["mean"] == pytest.approx(1.0, abs=0.01)
    assert last["pre"]["mean"] == pytest.approx(s_log, abs=0.01)
    assert last["admin"]["mean"] == pytest.approx(s_log, abs=0.01)
    assert last["admin_o1"]["mean"] == pytest.approx(0.0, abs=0.01)


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


def test_growth_exponent_needs_two_blocks_above_the_embedding():
    def stats(sq):
        return {"summary": {"embed_sq": 1.0}, "per_block": {"sq_norm": sq}}

    assert c01.growth_exponent_sq(stats([2.0, 3.0])) == pytest.approx(1.0)  # 1, 2 at l = 1, 2
    assert c01.growth_exponent_sq(stats([1.0, 2.0, 5.0])) == pytest.approx(
        math.log(4.0) / math.log(1.5))  # the block at the embedding's level is left out
    assert math.isnan(c01.growth_exponent_sq(stats([0.5, 2.0])))


def _row(rung: str, calibration: bool, verdict: str, **subjects: str) -> dict[str, Any]:
    return {"rung": rung, "change": f"{rung} changed", "calibration": calibration,
            "verdict": verdict, "predictions": [{"subject": k.replace("_", " "), "verdict": v}
                                                for k, v in subjects.items()]}


def test_calibration_status_names_the_readings_that_hold():
    rows = [_row("a", True, "supported"), _row("b", True, "not supported"),
            _row("c", True, "supported"), _row("block", False, "not supported")]
    assert ladder.calibration_status(rows) == {
        "status": "passed (a; c)", "held": ["a", "c"], "contradicted": ["b"],
        "rungs": ["a", "b", "c"]}
    assert ladder.calibration_status(rows[:1])["status"] == "passed"
    assert ladder.calibration_status([rows[1], _row("d", True, "inconclusive")])["status"] == \
        "failed"
    assert ladder.calibration_status([_row("d", True, "inconclusive")])["status"] == \
        "inconclusive"


def test_departure_names_each_prediction_s_first_contradicted_rung_after_the_source():
    rows = [_row("src", True, "supported", pre="supported", post="supported",
                 pre_vs_post="supported"),
            _row("mlp", False, "not supported", pre="not supported", post="supported",
                 pre_vs_post="supported"),
            _row("init", False, "not supported", pre="not supported", post="not supported",
                 pre_vs_post="supported")]
    assert ladder.departure(rows) == ("pre departs when mlp changed (mlp); post departs when "
                                      "init changed (init); pre vs post: contradicted on no rung")
    assert ladder.departure([_row("src", True, "inconclusive", pre="inconclusive")]) == ""
    # a prediction contradicted nowhere says where it was left undecided; off the source rungs
    # a prediction derived from the source's mechanism is the source rung's own
    rows = [_row("src", True, "supported", pre="supported", post="supported"),
            _row("heads", False, "inconclusive", pre="inconclusive", post="supported"),
            _row("mlp", False, "inconclusive", pre="supported", post="inconclusive"),
            _row("init", False, "not supported", pre="supported", post="not supported")]
    rows[1]["predictions"][0]["subject"] = "pre (mechanism)"
    assert ladder.departure(rows) == ("post departs when init changed (init); pre: contradicted "
                                      "on no rung (undecided: pre at heads)")


# -- the derived predictions on planted laws -------------------------------------------------------

NS = [2 * L for L in (3, 6, 12, 24, 48)]


def _slope(values: list[float]) -> float:
    return loglog_fit([(n, v, 0) for n, v in zip(NS, values, strict=True)],
                             n_boot=0)["slope"]


@pytest.mark.parametrize(("a", "b"), [(0.0, 1.0), (1.0, 1.0), (0.5, 2.0)])
def test_a_planted_log_law_falls_in_the_log_band(a, b):
    bands = c08.nearest_law_bands(c08.log_law_slope(NS))
    lo, hi = bands["O(log n)"]
    assert lo <= _slope([a + b * math.log(n) for n in NS]) <= hi


def test_planted_linear_and_constant_laws_fall_in_their_own_bands():
    bands = c08.nearest_law_bands(c08.log_law_slope(NS))
    assert bands["O(n)"][0] <= _slope([3.0 + 2.0 * n for n in NS]) <= bands["O(n)"][1]
    assert bands["O(1)"][0] <= _slope([5.0] * len(NS)) <= bands["O(1)"][1]
    # the bands meet halfway between the laws' slopes 0, s_log and 1
    assert bands["O(1)"][1] == bands["O(log n)"][0]
    assert bands["O(log n)"][1] == bands["O(n)"][0]
    assert c08.log_law_slope(NS) == pytest.approx(0.337, abs=0.01)


def test_the_lemma_bounds_a_planted_increment_and_reject_a_violation(tmp_path):
    """Lemma 2's bounds are tested as bounds where the lemma is the prediction: on the
    uniform-attention source rung (its branches planted at the increment, so the stream alone
    moves the verdict)."""
    def source_b(inc: float) -> str:
        world = Planted(source_b={"pre_inc": inc, "attn_sq": inc / 2, "mlp_sq": inc / 2})
        row = c01.measure(planted_study(tmp_path, world)).ladder[1]
        assert row["key"] == "source_b"
        return _rung_verdicts(row)["pre"]

    assert source_b(1.4) == "supported"
    assert source_b(1.6) == "not supported"
    assert source_b(0.4) == "not supported"


def test_per_block_increment_and_norm_input_read_the_stated_quantities():
    stats = {"per_block": {"sq_norm": [3.0, 5.0, 7.0], "mlp_norm_input_sq": [3.0, 6.0, 9.0]},
             "summary": {"embed_sq": 2.0, "d_model": 2, "n_blocks": 3}}
    assert c01.per_block_increment(stats) == pytest.approx((7.0 - 2.0) / (3 * 2))
    assert c01.norm_input_over_d(stats) == pytest.approx(3.0)


def test_law_bands_meet_halfway_between_the_laws_slopes():
    bands = c08.nearest_law_bands(0.4)
    assert bands == {"O(1)": pytest.approx((-0.2, 0.2)), "O(log n)": pytest.approx((0.2, 0.7)),
                     "O(n)": pytest.approx((0.7, 1.3))}


def test_c5_reads_the_figure_s_depth_and_its_depth_rung_the_deepest_model(tmp_path):
    """C5 is Fig. 3, a 6-layer model: every rung reads the 6-block models, and the depth rung
    alone reads the profile's deepest. Planted: post's trend falls at every depth but 6 in the
    source setting (the calibration must still pass), and on normlab's block at the deepest
    depth only (only the depth rung may fail, and it is reported, not the verdict)."""
    depths = planted_study(tmp_path, Planted()).depths()
    deepest = max(PROFILES["quick"].init_depths)
    away = {f"post_trend@{L}": -1.0 for L in depths if L != ladder.FIG3_DEPTH}
    world = Planted(source_a=away, source_b=away, init={f"post_trend@{deepest}": -1.0})
    result = c05.measure(planted_study(tmp_path, world))
    # the verdict is read at the figure's depth, where post's trend still rises
    assert result.calibration == "passed" and result.verdict == "supported"
    assert _verdicts(result) == {"post": "supported", "pre flat": "supported",
                                 "post vs pre": "supported"}
    by_rung = {r["key"]: {p["subject"]: p["verdict"] for p in r["predictions"]}
               for r in result.ladder}
    assert all(v["post"] == "supported" for k, v in by_rung.items() if k != "deep"), by_rung
    assert by_rung["deep"]["post"] == "not supported"
    deep = next(r for r in result.ladder if r["key"] == "deep")
    assert deep["rung"] == f"normlab's block at {deepest} blocks"
    assert f"{deepest} blocks instead of the source's {ladder.FIG3_DEPTH}" in deep["change"]
    assert result.numbers["post_trend"][deep["rung"]]["mean"] < 0
    assert result.numbers["post_trend"]["normlab's block (own inits)"]["mean"] > 0
    # the predictions' words, as the report shows them
    first = next(r for r in result.ladder if r["key"] == "source_a")
    quantities = {p["subject"]: (p["quantity"], p["paper"]) for p in first["predictions"]}
    assert quantities == {
        "post": ("trend of log ||grad W^2|| over relative depth",
                 "Fig. 3: 'the scale of the expected gradients grows along with the layer index "
                 "for the Post-LN Transformer'"),
        "pre flat": ("trend of log ||grad W^2|| over relative depth",
                     "Fig. 3: 'the scale almost keeps the same for different layers in the "
                     "Pre-LN Transformer'"),
        "post vs pre": ("trend(post) - trend(pre)",
                        "Fig. 3: post's gradients grow toward the output, pre's do not")}


def test_c5_s_verdict_is_read_at_the_figure_s_depth_not_on_the_deep_rung(tmp_path):
    """Post's trend planted falling on normlab's block at the figure's depth (6 blocks) only:
    the verdict, read there, is not supported though the deep rung (the profile's deepest
    model) supports; planted falling at the deepest only, the deep rung alone says so and the
    verdict stands."""
    deepest = max(PROFILES["quick"].init_depths)
    at_six = Planted(init={f"post_trend@{ladder.FIG3_DEPTH}": -1.0})
    result = c05.measure(planted_study(tmp_path, at_six))
    *_, block, deep = result.ladder
    assert (block["key"], deep["key"]) == ("init", "deep")
    assert _rung_verdicts(block)["post"] == "not supported"
    assert _rung_verdicts(deep) == {"post": "supported", "pre flat": "supported",
                                    "post vs pre": "supported"}
    assert deep["verdict"] == "supported"
    assert result.predictions == block["predictions"]
    assert result.verdict == "not supported" and result.calibration == "passed"
    assert f"post departs when {block['change']} ({block['rung']})" in result.departure
    at_deepest = Planted(init={f"post_trend@{deepest}": -1.0})
    result = c05.measure(planted_study(tmp_path, at_deepest))
    *_, block, deep = result.ladder
    assert deep["verdict"] == "not supported" and block["verdict"] == "supported"
    assert result.predictions == block["predictions"]
    assert result.verdict == "supported"
    assert f"post departs when {deep['change']} ({deep['rung']})" in result.departure


def test_c7_s_ratio_is_decided_at_0_not_at_a_factor(tmp_path):
    """DeepNet gives no factor: post's first update 1.5 times DeepNorm's supports the claim."""
    result = c07.measure(planted_study(tmp_path, Planted(tied={"deepnorm": 1.0 / 1.5})))
    assert _verdicts(result)["post vs deepnorm"] == "supported"
    pred = next(p for p in result.predictions if p["subject"] == "post vs deepnorm")
    assert pred["effect"]["estimate"] == pytest.approx(math.log(1.5), abs=0.01)


def test_c4_s_gap_off_the_source_is_minus_half_the_rung_s_own_stream_slope(tmp_path):
    """On a rung whose Pre-LN stream barely grows (E||x_L||^2 / d = 1 + 0.01 L, slope about
    0.02) the final norm's Jacobian barely moves pre's gradient: the mechanism predicts a gap
    near 0, not the theorem's -1/2, and pre and post level with each other are supported."""
    result = c04.measure(planted_study(tmp_path, Planted(gelu={"pre_inc": 0.01})))
    row = next(r for r in result.ladder if r["key"] == "gelu")
    stream = result.numbers["slopes"][row["rung"]]["pre E||x_L||^2"]["mean"]
    assert stream == pytest.approx(_fit([3, 6, 12, 24], [1 + 0.01 * L for L in (3, 6, 12, 24)]),
                                   abs=0.01)
    gap = next(p for p in row["predictions"] if p["subject"] == "pre vs post")
    assert gap["verdict"] == "supported"
    assert gap["effect"]["estimate"] == pytest.approx(0.0, abs=0.02)
    assert f"{-0.5 * stream:+.3g} (mean over seeds)" in gap["derivation"]
    assert result.verdict == "supported"


# -- C7 in the linear regime -----------------------------------------------------------------

def _c7_labels(result) -> dict[str, str]:
    return {r["key"]: r["rung"] for r in result.ladder}


def test_c7_asks_for_the_saturating_diagnostic_then_the_linear_grid_then_the_depths(tmp_path):
    p = PROFILES["quick"]
    grid = sorted(p.lrs)
    ctx = planted_study(tmp_path, Planted(), failing_lrs=tuple(grid[1:]))
    c07.measure(ctx)
    source, *toward = fairseq_ladder(p.width, p.heads)[:-1]  # post's own init is Xavier
    depths = sorted(set(p.init_depths) | {p.update_blocks})
    assert ctx.requests[0] == {"kind": "runs", "family": "post", "lrs": grid, "warmup": 0}
    # the saturating measure, a diagnostic: the source's lr, then C6's
    assert ctx.requests[1] == {
        "kind": "update", "name": f"ladder_deepnet_{c07.DEEPNET_CACHE}",
        "rungs": [(source.key, source.fields, c07.SOURCE_LR),
                  ("lr", source.fields, grid[1])] + [(r.key, r.fields, grid[1])
                                                     for r in toward],
        "depths": sorted({L for L in p.init_depths if p.update_blocks >= L}
                         | {p.update_blocks}),
        "steps": 1, "warmup": p.update_steps}
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
    N^1.32 and DeepNorm's like N^0.56. Bounded is a slope below 1/2: DeepNorm's fails it there
    (the source rung keeps the laws), and the claim is not supported; post's growth holds."""
    world = Planted(tied={"post_depth_linear": 1.32, "deepnorm_depth_linear": 0.56})
    result = c07.measure(planted_study(tmp_path, world))
    assert result.calibration == "passed"
    v = _verdicts(result)
    assert v["deepnorm: depth"] == "not supported" and v["post: depth"] == "supported"
    assert v["post vs deepnorm: depth"] == "supported"
    dn = next(p for p in result.predictions if p["subject"] == "deepnorm: depth")
    assert dn["effect"]["estimate"] == pytest.approx(0.56, abs=0.02)
    assert result.verdict == "not supported"


def test_c7_reports_warmup_s_and_pre_s_ratios_and_the_saturation_at_the_first_step(tmp_path):
    p = PROFILES["quick"]
    scale = p.update_blocks / 24  # planted: post's first update is 1.0 (L / 24) without warmup
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
