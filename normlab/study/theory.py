"""The theory claims (C1, C4, C5, C7, C8): each first calibrated in its source's own setting, then
traced rung by rung to normlab's block (`normlab.study.ladders`). docs/study.md quotes each source,
states its setting and derives each prediction at the depths measured.

How a prediction is derived from its source (fixed before any run):
- a **bound** is a band whose edges are the bounds (Lemma 2: `0.5d <= increment <= 1.5d`);
- an **equality** the source derives (Post-LN's `E||x||^2 = 3d/2`; the FFN-only block's exact
  `d/2` per block) is a band of +- half the smallest difference the source itself separates;
- an **order of growth** becomes the log-log slope it takes over the measured range; laws are
  told apart by the nearest one (the band of each law reaches halfway to its neighbours);
- an **upper bound** is tested through the quantity its mechanism predicts (Theorem 1's final-norm
  Jacobian, `sqrt(d)/||x_L||`);
- a **direction** the source states without a size is decided at 0 and its size reported; where
  the claim means a factor, at that factor.

A claim whose calibration fails is "calibration failed", with its numbers, and gets no verdict on
normlab's block: our reading of the source or our instrument is wrong there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from normlab.probe.fits import loglog_fit, mean_ci
from normlab.study.claims import SCALE, _rel, make_claim, slope_over_depth
from normlab.study.experiments import StudyContext
from normlab.study.figures import plot_ladder
from normlab.study.ladder_runs import init_ladder, update_ladder
from normlab.study.ladders import Rung, fairseq_ladder, with_depth_rung, xiong_ladder
from normlab.study.schema import ClaimResult
from normlab.study.verdict import Prediction, combine, predict_band, predict_direction

# Half the smallest per-block difference Lemma 2 separates: Pre-LN adds at least d/2 per block,
# Post-LN's norm input stays at 3d/2, so agreement with an equality is judged to within d/4.
LEMMA2_RESOLUTION = 0.25
# Half the gap between Theorem 1's two exponents (post 0, pre -1/2).
THEOREM1_RESOLUTION = 0.25
# Xiong et al.'s Fig. 3 is a 6-layer model.
FIG3_DEPTH = 6
# DeepNet's "explodes": at least a factor 2 (docs/reference.md, C7).
DEEPNET_FACTOR = math.log(2)
# DeepNet and Xiong train at this peak lr.
SOURCE_LR = 5e-4
CACHE_VERSION = "v3"
DEEPNET_CACHE = "v4"

Rows = list[dict[str, Any]]


# -- per-seed quantities ---------------------------------------------------------------------------

def _by_seed(rows: Rows) -> dict[int, Rows]:
    out: dict[int, Rows] = {}
    for r in rows:
        out.setdefault(r["seed"], []).append(r)
    return dict(sorted(out.items()))


def _at_depth(rows: Rows, depth: int | None = None) -> list[dict[str, Any]]:
    """Per seed, the stats of the model at `depth` (the deepest when None)."""
    out = []
    for mine in _by_seed(rows).values():
        L = max(r["n_blocks"] for r in mine) if depth is None else depth
        out.append(next(r for r in mine if r["n_blocks"] == L))
    return out


def _slopes(rows: Rows, value: Callable[[dict[str, Any]], float], x: Callable[[int], float]
            = float) -> list[float]:
    """Per seed, the log-log slope of `value(row)` against `x(n_blocks)` over the depths."""
    out = []
    for seed, mine in _by_seed(rows).items():
        pts = [(x(r["n_blocks"]), value(r), seed) for r in mine]
        out.append(loglog_fit(pts, n_boot=0)["slope"])
    return out


def per_block_increment(stats: dict[str, Any]) -> float:
    """(E||x_L||^2 - E||x_0||^2) / (L d): Lemma 2's per-block growth in units of d."""
    s = stats["summary"]
    return (stats["per_block"]["sq_norm"][-1] - s["embed_sq"]) / (s["n_blocks"] * s["d_model"])


def norm_input_over_d(stats: dict[str, Any]) -> float:
    """Mean over blocks of E||x + MLP(x)||^2 / d: Post-LN's norm input (Lemma 2: 3/2)."""
    v = stats["per_block"]["mlp_norm_input_sq"]
    return sum(v) / len(v) / stats["summary"]["d_model"]


def growth_exponent_sq(stats: dict[str, Any]) -> float:
    """Log-log slope of E||x_l||^2 - E||x_0||^2 against l = 1..L (reported, not tested)."""
    e0 = stats["summary"]["embed_sq"]
    pts = [(i + 1, v - e0, 0) for i, v in enumerate(stats["per_block"]["sq_norm"]) if v > e0]
    return loglog_fit(pts, n_boot=0)["slope"] if len(pts) >= 2 else math.nan


def gradient_trend(stats: dict[str, Any]) -> float:
    """Slope of log ||grad W^2|| of each block against relative depth l/(L-1)."""
    return slope_over_depth([math.log(max(v, 1e-30)) for v in stats["per_block"]["fc_out_grad"]])


def log_law_slope(ns: Sequence[float]) -> float:
    """The log-log slope that `y = ln n` takes over `ns` (an O(log n) law at zero offset)."""
    return loglog_fit([(n, math.log(n), 0) for n in ns], n_boot=0)["slope"]


def nearest_law_bands(s_log: float) -> dict[str, tuple[float, float]]:
    """Slope bands of O(1), O(log n), O(n) over a range where ln n has log-log slope `s_log`:
    each law's band holds the slopes nearer to its own (0, s_log, 1) than to a neighbour's."""
    lo, hi = s_log / 2, (1 + s_log) / 2
    return {"O(1)": (-lo, lo), "O(log n)": (lo, hi), "O(n)": (hi, 2 - hi)}


# -- the ladder table ----------------------------------------------------------------------------

def ladder_row(rung: Rung, preds: Sequence[Prediction]) -> dict[str, Any]:
    return {"rung": rung.label, "key": rung.key, "change": rung.change,
            "calibration": rung.calibration, "verdict": combine(preds),
            "predictions": [p.to_dict() for p in preds]}


def calibration_status(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The calibration rungs' verdicts in one word: `passed` (every source rung supported),
    `passed (<rungs>)` (some supported: the readings that hold), `failed` (none supported and one
    contradicted: our reading or the instrument is wrong), `inconclusive` (none decided)."""
    cal = [r for r in rows if r["calibration"]]
    held = [r["rung"] for r in cal if r["verdict"] == "supported"]
    contradicted = [r["rung"] for r in cal if r["verdict"] == "not supported"]
    if held and len(held) == len(cal):
        status = "passed"
    elif held:
        status = "passed (" + "; ".join(held) + ")"
    elif contradicted:
        status = "failed"
    else:
        status = "inconclusive"
    return {"status": status, "held": held, "contradicted": contradicted,
            "rungs": [r["rung"] for r in cal]}


def departure(rows: Sequence[dict[str, Any]]) -> str:
    """Where each prediction first stops holding along the ladder (its first "not supported"
    rung after a source rung that holds), in words; "" when no source rung holds."""
    start = next((i for i, r in enumerate(rows) if r["calibration"]
                  and r["verdict"] == "supported"), None)
    if start is None:
        return ""
    parts, holds = [], []
    subjects = [p["subject"] for p in rows[start]["predictions"]]
    for subject in subjects:
        at = next((r for r in rows[start + 1:] for p in r["predictions"]
                   if p["subject"] == subject and p["verdict"] == "not supported"), None)
        if at is None:
            holds.append(subject)
        else:
            parts.append(f"{subject} departs when {at['change']} ({at['rung']})")
    if holds:
        parts.append(f"{', '.join(holds)}: contradicted on no rung")
    return "; ".join(parts)


def ladder_claim(ctx: StudyContext, cid: str, title: str, statement: str, source: str,
                 method: str, rungs: Sequence[Rung],
                 predict: Callable[[Rung], list[Prediction]], paper: str,
                 numbers: dict[str, Any], figures: list[str], quantities: dict[str, str],
                 caveat: str = SCALE) -> ClaimResult:
    """The claim's result: calibration, the ladder, and the verdict on normlab's block (the last
    rung) only when the calibration passed."""
    per_rung = [predict(rung) for rung in rungs]
    rows = [ladder_row(rung, preds) for rung, preds in zip(rungs, per_rung, strict=True)]
    cal = calibration_status(rows)
    result = make_claim(cid, title, statement, source, method, per_rung[-1], paper, numbers,
                        figures, caveat=caveat)
    result.ladder = rows
    where = departure(rows)
    source_verdicts = "; ".join(f"{r['rung']}: {r['verdict']}" for r in rows if r["calibration"])
    if cal["status"] == "failed":
        result.verdict = "calibration failed"
        result.note = (f"Calibration failed: in the source's own setting ({source_verdicts}) "
                       "the prediction does not hold, so either our reading of the source or "
                       "the instrument is wrong there, and no verdict is given on normlab's "
                       "block.")
    elif cal["status"] == "inconclusive":
        result.verdict = "inconclusive"
        result.note = (f"Calibration inconclusive: in the source's own setting "
                       f"({source_verdicts}) the prediction could not be confirmed at this "
                       "size (see each rung's power), so normlab's block is not judged.")
    else:
        result.note = (f"Calibration {cal['status']}: the prediction holds in the source's "
                       f"setting; {where}.")
    result.calibration, result.departure = cal["status"], where
    fig = plot_ladder(rows, ctx.fig_dir / f"{cid.lower()}_ladder.svg", quantities,
                      title=f"{cid}: source setting to normlab's block")
    result.figures = _rel(ctx, fig) + list(figures)
    return result


# -- C1: Lemma 2 ---------------------------------------------------------------------------------

def xiong_sweep(ctx: StudyContext) -> tuple[list[Rung], dict[str, Any]]:
    p = ctx.profile
    rungs = xiong_ladder(p.width, p.heads)
    depths = sorted(set(p.init_depths) | {FIG3_DEPTH})
    data = init_ladder(ctx, f"ladder_xiong_{CACHE_VERSION}", rungs, ["pre", "post"], depths)
    return rungs, data


def c1(ctx: StudyContext) -> ClaimResult:
    rungs, data = xiong_sweep(ctx)
    L = max(ctx.profile.init_depths)

    def at_deepest(rung: Rung, placement: str) -> list[dict[str, Any]]:
        rows = [r for r in data[rung.key][placement] if r["n_blocks"] <= L]
        return [r["stats"] for r in _at_depth(rows)]

    def predict(rung: Rung) -> list[Prediction]:
        pre = [per_block_increment(s) for s in at_deepest(rung, "pre")]
        post = [norm_input_over_d(s) for s in at_deepest(rung, "post")]
        if rung.key == "source_a":  # no attention: each ReLU FFN adds exactly d/2 (Lemma 1)
            pre_pred = predict_band(
                "pre", "per-block increment of E||x_l||^2, in units of d",
                "Lemma 2 read without attention: each ReLU FFN of width d adds E||ReLU(z)||^2 "
                "= d/2 (Lemma 1), so E||x_l||^2 = (1 + l/2)d: the lower bound, attained",
                pre, 0.5 - LEMMA2_RESOLUTION, 0.5 + LEMMA2_RESOLUTION)
        else:
            pre_pred = predict_band(
                "pre", "per-block increment of E||x_l||^2, in units of d",
                "Lemma 2: (1 + l/2)d <= E||x_l||^2 <= (1 + 3l/2)d, so each block adds between "
                "0.5d and 1.5d (bounds, not a law)", pre, 0.5, 1.5)
        post_pred = predict_band(
            "post", "E||x + FFN(x)||^2 / d at Post-LN's FFN norm input (mean over blocks)",
            "Lemma 2: E||x^post||^2 = 3d/2 at every layer", post,
            1.5 - LEMMA2_RESOLUTION, 1.5 + LEMMA2_RESOLUTION)
        return [pre_pred, post_pred]

    exponents = {r.label: mean_ci([growth_exponent_sq(s) for s in at_deepest(r, "pre")])
                 for r in rungs}
    allowed = [1 - math.log(3) / math.log(L), 1 + math.log(3) / math.log(L)]
    numbers = {"growth_exponent_of_E_x_sq_at_init": exponents,
               "exponent_range_the_bounds_allow": allowed}
    return ladder_claim(
        ctx, "C1", "Pre-Norm's stream grows with depth; Post-Norm's stays constant",
        "Xiong et al.'s Lemma 2: at init, for Pre-LN, (1 + l/2)d <= E||x_l||^2 <= (1 + 3l/2)d; "
        "for Post-LN, E||x^post_l||^2 = 3d/2. Curse of Depth: trained models grow faster.",
        "Xiong et al. 2020 (2002.04745), Sec. 3.3, Lemma 2 (setting: Xavier N(0, 1/d), "
        "x_0 ~ N(0, I_d), a ReLU FFN of width d, and in one reading a single head with "
        "W^Q = W^K = 0); Sun et al. 2025 (2502.05795)",
        f"At init, deepest model (L = {L}), per seed: Pre-LN's per-block increment "
        "(E||x_L||^2 - E||x_0||^2) / (L d), tested against the lemma's bounds 0.5-1.5; Post-LN's "
        "FFN norm input E||x + FFN(x)||^2 / d against 3/2 +- 0.25. Calibrated in both readings "
        "of the lemma's block, then one change per rung to normlab's block.",
        rungs, predict,
        "Xiong Lemma 2: per block E||x_l||^2 grows by 0.5d to 1.5d under Pre-LN; 3d/2 at "
        "Post-LN's norm. Curse of Depth: the last layer's variance ~175 in a trained 130M model.",
        numbers, [], {"pre": "pre: increment / d", "post": "post: norm input / d"},
        caveat=SCALE + " The squared-norm growth exponent is reported only: bounds that differ "
                       f"by a factor 3 allow any exponent in [{allowed[0]:.2f}, "
                       f"{allowed[1]:.2f}] at L = {L}.")


# -- C4: Theorem 1 -------------------------------------------------------------------------------

def c4(ctx: StudyContext) -> ClaimResult:
    rungs, data = xiong_sweep(ctx)
    depths = list(ctx.profile.init_depths)

    def rows(rung: Rung, placement: str) -> Rows:
        return [r for r in data[rung.key][placement] if r["n_blocks"] in depths]

    def grad(r: dict[str, Any]) -> float:
        return r["stats"]["summary"]["last_fc_out_grad"]

    def stream_sq(r: dict[str, Any]) -> float:
        return r["stats"]["summary"]["final_in_sq"]

    def predict(rung: Rung) -> list[Prediction]:
        s_pre, s_post = _slopes(rows(rung, "pre"), grad), _slopes(rows(rung, "post"), grad)
        s_norm = _slopes(rows(rung, "pre"), stream_sq)
        mechanism = [a + 0.5 * b for a, b in zip(s_pre, s_norm, strict=True)]
        return [
            predict_band("post", "log-log slope of ||grad W^2_L|| against L",
                         "Theorem 1: O(d sqrt(ln d)), independent of L (slope 0)", s_post,
                         -THEOREM1_RESOLUTION, THEOREM1_RESOLUTION),
            predict_band("pre", "slope of ||grad W^2_L|| + 1/2 slope of E||x_L||^2 against L",
                         "Theorem 1's mechanism: the final norm's Jacobian sqrt(d)/||x_L|| makes "
                         "pre's slope -1/2 that of E||x_L||^2 (-0.5 as L grows)", mechanism,
                         -THEOREM1_RESOLUTION, THEOREM1_RESOLUTION),
            predict_direction("pre vs post", "slope(pre) - slope(post)",
                              "Theorem 1: pre's bound falls with L like L^-1/2, post's does not",
                              [a - b for a, b in zip(s_pre, s_post, strict=True)], "<", 0.0,
                              THEOREM1_RESOLUTION),
        ]

    slopes = {r.label: {"pre": mean_ci(_slopes(rows(r, "pre"), grad)),
                        "post": mean_ci(_slopes(rows(r, "post"), grad)),
                        "pre E||x_L||^2": mean_ci(_slopes(rows(r, "pre"), stream_sq))}
              for r in rungs}
    return ladder_claim(
        ctx, "C4", "Xiong Theorem 1: the last layer's gradient vs depth",
        "Theorem 1 (upper bounds at init): Post-LN's gradient of the last FFN weight is "
        "O(d sqrt(ln d)), independent of L; Pre-LN's is O(d sqrt(ln d / L)).",
        "Xiong et al. 2020 (2002.04745), Sec. 3.3, Theorem 1 (Lemma 2's setting, with fairseq's "
        "embedding and an untied output projection: logits of order 1)",
        f"Frobenius norm of the gradient of the last block's W^2 at init over depths {depths}; "
        "per seed, log-log slopes against L. Post: 0 +- 0.25 (half the gap between the "
        "theorem's exponents). Pre: the bound's mechanism predicts -1/2 the slope of "
        "E||x_L||^2 measured on the same models, tested to +- 0.25. Pre vs post: pre's slope "
        "below post's.",
        rungs, predict, "Xiong Theorem 1: post flat in L, pre falls like 1/sqrt(L).",
        {"slopes": slopes}, [],
        {"post": "post: slope", "pre": "pre: slope + slope(E||x_L||^2)/2",
         "pre vs post": "slope(pre) - slope(post)"})


# -- C5: Fig. 3 ----------------------------------------------------------------------------------

def c5(ctx: StudyContext) -> ClaimResult:
    base, data = xiong_sweep(ctx)
    deepest = max(ctx.profile.init_depths)
    rungs = with_depth_rung(base, FIG3_DEPTH, deepest)

    def trends(rung: Rung, placement: str) -> list[float]:
        depth = FIG3_DEPTH if rung.depth == "source" else deepest
        return [gradient_trend(r["stats"])
                for r in _at_depth(data[rung.data_key][placement], depth)]

    def predict(rung: Rung) -> list[Prediction]:
        post, pre = trends(rung, "post"), trends(rung, "pre")
        return [
            predict_direction("post", "trend of log ||grad W^2|| over relative depth",
                              "Fig. 3: 'the scale of the expected gradients grows along with "
                              "the layer index for the Post-LN Transformer'", post, ">", 0.0,
                              0.0),
            predict_direction("post vs pre", "trend(post) - trend(pre)",
                              "Fig. 3: 'the scale almost keeps the same for different layers in "
                              "the Pre-LN Transformer'", [a - b for a, b in
                                                          zip(post, pre, strict=True)],
                              ">", 0.0, 0.0),
        ]

    numbers = {"pre_trend": {r.label: mean_ci(trends(r, "pre")) for r in rungs},
               "post_trend": {r.label: mean_ci(trends(r, "post")) for r in rungs}}
    return ladder_claim(
        ctx, "C5", "Per-layer gradients at init: Post grows toward the output, Pre is flat",
        "At init the gradient norm of the FFN sublayers grows with the layer index under "
        "Post-LN and almost keeps the same under Pre-LN.",
        "Xiong et al. 2020 (2002.04745), Sec. 3.4 and Fig. 3 (a 6-layer model at init)",
        f"Gradient norm of each block's W^2 at init in {FIG3_DEPTH}-block models (the "
        "figure's depth); trend = slope of log gradient norm against relative depth l/(L-1), "
        "per seed. Post's trend > 0 and post's trend above pre's, each decided at 0 (the "
        f"figure gives no size). The last rung moves to {deepest} blocks.",
        rungs, predict, "Xiong Fig. 3 (6 layers, at init): post's gradient norm rises toward "
        "the top layers; pre's stays about level.", numbers, [],
        {"post": "post: trend", "post vs pre": "trend(post) - trend(pre)"})


# -- C8: Admin -----------------------------------------------------------------------------------

def c8(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    rungs = fairseq_ladder(p.width, p.heads)
    depths = list(p.init_depths)
    placements = ["post", "pre", "admin", "admin_o1"]
    data = init_ladder(ctx, f"ladder_admin_{CACHE_VERSION}", rungs, placements, depths,
                       perturb=True, stats=False)
    s_log = log_law_slope([2 * L for L in depths])
    bands = nearest_law_bands(s_log)

    def slopes(rung: Rung, placement: str) -> list[float]:
        return _slopes(data[rung.key][placement], lambda r: r["perturb_change"],
                       lambda L: 2.0 * L)

    def law(subject: str, values: list[float], name: str, paper: str) -> Prediction:
        lo, hi = (round(v, 3) for v in bands[name])
        return predict_band(subject, "log-log slope of E||f(x; w) - f(x; w + delta)||^2 "
                            "against n = 2L residual sublayers", paper, values, lo, hi)

    def predict(rung: Rung) -> list[Prediction]:
        post, pre = slopes(rung, "post"), slopes(rung, "pre")
        return [
            law("post", post, "O(n)", "Admin: O(n) for Post-LN"),
            law("pre", pre, "O(log n)", "Admin: O(log n) for Pre-LN"),
            law("admin", slopes(rung, "admin"), "O(log n)",
                "admin-torch's default omega^2 = (n+1)/ln(n+1) - 1: O(log n), like Pre-LN"),
            law("admin O(1)", slopes(rung, "admin_o1"), "O(1)",
                "admin-torch's O(1) setting, omega^2 = n: bounded"),
            predict_direction("post vs pre", "slope(post) - slope(pre)",
                              "Admin: Post-LN's output change grows faster than Pre-LN's",
                              [a - b for a, b in zip(post, pre, strict=True)], ">", 0.0, 0.0),
        ]

    numbers = {"slope_of_ln_n_over_these_depths": s_log,
               "law_bands": {k: list(v) for k, v in bands.items()},
               "slopes": {r.label: {pl: mean_ci(slopes(r, pl)) for pl in placements}
                          for r in rungs}}
    return ladder_claim(
        ctx, "C8", "Admin: output sensitivity to weight perturbation grows with depth",
        "E||f(x; w) - f(x; w + delta)||^2 at init grows like O(n) for Post-LN and O(log n) for "
        "Pre-LN (n residual sublayers); Admin's omega sets it: admin-torch's default targets "
        "O(log n), its O(1) setting (omega^2 = n) keeps it bounded.",
        "Liu et al. 2020, Admin (2004.08249), Sec. 4; admin-torch's calculate_init "
        "(output_change_scale O(n), O(logn) default, O(1))",
        "Squared output change under a small random relative weight perturbation at init, "
        f"depths {depths} (n = 2L = {[2 * L for L in depths]}); per seed, the log-log slope "
        f"against n. Over this range ln n has slope {s_log:.3f}, so the laws' slopes are 0, "
        f"{s_log:.3f} and 1, each tested as the band of slopes nearer to it than to a "
        "neighbour.",
        rungs, predict, "Admin Fig. 5 (6-18 layers): post's output change grows with depth, "
        "pre's slowly, Admin's stays small.", numbers, [],
        {"post": "post: slope", "pre": "pre: slope", "admin": "admin: slope",
         "admin O(1)": "admin O(1): slope"})


# -- C7: DeepNet ---------------------------------------------------------------------------------

def c6_failing_lr(ctx: StudyContext) -> tuple[float, str]:
    """The smallest lr of C6's shared grid at which Post-LN without warmup failed (stalled or
    diverged, any seed); the grid's largest lr, said so, when it never failed."""
    lrs = sorted(ctx.profile.lrs)
    runs = ctx.runs("post", lrs, 0)
    for lr in lrs:
        if any(r["failed"] for r in runs[lr]):
            outcomes = ", ".join(sorted({r["outcome"] for r in runs[lr]}))
            return lr, ("the smallest lr of C6's grid at which post without warmup failed "
                        f"({outcomes})")
    return lrs[-1], "post without warmup failed at no lr of C6's grid: its largest lr"


def c7(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    lr, lr_why = c6_failing_lr(ctx)
    base = fairseq_ladder(p.width, p.heads)[:-1]  # post's own init is the source's Xavier
    source = base[0]
    at_lr = Rung("lr", f"lr {lr:g}", f"lr {lr:g} ({lr_why}) instead of {SOURCE_LR:g}",
                 source.fields)
    rungs = [source, at_lr, *base[1:]]
    lrs = [(source, SOURCE_LR)] + [(r, lr) for r in rungs[1:]]
    depths = sorted({L for L in p.init_depths if p.update_blocks >= L} | {p.update_blocks})
    data = update_ladder(ctx, f"ladder_deepnet_{DEEPNET_CACHE}", lrs, depths, steps=1,
                         warmup=p.update_steps)

    def first(rung: Rung, label: str, depth: int | None = None) -> Rows:
        rows = data[rung.key]["series"][label]
        return rows if depth is None else [r for r in rows if r["n_blocks"] == depth]

    def step1(rows: Rows) -> list[float]:
        return [r["update"][1] for r in sorted(rows, key=lambda r: r["seed"])]

    def unsaturated_depth(rung: Rung) -> int | None:
        """The deepest depth at which post's first update stays below half the distance
        between two independent inits (the measure's saturation scale)."""
        ok = []
        for L in depths:
            upd = mean_ci(step1(first(rung, "post, no warmup", L)))["mean"]
            dist = mean_ci([d["distance"] for d in data[rung.key]["init_distance"]
                            if d["n_blocks"] == L])["mean"]
            if upd < 0.5 * dist:
                ok.append(L)
        return max(ok) if ok else None

    def predict(rung: Rung) -> list[Prediction]:
        L = unsaturated_depth(rung)
        post = step1(first(rung, "post, no warmup", L)) if L else []
        dn = step1(first(rung, "deepnorm, no warmup", L)) if L else []
        s_post = _slopes(first(rung, "post, no warmup"), lambda r: r["update"][1])
        s_dn = _slopes(first(rung, "deepnorm, no warmup"), lambda r: r["update"][1])
        return [
            predict_direction("post vs deepnorm",
                              "log(first update post / DeepNorm), no warmup, at the deepest "
                              "unsaturated depth",
                              "DeepNet: DeepNorm bounds the update that explodes under Post-LN",
                              _log_ratios(post, dn), ">", DEEPNET_FACTOR, DEEPNET_FACTOR),
            predict_direction("post: depth", "log-log slope of post's first update against L",
                              "DeepNet Theorem 4.2: Post-LN's update grows with depth",
                              s_post, ">", 0.0, 0.0),
            predict_direction("post vs deepnorm: depth", "slope(post) - slope(DeepNorm)",
                              "DeepNet Theorem 4.2: DeepNorm's update is bounded in depth",
                              [a - b for a, b in zip(s_post, s_dn, strict=True)], ">", 0.0, 0.0),
        ]

    saturation = {}
    for rung in rungs:
        dist = mean_ci([d["distance"] for d in data[rung.key]["init_distance"]
                        if d["n_blocks"] == p.update_blocks])
        upd = mean_ci(step1(first(rung, "post, no warmup", p.update_blocks)))
        saturation[rung.label] = {"first_update_post": upd, "init_distance": dist,
                                  "saturated": upd["mean"] > 0.5 * dist["mean"]}
    warm = {r.label: mean_ci(_log_ratios(step1(first(r, "post, no warmup", p.update_blocks)),
                                         step1(first(r, "post, warmup", p.update_blocks))))
            for r in rungs}
    pre_ratio = {r.label: mean_ci(_log_ratios(step1(first(r, "post, no warmup",
                                                          p.update_blocks)),
                                              step1(first(r, "pre, no warmup", p.update_blocks))))
                 for r in rungs}
    numbers = {"lr": {"source": SOURCE_LR, "C6": lr, "why": lr_why},
               "depth_of_the_ratios": {r.label: unsaturated_depth(r) for r in rungs},
               "saturation_at_the_first_step": saturation,
               "log_ratio_no_warmup_over_warmup": warm,
               "log_ratio_post_over_pre_no_warmup": pre_ratio}
    return ladder_claim(
        ctx, "C7", "DeepNet: Post-LN's early model update explodes without warmup",
        "Post-LN without warmup makes a large change of the model output at the very first "
        "steps; DeepNorm's update stays bounded, and Post-LN's grows with depth.",
        "Wang et al. 2022, DeepNet (2203.00555), Sec. 3 (Fig. 5) and Theorem 4.2",
        "||f(x; theta_1) - f(x; theta_0)|| after the first AdamW step (beta2 0.98). The ratio "
        "to DeepNorm (which must exceed a factor 2) is read before the measure saturates: at "
        "the deepest depth where post's first update stays below half the distance between "
        f"two independent inits; depths {depths} for the depth law (decided at 0). Post's "
        "ratio to Pre-LN is reported (DeepNet states none). Source rung at lr "
        f"{SOURCE_LR:g}; then "
        f"lr {lr:g}, {lr_why}. Warmup ({p.update_steps} steps) is reported: with it the first "
        "step is smaller by construction.",
        rungs, predict, "DeepNet Fig. 5 (18L-18L Post-LN, lr 5e-4): without warmup the "
        "update jumps early and the model diverges; with warmup or DeepNorm it grows smoothly.",
        numbers, [], {"post vs deepnorm": "log(post / DeepNorm)",
                      "post: depth": "post's depth slope",
                      "post vs deepnorm: depth": "slope(post) - slope(DeepNorm)"})


def _log_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return [math.log(x / y) if x > 0 and y > 0 else math.nan
            for x, y in zip(a, b, strict=True)]


THEORY_CLAIMS: dict[str, Callable[[StudyContext], ClaimResult]] = {
    "C1": c1, "C4": c4, "C5": c5, "C7": c7, "C8": c8,
}
