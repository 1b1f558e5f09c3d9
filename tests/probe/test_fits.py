"""The statistics under every verdict, against independent numbers: the incomplete beta function,
Student's t (reference values from SciPy 1.17, which normlab does not depend on), least squares
(numpy's polyfit), the seed bootstrap, mean and Welch intervals."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from normlab.probe.fits import betainc, loglog_fit, mean_ci, t_cdf, t_quantile, welch_ci

NAN = math.nan


@pytest.mark.parametrize("a, b, x, want", [  # scipy.special.betainc(a, b, x)
    (2.0, 3.0, 0.4, 0.5247999999999999),  # the direct continued fraction (x below the split)
    (2.0, 3.0, 0.9, 0.9963),  # the symmetric one, 1 - I_{1-x}(b, a)
    (0.5, 5.0, 0.9, 0.9999974294103009),
    (5.0, 0.5, 0.3, 0.0006913033857629756),
    (50.0, 60.0, 0.45, 0.4642352914306031),  # many terms of the fraction
    (50.0, 60.0, 0.5, 0.8309072939016693),
    (1.5, 0.5, 0.75, 0.3910022189557705),
    (5.0, 60.0, 0.6, 1.0),
    (500.0, 600.0, 0.01, 0.0),
])
def test_betainc_matches_scipy(a, b, x, want):
    assert betainc(a, b, x) == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_betainc_ends():
    for a, b in ((2.0, 3.0), (0.5, 0.5)):
        assert betainc(a, b, 0.0) == 0.0 and betainc(a, b, -0.5) == 0.0
        assert betainc(a, b, 1.0) == 1.0 and betainc(a, b, 1.5) == 1.0


@pytest.mark.parametrize("t, df, want", [  # scipy.stats.t.cdf(t, df)
    (1.5, 3, 0.8847080673775886),
    (-2.0, 7, 0.042809664281488025),
    (0.5, 2, 0.6666666666666666),
    (-0.5, 2, 0.33333333333333337),
    (3.0, 1.5, 0.9332261228725434),
    (0.9, 10, 0.8053603689969587),
    (0.0, 4, 0.5),
])
def test_t_cdf_matches_scipy(t, df, want):
    assert t_cdf(t, df) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("p, df, want", [  # scipy.stats.t.ppf(p, df)
    (0.975, 1, 12.706204736174694),
    (0.975, 3, 3.1824463052837078),
    (0.8, 5, 0.9195437802408271),
    (0.6, 5, 0.2671808657041451),  # below 1: the bracket starts at [0, 1]
    (0.025, 4, -2.7764451051977943),  # lower half: minus the upper quantile
    (0.1, 30, -1.3104150253913955),
    (0.999999, 2, 707.1057205157672),  # far tail: the bracket doubles ten times
    (0.975, 5.5, 2.501858617589239),  # Welch's degrees of freedom are not integers
])
def test_t_quantile_matches_scipy(p, df, want):
    assert t_quantile(p, df) == pytest.approx(want, rel=1e-10)


def test_t_quantile_median_and_bad_p():
    assert t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-11)
    for p in (0.0, 1.0, -0.1, 1.5, 2.0):
        with pytest.raises(ValueError, match=r"^p must be in \(0, 1\)$"):
            t_quantile(p, 3)


def _polyfit(points):
    """Slope, intercept and the slope's standard error of log y on log x, by numpy."""
    lx = np.log([p[0] for p in points])
    ly = np.log([p[1] for p in points])
    slope, icpt = np.polyfit(lx, ly, 1)
    resid = ly - (icpt + slope * lx)
    se = math.sqrt((resid @ resid) / (len(lx) - 2) / ((lx - lx.mean()) @ (lx - lx.mean())))
    return slope, icpt, se


NOISY = [(x, 3.0 * x ** -0.5 * (1 + e), s) for s, (x, e) in enumerate(
    [(4, 0.05), (8, -0.03), (16, 0.02), (32, -0.04), (4, -0.02), (8, 0.06), (16, -0.05),
     (32, 0.01), (0.5, 0.03), (0.5, -0.01)])]
NOISY = [(x, y, s % 5) for x, y, s in NOISY]  # five seeds


def test_loglog_fit_matches_least_squares():
    fit = loglog_fit(NOISY)
    slope, icpt, se = _polyfit(NOISY)
    assert fit["slope"] == pytest.approx(slope, rel=1e-12)
    assert fit["intercept"] == pytest.approx(icpt, rel=1e-12)
    assert fit["slope_se"] == pytest.approx(se, rel=1e-12)
    half = t_quantile(0.975, len(NOISY) - 2) * se
    assert fit["ci95_t"] == pytest.approx([slope - half, slope + half], rel=1e-12)
    assert fit["n_points"] == 10 and fit["n_dropped"] == 0 and fit["n_seeds"] == 5
    exact = loglog_fit([(x, 5.0 * x ** -0.5, 0) for x in (4, 8, 16)])
    assert exact["slope"] == pytest.approx(-0.5) and exact["intercept"] == pytest.approx(
        math.log(5.0))
    assert exact["slope_se"] == pytest.approx(0.0, abs=1e-12)


def test_loglog_fit_drops_what_has_no_logarithm():
    good = [(0.5, 0.5, 0), (2.0, 0.25, 0), (4.0, 2.0, 1)]  # values below 1 are kept
    bad = [(0.0, 1.0, 0), (-1.0, 1.0, 0), (2.0, 0.0, 0), (2.0, -1.0, 1), (2.0, None, 1),
           (2.0, NAN, 1), (2.0, math.inf, 1)]
    fit = loglog_fit(good + bad)
    assert fit["n_points"] == 3 and fit["n_dropped"] == 7
    assert fit["slope"] == pytest.approx(_polyfit(good)[0], rel=1e-12)


def test_loglog_fit_too_few_points():
    one_x = loglog_fit([(4.0, 1.0, 0), (4.0, 2.0, 1), (0.0, 1.0, 2)])
    assert one_x["n_points"] == 2 and one_x["n_dropped"] == 1 and one_x["n_seeds"] == 2
    for key in ("slope", "intercept"):
        assert math.isnan(one_x[key]), key
    for key in ("ci95_t", "ci95_boot"):
        assert len(one_x[key]) == 2 and all(math.isnan(v) for v in one_x[key]), key
    # two points: a slope and an intercept, no residual degree of freedom for an interval
    two = loglog_fit([(1.0, 1.0, 0), (math.e, math.e ** 2, 1)])
    assert two["slope"] == pytest.approx(2.0) and two["intercept"] == pytest.approx(0.0)
    assert math.isnan(two["slope_se"]) and all(math.isnan(v) for v in two["ci95_t"])
    three = loglog_fit([(1.0, 1.0, 0), (2.0, 4.2, 0), (4.0, 15.0, 0)])
    assert all(math.isfinite(v) for v in three["ci95_t"])  # n = 3: one degree of freedom
    assert all(math.isnan(v) for v in three["ci95_boot"]) and three["n_seeds"] == 1


def _bootstrap(points, n_boot, seed):
    """The seed bootstrap from its definition: resample whole seeds, refit, 2.5/97.5% order
    statistics of the finite slopes."""
    seeds = sorted({s for *_, s in points})
    rng = random.Random(seed)
    slopes = []
    for _ in range(n_boot):
        pick = [p for s in rng.choices(seeds, k=len(seeds)) for p in points if p[2] == s]
        lx = [math.log(p[0]) for p in pick]
        if len(set(lx)) < 2:
            continue  # one x only: no slope
        slopes.append(float(np.polyfit(lx, [math.log(p[1]) for p in pick], 1)[0]))
    slopes.sort()
    return [slopes[int(0.025 * (len(slopes) - 1))], slopes[int(0.975 * (len(slopes) - 1))]]


def test_bootstrap_interval_over_seeds():
    fit = loglog_fit(NOISY, n_boot=300)
    assert fit["ci95_boot"] == pytest.approx(_bootstrap(NOISY, 300, 0), rel=1e-9)
    lo, hi = fit["ci95_boot"]
    assert lo < fit["slope"] < hi
    assert loglog_fit(NOISY, n_boot=300, seed=0)["ci95_boot"] == fit["ci95_boot"]
    other = loglog_fit(NOISY, n_boot=300, seed=5)["ci95_boot"]
    assert other != fit["ci95_boot"]
    assert other == pytest.approx(_bootstrap(NOISY, 300, 5), rel=1e-9)
    # seeds whose points sit at one x alone: a resample of only such seeds has no slope and is
    # left out; two seeds are enough to bootstrap
    split = [(1.0, 2.0, 0), (1.0, 2.2, 0), (3.0, 5.0, 1), (3.0, 4.0, 1)]
    boot = loglog_fit(split, n_boot=200, seed=1)["ci95_boot"]
    assert boot == pytest.approx(_bootstrap(split, 200, 1), rel=1e-9)
    assert all(math.isnan(v) for v in loglog_fit(split, n_boot=0)["ci95_boot"])  # none drawn


def test_mean_ci():
    vals = [1.0, 2.0, 4.0, 7.0]
    sd = math.sqrt(sum((v - 3.5) ** 2 for v in vals) / 3)
    half = t_quantile(0.975, 3) * sd / 2
    ci = mean_ci(vals + [None, NAN, math.inf])
    assert ci["mean"] == 3.5 and ci["n"] == 4
    assert ci["ci95"] == pytest.approx([3.5 - half, 3.5 + half], rel=1e-12)
    one = mean_ci([2.5, NAN])
    assert one["mean"] == 2.5 and one["n"] == 1 and all(math.isnan(v) for v in one["ci95"])
    none = mean_ci([None, NAN])
    assert none["n"] == 0 and math.isnan(none["mean"]) and all(math.isnan(v) for v in
                                                                  none["ci95"])
    assert mean_ci([])["n"] == 0
    two = mean_ci([1.0, 3.0])
    assert two["ci95"] == pytest.approx([2.0 - 12.706204736174694, 2.0 + 12.706204736174694],
                                        rel=1e-10)


@pytest.mark.parametrize("a, b, diff, low, high", [  # scipy.stats.ttest_ind(equal_var=False)
    ([1.0, 5.0], [2.0, 2.1, 2.2, 2.05, 2.15, 2.12], 0.8966666666666665, -24.49308961563588,
     26.286422948969218),  # df = 1.0004: one side of two values carries all the variance
    ([1.0, 2.0, 4.0], [3.0, 7.0], -2.6666666666666665, -17.21400919424841, 11.880675860915074),
])
def test_welch_ci_matches_scipy(a, b, diff, low, high):
    w = welch_ci(a, b)
    assert w["diff"] == pytest.approx(diff, rel=1e-12)
    assert w["ci95"] == pytest.approx([low, high], rel=1e-9)
    assert w["n"] == len(a) + len(b)


def test_welch_ci_without_spread():
    w = welch_ci([2.0, 2.0, 2.0], [1.0, 1.0])
    assert w["diff"] == 1.0 and w["ci95"] == [1.0, 1.0]
    single = welch_ci([1.0], [2.0, 3.0])
    assert single["diff"] == -1.5 and all(math.isnan(v) for v in single["ci95"])


# ten seeds, each with points at two depths: every resample has a slope, and resamples rarely tie
TEN = [(x, 2.0 * x ** -0.5 * (1 + 0.05 * math.sin(7 * s + x)), s)
       for s in range(10) for x in (4.0, 16.0)]


@pytest.mark.parametrize("n_boot", [39, 41, 2000])
def test_bootstrap_order_statistics(n_boot):
    # 39 and 41 resamples put 0.025 (n - 1) and 0.975 (n - 1) on either side of an integer,
    # so an index off by one shows; 2000 is the default
    kw = {} if n_boot == 2000 else {"n_boot": n_boot}
    assert loglog_fit(TEN, **kw)["ci95_boot"] == pytest.approx(_bootstrap(TEN, n_boot, 0),
                                                               rel=1e-9)
