"""Verdict rules: each claim states a quantitative prediction per placement, each prediction is
decided on per-seed values, and the claim's verdict combines them.

A prediction is one of
- a direction: the quantity is `> threshold` (or `< threshold`);
- a band: the quantity lies in `[low, high]` (a slope of -0.5 +- 0.15, a growth exponent near 1).

With the mean and its 95% t-interval over seeds (or models):
- direction: `supported` if the whole interval lies on the predicted side, `not supported` if
  it lies on the other side, `inconclusive` otherwise;
- band: `supported` if the whole interval lies inside the band, `not supported` if the interval
  and the band do not overlap, `inconclusive` otherwise.

A claim is `supported` when every prediction is, `not supported` when any is not supported,
`inconclusive` otherwise. Fewer than 2 values are always `inconclusive`.

Power: an inconclusive prediction says the smallest effect the experiment could have detected,
`mde = (t_{0.975, n-1} + t_{0.80, n-1}) * sd / sqrt(n)` (5% two-sided, 80% power), and compares
it with the smallest effect the claim means (`meaningful`): if `mde <= meaningful` the experiment
was large enough and the effect is absent or smaller than meant; otherwise it had too few seeds or
steps to tell.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from normlab.probe.fits import mean_ci, t_quantile
from normlab.study.schema import Effect

Direction = Literal[">", "<"]


def rule_text(name: str, expected: Direction, threshold: float) -> str:
    other = "<=" if expected == ">" else ">="
    return (f"supported if the 95% interval of [{name}] lies entirely {expected} {threshold:g}; "
            f"not supported if it lies entirely {other} {threshold:g}; otherwise inconclusive")


def band_rule_text(name: str, low: float, high: float) -> str:
    return (f"supported if the 95% interval of [{name}] lies inside [{low:g}, {high:g}]; not "
            f"supported if it lies entirely outside; otherwise inconclusive")


def decide_interval(estimate: float, low: float, high: float, expected: Direction,
                    threshold: float = 0.0) -> str:
    if not all(math.isfinite(v) for v in (estimate, low, high)):
        return "inconclusive"
    if expected == ">":
        if low > threshold:
            return "supported"
        if high <= threshold:
            return "not supported"
    else:
        if high < threshold:
            return "supported"
        if low >= threshold:
            return "not supported"
    return "inconclusive"


def decide_band(estimate: float, low: float, high: float, band_low: float, band_high: float
                ) -> str:
    if not all(math.isfinite(v) for v in (estimate, low, high)):
        return "inconclusive"
    if band_low <= low and high <= band_high:
        return "supported"
    if high < band_low or low > band_high:
        return "not supported"
    return "inconclusive"


def decide(values: Sequence[float], expected: Direction, threshold: float = 0.0, *,
           name: str = "effect") -> tuple[str, Effect]:
    """Verdict and effect from per-seed values of the effect (a direction)."""
    ci = mean_ci(values)
    low, high = ci["ci95"]
    effect = Effect(name=name, estimate=ci["mean"], ci_low=low, ci_high=high, n=ci["n"],
                    expected=f"{expected} {threshold:g}")
    if ci["n"] < 2:
        return "inconclusive", effect
    return decide_interval(ci["mean"], low, high, expected, threshold), effect


def min_detectable(values: Sequence[float]) -> float:
    """Smallest effect detectable at 5% (two-sided) with 80% power from these values' spread."""
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    n = len(vals)
    if n < 2:
        return math.inf
    mean = sum(vals) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    return (t_quantile(0.975, n - 1) + t_quantile(0.80, n - 1)) * sd / math.sqrt(n)


@dataclass
class Prediction:
    """One placement's (or one comparison's) quantitative prediction and its test."""

    subject: str  # "pre", "post", "post vs pre", ...
    quantity: str  # what is measured, in words
    paper: str  # what the literature predicts or reports, with its number
    rule: str
    verdict: str
    effect: Effect
    values: list[float] = field(default_factory=list)
    meaningful: float = 0.0  # the smallest effect the prediction means
    mde: float = math.nan  # the smallest effect this experiment could detect
    diagnosis: str = ""  # for an inconclusive prediction: absent effect or too small a test
    # where the threshold comes from: the source's own factor, or "no size given: 0"
    threshold_source: str = ""
    # "test": decides the claim; "premise": a condition the test needs (a model that learns,
    # a transfer to compare): a premise that fails leaves the claim inconclusive, never refuted
    role: str = "test"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _diagnose(verdict: str, mde: float, meaningful: float) -> str:
    if verdict != "inconclusive":
        return ""
    if not math.isfinite(mde):
        return "too few values to decide (fewer than 2)"
    if meaningful <= 0:
        return (f"too few seeds or steps to tell the effect from 0 (the source names no size, "
                f"so any effect counts): this test detects {mde:.3g} or more")
    if mde <= meaningful:
        return (f"the experiment was large enough (it could detect {mde:.3g}; the claim means "
                f"{meaningful:.3g}), and the effect sits at the line: absent, or too close to "
                "the threshold to call")
    return (f"too few seeds or steps: the smallest detectable effect is {mde:.3g}, larger than "
            f"the {meaningful:.3g} the claim means")


def predict_direction(subject: str, quantity: str, paper: str, values: Sequence[float],
                      expected: Direction, threshold: float, meaningful: float, *,
                      threshold_source: str = "", role: str = "test") -> Prediction:
    vals = [float(v) for v in values]
    verdict, effect = decide(vals, expected, threshold, name=quantity)
    mde = min_detectable(vals)
    return Prediction(subject, quantity, paper, rule_text(quantity, expected, threshold),
                      verdict, effect, vals, meaningful, mde, _diagnose(verdict, mde, meaningful),
                      threshold_source, role)


def predict_band(subject: str, quantity: str, paper: str, values: Sequence[float],
                 low: float, high: float, *, threshold_source: str = "") -> Prediction:
    vals = [float(v) for v in values]
    ci = mean_ci(vals)
    lo, hi = ci["ci95"]
    effect = Effect(name=quantity, estimate=ci["mean"], ci_low=lo, ci_high=hi, n=ci["n"],
                    expected=f"in [{low:g}, {high:g}]")
    verdict = "inconclusive" if ci["n"] < 2 else decide_band(ci["mean"], lo, hi, low, high)
    mde = min_detectable(vals)
    meaningful = (high - low) / 2
    return Prediction(subject, quantity, paper, band_rule_text(quantity, low, high), verdict,
                      effect, vals, meaningful, mde, _diagnose(verdict, mde, meaningful),
                      threshold_source)


def combine(predictions: Sequence[Prediction]) -> str:
    """All supported: supported; any not supported: not supported; otherwise inconclusive.
    Premises (`role="premise"`) do not refute: one that is not supported leaves the claim
    inconclusive (the test's condition does not hold)."""
    premises = [p for p in predictions if p.role == "premise"]
    if any(p.verdict != "supported" for p in premises):
        return "inconclusive"
    verdicts = [p.verdict for p in predictions if p.role != "premise"]
    if not verdicts:
        return "inconclusive"
    if any(v == "not supported" for v in verdicts):
        return "not supported"
    if all(v == "supported" for v in verdicts):
        return "supported"
    return "inconclusive"
