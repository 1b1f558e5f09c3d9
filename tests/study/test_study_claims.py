"""Every claim's decision on planted measurements: the planted effect gives `supported`, the
planted opposite `not supported`, noise `inconclusive`; a stalled side is reported, not compared.

The claims read their measurements from a StudyContext; here a fake context serves numbers made
from a few planted parameters per placement, so each claim's rule is tested without training.

"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from fake_study import FakeStudy
from planted_probes import CLAIMS, _fill, _study, _Unmatched

from normlab.study.verdict import NOT_TESTED, min_detectable, predict_band, predict_direction

SEEDS = 5


DEPTHS = (3, 6, 12, 24)


@pytest.fixture(autouse=True)
def figure_calls(stub_figures):
    import normlab.probe.figures
    import normlab.study.figures

    calls = stub_figures(normlab.study.figures, ["plot_bars", "plot_curves"])
    return stub_figures(normlab.probe.figures, ["plot_per_block"], calls)


# planted worlds per claim: (supporting, opposite)
WORLDS: dict[str, tuple[dict[str, float], dict[str, float]]] = {
    "C2": ({"ang_slope_pre": -0.2, "ang_slope_post": 0.0, "merge_pre": 0, "merge_post": 0},
           {"ang_slope_pre": 0.2, "ang_slope_post": -0.3}),
    "C13": ({"lens_gap_pre": 1.0, "lens_gap_post": 0.0},
            {"lens_gap_pre": -1.0, "lens_gap_post": 0.0}),
}


# noise large enough that no rule can decide
NOISE = {"C2": 3.0, "C13": 3.0}  # C3, C6a, C6b, C9-C12: tests/study/test_study_empirical.py


@pytest.mark.draws
@pytest.mark.parametrize("cid", sorted(WORLDS))
def test_planted_effect_supported_opposite_not(cid, tmp_path):
    yes, no = WORLDS[cid]
    result = CLAIMS[cid](_study(cid, tmp_path, 0.01, **_fill(yes)))
    assert result.verdict == "supported"
    assert result.figures and all((tmp_path / f).read_text().startswith("<?xml")
                                  for f in result.figures)
    assert CLAIMS[cid](_study(cid, tmp_path, 0.01, **_fill(no))).verdict == "not supported"


@pytest.mark.parametrize("cid", sorted(WORLDS))
def test_noise_is_inconclusive_and_says_why(cid, tmp_path):
    yes, _ = WORLDS[cid]
    result = CLAIMS[cid](_study(cid, tmp_path, NOISE[cid], **_fill(yes)))
    assert result.verdict == "inconclusive", [(p["subject"], p["effect"]) for p in
                                              result.predictions]
    assert "too few seeds or steps" in result.diagnosis


def test_every_prediction_cites_the_paper(tmp_path):
    for cid, (yes, _) in WORLDS.items():
        result = CLAIMS[cid](_study(cid, tmp_path, 0.01, **_fill(yes)))
        assert result.paper, cid
        assert all(p["paper"] and p["rule"] for p in result.predictions), cid


def test_band_and_direction_rules():
    assert predict_band("x", "q", "", [1.0, 1.01, 0.99], 0.85, 1.15).verdict == "supported"
    assert predict_band("x", "q", "", [2.0, 2.01, 1.99], 0.85, 1.15).verdict == "not supported"
    assert predict_band("x", "q", "", [0.0, 2.0, 1.0], 0.85, 1.15).verdict == "inconclusive"
    # an interval that covers the band edge is not a decision either way
    assert predict_band("x", "q", "", [1.1, 1.2, 1.15], 0.85, 1.15).verdict == "inconclusive"
    tight = predict_direction("x", "q", "", [0.11, 0.09, 0.1, 0.1], ">", 0.1, 0.5)
    assert tight.verdict == "inconclusive" and "large enough" in tight.diagnosis
    assert min_detectable([1.0]) == math.inf
    # mde = (t_.975 + t_.80) * sd / sqrt(n); df 3: (3.1824 + 0.9785) * sqrt(4/3) / 2
    assert min_detectable([-1.0, 1.0, -1.0, 1.0]) == pytest.approx(2.4023, rel=1e-3)


@pytest.mark.parametrize("cid", sorted(WORLDS))
def test_the_claim_s_words_are_the_recorded_ones(cid, tmp_path, recorded_words, figure_calls):
    yes, _ = WORLDS[cid]
    recorded_words(f"claims_{cid}", CLAIMS[cid](_study(cid, tmp_path, 0.01, **_fill(yes))),
                   figure_calls)
    recorded_words(f"claims_{cid}_noise",
                   CLAIMS[cid](_study(cid, tmp_path, NOISE[cid], **_fill(yes))))


TITLES = {"C2": "Pre-Norm's consecutive blocks become near-identical",
          "C3": "Pre-LN's depth acts like width",
          "C13": "Intermediate heads need a norm under Pre-LN"}


@pytest.mark.parametrize("cid", ["C2", "C3", "C13"])
@pytest.mark.parametrize("side", ["pre", "post"])
def test_no_checkpoints_to_compare_names_the_side_that_did_not_train(cid, side, tmp_path):
    reason = f"{side} stalled at every lr of its grid"
    ctx = _Unmatched(tmp_path, {"matched": False, "reason": reason},
                     drop=True)
    result = CLAIMS[cid](ctx)
    assert result.verdict == "inconclusive" and result.stalled == [side]
    assert result.note == f"No checkpoints to compare: {reason}."
    assert result.id == cid and result.title == TITLES[cid]
    assert (result.statement, result.source, result.method, result.rule) == ("", "", "", "")
    # a pair record with no reason: the side cannot be named from it, post is assumed
    silent = CLAIMS[cid](_Unmatched(tmp_path, {"matched": False},
                                    drop=True))
    assert silent.stalled == ["post"]


@pytest.mark.parametrize("cid", ["C2", "C3", "C13"])
def test_the_note_says_whether_the_checkpoints_matched(cid, tmp_path):
    pair = {"matched": False, "tolerance": 0.05, "pre_lr": 1e-3, "post_lr": 4e-3,
            "pre_val_loss": 2.2, "post_val_loss": 2.4, "gap": 0.2}
    result = CLAIMS[cid](_Unmatched(tmp_path, pair, drop=False))
    line = ("Checkpoints at matched loss: pre at lr 0.001 (val 2.200), post at lr 0.004 (val "
            "2.400): gap +0.200 nats, NOT matched (tolerance 0.05).")
    # C2 goes on to say the unmatched pair leaves it undecided; C3, whose planted pre is not
    # near-identical here, that it is not tested at this scale
    then = {"C2": " Not decided: a premise of the test fails (matched loss does not hold)",
            "C3": " Not tested at this scale: near-identical blocks does not hold here"}
    assert result.note == line if cid == "C13" else result.note.startswith(line + then[cid])
    assert result.numbers["matched_pair"] == pair
    reason = {"matched": False, "reason": "no pair within tolerance"}
    assert CLAIMS[cid](_Unmatched(tmp_path, reason, drop=False)
                       ).note.startswith("no pair within tolerance")
    assert CLAIMS[cid](_Unmatched(tmp_path, {"matched": False},
                                  drop=False)).note.startswith("" if cid == "C13" else "Not")


def test_c2_and_c13_report_the_planted_numbers(tmp_path):
    world = _fill({"ang_slope_pre": -0.2, "lens_gap_pre": 1.0})
    c2 = CLAIMS["C2"](FakeStudy(tmp_path, 0.0, "quick", **world)).numbers
    # planted: angles 0.4 + slope i / 4 for i = 0..4 after the first block; late half i = 2..4
    assert c2["late_angle_trained"]["pre"]["mean"] == pytest.approx(0.4 - 0.2 * 3 / 4)
    assert c2["late_angle_trained"]["post"]["mean"] == pytest.approx(0.4)
    assert c2["late_angle_init"]["pre"]["mean"] == pytest.approx(0.3)
    c13 = CLAIMS["C13"](FakeStudy(tmp_path, 0.0, "quick", **world)).numbers
    assert c13["lens_gap"]["pre"]["mean"] == pytest.approx(1.0)
    assert c13["lens_gap"]["post"]["mean"] == pytest.approx(0.0)


def test_every_passage_a_claim_quotes_is_in_the_project_s_reference():
    """A claim quotes its source between single quotes; each quote must be the source's words as
    docs/study.md or docs/reference.md record them, so the report never shows a paraphrase as
    a quote. The quotes are read from the claim registry: every string of every claim's spec
    (its statement, quote, setting, paper, needs and each prediction's words and rule)."""
    import dataclasses
    import re

    from normlab.study.claims import REGISTRY

    root = Path(__file__).resolve().parents[2]

    def plain(text: str) -> str:
        return " ".join(text.replace("`", "").split()).lower()

    docs = plain((root / "docs" / "study.md").read_text()
                 + (root / "docs" / "reference.md").read_text())
    quotes: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            quotes.update(re.findall(r"(?<![\w])'(.+?)'(?![\w])", value))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                walk(getattr(value, f.name))
        elif isinstance(value, tuple | list):
            for v in value:
                walk(v)

    assert len(REGISTRY) >= 15
    for claim in REGISTRY.values():
        walk(claim)
    assert len(quotes) >= 10, quotes
    missing = sorted(q for q in quotes if plain(q) not in docs)
    assert not missing, f"quoted in a claim but not in docs/: {missing}"


def test_slope_over_depth_is_the_least_squares_slope_against_relative_depth():
    from normlab.study.claims.common import slope_over_depth

    assert slope_over_depth([1.0, 3.0, 5.0]) == pytest.approx(4.0)  # x = 0, 1/2, 1
    assert slope_over_depth([2.0, 1.0]) == pytest.approx(-1.0)
    assert slope_over_depth([1.0, 1.5, 4.0, 2.5]) == pytest.approx(
        np_slope([0, 1 / 3, 2 / 3, 1], [1.0, 1.5, 4.0, 2.5]))
    assert math.isnan(slope_over_depth([2.0]))


def np_slope(xs: list[float], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
            / sum((x - mx) ** 2 for x in xs))


def _direction(subject: str, values: list[float], role: str = "claim", scale: bool = False):
    pred = predict_direction(subject, f"{subject} quantity", "paper", values, ">", 0.0, 0.0,
                             role=role)
    pred.scale = scale
    return pred


def test_the_deciding_prediction_is_the_first_undecided_premise_then_test():
    from normlab.study.claims.common import deciding

    yes, no = [1.0, 1.1, 0.9], [-1.0, -1.1, -0.9]
    undecided = [-1.0, 1.0, 0.1]
    tests = [_direction("a", yes), _direction("b", undecided), _direction("c", undecided)]
    assert deciding(tests, "inconclusive").subject == "b"
    premised = [_direction("p", yes, "premise"), _direction("q", undecided, "premise"), *tests]
    assert deciding(premised, "inconclusive").subject == "q"
    refuted = [_direction("p", no, "premise"), _direction("a", yes), _direction("b", no)]
    assert deciding(refuted, "not supported").subject == "b"
    assert deciding(tests[:1], "supported").subject == "a"
    # a diagnostic never decides: not the deciding prediction of a refuted claim, nor of an
    # undecided one, even listed first
    diag = [_direction("d", no, "diagnostic"), _direction("a", yes), _direction("b", no)]
    assert deciding(diag, "not supported").subject == "b"
    assert deciding([_direction("d", undecided, "diagnostic"), *tests], "inconclusive"
                    ).subject == "b"
    assert deciding([_direction("d", no, "diagnostic"), tests[0]], "supported").subject == "a"
    # not tested at this scale: the first scale premise that fails, not an undecided premise
    # before it nor a refuted claim prediction
    scaled = [_direction("q", undecided, "premise"), _direction("s", no, "premise", True),
              _direction("b", no)]
    assert deciding(scaled, NOT_TESTED).subject == "s"


def test_make_claim_joins_its_notes_and_names_every_stalled_side():
    from normlab.study.claims.common import make_claim

    premise = _direction("from init", [-1.0, -1.1, -0.9], "premise")
    res = make_claim("C0", "t", "s", "src", "m", [premise, _direction("a", [1.0, 1.1, 0.9])],
                     "paper", {}, [], note="First.", stalled=["pre", "post"],
                     calibration="passed")
    assert res.note == (
        "First. Not decided: a premise of the test fails (from init does not hold), so the "
        "claim's own predictions are reported, not decided. Not compared: pre, post stalled "
        "or diverged at every setting tried, so the claim's premise (a model that trains) does "
        "not hold here.")
    assert res.calibration == "passed" and res.verdict == "inconclusive"
    assert res.stalled == ["pre", "post"]
    alone = make_claim("C0", "t", "s", "src", "m", [_direction("a", [1.0, 1.1, 0.9])], "paper",
                       {}, [], stalled=["post"])
    assert alone.note.startswith("Not compared: post stalled") and alone.calibration is None


def test_make_claim_combines_by_role():
    from normlab.study.claims.common import make_claim

    yes, no, undecided = [1.0, 1.1, 0.9], [-1.0, -1.1, -0.9], [-1.0, 1.0, 0.1]

    def claim(preds, **kw):
        return make_claim("C0", "t", "s", "src", "m", preds, "paper", {}, [], **kw)

    # a scale premise that fails: not tested at this scale, whatever the claim predictions
    # say, with what the test needs; the effect is the premise's
    short = claim([_direction("long enough", no, "premise", True), _direction("a", no)],
                  needs="longer runs", note="First.")
    assert short.verdict == NOT_TESTED and short.needs == "longer runs"
    assert short.note == ("First. Not tested at this scale: long enough does not hold here, so "
                          "the claim's own predictions are reported, not decided. It needs "
                          "longer runs.")
    assert short.effect.name == "long enough quantity"
    # the same premise undecided: inconclusive, and `needs` is not said
    open_ = claim([_direction("long enough", undecided, "premise", True), _direction("a", yes)],
                  needs="longer runs")
    assert open_.verdict == "inconclusive" and open_.needs == ""
    assert "(long enough is not decided)" in open_.note
    # a premise not about scale that fails: inconclusive, never refuted nor "not tested"
    assert claim([_direction("p", no, "premise"), _direction("a", no)]).verdict == "inconclusive"
    # a diagnostic never decides, and its rule is not among the claim's
    diag = claim([_direction("a", yes), _direction("d", no, "diagnostic")])
    assert diag.verdict == "supported" and diag.effect.name == "a quantity"
    assert diag.rule.startswith("a: supported if") and "d:" not in diag.rule
    assert [p["role"] for p in diag.predictions] == ["claim", "diagnostic"]
    # with no claim prediction, nothing decides: inconclusive
    only = claim([_direction("d", yes, "diagnostic")])
    assert only.verdict == "inconclusive" and only.effect.name == "d quantity"
    premised = claim([_direction("p", yes, "premise"), _direction("d", yes, "diagnostic")])
    assert premised.verdict == "inconclusive"
    assert "p (premise): supported if" in premised.rule


def test_the_note_names_the_seeds_outside_the_tolerance_when_the_means_match():
    """Seeds are the units: cells matched on their means with a seed 0.123 nats apart (the
    standard profile's case) say so, and name it."""
    from normlab.study.context import MatchedPair

    pair = MatchedPair(True, tolerance=0.05, pre_lr=1.5e-3, post_lr=1.5e-3, pre_val_loss=2.451,
                       post_val_loss=2.490, gap=-0.038, runs={"pre": ("a",), "post": ("b",)},
                       seed_gaps=(-0.003, -0.046, 0.013, -0.123))
    assert ("gap -0.038 nats, matched on the mean, NOT in every seed (seed 3 -0.123) "
            "(tolerance 0.05).") in pair.note()
    every = MatchedPair(True, tolerance=0.05, pre_lr=1e-3, post_lr=1e-3, pre_val_loss=2.2,
                        post_val_loss=2.21, gap=-0.01, seed_gaps=(-0.01, 0.05))
    assert "gap -0.010 nats, matched (tolerance 0.05)." in every.note()  # 0.05: within
