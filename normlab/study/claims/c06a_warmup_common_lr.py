"""C6a: at a common peak lr, Post-LN needs warmup and Pre-LN does not (Xiong et al. 2020,
Sec. 3.1 and Fig. 1).

Xiong compare the placements at peak lrs where Post-LN without warmup "fails or ends much
worse" (IWSLT14, lr 5e-4: 8.45 BLEU against about 34 with warmup): there, Pre-LN without warmup
reaching "comparable results" is a statement about warmup. At an lr where Post-LN's own cost of
dropping warmup is within the margin for a comparable loss, nothing needs warmup, and pre
without warmup against post with it measures how far that lr lies from each placement's best,
not warmup. So the claim is decided only at the common lrs where post's warmup cost lies above
the margin on its 95% interval; at the others every row is reported, none decides."""

from __future__ import annotations

from normlab.probe.fits import mean_ci
from normlab.study import figures
from normlab.study.claims.common import (
    COMPARABLE,
    COMPARABLE_WHY,
    XIONG,
    _bracket_note,
    _per_seed,
    _rel,
    _stalled,
    _trains,
    claim_result,
)
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import StudyContext, TunedGrid, WorkPlan
from normlab.study.schema import PRE_POST, ClaimResult
from normlab.study.verdict import Prediction

_COST = "val loss without warmup - with warmup"

CLAIM = Claim(
    id="C6a", title="At a common peak lr, Post-LN needs warmup and Pre-LN does not",
    statement="Trained with Adam at the same peak learning rate, Post-LN without warmup fails "
              "or ends much worse than with it, while Pre-LN without warmup is comparable to "
              "Post-LN with warmup.",
    source=XIONG,
    quote="the learning rate warm-up stage can be safely removed ... Pre-LN Transformers "
          "without the warm-up stage can reach comparable results with baselines",
    setting="IWSLT14 De-En and BERT pre-training, Adam (beta2 0.98), the same peak lr for both "
            "placements (5e-4 and 1e-3), warmup 4000 steps against none",
    paper="Xiong Fig. 1 (IWSLT14, lr 5e-4 / 1e-3, Adam beta2 0.98): post without warmup 8.45 "
          "BLEU, with 4000 warmup steps ~34; warmup 500 at lr 1e-3: 2.77; pre without warmup "
          "comparable to post with it.",
    trains=(("pre", True), ("post", True), ("pre", False), ("post", False)),
    predictions=(
        PredictionSpec(
            "post needs warmup at a common lr",
            "common lrs where post's cost of dropping warmup lies above the margin (95% "
            "interval)",
            "Xiong compare at lrs where Post-LN without warmup fails or ends much worse (lr "
            "5e-4 and 1e-3)",
            Rule("setting", ">=", 1.0,
                 origin=XIONG + ": the comparison is made where post needs warmup; 'needs' is "
                        f"a cost beyond the {COMPARABLE:g}-nat margin for a comparable loss "
                        "(docs/study.md, Margins)"),
            role="premise"),
        PredictionSpec(
            "post, {lr}", _COST,
            "Xiong: Post-LN without warmup fails or ends much worse (IWSLT14, lr 5e-4: 8.45 "
            "BLEU vs ~34 with 4000 warmup steps)",
            Rule("direction", ">", COMPARABLE, meaningful=COMPARABLE,
                 origin=XIONG + ": 'fails or ends much worse', no size in loss: at least "
                        f"beyond the {COMPARABLE:g}-nat margin for a comparable loss "
                        "(docs/study.md, Margins); it selects the lrs the claim is decided at"),
            role="diagnostic"),
        PredictionSpec(
            "pre, {lr}", _COST, "Xiong: Pre-LN's warmup stage 'can be safely removed'",
            Rule("non_inferiority", ">", margin=COMPARABLE,
                 origin=XIONG + ": 'safely removed', " + COMPARABLE_WHY)),
        PredictionSpec(
            "pre without vs post with warmup, {lr}",
            "val loss(pre, no warmup) - val loss(post, warmup)",
            "Xiong: Pre-LN without warmup reaches 'comparable results' to Post-LN with it",
            Rule("non_inferiority", ">", margin=COMPARABLE,
                 origin=XIONG + ": 'comparable', " + COMPARABLE_WHY)),
        PredictionSpec(
            "pre, {lr}, post not shown to need warmup", _COST,
            "not decided at an lr where post's warmup cost is not above the margin: nothing "
            "there is shown to need warmup",
            Rule("non_inferiority", ">", margin=COMPARABLE,
                 origin=XIONG + ": 'safely removed', " + COMPARABLE_WHY),
            role="diagnostic"),
        PredictionSpec(
            "pre without vs post with warmup, {lr}, post not shown to need warmup",
            "val loss(pre, no warmup) - val loss(post, warmup)",
            "not decided at an lr where post's warmup cost is not above the margin: the "
            "difference there is each placement's distance from its best lr, not warmup",
            Rule("non_inferiority", ">", margin=COMPARABLE,
                 origin=XIONG + ": 'comparable', " + COMPARABLE_WHY),
            role="diagnostic"),
    ),
)


def common_lrs(pre: TunedGrid, post: TunedGrid) -> list[float]:
    """The lrs of both placements' warmup grids where every seed of both trained, post's tuned
    lr first: C6a's common peak lrs."""
    shared = [lr for lr in post.records if lr in pre.records
              and _trains(pre.cell(lr)) and _trains(post.cell(lr))]
    best = post.best_lr
    return sorted(shared, key=lambda lr: (lr != best, lr))


def lr_tag(lr: float, post: TunedGrid) -> str:
    """How C6a names a common lr, in its predictions' subjects and its figure's title alike:
    "lr 0.0015", with "(post's tuned)" only when it is post's tuned lr (`post.best_lr`, the
    tuning table's best_lr), which a common lr need not be (post's tuned lr may lie off pre's
    grid, or where pre did not train)."""
    return f"lr {lr:g}" + (" (post's tuned)" if lr == post.best_lr else "")


def _too_few_seeds(lr: float, gate: Prediction) -> str:
    """What the note adds for a common lr left undecided only by its seed count: every seed's
    cost of dropping warmup above the margin, the interval straddling it."""
    values = list(gate.values)
    if gate.verdict != "inconclusive" or not values or min(values) <= COMPARABLE:
        return ""
    seeds = ", ".join(f"{v:+.3f}" for v in values)
    return (f" At lr {lr:g} every seed's cost lies above the margin ({seeds}), yet "
            f"{len(values)} seeds leave the interval too wide to decide (the smallest effect "
            f"they detect is {gate.mde:.3f} nats): too few seeds, not evidence that post "
            "trains there without warmup.")


def measure(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    tuned = {pl: ctx.tuned(pl) for pl in ("pre", "post")}
    stalled = _stalled(*tuned.values())
    lrs = common_lrs(tuned["pre"], tuned["post"]) if not stalled else []
    if lrs:
        ctx.prefetch([(pl, lrs, 0) for pl in tuned])
    without = {pl: ctx.runs(pl, lrs, 0) if lrs else {} for pl in tuned}
    rows, numbers, decided = [], {}, []
    gates: dict[float, Prediction] = {}  # per common lr: post's cost of dropping warmup, decided
    for lr in lrs:
        w = {pl: tuned[pl].cell(lr) for pl in tuned}
        wo = {pl: without[pl][lr] for pl in tuned}
        tag = lr_tag(lr, tuned["post"])
        cost = {pl: _per_seed(wo[pl], w[pl]) for pl in tuned}
        vs = _per_seed(wo["pre"], w["post"])
        gate = CLAIM.predict("post, {lr}", cost["post"], subject=f"post, {tag}")
        needs = gate.verdict == "supported"
        gates[lr] = gate
        if needs:
            decided.append(lr)
        off = "" if needs else ", post not shown to need warmup"
        rows += [gate,
                 CLAIM.predict("pre, {lr}" + off, cost["pre"], subject=f"pre, {tag}{off}"),
                 CLAIM.predict("pre without vs post with warmup, {lr}" + off, vs,
                               subject=f"pre without vs post with warmup, {tag}{off}")]
        numbers[f"lr {lr:g}"] = {"cost": {pl: mean_ci(v) for pl, v in cost.items()},
                                 "pre without - post with": mean_ci(vs),
                                 "decided": needs,
                                 "outcomes_without_warmup": {pl: [r.outcome for r in rs]
                                                             for pl, rs in wo.items()}}
    predictions = [CLAIM.predict("post needs warmup at a common lr", [float(len(decided))]),
                   *rows] if lrs else []
    numbers["common_lrs"] = lrs
    numbers["decided_lrs"] = decided
    numbers["tuning"] = {pl: t.numbers() for pl, t in tuned.items()}
    fig = None
    if lrs:
        lr = (decided or lrs)[0]
        curves = {f"{pl}, {'warmup ' + str(p.warmup) if w else 'no warmup'}":
                  [r.run_id for r in (tuned[pl].cell(lr) if w else without[pl][lr])]
                  for pl in tuned for w in (1, 0)}
        fig = figures.plot_curves(ctx.runs_root, curves, ctx.fig_dir / "c6a_warmup_curves.svg",
                                  title=f"both placements at {lr_tag(lr, tuned['post'])}, all "
                                        "seeds")
    note = _bracket_note(*tuned.values())
    if lrs and lrs[0] != tuned["post"].best_lr:
        note = (note + " " if note else "") + (
            f"Post's tuned lr {tuned['post'].best_lr:g} is not a common lr (pre did not train "
            f"there with every seed, or its grid lacks it): compared at lr {lrs[0]:g} and the "
            "other common lrs.")
    if not lrs and not stalled:
        note = (note + " " if note else "") + (
            "No lr of the grid where both placements trained with warmup: no common lr to "
            "compare at.")
    skipped = [lr for lr in lrs if lr not in decided]
    if skipped:
        costs = "; ".join(
            "lr {:g}: {:+.3f} [{:+.3f}, {:+.3f}]".format(
                lr, numbers[f"lr {lr:g}"]["cost"]["post"]["mean"],
                *numbers[f"lr {lr:g}"]["cost"]["post"]["ci95"]) for lr in skipped)
        note = (note + " " if note else "") + (
            f"Not decided at {', '.join(f'{lr:g}' for lr in skipped)}: post's cost of dropping "
            f"warmup there ({costs} nats) does not lie above the {COMPARABLE:g}-nat margin, so "
            "nothing there is shown to need warmup and pre's rows are reported, not decided.")
        note += "".join(_too_few_seeds(lr, gates[lr]) for lr in skipped)
    return claim_result(
        CLAIM,
        f"Both placements at the same peak lr: post's tuned lr and every lr of the shared grid "
        f"where both trained with warmup ({p.warmup} = {p.warmup_frac:g} of {p.steps} steps); "
        "each trained again without warmup. Per seed, the cost of dropping warmup in final "
        "validation loss (a diverged run scores ln 256, a stalled one its loss), and pre "
        "without warmup against post with it. The claim is decided at the lrs where post needs "
        f"warmup (its cost above {COMPARABLE:g} nats on its 95% interval), as in Xiong's "
        f"comparison: there pre's cost and pre without against post with warmup are "
        f"non-inferiority tests at {COMPARABLE:g} nats ('safely removed', 'comparable'); at the "
        "other common lrs they are reported only.",
        predictions, numbers, _rel(ctx, fig), stalled=stalled, note=note)


def work(plan: WorkPlan) -> None:
    """C6a's runs beyond its grids: both placements without warmup at every common lr of the
    tuned grids (while those are not known: a cell beyond the no-warmup grids)."""
    p = plan.profile
    pre, post = plan.tuned("pre", p.warmup), plan.tuned("post", p.warmup)
    if pre is not None and post is not None:
        plan.runs([plan.folder.family_config(pl, lr, 0, s) for lr in common_lrs(pre, post)
                   for pl in PRE_POST for s in range(p.seeds)])
    else:
        plan.later([plan.folder.family_config(pl, p.lrs[-1], 0, s)
                    for pl in PRE_POST for s in range(p.seeds)])


CLAIM = CLAIM.bind(measure, work=work)
