"""Verdict rules: each claim states its predictions before any run (`normlab.study.claims.spec`),
each prediction is decided on per-seed values, and the claim's verdict combines them by role.

A prediction's rule is one of
- a **direction**: the quantity is `> threshold` (or `< threshold`);
- a **band**: the quantity lies in `[low, high]` (a bound tested as a bound, an equality to
  within a resolution the source itself separates);
- an **order**: a one-sided law of growth, a slope above (or below) a bound ("at least linear");
- **non-inferiority**: a difference no worse than a margin stated before the run (worse is `>`:
  the interval's upper end below the margin supports, its lower end at or above refutes);
- **equivalence**: a difference within `[-margin, margin]`;
- a **failure rate**: the share of seeds that diverged or stalled, above (or below) a rate, on
  its 95% Wilson interval;
- a **setting**: a fact of the design or of the runs (the depth a probe reads, the loss gap of a
  matched pair, the number of pairs that formed), not an estimate: checked exactly against the
  source's setting, with no interval.

With the mean and its 95% t-interval over seeds (or models):
- direction, order, non-inferiority: `supported` if the whole interval lies on the predicted
  side, `not supported` if it lies on the other side, `inconclusive` otherwise;
- band, equivalence: `supported` if the whole interval lies inside, `not supported` if the
  interval and the band do not overlap, `inconclusive` otherwise.
Fewer than 2 values are always `inconclusive`; so is a premise whose values do not vary at all
(an interval of zero width: a constant, not a measurement of the premise).

Roles: only `claim` predictions decide. A claim is `supported` when every claim prediction is,
`not supported` when any is not supported, `inconclusive` otherwise. A `premise` must hold for
the test to mean anything: one that is not supported or undecided makes the claim inconclusive,
never refuted; a premise about scale (depth, training regime, power) that is not supported
makes it `not tested at this scale`. A `diagnostic` is reported with its interval and never
decides.

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


MECHANISM = " (mechanism)"


def base_subject(subject: str) -> str:
    """A prediction's subject without the mark of how it is derived on a rung: off the source
    rungs a theory claim's "pre (mechanism)" is the source rung's "pre" (the ladder follows it
    from rung to rung)."""
    return subject.removesuffix(MECHANISM)


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
    # "claim": decides the claim; "premise": a condition the test needs (a model that learns,
    # a transfer to compare): a premise that fails leaves the claim inconclusive, never refuted;
    # "diagnostic": reported, never decides
    role: str = "claim"
    kind: str = "direction"  # the rule kind (module doc)
    scale: bool = False  # a premise about scale: failing it means "not tested at this scale"
    derivation: str = ""  # how the prediction's numbers were derived on this rung

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _diagnose(verdict: str, mde: float, meaningful: float, threshold: float) -> str:
    if verdict != "inconclusive":
        return ""
    if not math.isfinite(mde):
        return "too few values to decide (fewer than 2)"
    if meaningful <= 0:
        return (f"too few seeds or steps to tell the quantity from {threshold:g} (the source "
                f"names no size, so any effect counts): this test detects {mde:.3g} or more")
    if mde <= meaningful:
        return (f"the experiment was large enough (it could detect {mde:.3g}; the claim means "
                f"{meaningful:.3g}), and the effect sits at the line: absent, or too close to "
                "the threshold to call")
    return (f"too few seeds or steps: the smallest detectable effect is {mde:.3g}, larger than "
            f"the {meaningful:.3g} the claim means")


def predict_direction(subject: str, quantity: str, paper: str, values: Sequence[float],
                      expected: Direction, threshold: float, meaningful: float, *,
                      threshold_source: str = "", role: str = "claim") -> Prediction:
    vals = [float(v) for v in values]
    verdict, effect = decide(vals, expected, threshold, name=quantity)
    mde = min_detectable(vals)
    return Prediction(subject, quantity, paper, rule_text(quantity, expected, threshold),
                      verdict, effect, vals, meaningful, mde,
                      _diagnose(verdict, mde, meaningful, threshold), threshold_source, role)


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
                      effect, vals, meaningful, mde,
                      _diagnose(verdict, mde, meaningful, low),  # (a band of no width: a point)
                      threshold_source, "claim", "band")


def combine(predictions: Sequence[Prediction]) -> str:
    """The claim's verdict from its predictions' (module doc): claim predictions decide; a
    premise that does not hold leaves it inconclusive, or not tested at this scale when the
    premise is about scale; diagnostics never decide."""
    premises = [p for p in predictions if p.role == "premise"]
    if any(p.scale and p.verdict == "not supported" for p in premises):
        return NOT_TESTED
    if any(p.verdict != "supported" for p in premises):
        return "inconclusive"
    verdicts = [p.verdict for p in predictions if p.role == "claim"]
    if not verdicts:
        return "inconclusive"
    if any(v == "not supported" for v in verdicts):
        return "not supported"
    if all(v == "supported" for v in verdicts):
        return "supported"
    return "inconclusive"


NOT_TESTED = "not tested at this scale"


def zero_width_undecided(pred: Prediction) -> Prediction:
    """A premise whose values do not vary is undecided: its interval has zero width (a setting
    is a fact, checked exactly, not an estimate: it is left as it is)."""
    vals = pred.values
    if pred.role == "premise" and pred.kind != "setting" and len(vals) >= 2 and \
            max(vals) == min(vals):
        pred.verdict = "inconclusive"
        pred.diagnosis = ("every value is the same (an interval of zero width): a constant, not "
                          "a measurement of the premise, so it is not decided")
    return pred


def wilson_interval(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a share k/n."""
    if n <= 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def predict_order(subject: str, quantity: str, paper: str, values: Sequence[float],
                  expected: Direction, bound: float, *, threshold_source: str = "",
                  role: str = "claim") -> Prediction:
    """A one-sided law of growth: the slope is `> bound` (at least this order) or `< bound`."""
    pred = predict_direction(subject, quantity, paper, values, expected, bound, 0.0,
                             threshold_source=threshold_source, role=role)
    side = "above" if expected == ">" else "below"
    pred.rule = (f"an order, one-sided: supported if the 95% interval of [{quantity}] lies "
                 f"entirely {side} {bound:g}; not supported if it lies entirely on the other "
                 "side; otherwise inconclusive")
    pred.kind = "order"
    return pred


def predict_non_inferiority(subject: str, quantity: str, paper: str, values: Sequence[float],
                            margin: float, worse: Direction = ">", *,
                            threshold_source: str = "", role: str = "claim") -> Prediction:
    """No worse than `margin`: with worse `>` (a loss difference), supported if the interval's
    upper end lies below `margin`, not supported if its lower end lies at or above it."""
    expected: Direction = "<" if worse == ">" else ">"
    line = margin if worse == ">" else -margin
    pred = predict_direction(subject, quantity, paper, values, expected, line, margin,
                             threshold_source=threshold_source, role=role)
    end, other = ("upper", "lower") if worse == ">" else ("lower", "upper")
    pred.rule = (f"non-inferiority at margin {margin:g}: supported if the 95% interval's {end} "
                 f"end of [{quantity}] lies {expected} {line:g}; not supported if its {other} "
                 f"end lies at or beyond {line:g} (worse than the margin); otherwise inconclusive")
    pred.kind = "non_inferiority"
    return pred


def predict_equivalence(subject: str, quantity: str, paper: str, values: Sequence[float],
                        margin: float, *, threshold_source: str = "",
                        role: str = "claim") -> Prediction:
    """Within `[-margin, margin]` (a band about 0)."""
    pred = predict_band(subject, quantity, paper, values, -margin, margin,
                        threshold_source=threshold_source)
    pred.role, pred.kind = role, "equivalence"
    pred.rule = (f"equivalence at margin {margin:g}: supported if the 95% interval of "
                 f"[{quantity}] lies inside [{-margin:g}, {margin:g}]; not supported if it lies "
                 "entirely outside; otherwise inconclusive")
    return pred


def predict_failure_rate(subject: str, quantity: str, paper: str, failed: Sequence[bool],
                         expected: Direction, rate: float, *, threshold_source: str = "",
                         role: str = "claim") -> Prediction:
    """The share of seeds that failed (diverged or stalled), decided on its 95% Wilson
    interval against `rate`."""
    n, k = len(failed), sum(bool(f) for f in failed)
    low, high = wilson_interval(k, n)
    share = k / n if n else math.nan
    effect = Effect(name=quantity, estimate=share, ci_low=low, ci_high=high, n=n,
                    expected=f"{expected} {rate:g}")
    verdict = "inconclusive" if n < 2 else decide_interval(share, low, high, expected, rate)
    diagnosis = ""
    if verdict == "inconclusive":
        diagnosis = (f"{k} of {n} seeds failed: the 95% interval [{low:.2f}, {high:.2f}] "
                     f"includes {rate:g}" if n >= 2 else "too few seeds to decide (fewer than 2)")
    side = "above" if expected == ">" else "below"
    rule = (f"a failure rate: supported if the 95% Wilson interval of [{quantity}] lies "
            f"entirely {side} {rate:g}; not supported if it lies entirely on the other side; "
            "otherwise inconclusive")
    return Prediction(subject, quantity, paper, rule, verdict, effect,
                      [1.0 if f else 0.0 for f in failed], rate, math.nan, diagnosis,
                      threshold_source, role, "failure_rate")


SETTING_SIDES = (">", "<", ">=", "<=")


def predict_setting(subject: str, quantity: str, paper: str, values: Sequence[float],
                    expected: str, threshold: float, *, threshold_source: str = "",
                    role: str = "premise") -> Prediction:
    """A fact of the design or of the runs, checked exactly (no interval: it is not estimated
    from seeds): supported when every value lies on the `expected` side of `threshold` (one of
    `>`, `<`, `>=`, `<=`), not supported when any does not; with no value, inconclusive."""
    if expected not in SETTING_SIDES:
        raise ValueError(f"a setting's side must be one of {', '.join(SETTING_SIDES)}, got "
                         f"{expected!r}")
    vals = [float(v) for v in values]
    holds = {">": lambda v: v > threshold, "<": lambda v: v < threshold,
             ">=": lambda v: v >= threshold, "<=": lambda v: v <= threshold}[expected]
    if not vals or not all(math.isfinite(v) for v in vals):
        verdict = "inconclusive"
    else:
        verdict = "supported" if all(holds(v) for v in vals) else "not supported"
    finite = [v for v in vals if math.isfinite(v)]
    effect = Effect(name=quantity, estimate=sum(finite) / len(finite) if finite else math.nan,
                    ci_low=min(finite, default=math.nan), ci_high=max(finite, default=math.nan),
                    n=len(vals), expected=f"{expected} {threshold:g}")
    diagnosis = "" if verdict != "inconclusive" else "no value to check"
    rule = (f"a setting, checked exactly: supported if every value of [{quantity}] is "
            f"{expected} {threshold:g}; not supported otherwise")
    return Prediction(subject, quantity, paper, rule, verdict, effect, vals, 0.0, math.nan,
                      diagnosis, threshold_source, role, "setting")
