"""C7: DeepNet's account of Post-LN's instability: without warmup the first model update
explodes, DeepNorm bounds it, and Post-LN's grows with depth (Wang et al. 2022), calibrated in
the source's setting and traced along the fairseq ladder.

The predictions are read in the linear regime (docs/study.md, C7): DeepNet's analysis bounds
the model update per step after initialization as the lr goes to 0, where the update is
linear in the lr; at the source's lr 5e-4 on these narrow models Post-LN's first update
already reaches the distance between two independent inits (the measure saturates), which is
reported as a diagnostic. The lr is the largest of a fixed grid at which the first update
scales linearly with the lr, checked at the deepest depth before the verdict is read."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from normlab.probe.fits import mean_ci
from normlab.study.claims.ladder import (
    Rows,
    _slopes,
    ladder_claim,
    log_law_slope,
    nearest_law_bands,
)
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import StudyContext, WorkPlan
from normlab.study.ladders import Rung, fairseq_ladder
from normlab.study.schema import ClaimResult
from normlab.study.verdict import Prediction

# DeepNorm's "bounded" is an order, O(1), read as C8 reads Admin's orders
# (`nearest_law_bands`): its depth slope lies below the O(1) band's upper edge, half the slope
# ln N takes over the depths measured (O(log N) is not bounded; a midpoint of 1/2 between O(1)
# and O(N) let it pass).
# DeepNet and Xiong train at this peak lr.
SOURCE_LR = 5e-4
DEEPNET_CACHE = "v4"  # the saturating measure at the rungs' lrs (a diagnostic)
# The linear regime (fixed before its runs): the grid of lrs below the source's, each a tenth of
# the one before; the largest lr at which the first update per unit lr agrees with the one at a
# tenth of that lr within LINEAR_TOLERANCE (mean over seeds, post and DeepNorm, deepest depth)
# is the lr the claim is read at. The smallest lr is a reference only.
LINEAR_LRS = (5e-5, 5e-6, 5e-7, 5e-8)
LINEAR_TOLERANCE = 0.05
LINEAR_CACHE = "v1"
LINEAR_VARIANTS = ("post, no warmup", "deepnorm, no warmup")



@dataclass(frozen=True)
class Settings:
    """C7's own sizes: the update ladder's models and their first steps."""

    update_steps: int = 30  # the warmup of the "with warmup" variants, in steps
    update_blocks: int = 24  # the depth the update comparisons are read at
    update_lr: float = SOURCE_LR  # the source's lr, recorded with the profile


# each profile's
SETTINGS = {"tiny": Settings(update_steps=4, update_blocks=4),
            "quick": Settings(update_steps=24, update_blocks=24),
            "standard": Settings(), "long": Settings(), "gpu": Settings(),
            "full": Settings(update_steps=60, update_blocks=48)}

CLAIM = Claim(
    id="C7", title="DeepNet: Post-LN's early model update explodes without warmup",
    statement="Post-LN without warmup makes a large change of the model output at the very "
              "first steps; DeepNorm's update stays bounded, and Post-LN's grows with depth.",
    source="Wang et al. 2022, DeepNet (2203.00555), Sec. 3 (Fig. 5) and Theorem 4.2",
    quote="the instability of Post-LN Transformer ... comes from ... an exploding model update "
          "at the beginning of training (Sec. 3); DeepNorm bounds the model update by a "
          "constant (Theorem 4.2); 'model updates can be bounded in a stable way' (abstract)",
    setting="an 18L-18L Post-LN encoder-decoder, Adam, lr 5e-4, the first steps of training; "
            "Theorem 4.2: the update per step after initialization, to first order in the lr",
    paper="DeepNet Fig. 5 (18L-18L Post-LN, lr 5e-4): without warmup the update jumps early and "
          "the model diverges; with warmup or DeepNorm it grows smoothly.",
    ladder="fairseq",
    settings_class=Settings, per_profile=SETTINGS,
    trains=(("post", False),),  # the lr at which post without warmup fails (C6b's grid)
    predictions=(
        PredictionSpec(
            "post vs deepnorm",
            "log(first update post / DeepNorm), no warmup, in the linear regime, at the "
            "profile's update_blocks",
            "DeepNet: DeepNorm bounds the update that explodes under Post-LN",
            Rule("direction", ">", 0.0, origin="DeepNet gives no factor: 0, the size reported")),
        PredictionSpec(
            "post: depth", "log-log slope of post's first update (linear regime) against L, "
            "over the profile's depths",
            "DeepNet Theorem 4.2: Post-LN's update grows with depth",
            Rule("order", ">", 0.0, origin="Theorem 4.2 gives an order, no size: grows, above "
                                           "0")),
        PredictionSpec(
            "deepnorm: depth", "log-log slope of DeepNorm's first update (linear regime) "
            "against L, over the profile's depths",
            "DeepNet Theorem 4.2: DeepNorm's update is bounded in depth (O(1))",
            Rule("order", "<",
                 origin="Theorem 4.2's O(1) for DeepNorm, an order: below the O(1) band's "
                        "upper edge, half the log-log slope of ln N over the depths measured "
                        "(the nearest-law bands C8 reads Admin's orders with)")),
        PredictionSpec(
            "post vs deepnorm: depth", "slope(post) - slope(DeepNorm), linear regime",
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


def linear_lr(check: dict[float, dict[str, list[float]]]) -> float | None:
    """The largest lr of `LINEAR_LRS` (the last one a reference only) at which the first
    update is linear in the lr: for every variant, the mean over seeds of
    `(update(lr) / lr) / (update(lr / 10) / (lr / 10))` lies within `LINEAR_TOLERANCE` of 1.
    `check[lr][variant]` holds those per-seed ratios; None when no lr of the grid passes."""
    for lr in LINEAR_LRS[:-1]:
        means = [mean_ci(v)["mean"] for v in check[lr].values()]
        if means and all(math.isfinite(m) and abs(m - 1) <= LINEAR_TOLERANCE for m in means):
            return lr
    return None


def measure(ctx: StudyContext) -> ClaimResult:
    p, own = ctx.profile, CLAIM.settings(ctx.profile)
    lr, lr_why = c6_failing_lr(ctx)
    base = fairseq_ladder(p.width, p.heads)[:-1]  # post's own init is the source's Xavier
    source = base[0]
    at_lr = Rung("lr", f"lr {lr:g}", f"lr {lr:g} ({lr_why}) instead of {SOURCE_LR:g}",
                 source.fields)
    # the saturating measure (a diagnostic): the first update at the source's lr, then C6's
    sat_rungs = [source, at_lr, *base[1:]]
    sat_lrs = [(source, SOURCE_LR)] + [(r, lr) for r in sat_rungs[1:]]
    sat_depths = sorted({L for L in p.init_depths if own.update_blocks >= L} | {own.update_blocks})
    sat = ctx.update_ladder(f"ladder_deepnet_{DEEPNET_CACHE}", sat_lrs, sat_depths, steps=1,
                            warmup=own.update_steps)
    # the linear regime: per unit lr the first update does not depend on the lr (Adam's first
    # step has the direction g / |g| at every lr), so the lr rung is the source rung again and
    # the ladder is the fairseq one
    rungs = list(base)
    depths = sorted(set(p.init_depths) | {own.update_blocks})
    deepest = depths[-1]
    grid = ctx.update_ladder(
        f"ladder_deepnet_linear_grid_{LINEAR_CACHE}",
        [(replace(r, key=f"{r.key}@{x:g}"), x) for r in rungs for x in LINEAR_LRS], [deepest],
        steps=1, warmup=0, variants=LINEAR_VARIANTS, distance=False)

    def per_unit(rows: Rows, x: float) -> dict[int, float]:
        return {r["seed"]: r["update"][1] / x for r in rows}

    checks: dict[str, dict[float, dict[str, list[float]]]] = {}
    chosen: dict[str, float | None] = {}
    for r in rungs:
        checks[r.key] = {}
        for x in LINEAR_LRS[:-1]:
            checks[r.key][x] = {}
            for label in LINEAR_VARIANTS:
                a = per_unit(grid[f"{r.key}@{x:g}"]["series"][label], x)
                b = per_unit(grid[f"{r.key}@{x / 10:g}"]["series"][label], x / 10)
                checks[r.key][x][label] = [a[s] / b[s] if b[s] > 0 else math.nan
                                           for s in sorted(a)]
        chosen[r.key] = linear_lr(checks[r.key])
    at = [(r, chosen[r.key]) for r in rungs if chosen[r.key] is not None]
    shallower = [L for L in depths if deepest != L]
    data = ctx.update_ladder(
        f"ladder_deepnet_linear_{LINEAR_CACHE}_"
        + "-".join(f"{r.key}@{x:g}" for r, x in at), at, shallower, steps=1, warmup=0,
        variants=LINEAR_VARIANTS, distance=False) if at and shallower else {}

    def rows_of(rung: Rung, label: str, depth: int | None = None) -> Rows:
        x = chosen[rung.key]
        if x is None:
            return []
        rows = list(data.get(rung.key, {}).get("series", {}).get(label, []))
        rows += grid[f"{rung.key}@{x:g}"]["series"][label]
        return rows if depth is None else [q for q in rows if q["n_blocks"] == depth]

    def step1(rows: Rows) -> list[float]:
        return [q["update"][1] for q in sorted(rows, key=lambda q: q["seed"])]

    def slopes(rung: Rung, label: str) -> list[float]:
        rows = rows_of(rung, label)
        return _slopes(rows, lambda q: q["update"][1]) if len(depths) > 1 and rows else []

    s_log = log_law_slope(depths)
    bounded = round(nearest_law_bands(s_log)["O(1)"][1], 3)

    def predict(rung: Rung) -> list[Prediction]:
        x = chosen[rung.key]
        post = step1(rows_of(rung, "post, no warmup", own.update_blocks))
        dn = step1(rows_of(rung, "deepnorm, no warmup", own.update_blocks))
        s_post, s_dn = slopes(rung, "post, no warmup"), slopes(rung, "deepnorm, no warmup")
        how = (f"linear regime at lr {x:g} (the largest of {list(LINEAR_LRS[:-1])} linear "
               f"within {LINEAR_TOLERANCE:g} at {deepest} blocks), over the depths {depths}"
               if x is not None else
               f"no lr of {list(LINEAR_LRS[:-1])} is linear within {LINEAR_TOLERANCE:g} at "
               f"{deepest} blocks: not measured")
        return [
            CLAIM.predict("post vs deepnorm", _log_ratios(post, dn), derivation=how),
            CLAIM.predict("post: depth", s_post, derivation=how),
            CLAIM.predict("deepnorm: depth", s_dn, threshold=bounded, derivation=how
                          + f"; O(1)'s band ends at {bounded:g}, half of ln N's slope "
                            f"{s_log:.3f} over {depths}"),
            CLAIM.predict("post vs deepnorm: depth",
                          [a - b for a, b in zip(s_post, s_dn, strict=True)], derivation=how),
        ]

    linear = {
        "lrs": list(LINEAR_LRS), "tolerance": LINEAR_TOLERANCE, "checked_at_blocks": deepest,
        "depths": depths,
        "lr": {r.label: chosen[r.key] for r in rungs},
        "check": {r.label: {f"{x:g}": {label: mean_ci(v) for label, v in by.items()}
                            for x, by in checks[r.key].items()} for r in rungs},
        "first_update_per_unit_lr": {
            r.label: {label: {str(L): mean_ci([u / chosen[r.key]  # type: ignore[operator]
                                               for u in step1(rows_of(r, label, L))])
                              for L in depths}
                      for label in LINEAR_VARIANTS} for r in rungs if chosen[r.key]},
    }

    def sat_rows(rung: Rung, label: str, depth: int) -> Rows:
        return [q for q in sat[rung.key]["series"][label] if q["n_blocks"] == depth]

    def unsaturated_depths(rung: Rung) -> list[int]:
        """The depths at which post's first update at the rung's lr stays below half the
        distance between two independent inits (the measure's saturation scale)."""
        ok = []
        for L in sat_depths:
            upd = mean_ci(step1(sat_rows(rung, "post, no warmup", L)))["mean"]
            dist = mean_ci([d["distance"] for d in sat[rung.key]["init_distance"]
                            if d["n_blocks"] == L])["mean"]
            if upd < 0.5 * dist:
                ok.append(L)
        return ok

    saturation = {}
    for rung in sat_rungs:
        dist = mean_ci([d["distance"] for d in sat[rung.key]["init_distance"]
                        if d["n_blocks"] == own.update_blocks])
        upd = mean_ci(step1(sat_rows(rung, "post, no warmup", own.update_blocks)))
        saturation[rung.label] = {"first_update_post": upd, "init_distance": dist,
                                  "saturated": upd["mean"] > 0.5 * dist["mean"]}

    def sat_ratio(rung: Rung, other: str) -> dict:
        return mean_ci(_log_ratios(step1(sat_rows(rung, "post, no warmup", own.update_blocks)),
                                   step1(sat_rows(rung, other, own.update_blocks))))

    numbers = {"lr": {"source": SOURCE_LR, "C6": lr, "why": lr_why},
               "linear_regime": linear,
               "saturating_measure": {
                   "note": "the first update at the rungs' own lrs (the source's 5e-4, then "
                           "C6's): a diagnostic; it saturates where post's update nears the "
                           "init-to-init distance",
                   "unsaturated_depths": {r.label: unsaturated_depths(r) for r in sat_rungs},
                   "saturation_at_the_first_step": saturation,
                   "log_ratio_post_over_deepnorm": {
                       r.label: sat_ratio(r, "deepnorm, no warmup") for r in sat_rungs}},
               "log_ratio_no_warmup_over_warmup": {r.label: sat_ratio(r, "post, warmup")
                                                   for r in sat_rungs},
               "log_ratio_post_over_pre_no_warmup": {r.label: sat_ratio(r, "pre, no warmup")
                                                     for r in sat_rungs}}
    return ladder_claim(
        ctx, CLAIM,
        "||f(x; theta_1) - f(x; theta_0)|| after the first AdamW step (beta2 0.98), in the "
        "linear regime DeepNet's Theorem 4.2 analyses (the update per step after "
        "initialization, to first order in the lr): on each rung, at the largest lr of "
        f"{list(LINEAR_LRS[:-1])} at which the update per unit lr agrees with the one at a "
        f"tenth of the lr within {LINEAR_TOLERANCE:g} (mean over seeds, post and DeepNorm, at "
        f"{deepest} blocks; recorded). The ratio to DeepNorm (above 1, decided at 0 in log) "
        f"at {own.update_blocks} blocks; the depth laws over {depths}: post's slope above 0, "
        f"DeepNorm's below {bounded:g} (Theorem 4.2's bounded law, O(1): nearer 0 than ln N's "
        f"slope {s_log:.3f} over these depths), post's above DeepNorm's. Reported: the first "
        "update at the source's lr "
        f"{SOURCE_LR:g} and at C6's lr {lr:g} ({lr_why}), which saturates, with post's ratio "
        f"to Pre-LN and to itself with warmup ({own.update_steps} steps).",
        rungs, predict, numbers, [], {"post vs deepnorm": "log(post / DeepNorm)",
                                      "post: depth": "post's depth slope",
                                      "deepnorm: depth": "DeepNorm's depth slope",
                                      "post vs deepnorm: depth": "slope(post) - slope(DeepNorm)"})


def _log_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return [math.log(x / y) if x > 0 and y > 0 else math.nan
            for x, y in zip(a, b, strict=True)]


# The linear-regime ladders' cost for the time estimate, in training steps of the profile's
# 6-block shape per model block (one model: a forward, a backward, one Adam step and a forward),
# from the recorded quick study's log (docs/results/study_quick/log.txt, 0.033 s a step): the
# grid, 3 rungs x 4 lrs x 2 variants x 3 seeds at 24 blocks, took 8 s (0.14 a model block); the
# shallower depths, 3 x 2 x 3 at 3 + 6 + 12 blocks, 2 s (0.16).
LINEAR_STEPS_PER_BLOCK = 0.15


def work(plan: WorkPlan) -> None:
    """C7's ladders, for the time estimate. The saturating ladder: seeds x update steps, each
    about 10 training steps of the profile's shape (the recorded quick study's log: 24 s at
    0.033 s a step for 3 x 24). The linear regime's grid at the deepest depth and its ladder
    at the shallower ones (`LINEAR_STEPS_PER_BLOCK`); the second is named by the lrs the grid
    chooses, so a cache of any such name counts as done."""
    p, own = plan.profile, CLAIM.settings(plan.profile)
    plan.ladder(f"ladder_deepnet_{DEEPNET_CACHE}", 730 / 72 * (p.init_seeds * own.update_steps))
    depths = sorted(set(p.init_depths) | {own.update_blocks})
    rungs = len(fairseq_ladder(p.width, p.heads)) - 1  # as `measure`: post's own init is Xavier
    per_block = LINEAR_STEPS_PER_BLOCK * rungs * len(LINEAR_VARIANTS) * p.init_seeds
    plan.ladder(f"ladder_deepnet_linear_grid_{LINEAR_CACHE}",
                per_block * len(LINEAR_LRS) * depths[-1])
    done = sorted(plan.folder.cache_dir.glob(f"ladder_deepnet_linear_{LINEAR_CACHE}_*.json"))
    plan.ladder(done[0].stem if done else f"ladder_deepnet_linear_{LINEAR_CACHE}_(the grid's lrs)",
                per_block * sum(depths[:-1]))


CLAIM = CLAIM.bind(measure, work=work)
