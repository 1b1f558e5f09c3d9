"""The verdict rules at their edges: a bound equal to the threshold, an interval touching a band's
edge, fewer than 2 values, non-finite numbers, the power diagnosis and the rule texts."""

from __future__ import annotations

import math

import pytest

from normlab.probe.fits import mean_ci, t_quantile
from normlab.study.verdict import (
    Prediction,
    band_rule_text,
    combine,
    decide,
    decide_band,
    decide_interval,
    min_detectable,
    predict_band,
    predict_direction,
    rule_text,
)

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize("low, high, verdict", [
    (0.2, 0.9, "supported"),
    (0.1, 0.9, "inconclusive"),  # lower bound on the threshold: not entirely above it
    (0.1000001, 0.9, "supported"),
    (-0.5, 0.1, "not supported"),  # upper bound on the threshold: entirely at or below it
    (-0.5, 0.1000001, "inconclusive"),
    (-0.5, 0.0, "not supported"),
])
def test_direction_above_edges(low, high, verdict):
    assert decide_interval((low + high) / 2, low, high, ">", 0.1) == verdict


@pytest.mark.parametrize("low, high, verdict", [
    (-0.9, -0.2, "supported"),
    (-0.9, -0.1, "inconclusive"),  # upper bound on the threshold
    (-0.9, -0.1000001, "supported"),
    (-0.1, 0.5, "not supported"),  # lower bound on the threshold
    (-0.1000001, 0.5, "inconclusive"),
    (0.0, 0.5, "not supported"),
])
def test_direction_below_edges(low, high, verdict):
    assert decide_interval((low + high) / 2, low, high, "<", -0.1) == verdict


def test_direction_default_threshold_is_zero():
    assert decide_interval(0.5, 1e-9, 1.0, ">") == "supported"
    assert decide_interval(0.5, 0.0, 1.0, ">") == "inconclusive"
    assert decide_interval(-0.5, -1.0, 0.0, ">") == "not supported"
    assert decide_interval(-0.5, -1.0, -1e-9, "<") == "supported"


@pytest.mark.parametrize("bad", [(NAN, 0.0, 1.0), (0.5, NAN, 1.0), (0.5, 0.2, NAN),
                                 (INF, 0.2, 0.3), (0.5, -INF, 1.0), (0.5, 0.2, INF)])
def test_non_finite_numbers_are_inconclusive(bad):
    # each of these would otherwise be decided (0.2 > 0.1, 1.0 in the band...)
    assert decide_interval(*bad, ">", 0.1) == "inconclusive"
    assert decide_interval(*bad, "<", 5.0) == "inconclusive"
    assert decide_band(*bad, -10.0, 10.0) == "inconclusive"


@pytest.mark.parametrize("low, high, verdict", [
    (0.9, 1.1, "supported"),
    (0.85, 1.15, "supported"),  # the interval is the band: inside, edges included
    (0.85, 0.9, "supported"),
    (1.1, 1.15, "supported"),
    (0.8499, 1.0, "inconclusive"),  # crosses the low edge
    (1.0, 1.1501, "inconclusive"),  # crosses the high edge
    (0.5, 0.85, "inconclusive"),  # touches the low edge: overlaps it
    (1.15, 1.5, "inconclusive"),  # touches the high edge
    (0.5, 0.8499, "not supported"),
    (1.1501, 1.5, "not supported"),
    (0.0, 2.0, "inconclusive"),  # wider than the band
])
def test_band_edges(low, high, verdict):
    assert decide_band((low + high) / 2, low, high, 0.85, 1.15) == verdict


def test_decide_effect_and_fewer_than_two_values():
    verdict, effect = decide([1.9, 2.0, 2.1], ">", 0.5, name="gap")
    ci = mean_ci([1.9, 2.0, 2.1])
    assert verdict == "supported"
    assert effect.name == "gap" and effect.estimate == pytest.approx(2.0) and effect.n == 3
    assert (effect.ci_low, effect.ci_high) == tuple(ci["ci95"])
    assert effect.expected == "> 0.5"
    assert decide([1.0, 2.0], "<", 5)[1].expected == "< 5"
    assert decide([1.0, 2.0], ">")[1].name == "effect"
    assert decide([1.0, 2.0], ">")[1].expected == "> 0"
    # one value (however far from the threshold), none, or only non-finite ones: inconclusive
    for values in ([100.0], [], [NAN, 100.0], [INF]):
        verdict, effect = decide(values, ">", 0.0)
        assert verdict == "inconclusive", values
        assert effect.n == len([v for v in values if math.isfinite(v)])


def test_decide_with_two_values_is_decided():
    assert decide([1.0, 1.1], ">", 0.0)[0] == "supported"  # n == 2 is enough to decide


def test_min_detectable_value_and_non_finite_values_left_out():
    vals = [1.0, 2.0, 4.0, 7.0]
    n, mean = 4, 3.5
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    want = (t_quantile(0.975, 3) + t_quantile(0.80, 3)) * sd / math.sqrt(n)
    assert min_detectable(vals) == pytest.approx(want, rel=1e-12)
    assert min_detectable(vals + [NAN, INF, -INF]) == pytest.approx(want, rel=1e-12)
    assert min_detectable([3, 5]) == pytest.approx(
        (t_quantile(0.975, 1) + t_quantile(0.80, 1)) * math.sqrt(2) / math.sqrt(2), rel=1e-12)
    assert min_detectable([5.0, NAN]) == INF
    assert min_detectable([]) == INF
    assert min_detectable([2.0, 2.0, 2.0]) == 0.0


def test_rule_texts_name_the_quantity_and_both_sides():
    assert rule_text("slope", ">", 0.25) == (
        "supported if the 95% interval of [slope] lies entirely > 0.25; not supported if it "
        "lies entirely <= 0.25; otherwise inconclusive")
    assert rule_text("gap", "<", -1) == (
        "supported if the 95% interval of [gap] lies entirely < -1; not supported if it lies "
        "entirely >= -1; otherwise inconclusive")
    assert band_rule_text("b", -0.65, -0.35) == (
        "supported if the 95% interval of [b] lies inside [-0.65, -0.35]; not supported if it "
        "lies entirely outside; otherwise inconclusive")


def test_predict_direction_fields():
    p = predict_direction("pre", "slope", "Xiong 2020: -0.5", [2, 2.5, 3], ">", 0.5, 0.25)
    assert isinstance(p, Prediction)
    assert (p.subject, p.quantity, p.paper) == ("pre", "slope", "Xiong 2020: -0.5")
    assert p.rule == rule_text("slope", ">", 0.5)
    assert p.verdict == "supported" and p.diagnosis == ""
    assert p.values == [2.0, 2.5, 3.0] and all(type(v) is float for v in p.values)
    assert p.meaningful == 0.25 and p.mde == pytest.approx(min_detectable([2, 2.5, 3]))
    assert p.effect.name == "slope" and p.effect.estimate == 2.5
    d = p.to_dict()
    assert d["subject"] == "pre" and d["effect"]["n"] == 3 and d["values"] == [2.0, 2.5, 3.0]


def test_diagnosis_of_an_inconclusive_prediction():
    # tight values sitting on the line: the test could see an effect of 0.5, nothing is there
    tight = predict_direction("x", "q", "", [0.11, 0.09, 0.1, 0.1], ">", 0.1, 0.5)
    assert tight.verdict == "inconclusive"
    mde = min_detectable([0.11, 0.09, 0.1, 0.1])
    assert tight.diagnosis == (
        f"the experiment was large enough (it could detect {mde:.3g}; the claim means 0.5), "
        "and the effect sits at the line: absent, or too close to the threshold to call")
    # mde exactly the meaningful effect still counts as large enough
    at = predict_direction("x", "q", "", [0.11, 0.09, 0.1, 0.1], ">", 0.1, mde)
    assert "large enough" in at.diagnosis
    noisy = predict_direction("x", "q", "", [-3.0, 1.0, 5.0], ">", 0.0, 0.1)
    big = min_detectable([-3.0, 1.0, 5.0])
    assert noisy.diagnosis == (f"too few seeds or steps: the smallest detectable effect is "
                               f"{big:.3g}, larger than the 0.1 the claim means")
    one = predict_direction("x", "q", "", [3.0], ">", 0.0, 0.1)
    assert one.verdict == "inconclusive"
    assert one.diagnosis == "too few values to decide (fewer than 2)"
    decided = predict_direction("x", "q", "", [-3.0, -3.1, -2.9], ">", 0.0, 0.1)
    assert decided.verdict == "not supported" and decided.diagnosis == ""


def test_predict_band_fields_and_edges():
    p = predict_band("post", "exponent", "Liu 2020: ~1", [1.0, 1.01, 0.99], 0.8, 1.2)
    assert p.verdict == "supported" and p.diagnosis == ""
    assert (p.subject, p.quantity, p.paper) == ("post", "exponent", "Liu 2020: ~1")
    assert p.rule == band_rule_text("exponent", 0.8, 1.2)
    assert p.effect.expected == "in [0.8, 1.2]" and p.effect.name == "exponent"
    assert p.effect.estimate == pytest.approx(1.0) and p.effect.n == 3
    lo, hi = mean_ci([1.0, 1.01, 0.99])["ci95"]
    assert (p.effect.ci_low, p.effect.ci_high) == (lo, hi)
    assert p.meaningful == pytest.approx(0.2) and p.values == [1.0, 1.01, 0.99]
    assert p.mde == pytest.approx(min_detectable([1.0, 1.01, 0.99]))
    one = predict_band("post", "exponent", "", [1.0], 0.8, 1.2)
    assert one.verdict == "inconclusive" and "fewer than 2" in one.diagnosis
    two = predict_band("post", "exponent", "", [1.0, 1.001], 0.8, 1.2)
    assert two.verdict == "supported"
    wide = predict_band("post", "exponent", "", [0.0, 2.0, 1.0], 0.8, 1.2)
    assert wide.verdict == "inconclusive" and "too few seeds" in wide.diagnosis


@pytest.mark.parametrize("verdicts, combined", [
    ([], "inconclusive"),
    (["supported"], "supported"),
    (["supported", "supported"], "supported"),
    (["supported", "inconclusive"], "inconclusive"),
    (["inconclusive", "not supported", "supported"], "not supported"),
    (["not supported"], "not supported"),
    (["inconclusive"], "inconclusive"),
])
def test_combine(verdicts, combined):
    preds = [predict_direction("s", "q", "", [1.0, 2.0], ">", 0.0, 1.0) for _ in verdicts]
    for p, v in zip(preds, verdicts, strict=True):
        p.verdict = v
    assert combine(preds) == combined
