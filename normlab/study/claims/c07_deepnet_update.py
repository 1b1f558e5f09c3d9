"""C7: DeepNet's account of Post-LN's instability: without warmup the first model update
explodes, DeepNorm bounds it, and Post-LN's grows with depth (Wang et al. 2022), calibrated at
the source's lr and traced along the fairseq ladder."""

from __future__ import annotations

import math
from collections.abc import Sequence

from normlab.probe.fits import mean_ci
from normlab.study.claims.ladder import Rows, _slopes, ladder_claim
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import StudyContext
from normlab.study.ladders import Rung, fairseq_ladder
from normlab.study.schema import ClaimResult
from normlab.study.verdict import Prediction

# The two laws DeepNet's analysis sets apart: Post-LN's update O(N), DeepNorm's O(1). On a
# log-log plot against depth their slopes are 1 and 0; a slope nearer 0 than 1 (below 1/2) is
# the bounded law's side.
LAW_MIDPOINT = 0.5
# DeepNet and Xiong train at this peak lr.
SOURCE_LR = 5e-4
DEEPNET_CACHE = "v4"

CLAIM = Claim(
    id="C7", title="DeepNet: Post-LN's early model update explodes without warmup",
    statement="Post-LN without warmup makes a large change of the model output at the very "
              "first steps; DeepNorm's update stays bounded, and Post-LN's grows with depth.",
    source="Wang et al. 2022, DeepNet (2203.00555), Sec. 3 (Fig. 5) and Theorem 4.2",
    quote="the instability of Post-LN Transformer ... comes from ... an exploding model update "
          "at the beginning of training (Sec. 3); DeepNorm bounds the model update by a "
          "constant (Theorem 4.2)",
    setting="an 18L-18L Post-LN encoder-decoder, Adam, lr 5e-4, the first steps of training",
    paper="DeepNet Fig. 5 (18L-18L Post-LN, lr 5e-4): without warmup the update jumps early and "
          "the model diverges; with warmup or DeepNorm it grows smoothly.",
    ladder="fairseq",
    trains=(("post", False),),  # the lr at which post without warmup fails (C6b's grid)
    predictions=(
        PredictionSpec(
            "post vs deepnorm",
            "log(first update post / DeepNorm), no warmup, at the deepest unsaturated depth",
            "DeepNet: DeepNorm bounds the update that explodes under Post-LN",
            Rule("direction", ">", 0.0, origin="DeepNet gives no factor: 0, the size reported")),
        PredictionSpec(
            "post: depth", "log-log slope of post's first update against L, over the depths "
            "where it has not saturated",
            "DeepNet Theorem 4.2: Post-LN's update grows with depth",
            Rule("order", ">", 0.0, origin="Theorem 4.2 gives an order, no size: grows, above "
                                           "0")),
        PredictionSpec(
            "deepnorm: depth", "log-log slope of DeepNorm's first update against L, over the "
            "depths where post's has not saturated",
            "DeepNet Theorem 4.2: DeepNorm's update is bounded in depth (O(1))",
            Rule("order", "<", LAW_MIDPOINT,
                 origin="Theorem 4.2's two laws, O(N) for Post-LN and O(1) for DeepNorm: "
                        "log-log slopes 1 and 0, bounded means nearer 0 (below 1/2)")),
        PredictionSpec(
            "post vs deepnorm: depth", "slope(post) - slope(DeepNorm), unsaturated depths",
            "DeepNet Theorem 4.2: Post-LN's update grows faster in depth than DeepNorm's",
            Rule("direction", ">", 0.0, origin="Theorem 4.2 gives an order, no size: 0")),
    ),
)


def c6_failing_lr(ctx: StudyContext) -> tuple[float, str]:
    """The smallest lr of C6's shared grid at which Post-LN without warmup failed (stalled or
    diverged, any seed); the grid's largest lr, said so, when it never failed."""
    lrs = sorted(ctx.profile.lrs)
    runs = ctx.runs("post", lrs, 0)
    for lr in lrs:
        if any(r.failed for r in runs[lr]):
            outcomes = ", ".join(sorted({str(r.outcome) for r in runs[lr]}))
            return lr, ("the smallest lr of C6's grid at which post without warmup failed "
                        f"({outcomes})")
    return lrs[-1], "post without warmup failed at no lr of C6's grid: its largest lr"


def measure(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    lr, lr_why = c6_failing_lr(ctx)
    base = fairseq_ladder(p.width, p.heads)[:-1]  # post's own init is the source's Xavier
    source = base[0]
    at_lr = Rung("lr", f"lr {lr:g}", f"lr {lr:g} ({lr_why}) instead of {SOURCE_LR:g}",
                 source.fields)
    rungs = [source, at_lr, *base[1:]]
    lrs = [(source, SOURCE_LR)] + [(r, lr) for r in rungs[1:]]
    depths = sorted({L for L in p.init_depths if p.update_blocks >= L} | {p.update_blocks})
    data = ctx.update_ladder(f"ladder_deepnet_{DEEPNET_CACHE}", lrs, depths, steps=1,
                         warmup=p.update_steps)

    def first(rung: Rung, label: str, depth: int | None = None) -> Rows:
        rows = data[rung.key]["series"][label]
        return rows if depth is None else [r for r in rows if r["n_blocks"] == depth]

    def step1(rows: Rows) -> list[float]:
        return [r["update"][1] for r in sorted(rows, key=lambda r: r["seed"])]

    def unsaturated_depths(rung: Rung) -> list[int]:
        """The depths at which post's first update stays below half the distance between two
        independent inits (the measure's saturation scale)."""
        ok = []
        for L in depths:
            upd = mean_ci(step1(first(rung, "post, no warmup", L)))["mean"]
            dist = mean_ci([d["distance"] for d in data[rung.key]["init_distance"]
                            if d["n_blocks"] == L])["mean"]
            if upd < 0.5 * dist:
                ok.append(L)
        return ok

    def unsaturated_depth(rung: Rung) -> int | None:
        ok = unsaturated_depths(rung)
        return max(ok) if ok else None

    def slopes(rung: Rung, label: str) -> list[float]:
        """Per seed, the depth slope over the unsaturated depths (none with fewer than 2)."""
        ok = unsaturated_depths(rung)
        if len(ok) < 2:
            return []
        rows = [r for r in first(rung, label) if r["n_blocks"] in ok]
        return _slopes(rows, lambda r: r["update"][1])

    def predict(rung: Rung) -> list[Prediction]:
        L = unsaturated_depth(rung)
        post = step1(first(rung, "post, no warmup", L)) if L else []
        dn = step1(first(rung, "deepnorm, no warmup", L)) if L else []
        s_post, s_dn = slopes(rung, "post, no warmup"), slopes(rung, "deepnorm, no warmup")
        how = f"over the unsaturated depths {unsaturated_depths(rung)}"
        return [
            CLAIM.predict("post vs deepnorm", _log_ratios(post, dn)),
            CLAIM.predict("post: depth", s_post, derivation=how),
            CLAIM.predict("deepnorm: depth", s_dn, derivation=how),
            CLAIM.predict("post vs deepnorm: depth",
                          [a - b for a, b in zip(s_post, s_dn, strict=True)], derivation=how),
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
               "unsaturated_depths": {r.label: unsaturated_depths(r) for r in rungs},
               "saturation_at_the_first_step": saturation,
               "log_ratio_no_warmup_over_warmup": warm,
               "log_ratio_post_over_pre_no_warmup": pre_ratio}
    return ladder_claim(
        ctx, CLAIM,
        "||f(x; theta_1) - f(x; theta_0)|| after the first AdamW step (beta2 0.98). Every "
        "number is read before the measure saturates: the ratio to DeepNorm (above 1, decided "
        "at 0 in log) at the deepest depth where post's first update stays below half the "
        "distance between two independent inits, and the depth laws over the depths of "
        f"{depths} where it does: post's slope above 0, DeepNorm's below 1/2 (nearer Theorem "
        "4.2's bounded law than to linear), post's above DeepNorm's. Post's "
        "ratio to Pre-LN is reported (DeepNet states none). Source rung at lr "
        f"{SOURCE_LR:g}; then "
        f"lr {lr:g}, {lr_why}. Warmup ({p.update_steps} steps) is reported: with it the first "
        "step is smaller by construction.",
        rungs, predict, numbers, [], {"post vs deepnorm": "log(post / DeepNorm)",
                                      "post: depth": "post's depth slope",
                                      "deepnorm: depth": "DeepNorm's depth slope",
                                      "post vs deepnorm: depth": "slope(post) - slope(DeepNorm)"})


def _log_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return [math.log(x / y) if x > 0 and y > 0 else math.nan
            for x, y in zip(a, b, strict=True)]



CLAIM = CLAIM.bind(measure)
