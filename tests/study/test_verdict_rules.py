"""The verdict rules at their edges: a bound equal to the threshold, an interval touching a band's
edge, fewer than 2 values, non-finite numbers, the power diagnosis and the rule texts; each rule
kind (order, non-inferiority, equivalence, failure rate) on planted values, the roles a claim's
predictions combine by, and what a claim says when a premise about scale fails."""

from __future__ import annotations

import math

import pytest

from normlab.probe.fits import mean_ci, t_quantile
from normlab.study.claims.common import make_claim
from normlab.study.verdict import (
    MECHANISM,
    NOT_TESTED,
    Prediction,
    band_rule_text,
    base_subject,
    combine,
    decide,
    decide_band,
    decide_interval,
    min_detectable,
    predict_band,
    predict_direction,
    predict_equivalence,
    predict_failure_rate,
    predict_non_inferiority,
    predict_order,
    predict_setting,
    rule_text,
    wilson_interval,
    zero_width_undecided,
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


# -- the rule kinds on planted values -------------------------------------------------------------

MARGIN = 0.02
# per-seed differences of final loss (worse is larger): tight around a centre, 95% interval
# about +-0.005 wide
EQUAL = [-0.004, 0.002, 0.0, 0.003, -0.001]  # the same loss: inside the margin
WORSE = [0.05 + v for v in EQUAL]  # 0.05 worse: beyond the margin
STRADDLE = [-0.01, 0.05, 0.0, 0.04, 0.02]  # the interval holds 0.02


def _ci(values):
    return tuple(mean_ci(values)["ci95"])


def test_planted_differences_sit_where_the_tests_say():
    assert _ci(EQUAL)[1] < MARGIN and _ci(EQUAL)[0] > -MARGIN
    assert _ci(WORSE)[0] > MARGIN
    lo, hi = _ci(STRADDLE)
    assert lo < MARGIN < hi and lo > -MARGIN


@pytest.mark.parametrize("values, verdict", [
    (EQUAL, "supported"), (WORSE, "not supported"), (STRADDLE, "inconclusive")])
def test_non_inferiority_with_worse_above(values, verdict):
    p = predict_non_inferiority("post vs pre", "loss(post) - loss(pre)", "as good", values,
                                MARGIN)
    assert p.verdict == verdict
    assert p.kind == "non_inferiority" and p.role == "claim"
    assert p.effect.expected == "< 0.02"  # the interval's upper end below the margin
    assert p.meaningful == MARGIN
    assert (p.diagnosis == "") == (verdict != "inconclusive")


@pytest.mark.parametrize("values, verdict", [
    (EQUAL, "supported"), (WORSE, "not supported"), (STRADDLE, "inconclusive")])
def test_non_inferiority_with_worse_below(values, verdict):
    """An accuracy difference: worse is lower, so the same planted values mirrored."""
    mirrored = [-v for v in values]
    p = predict_non_inferiority("post vs pre", "acc(post) - acc(pre)", "as good", mirrored,
                                MARGIN, "<")
    assert p.verdict == verdict
    assert p.effect.expected == "> -0.02"  # the interval's lower end above -margin
    assert "lower end of [acc(post) - acc(pre)] lies > -0.02" in p.rule


def test_non_inferiority_is_not_superiority_and_its_rule_text():
    # clearly better (the loss lower by 0.05): non-inferior, whatever the margin
    better = [-0.05 + v for v in EQUAL]
    assert predict_non_inferiority("s", "q", "", better, MARGIN).verdict == "supported"
    # 0.015 worse with a tight interval: still within the margin, so non-inferior
    slightly = [0.015 + v / 4 for v in EQUAL]
    assert predict_non_inferiority("s", "q", "", slightly, MARGIN).verdict == "supported"
    assert predict_direction("s", "q", "", slightly, "<", 0.0, 0.0).verdict == "not supported"
    p = predict_non_inferiority("s", "gap", "", EQUAL, MARGIN, threshold_source="the margin",
                                role="diagnostic")
    assert p.rule == ("non-inferiority at margin 0.02: supported if the 95% interval's upper end "
                      "of [gap] lies < 0.02; not supported if its lower end lies at or beyond 0.02 "
                      "(worse than the margin); otherwise inconclusive")
    assert p.role == "diagnostic" and p.threshold_source == "the margin"
    assert predict_non_inferiority("s", "q", "", [0.1], MARGIN).verdict == "inconclusive"


@pytest.mark.parametrize("values, verdict", [
    (EQUAL, "supported"),
    (WORSE, "not supported"),
    ([-v for v in WORSE], "not supported"),  # beyond the margin on the other side too
    (STRADDLE, "inconclusive"),
    ([-v for v in STRADDLE], "inconclusive"),
])
def test_equivalence_is_a_band_about_zero(values, verdict):
    p = predict_equivalence("post vs pre", "gap", "the same", values, MARGIN,
                            threshold_source="the margin", role="premise")
    assert p.verdict == verdict
    assert (p.kind, p.role, p.threshold_source) == ("equivalence", "premise", "the margin")
    assert p.effect.expected == "in [-0.02, 0.02]"
    assert p.meaningful == pytest.approx(MARGIN)
    assert p.rule == ("equivalence at margin 0.02: supported if the 95% interval of [gap] lies "
                      "inside [-0.02, 0.02]; not supported if it lies entirely outside; "
                      "otherwise inconclusive")


SLOPES_HIGH = [2.9, 3.1, 3.0, 3.05]


@pytest.mark.parametrize("values, verdict", [
    (SLOPES_HIGH, "supported"),  # far above the bound
    ([100.0, 101.0, 99.0], "supported"),  # no upper edge: any faster growth is at least linear
    ([0.2, 0.3, 0.25, 0.22], "not supported"),  # below the bound
    ([0.5, 1.5, 0.8, 1.3], "inconclusive"),  # the interval holds 1
])
def test_order_is_one_sided(values, verdict):
    p = predict_order("post", "growth exponent", "at least linear", values, ">", 1.0)
    assert p.verdict == verdict
    assert p.kind == "order" and p.effect.expected == "> 1"
    assert p.rule == ("an order, one-sided: supported if the 95% interval of [growth exponent] "
                      "lies entirely above 1; not supported if it lies entirely on the other "
                      "side; otherwise inconclusive")
    # a band of the same centre would refute a slope far above it: an order has no upper edge
    if values[0] == 100.0:
        assert predict_band("post", "g", "", values, 0.5, 1.5).verdict == "not supported"


def test_order_below_a_bound():
    p = predict_order("deepnorm", "depth slope", "O(1)", [0.1, 0.12, 0.08], "<", 0.5,
                      role="premise")
    assert p.verdict == "supported" and p.role == "premise" and "below 0.5" in p.rule
    assert predict_order("d", "s", "", [-50.0, -51.0, -49.0], "<", 0.5).verdict == "supported"
    assert predict_order("d", "s", "", SLOPES_HIGH, "<", 0.5).verdict == "not supported"


def test_wilson_interval_at_known_values():
    low, high = wilson_interval(4, 4)
    assert low == pytest.approx(0.5101, abs=1e-4) and high == pytest.approx(1.0)
    assert wilson_interval(0, 4) == (0.0, pytest.approx(0.4899, abs=1e-4))
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert wilson_interval(5, 10) == (pytest.approx(0.2366, abs=1e-4),
                                      pytest.approx(0.7634, abs=1e-4))
    assert wilson_interval(1, 3) == (pytest.approx(0.0615, abs=1e-4),
                                     pytest.approx(0.7923, abs=1e-4))
    # symmetric: k failures of n mirror n - k
    lo, hi = wilson_interval(3, 7)
    assert (1 - hi, 1 - lo) == (pytest.approx(wilson_interval(4, 7)[0]),
                                pytest.approx(wilson_interval(4, 7)[1]))
    assert all(math.isnan(v) for v in wilson_interval(0, 0))
    # a narrower interval at a smaller z
    assert wilson_interval(5, 10, z=1.0)[0] > wilson_interval(5, 10)[0]


@pytest.mark.parametrize("failed, expected, verdict", [
    ([True] * 4, ">", "supported"),  # 4 of 4: the interval's low end, 0.51, above 0.5
    ([True, True, True, False], ">", "inconclusive"),  # 3 of 4: [0.30, 0.95] holds 0.5
    ([False] * 4, ">", "not supported"),  # 0 of 4: [0, 0.49] below 0.5
    ([False] * 4, "<", "supported"),
    ([True] * 4, "<", "not supported"),
])
def test_failure_rate_on_its_wilson_interval(failed, expected, verdict):
    p = predict_failure_rate("post", "share of runs that diverged", "diverges", failed,
                             expected, 0.5, threshold_source="the source")
    assert p.verdict == verdict and p.kind == "failure_rate"
    k, n = sum(failed), len(failed)
    assert p.effect.estimate == k / n and p.effect.n == n
    assert (p.effect.ci_low, p.effect.ci_high) == wilson_interval(k, n)
    assert p.values == [1.0 if f else 0.0 for f in failed]
    assert p.meaningful == 0.5 and math.isnan(p.mde)
    assert p.effect.expected == f"{expected} 0.5"
    if verdict == "inconclusive":
        assert p.diagnosis == ("3 of 4 seeds failed: the 95% interval [0.30, 0.95] includes 0.5")
    else:
        assert p.diagnosis == ""


def test_failure_rate_with_fewer_than_two_seeds_and_its_rule_text():
    one = predict_failure_rate("post", "q", "", [True], ">", 0.5)
    assert one.verdict == "inconclusive"
    assert one.diagnosis == "too few seeds to decide (fewer than 2)"
    none = predict_failure_rate("post", "q", "", [], ">", 0.5)
    assert none.verdict == "inconclusive" and math.isnan(none.effect.estimate)
    p = predict_failure_rate("post", "diverged", "", [True, True], ">", 0.5, role="diagnostic")
    assert p.role == "diagnostic"
    assert p.rule == ("a failure rate: supported if the 95% Wilson interval of [diverged] lies "
                      "entirely above 0.5; not supported if it lies entirely on the other side; "
                      "otherwise inconclusive")
    # 2 of 2 is not enough for a rate above 0.5: [0.34, 1]
    assert p.verdict == "inconclusive"


# -- roles: claim predictions decide, premises gate, diagnostics are reported ---------------------

def _pred(verdict: str, role: str = "claim", scale: bool = False, subject: str = "s"
          ) -> Prediction:
    p = predict_direction(subject, "q", "", [1.0, 2.0], ">", 0.0, 1.0, role=role)
    p.verdict, p.scale = verdict, scale
    return p


@pytest.mark.parametrize("preds, combined", [
    # a diagnostic, whatever its verdict, leaves the claim's verdict alone
    ([_pred("supported"), _pred("not supported", "diagnostic")], "supported"),
    ([_pred("not supported"), _pred("supported", "diagnostic")], "not supported"),
    ([_pred("inconclusive"), _pred("not supported", "diagnostic")], "inconclusive"),
    # a premise that fails or is undecided: inconclusive, never "not supported"
    ([_pred("not supported", "premise"), _pred("supported")], "inconclusive"),
    ([_pred("not supported", "premise"), _pred("not supported")], "inconclusive"),
    ([_pred("inconclusive", "premise"), _pred("not supported")], "inconclusive"),
    ([_pred("supported", "premise"), _pred("supported")], "supported"),
    ([_pred("supported", "premise"), _pred("not supported")], "not supported"),
    # a premise about scale that fails: not tested at this scale, whatever the claim says
    ([_pred("not supported", "premise", True), _pred("not supported")], NOT_TESTED),
    ([_pred("supported", "premise"), _pred("not supported", "premise", True),
      _pred("supported")], NOT_TESTED),
    # ... but one that is only undecided leaves it inconclusive
    ([_pred("inconclusive", "premise", True), _pred("supported")], "inconclusive"),
    # no claim prediction: nothing decides
    ([_pred("supported", "premise"), _pred("supported", "diagnostic")], "inconclusive"),
    ([_pred("supported", "diagnostic")], "inconclusive"),
])
def test_combine_by_role(preds, combined):
    assert combine(preds) == combined


def test_zero_width_undecided_touches_premises_only():
    constant = [0.3, 0.3, 0.3]
    premise = predict_direction("pre", "q", "", constant, ">", 0.0, 0.0, role="premise")
    assert premise.verdict == "supported"  # a [0.3, 0.3] interval, decided as it stands
    same = zero_width_undecided(premise)
    assert same is premise and premise.verdict == "inconclusive"
    assert premise.diagnosis == ("every value is the same (an interval of zero width): a "
                                 "constant, not a measurement of the premise, so it is not "
                                 "decided")
    # a claim prediction (or a diagnostic) of constant values is not touched
    for role in ("claim", "diagnostic"):
        p = zero_width_undecided(predict_direction("pre", "q", "", constant, ">", 0.0, 0.0,
                                                   role=role))
        assert p.verdict == "supported" and p.diagnosis == "", role
    # a premise that varies, or of one value, is left as decided
    varies = zero_width_undecided(predict_direction("pre", "q", "", [0.3, 0.31, 0.29], ">",
                                                    0.0, 0.0, role="premise"))
    assert varies.verdict == "supported"
    one = zero_width_undecided(predict_direction("pre", "q", "", [0.3], ">", 0.0, 0.0,
                                                 role="premise"))
    assert one.diagnosis == "too few values to decide (fewer than 2)"
    # a zero-width premise that would refute is undecided too: it never says "not supported"
    refuting = zero_width_undecided(predict_direction("pre", "q", "", [-1.0, -1.0], ">", 0.0,
                                                      0.0, role="premise"))
    assert refuting.verdict == "inconclusive"


# -- a claim not tested at this scale -------------------------------------------------------------

def _claim(preds, needs="1000 steps or more", **kw):
    return make_claim("CX", "title", "statement", "source", "method", preds, "paper", {}, [],
                      needs=needs, **kw)


def test_a_failed_scale_premise_says_the_claim_is_not_tested_and_what_it_needs():
    preds = [_pred("supported", "premise", subject="learns"),
             _pred("not supported", "premise", True, subject="from init"),
             _pred("not supported", "premise", True, subject="transfer"),
             _pred("supported", subject="post vs pre")]
    res = _claim(preds)
    assert res.verdict == NOT_TESTED and res.needs == "1000 steps or more"
    assert res.note == ("Not tested at this scale: from init; transfer does not hold here, so "
                        "the claim's own predictions are reported, not decided. It needs 1000 "
                        "steps or more.")
    assert res.effect is preds[1].effect  # the first scale premise that failed
    # the claim's own note comes first; without `needs` no sentence about it
    bare = _claim(preds, needs="", note="Planted.")
    assert bare.note == ("Planted. Not tested at this scale: from init; transfer does not hold "
                         "here, so the claim's own predictions are reported, not decided.")
    assert bare.needs == ""
    # the rule names each deciding prediction with its role; diagnostics are left out
    with_diag = _claim([*preds, _pred("supported", "diagnostic", subject="reported")])
    assert "from init (premise): " in with_diag.rule and "post vs pre: " in with_diag.rule
    assert "reported (diagnostic)" not in with_diag.rule and with_diag.rule == res.rule


def test_needs_is_said_only_when_the_claim_is_not_tested_at_this_scale():
    supported = _claim([_pred("supported", "premise", True), _pred("supported")])
    assert supported.verdict == "supported" and supported.needs == "" and supported.note == ""
    # a premise not about scale that fails: undecided, the premise named, no `needs`
    undecided = _claim([_pred("not supported", "premise", subject="learns"),
                        _pred("supported")])
    assert undecided.verdict == "inconclusive" and undecided.needs == ""
    assert undecided.note == ("Not decided: a premise of the test fails (learns does not hold), "
                              "so the claim's own predictions are reported, not decided.")
    # a scale premise only undecided: inconclusive, not "not tested"
    open_ = _claim([_pred("inconclusive", "premise", True, subject="long enough"),
                    _pred("supported")])
    assert open_.verdict == "inconclusive" and open_.needs == ""
    assert "a premise of the test fails (long enough is not decided)" in open_.note
    refuted = _claim([_pred("supported", "premise", True), _pred("not supported")])
    assert refuted.verdict == "not supported" and refuted.needs == ""
    # a side that stalled everywhere: inconclusive even where a scale premise failed, and the
    # claim is then not called "not tested", so it says no `needs`
    stalled = _claim([_pred("not supported", "premise", True, subject="from init"),
                      _pred("supported")], stalled=["post"])
    assert stalled.verdict == "inconclusive" and stalled.needs == ""
    assert stalled.note.endswith("Not compared: post stalled or diverged at every setting "
                                 "tried, so the claim's premise (a model that trains) does not "
                                 "hold here.")


@pytest.mark.parametrize(("values", "side", "threshold", "verdict"), [
    ([7.0], ">", 6.0, "supported"),
    ([6.0], ">", 6.0, "not supported"),  # the edge itself is not past it
    ([6.0], ">=", 6.0, "supported"),
    ([5.999], ">=", 6.0, "not supported"),
    ([0.05], "<=", 0.05, "supported"),  # a loss gap at the tolerance is matched
    ([0.0500001], "<=", 0.05, "not supported"),
    ([0.04], "<", 0.05, "supported"),
    ([0.05], "<", 0.05, "not supported"),
    ([7.0, 7.0, 5.0], ">", 6.0, "not supported"),  # every value must hold
    ([7.0, 8.0], ">", 6.0, "supported"),
    ([], ">", 6.0, "inconclusive"),
    ([NAN], "<=", 0.05, "inconclusive"),  # no pair, no gap
    ([7.0, INF], ">", 6.0, "inconclusive"),
])
def test_a_setting_is_checked_exactly(values, side, threshold, verdict):
    p = predict_setting("large t", "first late block", "the seed", values, side, threshold)
    assert (p.verdict, p.kind, p.role) == (verdict, "setting", "premise")
    assert p.rule == (f"a setting, checked exactly: supported if every value of [first late "
                      f"block] is {side} {threshold:g}; not supported otherwise")
    assert p.effect.expected == f"{side} {threshold:g}"
    assert p.diagnosis == ("no value to check" if verdict == "inconclusive" else "")


def test_a_setting_reports_its_values_and_is_never_undecided_for_being_constant():
    p = predict_setting("pairs", "matched pairs", "", [3.0, 3.0, 5.0], ">=", 3.0,
                        threshold_source="the design", role="premise")
    assert (p.effect.estimate, p.effect.ci_low, p.effect.ci_high, p.effect.n) == (
        pytest.approx(11 / 3), 3.0, 5.0, 3)
    assert p.threshold_source == "the design" and p.values == [3.0, 3.0, 5.0]
    same = zero_width_undecided(predict_setting("pairs", "q", "", [4.0, 4.0], ">=", 3.0))
    assert same.verdict == "supported"  # a fact, not an estimate: zero width is no reason
    with pytest.raises(ValueError, match="one of >, <, >=, <="):
        predict_setting("x", "q", "", [1.0], "==", 1.0)


def test_a_failed_setting_about_scale_makes_the_claim_not_tested():
    short = predict_setting("large t", "q", "", [4.0], ">", 6.0)
    short.scale = True
    good = predict_direction("post vs pre", "q", "", [1.0, 1.1, 0.9], ">", 0.0, 0.0)
    bad = predict_direction("post vs pre", "q", "", [-1.0, -1.1, -0.9], ">", 0.0, 0.0)
    assert combine([short, good]) == NOT_TESTED and combine([short, bad]) == NOT_TESTED
    unmatched = predict_setting("matched loss", "q", "", [0.3], "<=", 0.05)
    assert combine([unmatched, bad]) == "inconclusive"  # not about scale: never refuted


# -- every field of a prediction, from its arguments ------------------------------------------
# Each rule's function carries its subject, quantity, source text, role, kind and threshold's
# origin through to the prediction the claim tables print: checked field by field here, with
# the defaults a caller leaves out.

def _carried(pred, subject="s", quantity="q", paper="p", source="", role="claim"):
    return (pred.subject, pred.quantity, pred.paper, pred.threshold_source, pred.role,
            pred.effect.name) == (subject, quantity, paper, source, role, quantity)


def test_a_direction_carries_its_arguments_and_names_its_threshold_when_undecided():
    pred = predict_direction("s", "q", "p", [0.4, 0.6, 0.5], ">", 0.5, 0.0)
    assert _carried(pred) and pred.kind == "direction" and pred.verdict == "inconclusive"
    assert pred.diagnosis.startswith("too few seeds or steps to tell the quantity from 0.5 ")
    pred = predict_direction("s", "q", "p", [1.0, 1.1], ">", 0.0, 0.0, threshold_source="t",
                             role="premise")
    assert _carried(pred, source="t", role="premise")


def test_an_order_carries_its_arguments_and_means_any_size():
    for expected, side in ((">", "above"), ("<", "below")):
        pred = predict_order("s", "q", "p", [0.4, 0.6, 0.5], expected, 0.5)
        assert _carried(pred) and pred.kind == "order" and pred.meaningful == 0.0
        assert f"lies entirely {side} 0.5;" in pred.rule
        assert pred.diagnosis.startswith("too few seeds or steps to tell the quantity from 0.5")
    pred = predict_order("s", "q", "p", [1.0, 1.1], ">", 0.0, threshold_source="t",
                         role="diagnostic")
    assert _carried(pred, source="t", role="diagnostic")


def test_non_inferiority_carries_its_arguments_and_names_both_ends():
    pred = predict_non_inferiority("s", "q", "p", [0.0, 0.01], 0.02)
    assert _carried(pred) and pred.kind == "non_inferiority"
    assert "95% interval's upper end" in pred.rule
    assert "its lower end lies at or beyond" in pred.rule
    pred = predict_non_inferiority("s", "q", "p", [0.0, 0.01], 0.02, "<", threshold_source="t",
                                   role="premise")
    assert _carried(pred, source="t", role="premise")
    assert "95% interval's lower end" in pred.rule
    assert "its upper end lies at or beyond" in pred.rule


def test_a_band_and_an_equivalence_carry_their_arguments():
    pred = predict_band("s", "q", "p", [0.1, 0.2], 0.0, 1.0)
    assert _carried(pred) and (pred.kind, pred.meaningful) == ("band", 0.5)
    assert predict_band("s", "q", "p", [0.1, 0.2], 0.0, 1.0, threshold_source="t"
                        ).threshold_source == "t"
    point = predict_band("s", "q", "p", [0.4, 0.6, 0.5], 0.5, 0.5)  # a band of no width
    assert point.diagnosis.startswith("too few seeds or steps to tell the quantity from 0.5 ")
    pred = predict_equivalence("s", "q", "p", [0.0, 0.01], 0.02)
    assert _carried(pred) and pred.kind == "equivalence"
    pred = predict_equivalence("s", "q", "p", [0.0, 0.01], 0.02, threshold_source="t",
                               role="diagnostic")
    assert _carried(pred, source="t", role="diagnostic")


def test_a_failure_rate_carries_its_arguments_and_decides_from_two_seeds():
    pred = predict_failure_rate("s", "q", "p", [True, True], ">", 0.1)
    assert _carried(pred) and (pred.kind, pred.meaningful) == ("failure_rate", 0.1)
    assert pred.verdict == "supported" and pred.effect.n == 2  # two seeds decide
    assert "lies entirely above 0.1;" in pred.rule
    pred = predict_failure_rate("s", "q", "p", [True, False], "<", 0.5, threshold_source="t",
                                role="premise")
    assert _carried(pred, source="t", role="premise") and "lies entirely below 0.5;" in pred.rule
    assert pred.diagnosis == "1 of 2 seeds failed: the 95% interval [0.09, 0.91] includes 0.5"
    one = predict_failure_rate("s", "q", "p", [True], ">", 0.1)
    assert one.verdict == "inconclusive" and one.diagnosis == \
        "too few seeds to decide (fewer than 2)"


def test_a_setting_carries_its_arguments_and_its_extremes():
    pred = predict_setting("s", "q", "p", [6.0, 12.0], ">", 5.0)
    assert _carried(pred, role="premise") and (pred.kind, pred.meaningful) == ("setting", 0.0)
    assert math.isnan(pred.mde)
    assert (pred.effect.estimate, pred.effect.ci_low, pred.effect.ci_high) == (9.0, 6.0, 12.0)
    empty = predict_setting("s", "q", "p", [], ">", 5.0, threshold_source="t", role="claim")
    assert _carried(empty, source="t") and empty.verdict == "inconclusive"
    assert math.isnan(empty.effect.ci_low) and math.isnan(empty.effect.ci_high)


def test_wilson_interval_of_one_seed_and_its_ends():
    assert wilson_interval(1, 1) == pytest.approx((0.2065, 1.0), abs=1e-4)
    assert wilson_interval(0, 1) == pytest.approx((0.0, 0.7935), abs=1e-4)
    assert wilson_interval(20, 20)[1] == 1.0  # clamped: unclamped it is 1 + 2e-16
    assert wilson_interval(7, 7)[0] > 0 and wilson_interval(0, 7)[0] == 0.0


def test_base_subject_strips_the_mechanism_mark_at_the_end_only():
    assert base_subject("pre" + MECHANISM) == "pre"
    assert base_subject("post vs pre") == "post vs pre"
