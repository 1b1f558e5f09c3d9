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

from typing import Any

import pytest
from fake_study import Planted
from planted_ladders import _rung_verdicts, _verdicts, planted_study

from normlab.study.claims import c01_stream_growth as c01
from normlab.study.claims import c04_last_layer_gradient as c04
from normlab.study.claims import c05_gradient_by_layer as c05
from normlab.study.claims import c07_deepnet_update as c07
from normlab.study.claims import c08_admin_sensitivity as c08
from normlab.study.claims import ladder
from normlab.study.ladders import xiong_ladder
from normlab.study.profiles import PROFILES
from normlab.study.verdict import base_subject


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
           "post vs deepnorm: depth": {"post_depth": 0.1, "deepnorm_depth": 0.2}},
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
    c5_seeds = c05.CLAIM.settings(p).c5_seeds
    fig3 = sweep | {"name": f"ladder_xiong_fig3_{ladder.CACHE_VERSION}_{c5_seeds}seeds",
                    "depths": [ladder.FIG3_DEPTH], "seeds": c5_seeds}
    assert asked == [sweep] * 3 + [fig3]


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
