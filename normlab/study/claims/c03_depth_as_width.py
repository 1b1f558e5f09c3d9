"""C3: under Pre-LN, depth acts like width: running block t+1 on block t's input changes the
model little for deep t (the seed argument; Curse of Depth)."""

from __future__ import annotations

import math
from typing import Any

from normlab.probe import figures as probe_figures
from normlab.probe.fits import mean_ci
from normlab.study.claims.common import (
    LARGE_T_NEEDS,
    MATCHED,
    NO_SIZE,
    _late_mean,
    _rel,
    _seed_mean_curves,
    _trained,
    claim_result,
    first_late_block,
    large_t_premise,
    matched_gap,
)
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import StudyContext
from normlab.study.schema import ClaimResult

CLAIM = Claim(
    id="C3", title="Pre-LN's depth acts like width",
    statement="Running block t+1 on block t's input (merge test) changes a Pre-LN model little "
              "for deep t, in units of what block t+1 does (the cost of dropping it), a Post-LN "
              "model much; the cost of dropping a block is reported.",
    source="Seed argument; Curse of Depth (2502.05795)",
    quote="when t is large, x_{t+1} and x_t are very close ... so F_{t+1}(x_{t+1}) is "
          "approximately F_{t+1}(x_t): the two layers act approximately like a single, wider "
          "layer (the seed)",
    setting="large t: deep blocks of a deep trained Pre-LN model",
    paper="Curse of Depth: removing a deep layer of a pre-LN LLM costs little; no merge-test "
          "number is published.",
    trains=(("pre", True), ("post", True)),
    needs=LARGE_T_NEEDS,
    predictions=(
        large_t_premise("the late merge and drop costs read"),
        MATCHED,
        PredictionSpec(
            "post vs pre", "log(late merge KL / drop KL, post) - log(same, pre)",
            "seed argument: block t+1 run on block t's input acts like a wider layer under pre "
            "(its merge changes little of what the block does), not under post",
            Rule("direction", ">", 0.0,
                 origin="the seed argument ('very close', 'approximately like a single, wider "
                        "layer'): " + NO_SIZE)),
    ),
)


def merge_per_drop(per_block: dict[str, Any]) -> float:
    """Mean over the deeper half of the pairs (t, t+1) of merge_kl[t] / drop_kl[t+1]: the merge
    cost of block t+1 in units of that block's own drop cost (nan where a drop costs 0)."""
    merge, drop = per_block["merge_kl"], per_block["drop_kl"]
    ratios = [m / d if d > 0 else math.nan for m, d in zip(merge, drop[1:], strict=True)]
    return _late_mean(ratios)


def measure(ctx: StudyContext) -> ClaimResult:
    tp, missing = _trained(ctx, CLAIM.id, CLAIM.title)
    if missing:
        return missing
    n = min(len(tp.seeds["pre"]), len(tp.seeds["post"]))
    seeds = {p: tp.seeds[p][:n] for p in ("pre", "post")}
    kl = {p: [_late_mean(s.per_block["merge_kl"]) for s in v] for p, v in seeds.items()}
    drop_kl = {p: [_late_mean(s.per_block["drop_kl"][1:]) for s in v]
               for p, v in seeds.items()}
    drop = {p: [_late_mean(s.per_block["drop_dloss"]) for s in v] for p, v in seeds.items()}
    ratio = {p: [merge_per_drop(s.per_block) for s in v] for p, v in seeds.items()}
    values = [math.log(b / a) for a, b in zip(ratio["pre"], ratio["post"], strict=True)
              if a > 0 and b > 0]
    predictions = [
        CLAIM.predict("large t", [first_late_block(tp.pair.blocks or ctx.profile.train_blocks)]),
        CLAIM.predict("matched loss", matched_gap(tp.pair), threshold=ctx.profile.match_tolerance),
        CLAIM.predict("post vs pre", values)]
    curves = _seed_mean_curves(ctx, tp, ("merge_kl", "drop_dloss"))
    figs = _rel(ctx, probe_figures.plot_per_block(curves, "merge_kl",
                                                  ctx.fig_dir / "c3_merge.svg"))
    figs += _rel(ctx, probe_figures.plot_per_block(curves, "drop_dloss",
                                                   ctx.fig_dir / "c3_drop.svg"))
    return claim_result(
        CLAIM,
        "On trained checkpoints at matched loss: for each late pair (t, t+1), KL(original || "
        "merged) of the output distribution when block t+1 reads block t's branch inputs, "
        "divided by KL(original || block t+1 dropped), the block's own cost: the share of what "
        "block t+1 does that the merge loses; averaged over the deeper half; effect per seed: "
        "log(ratio post / ratio pre). Both raw numbers (merge KL, drop KL and drop loss) are "
        "reported.",
        predictions,
        {"late_merge_per_drop": {p: mean_ci(v) for p, v in ratio.items()},
         "late_merge_kl": {p: mean_ci(v) for p, v in kl.items()},
         "late_drop_kl": {p: mean_ci(v) for p, v in drop_kl.items()},
         "late_drop_dloss": {p: mean_ci(v) for p, v in drop.items()},
         "effective_depth": {p: mean_ci([s.summary.get("effective_depth_kl") for s in
                                         tp.seeds[p]]) for p in ("pre", "post")},
         "matched_pair": tp.pair.to_json()},
        figs, note=tp.pair.note())


CLAIM = CLAIM.bind(measure)
