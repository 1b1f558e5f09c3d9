"""Least-squares fits with 95% intervals, in the standard library plus torch (no SciPy).

`loglog_fit` fits `log(y) = a + b log(x)` by ordinary least squares over all points (all seeds
and depths) and gives the slope's t-interval, `b +- t_{0.975, n-2} * se(b)`, plus a bootstrap
interval over seeds (whole seeds resampled with replacement, so the points of one seed stay
together), which does not assume independent points.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """CDF of Student's t distribution with `df` degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t (bisection on the CDF; |error| < 1e-10)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def _ols(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float]:
    """(slope, intercept, standard error of the slope)."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    if sxx == 0:
        return math.nan, math.nan, math.nan
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sxx
    icpt = my - slope * mx
    if n <= 2:
        return slope, icpt, math.nan
    rss = sum((b - icpt - slope * a) ** 2 for a, b in zip(x, y, strict=True))
    return slope, icpt, math.sqrt(rss / (n - 2) / sxx)


def loglog_fit(points: Sequence[tuple[float, float, int]], *, n_boot: int = 2000,
               seed: int = 0) -> dict[str, object]:
    """Fit `log y = a + b log x` over `(x, y, seed)` points; non-positive or non-finite y are
    left out (and counted). Returns slope, intercept, the slope's 95% t-interval and bootstrap
    interval over seeds."""
    good = [(x, y, s) for x, y, s in points
            if x > 0 and y is not None and math.isfinite(y) and y > 0]
    out: dict[str, object] = {"n_points": len(good), "n_dropped": len(points) - len(good)}
    xs = {x for x, _, _ in good}
    if len(xs) < 2:
        out.update(slope=math.nan, intercept=math.nan, ci95_t=[math.nan, math.nan],
                   ci95_boot=[math.nan, math.nan], n_seeds=len({s for *_, s in good}))
        return out
    lx = [math.log(x) for x, _, _ in good]
    ly = [math.log(y) for _, y, _ in good]
    slope, icpt, se = _ols(lx, ly)
    n = len(good)
    if n > 2 and math.isfinite(se):
        half = t_quantile(0.975, n - 2) * se
        ci_t = [slope - half, slope + half]
    else:
        ci_t = [math.nan, math.nan]
    seeds = sorted({s for *_, s in good})
    boot = [math.nan, math.nan]
    if len(seeds) >= 2:
        rng = random.Random(seed)
        by_seed = {s: [(a, b) for a, b, (_, _, s2) in zip(lx, ly, good, strict=True) if s2 == s]
                   for s in seeds}
        slopes = []
        for _ in range(n_boot):
            pick = [p for s in rng.choices(seeds, k=len(seeds)) for p in by_seed[s]]
            b, _, _ = _ols([p[0] for p in pick], [p[1] for p in pick])
            if math.isfinite(b):
                slopes.append(b)
        if slopes:
            slopes.sort()
            boot = [slopes[int(0.025 * (len(slopes) - 1))], slopes[int(0.975 * (len(slopes) - 1))]]
    out.update(slope=slope, intercept=icpt, slope_se=se, ci95_t=ci_t, ci95_boot=boot,
               n_seeds=len(seeds))
    return out


def mean_ci(values: Sequence[float]) -> dict[str, float]:
    """Mean with a 95% t-interval (NaN half-width for fewer than 2 values)."""
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return {"mean": math.nan, "ci95": [math.nan, math.nan], "n": 0}
    m = sum(v) / len(v)
    if len(v) < 2:
        return {"mean": m, "ci95": [math.nan, math.nan], "n": 1}
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))
    half = t_quantile(0.975, len(v) - 1) * sd / math.sqrt(len(v))
    return {"mean": m, "ci95": [m - half, m + half], "n": len(v)}


def welch_ci(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """mean(a) - mean(b) with a 95% Welch interval (unequal variances, Welch-Satterthwaite
    degrees of freedom); NaN half-width when either side has fewer than 2 values."""
    def mean_var(v: Sequence[float]) -> tuple[float, float]:
        m = sum(v) / len(v)
        var = sum((x - m) ** 2 for x in v) / (len(v) - 1) if len(v) > 1 else math.nan
        return m, var / len(v)  # the squared standard error of the mean

    (ma, va), (mb, vb) = mean_var(a), mean_var(b)
    diff, se = ma - mb, math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / max(1, len(a) - 1) + vb**2 / max(1, len(b) - 1)) if se else 1.0
    half = t_quantile(0.975, max(1.0, df)) * se
    return {"diff": diff, "ci95": [diff - half, diff + half], "n": len(a) + len(b)}
