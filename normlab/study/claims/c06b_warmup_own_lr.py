"""C6b: Pre-LN needs no warmup even at its own best lr; Post-LN diverges without it (the warmup
lesson quoted in docs/reference.md, section 2)."""

from __future__ import annotations

from normlab.probe.fits import mean_ci
from normlab.study import figures
from normlab.study.claims.common import (
    COMPARABLE,
    COMPARABLE_WHY,
    NO_SIZE,
    _bracket_note,
    _per_seed,
    _rel,
    _stalled,
    _val,
    claim_result,
)
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import StudyContext
from normlab.study.schema import ClaimResult

_LESSON = "the warmup lesson (docs/reference.md, section 2): "
_COST = "best val loss over lr without warmup - best with warmup"

CLAIM = Claim(
    id="C6b", title="Pre-LN needs no warmup even at its own best lr; Post-LN does",
    statement="Pre-LN does not need warmup and can train with large learning rates from the "
              "start; Post-LN diverges without warmup.",
    source="The warmup lesson, 'A Direct Comparison: Stability vs. Performance' (quoted in "
           "docs/reference.md, section 2)",
    quote="Post-LN: warmup 'Required. Training diverges without it.' Pre-LN: 'Not required. "
          "Can train with large learning rates from the start.'",
    setting="no setting stated: a general lesson on Transformer training",
    paper="The lesson gives no number; Xiong (same lr, not best over lr): post without warmup "
          "8.45 BLEU vs ~34 with.",
    trains=(("pre", True), ("post", True), ("pre", False), ("post", False)),
    predictions=(
        PredictionSpec("post diverges", "share of seeds that diverged or stalled without warmup "
                       "at post's own best lr (with warmup)",
                       "lesson: Post-LN warmup 'Required. Training diverges without it.'",
                       Rule("failure_rate", ">", 0.5,
                            origin=_LESSON + "'diverges': in more seeds than not (a share "
                                             "above 1/2)")),
        PredictionSpec("pre", _COST,
                       "lesson: Pre-LN warmup 'Not required. Can train with large learning "
                       "rates from the start.'",
                       Rule("non_inferiority", ">", margin=COMPARABLE,
                            origin=_LESSON + "'not required', " + COMPARABLE_WHY)),
        PredictionSpec("pre at its best lr", "val loss without warmup - with warmup, both at "
                       "pre's own best lr with warmup",
                       "lesson: Pre-LN 'Can train with large learning rates from the start': "
                       "the lr it trains best at with warmup, with no warmup at all",
                       Rule("non_inferiority", ">", margin=COMPARABLE,
                            origin=_LESSON + "'can train with large learning rates from the "
                                             "start': the large lr is pre's own best with "
                                             "warmup; 'can train' is a comparable loss, "
                                             + COMPARABLE_WHY)),
        PredictionSpec("post vs pre", "cost(post) - cost(pre) of dropping warmup, each at its "
                       "best lr", "lesson: warmup is required for Post-LN, not for Pre-LN",
                       Rule("direction", ">", 0.0, origin=_LESSON + NO_SIZE)),
        PredictionSpec("post", _COST, "lesson: Post-LN needs warmup (its loss without it)",
                       Rule("direction", ">", 0.0, origin=_LESSON + NO_SIZE),
                       role="diagnostic"),
    ),
)


def measure(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    tuned = {pl: ctx.tuned(pl) for pl in ("pre", "post")}
    no_w = {pl: ctx.tuned(pl, 0) for pl in ("pre", "post")}
    # no-warmup grids that fail everywhere are the claim's result for post, not a stall
    stalled = _stalled(*tuned.values())
    cost = {pl: _per_seed(no_w[pl].best, tuned[pl].best) for pl in tuned}
    best = tuned["post"].best_lr
    at_best = ctx.runs("post", [best], 0)[best]  # without warmup at post's own best lr
    pre_best = tuned["pre"].best_lr
    pre_at_best = ctx.runs("pre", [pre_best], 0)[pre_best]
    pre_cost_at_best = _per_seed(pre_at_best, tuned["pre"].cell(pre_best))
    predictions = [
        CLAIM.predict("post diverges", [r.failed for r in at_best]),
        CLAIM.predict("pre", cost["pre"]),
        CLAIM.predict("pre at its best lr", pre_cost_at_best,
                      subject=f"pre at its best lr ({pre_best:g})"),
        CLAIM.predict("post vs pre", [a - b for a, b in zip(cost["post"], cost["pre"],
                                                            strict=True)]),
        CLAIM.predict("post", cost["post"])]
    bars = {f"{pl}, {'warmup' if w else 'no warmup'} (best lr {t.best_lr:g})":
            mean_ci(_val(t.best)) for pl in tuned
            for w, t in ((1, tuned[pl]), (0, no_w[pl]))}
    fig = figures.plot_bars(bars, ctx.fig_dir / "c6b_best_over_lr.svg",
                            ylabel="final validation loss (nats)",
                            title=f"each placement's best over its own grid, {p.seeds} seeds")
    return claim_result(
        CLAIM,
        f"Each placement tuned twice over its own bracketed grid: with warmup ({p.warmup} of "
        f"{p.steps} steps) and without; per seed, the best cell without warmup minus the best "
        "cell with it (a cell where a seed failed is never the optimum unless every cell "
        "failed; then the least bad, scored ln 256 when diverged). Post's 'diverges' is the "
        "share of seeds that diverged or stalled without warmup at post's own best lr (with "
        f"warmup), above 1/2 on its Wilson interval; pre's cost is non-inferior at {COMPARABLE:g} "
        "nats, both best over lr ('not required') and at pre's own best lr with warmup, trained "
        "there without warmup ('can train with large learning rates from the start'); post's "
        "cost exceeds pre's, per seed.",
        predictions,
        {"cost": {pl: mean_ci(v) for pl, v in cost.items()},
         "post_without_warmup_at_its_best_lr": {
             "lr": best, "outcomes": [r.outcome for r in at_best]},
         "pre_without_warmup_at_its_best_lr": {
             "lr": pre_best, "cost": mean_ci(pre_cost_at_best),
             "outcomes": [r.outcome for r in pre_at_best]},
         "tuning_with_warmup": {pl: t.numbers() for pl, t in tuned.items()},
         "tuning_without_warmup": {pl: t.numbers() for pl, t in no_w.items()}},
        _rel(ctx, fig), stalled=stalled, note=_bracket_note(*tuned.values(), *no_w.values()))


CLAIM = CLAIM.bind(measure)
