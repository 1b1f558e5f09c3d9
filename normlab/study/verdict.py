"""The verdict rule: an effect with a 95% interval, compared with a threshold.

Every claim is reduced to one effect whose sign the claim predicts (for example "slope of pre
minus slope of post < 0"), measured once per seed. With the mean and its 95% t-interval over
seeds:

- `supported`: the whole interval lies on the predicted side of the threshold;
- `not supported`: the whole interval lies on the other side (no effect of that size, or the
  opposite effect);
- `inconclusive`: the interval straddles the threshold, or there are fewer than 2 values.

The threshold is the smallest effect the claim means (0 when any effect in the predicted direction
counts). The rule is printed with every verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from normlab.probe.fits import mean_ci
from normlab.study.schema import Effect

Direction = Literal[">", "<"]


def rule_text(name: str, expected: Direction, threshold: float) -> str:
    other = "<=" if expected == ">" else ">="
    return (f"supported if the 95% interval of [{name}] lies entirely {expected} {threshold:g}; "
            f"not supported if it lies entirely {other} {threshold:g}; otherwise inconclusive")


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


def decide(values: Sequence[float], expected: Direction, threshold: float = 0.0, *,
           name: str = "effect") -> tuple[str, Effect]:
    """Verdict and effect from per-seed values of the effect."""
    ci = mean_ci(values)
    low, high = ci["ci95"]
    effect = Effect(name=name, estimate=ci["mean"], ci_low=low, ci_high=high, n=ci["n"],
                    expected=f"{expected} {threshold:g}")
    if ci["n"] < 2:
        return "inconclusive", effect
    return decide_interval(ci["mean"], low, high, expected, threshold), effect
