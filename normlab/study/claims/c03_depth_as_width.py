"""C3: under Pre-LN, depth acts like width: running block t+1 on block t's input changes the
model little for deep t (the seed argument; Curse of Depth).

Statistic per model: over the deeper half of the pairs (t, t+1), the mean merge KL (KL of the
output distribution, original || block t+1 run on block t's branch inputs) divided by the mean
drop KL of block t+1 (original || block t+1 skipped): the share of what the deep blocks do that
the merge loses. A ratio of means, so one denominator per model.

Minimum denominator (``MIN_DROP_KL``), fixed before the runs that use it: 0.02 nats, the study's
margin for a comparable loss (docs/study.md, Margins). KL(original || dropped) in nats is the
increase of the expected log-loss, under the model's own predictions, when the block is
skipped; below 0.02 the block does no work the study resolves, and "the merge cost in units of
what block t+1 does" is noise over noise (a trained 12-block Pre-LN's deep drop KL is about
0.001). So the ratio is computed only for a model whose late drop KL is at least 0.02, and the
premise *drop cost* (every probed model's late drop KL >= 0.02, checked exactly) must hold for
the claim to be decided: where it does not, C3 is inconclusive and the note names the models.

Premise *near-identical blocks* (about scale; `common.near_identical_premise`): the seed derives
the merge from consecutive deep blocks being very close, so C3 is decided only where pre's
deeper half is near-identical (its mean consecutive angular distance below 0.2 on its 95%
interval, Curse of Depth's level); where it lies above, C3 is not tested at this scale.

Init: the same numbers on each run's own model at step 0 (`StudyContext.init_probes`), reported
beside the trained ones with the contrast at init as a diagnostic; a contrast already there at
init is said to be architectural, not learned (the note), and does not change the verdict.
"""

from __future__ import annotations

import math
from typing import Any

from normlab.probe import figures as probe_figures
from normlab.probe.fits import mean_ci
from normlab.study.claims.common import (
    COMPARABLE,
    MATCHED,
    NEAR_IDENTICAL_NEEDS,
    NO_SIZE,
    SAME_LR_WHY,
    _late_mean,
    _rel,
    _seed_mean_curves,
    _trained,
    claim_result,
    late_angle,
    matched_gap,
    near_identical_premise,
    probed_deep,
    same_lr_words,
)
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import StudyContext
from normlab.study.schema import ClaimResult

# the smallest late drop KL a ratio is computed over (module doc)
MIN_DROP_KL = COMPARABLE
_MIN_WHY = (f"the design: {MIN_DROP_KL:g} nats, the study's margin for a comparable loss "
            "(docs/study.md, Margins): a drop KL below it is a block whose removal the study "
            "does not resolve, no unit for the merge cost")
_RATIO = "log(late merge KL / drop KL, post) - log(same, pre)"

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
    needs=NEAR_IDENTICAL_NEEDS,
    predictions=(
        near_identical_premise("of the probed models"),
        MATCHED,
        PredictionSpec(
            "drop cost", "late drop KL: mean over the deeper half of KL(original || block t+1 "
            "dropped), each probed model (nats)",
            "the ratio's denominator: the merge cost is measured in units of what the block does",
            Rule("setting", ">=", MIN_DROP_KL, origin=_MIN_WHY), role="premise"),
        PredictionSpec(
            "post vs pre", _RATIO,
            "seed argument: block t+1 run on block t's input acts like a wider layer under pre "
            "(its merge changes little of what the block does), not under post",
            Rule("direction", ">", 0.0,
                 origin="the seed argument ('very close', 'approximately like a single, wider "
                        "layer'): " + NO_SIZE)),
        PredictionSpec(
            "post vs pre at init", _RATIO + ", each run's model at step 0",
            "a contrast already present at init is architectural, not learned (reported)",
            Rule("direction", ">", 0.0, origin=NO_SIZE), role="diagnostic"),
        PredictionSpec(
            "post vs pre, same lr and step", _RATIO + ", both trained at one lr and read at "
            "their last step", SAME_LR_WHY,
            Rule("direction", ">", 0.0, origin=NO_SIZE), role="diagnostic"),
    ),
)


def late_drop_kl(per_block: dict[str, Any]) -> float:
    """The ratio's denominator: mean of drop_kl[t+1] over the deeper half of the pairs."""
    return _late_mean(per_block["drop_kl"][1:])


def merge_per_drop(per_block: dict[str, Any]) -> float:
    """Late mean merge KL of the pairs (t, t+1) over their late mean drop KL of block t+1: the
    merge cost in units of what the deep blocks do; nan where that drop KL is below
    ``MIN_DROP_KL`` (not computed: module doc)."""
    drop = late_drop_kl(per_block)
    return _late_mean(per_block["merge_kl"]) / drop if drop >= MIN_DROP_KL else math.nan


def _contrast(ratio: dict[str, list[float]]) -> list[float]:
    """Per seed, log(ratio post / ratio pre), where both ratios are computed and positive."""
    return [math.log(b / a) for a, b in zip(ratio["pre"], ratio["post"], strict=True)
            if a > 0 and b > 0]


def _below_minimum(drop: dict[str, list[float]], when: str) -> str:
    low = [f"{p} seed {k} ({v:.2g})" for p in ("pre", "post")
           for k, v in enumerate(drop[p]) if not v >= MIN_DROP_KL]
    return (f"{when}: the merge/drop ratio is not computed where the late drop KL is below "
            f"{MIN_DROP_KL:g} nats: " + ", ".join(low)) if low else ""


def measure(ctx: StudyContext) -> ClaimResult:
    tp, missing = _trained(ctx, CLAIM.id, CLAIM.title)
    if missing:
        return missing
    n = min(len(tp.seeds["pre"]), len(tp.seeds["post"]))
    seeds = {p: tp.seeds[p][:n] for p in ("pre", "post")}
    kl = {p: [_late_mean(s.per_block["merge_kl"]) for s in v] for p, v in seeds.items()}
    drop_kl = {p: [late_drop_kl(s.per_block) for s in v] for p, v in seeds.items()}
    drop = {p: [_late_mean(s.per_block["drop_dloss"]) for s in v] for p, v in seeds.items()}
    ratio = {p: [merge_per_drop(s.per_block) for s in v] for p, v in seeds.items()}
    predictions = [
        CLAIM.predict("near-identical blocks", [late_angle(s.per_block) for s in seeds["pre"]]),
        CLAIM.predict("matched loss", matched_gap(tp.pair), threshold=ctx.profile.match_tolerance),
        CLAIM.predict("drop cost", drop_kl["pre"] + drop_kl["post"]),
        CLAIM.predict("post vs pre", _contrast(ratio))]
    notes = [tp.pair.note(), _below_minimum(drop_kl, "trained")]
    numbers: dict[str, Any] = {
        "late_merge_per_drop": {p: mean_ci(v) for p, v in ratio.items()},
        "late_merge_kl": {p: mean_ci(v) for p, v in kl.items()},
        "late_drop_kl": {p: mean_ci(v) for p, v in drop_kl.items()},
        "late_drop_dloss": {p: mean_ci(v) for p, v in drop.items()},
        "min_drop_kl": MIN_DROP_KL,
        "effective_depth": {p: mean_ci([s.summary.get("effective_depth_kl") for s in
                                        tp.seeds[p]]) for p in ("pre", "post")},
        "matched_pair": tp.pair.to_json()}
    init = ctx.init_probes()
    runs0 = {p: init.seeds.get(p, ())[:n] for p in ("pre", "post")}
    if all(len(runs0[p]) == n and all("merge_kl" in r.per_block and "drop_kl" in r.per_block
                                      for r in runs0[p]) for p in ("pre", "post")):
        ratio0 = {p: [merge_per_drop(r.per_block) for r in v] for p, v in runs0.items()}
        drop0 = {p: [late_drop_kl(r.per_block) for r in v] for p, v in runs0.items()}
        numbers |= {
            "late_merge_per_drop_init": {p: mean_ci(v) for p, v in ratio0.items()},
            "late_merge_kl_init": {p: mean_ci([_late_mean(r.per_block["merge_kl"]) for r in v])
                                   for p, v in runs0.items()},
            "late_drop_kl_init": {p: mean_ci(v) for p, v in drop0.items()}}
        at_init = CLAIM.predict("post vs pre at init", _contrast(ratio0))
        predictions.append(at_init)
        notes.append(_below_minimum(drop0, "at init"))
        if at_init.verdict == "supported":
            notes.append("the contrast is present at init (post vs pre at step 0 above 0): "
                         "architectural, not learned")
    else:
        notes.append("at init: the init probes carry no merge and drop KLs, so no init value "
                     "is reported")
    same = ctx.same_lr_probes()
    if same.found:
        m = min(len(same.seeds["pre"]), len(same.seeds["post"]))
        ratio_same = {p: [merge_per_drop(s.per_block) for s in same.seeds[p][:m]]
                      for p in ("pre", "post")}
        drop_same = {p: [late_drop_kl(s.per_block) for s in same.seeds[p][:m]]
                     for p in ("pre", "post")}
        predictions.append(CLAIM.predict("post vs pre, same lr and step",
                                         _contrast(ratio_same)))
        numbers |= {"late_merge_per_drop_same_lr": {p: mean_ci(v) for p, v in
                                                    ratio_same.items()},
                    "late_drop_kl_same_lr": {p: mean_ci(v) for p, v in drop_same.items()}}
        notes.append(_below_minimum(drop_same, "same lr and step"))
    numbers["same_lr_pair"] = same.pair.to_json()
    curves = _seed_mean_curves(ctx, tp, ("merge_kl", "drop_dloss"))
    figs = _rel(ctx, probe_figures.plot_per_block(curves, "merge_kl",
                                                  ctx.fig_dir / "c3_merge.svg"))
    figs += _rel(ctx, probe_figures.plot_per_block(curves, "drop_dloss",
                                                   ctx.fig_dir / "c3_drop.svg"))
    result = claim_result(
        CLAIM,
        "On trained checkpoints at matched loss: for the late pairs (t, t+1), KL(original || "
        "merged) of the output distribution when block t+1 reads block t's branch inputs, "
        "averaged over the deeper half, divided by the same half's mean KL(original || block "
        "t+1 dropped), the blocks' own cost: the share of what the deep blocks do that the "
        f"merge loses, computed only where that drop KL is at least {MIN_DROP_KL:g} nats; "
        "effect per seed: log(ratio post / ratio pre). Both raw numbers (merge KL, drop KL and "
        "drop loss) are reported, and the same numbers on each run's model at step 0 and on "
        "pre and post trained at one lr and read at their last step (a diagnostic).",
        predictions, numbers, figs, note="; ".join(x for x in notes if x))
    # after the verdict's own words: the same-lr pair is a diagnostic beside them
    result.note = " ".join(x for x in (result.note, same_lr_words(same.pair)) if x)
    return result


CLAIM = CLAIM.bind(measure, deep_grids=probed_deep)
