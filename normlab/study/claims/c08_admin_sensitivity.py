"""C8: Admin's output sensitivity to a weight perturbation at init, O(n) under Post-LN and
O(log n) under Pre-LN (Liu et al. 2020), calibrated in the fairseq setting and traced along the
fairseq ladder."""

from __future__ import annotations

from normlab.probe.fits import mean_ci
from normlab.study.claims.ladder import (
    CACHE_VERSION,
    _slopes,
    at_init_units,
    ladder_claim,
    log_law_slope,
    nearest_law_bands,
)
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import StudyContext, WorkPlan
from normlab.study.ladders import Rung, fairseq_ladder
from normlab.study.schema import ClaimResult
from normlab.study.verdict import Prediction

_LAW = "log-log slope of E||f(x; w) - f(x; w + delta)||^2 against n = 2L residual sublayers"
_BANDS = ("the band of slopes nearer to this law's than to a neighbour's, over the depths "
          "measured (ln n's log-log slope there)")

CLAIM = Claim(
    id="C8", title="Admin: output sensitivity to weight perturbation grows with depth",
    statement="E||f(x; w) - f(x; w + delta)||^2 at init grows like O(n) for Post-LN and "
              "O(log n) for Pre-LN (n residual sublayers); Admin's omega sets it: admin-torch's "
              "default targets O(log n), its O(1) setting (omega^2 = n) keeps it bounded.",
    source="Liu et al. 2020, Admin (2004.08249), Sec. 4; admin-torch's calculate_init "
           "(output_change_scale O(n), O(logn) default, O(1))",
    quote="for Post-LN, Var[F(x, W) - F(x, W*)] = O(N); for Pre-LN, O(log N) (Sec. 4)",
    setting="at initialization, the fairseq Transformer (Xavier, post's own init)",
    paper="Admin Fig. 5 (6-18 layers): post's output change grows with depth, pre's slowly, "
          "Admin's stays small.",
    ladder="fairseq",
    predictions=(
        PredictionSpec("post", _LAW, "Admin: O(n) for Post-LN, an order: at least linear",
                       Rule("order", ">", origin="O(n), one-sided: the slope lies above the "
                                                 "midpoint between ln n's slope over these "
                                                 "depths and 1 (nearer linear than "
                                                 "logarithmic); no upper edge"),
                       derivation="the same order on every rung"),
        PredictionSpec("pre", _LAW, "Admin: O(log n) for Pre-LN (Xavier-like branches)",
                       Rule("band", origin=_BANDS),
                       derivation="on the source rung only (fairseq's Xavier)"),
        PredictionSpec("pre (mechanism)", "slope of the output change - slope of Admin's sum "
                       "of branch variances over input variances, against n",
                       "Admin's mechanism: the output change follows sum_i Var[f_i] / Var[x_i], "
                       "each branch's energy over its input stream's",
                       Rule("band", origin="the mechanism's slope, +- half the slope of ln n "
                                           "over these depths (the resolution at which the "
                                           "laws are told apart)"),
                       derivation="off the source rung: the rung's own branch and input "
                                  "energies at init, through the taps"),
        PredictionSpec("admin", _LAW,
                       "admin-torch's default omega^2 = (n+1)/ln(n+1) - 1: O(log n), like "
                       "Pre-LN", Rule("band", origin=_BANDS), role="diagnostic",
                       derivation="the O(log n) band on every rung (normlab's Admin code, not "
                                  "the claim)"),
        PredictionSpec("admin O(1)", _LAW, "admin-torch's O(1) setting, omega^2 = n: bounded",
                       Rule("band", origin=_BANDS), role="diagnostic",
                       derivation="the O(1) band on every rung (normlab's Admin code)"),
        PredictionSpec("post vs pre", "slope(post) - slope(pre)",
                       "Admin: Post-LN's output change grows faster than Pre-LN's",
                       Rule("direction", ">", 0.0, origin="Admin gives no size: 0, the size "
                                                          "reported"),
                       derivation="the same contrast on every rung"),
    ),
)

# which law each banded subject is tested against
LAWS = {"pre": "O(log n)", "admin": "O(log n)", "admin O(1)": "O(1)"}


def admin_sum(stats: dict) -> float:
    """Admin's mechanism at init: sum over the residual sublayers of each branch's energy over
    the energy of the stream it reads, E||f_i||^2 / E||x_i||^2 (Liu et al. 2020, Sec. 4: the
    output change follows this sum; under Pre-LN with Xavier branches it grows like log n)."""
    pb = stats["per_block"]
    total = 0.0
    for k in ("attn", "mlp"):
        for branch, stream in zip(pb[f"{k}_branch_sq"], pb[f"{k}_in_sq"], strict=True):
            if stream > 0:
                total += branch / stream
    return total


def measure(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    rungs = fairseq_ladder(p.width, p.heads)
    depths = list(p.init_depths)
    placements = ["post", "pre", "admin", "admin_o1"]
    data = ctx.init_ladder(f"ladder_admin_{CACHE_VERSION}", rungs, placements, depths,
                       perturb=True, stats=True)
    s_log = log_law_slope([2 * L for L in depths])
    bands = nearest_law_bands(s_log)

    def slopes(rung: Rung, placement: str) -> list[float]:
        return _slopes(data[rung.key][placement], lambda r: r["perturb_change"],
                       lambda L: 2.0 * L)

    def law(subject: str, values: list[float]) -> Prediction:
        lo, hi = (round(v, 3) for v in bands[LAWS[subject]])
        return CLAIM.predict(subject, values, low=lo, high=hi)

    def mechanism(rung: Rung, placement: str) -> list[float]:
        return _slopes(data[rung.key][placement], lambda r: admin_sum(r["stats"]),
                       lambda L: 2.0 * L)

    def predict(rung: Rung) -> list[Prediction]:
        post, pre = slopes(rung, "post"), slopes(rung, "pre")
        order = round(bands["O(n)"][0], 3)
        if rung.calibration:
            pre_pred = law("pre", pre)
        else:
            mech = mechanism(rung, "pre")
            pre_pred = CLAIM.predict(
                "pre (mechanism)", [a - b for a, b in zip(pre, mech, strict=True)],
                subject="pre", low=-round(s_log / 2, 3), high=round(s_log / 2, 3),
                derivation="the rung's own sum of branch over input energies has slope "
                           f"{sum(mech) / max(1, len(mech)):+.3g} (mean over seeds)")
        return [
            CLAIM.predict("post", post, threshold=order), pre_pred,
            law("admin", slopes(rung, "admin")), law("admin O(1)", slopes(rung, "admin_o1")),
            CLAIM.predict("post vs pre", [a - b for a, b in zip(post, pre, strict=True)]),
        ]

    numbers = {"slope_of_ln_n_over_these_depths": s_log,
               "law_bands": {k: list(v) for k, v in bands.items()},
               "slopes": {r.label: {pl: mean_ci(slopes(r, pl)) for pl in placements}
                          for r in rungs},
               "mechanism_slopes": {r.label: {pl: mean_ci(mechanism(r, pl))
                                              for pl in placements} for r in rungs}}
    return ladder_claim(
        ctx, CLAIM,
        "Squared output change under a small random relative weight perturbation at init, "
        f"depths {depths} (n = 2L = {[2 * L for L in depths]}); per seed, the log-log slope "
        f"against n. Over this range ln n has slope {s_log:.3f}, so the laws' slopes are 0, "
        f"{s_log:.3f} and 1. Post's O(n) is an order: its slope above {bands['O(n)'][0]:.3f}, "
        "nearer linear than logarithmic, no upper edge. Pre's O(log n) holds under the source's "
        "Xavier branches; on every other rung pre's slope is tested against the slope of "
        "Admin's own sum of branch over input energies on that rung, to +- half ln n's slope. "
        "Admin's two settings test normlab's Admin code and are reported as diagnostics.",
        rungs, predict, numbers, [],
        {"post": "post: slope", "pre": "pre: slope", "admin": "admin: slope",
         "admin O(1)": "admin O(1): slope"})


def work(plan: WorkPlan) -> None:
    """Admin's ladder, for the time estimate: its cost per unit of size from the recorded quick
    study (docs/results/study_quick/log.txt: 36 s at 0.033 s a step, 270 units)."""
    plan.ladder(f"ladder_admin_{CACHE_VERSION}", 1090 / 270 * at_init_units(plan.profile))


CLAIM = CLAIM.bind(measure, work=work)
