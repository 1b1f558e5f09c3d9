"""C2: under Pre-Norm, consecutive blocks' streams become near-identical with depth; under
Post-Norm they stay apart (the seed argument; Curse of Depth; Gromov et al. 2024)."""

from __future__ import annotations

from typing import Any

from normlab.probe import figures as probe_figures
from normlab.probe.fits import mean_ci
from normlab.study.claims.common import (
    MATCHED,
    NEAR_IDENTICAL,
    NEAR_IDENTICAL_WHY,
    NO_SIZE,
    SAME_LR_WHY,
    _late_mean,
    _rel,
    _seed_mean_curves,
    _trained,
    claim_result,
    late_angle,
    matched_gap,
    probed_deep,
    same_lr_words,
    slope_over_depth,
)
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import StudyContext
from normlab.study.schema import ClaimResult

CLAIM = Claim(
    id="C2", title="Pre-Norm's consecutive blocks become near-identical",
    statement="Under Pre-Norm the angular distance between consecutive blocks' streams falls "
              "with depth; under Post-Norm it stays high.",
    source="Seed argument; Curse of Depth (2502.05795); Gromov et al. 2024 (angular distance)",
    quote="x_{t+1} = x_t + F_t(Norm(x_t)) ... when t is large, x_{t+1} and x_t are very close "
          "(the seed); the angular distance of deep consecutive layers falls below 0.2 (Curse "
          "of Depth)",
    setting="trained Pre-LN LLMs of 30 layers and more (Curse of Depth: DeepSeek-7B, LLaMA)",
    paper="Gromov et al. / Curse of Depth: in pre-LN LLMs the angular distance of deep "
          "consecutive layers falls below 0.2 (DeepSeek-7B after layer 18).",
    trains=(("pre", True), ("post", True)),
    # no premise about depth: the seed's mechanism (a relative update falling like 1/sqrt(t))
    # predicts both directions at every depth, graded; the sources' level is a diagnostic
    predictions=(
        MATCHED,
        PredictionSpec(
            "pre", "slope of angular distance(x_l, x_{l+1}) over relative depth",
            "Curse of Depth: falls with depth (< 0.2 in deep layers of pre-LN LLMs)",
            Rule("direction", "<", 0.0,
                 origin="Curse of Depth gives a level (< 0.2 in 30-layer LLMs), not a slope: "
                        + NO_SIZE)),
        PredictionSpec(
            "post vs pre", "late angular distance(post) - late(pre)",
            "seed argument: post's consecutive blocks stay apart",
            Rule("direction", ">", 0.0, origin="the seed argument: " + NO_SIZE)),
        PredictionSpec(
            "pre, deeper half", "late angular distance(pre): mean over the deeper half",
            f"Curse of Depth: below {NEAR_IDENTICAL:g} in deep layers of 30-layer pre-LN LLMs "
            "(a level in their setting: reported)",
            Rule("direction", "<", NEAR_IDENTICAL, origin=NEAR_IDENTICAL_WHY),
            role="diagnostic"),
        PredictionSpec(
            "post vs pre, same lr and step", "late angular distance(post) - late(pre), both "
            "trained at one lr and read at their last step", SAME_LR_WHY,
            Rule("direction", ">", 0.0, origin="the seed argument: " + NO_SIZE),
            role="diagnostic"),
    ),
)


def measure(ctx: StudyContext) -> ClaimResult:
    tp, missing = _trained(ctx, CLAIM.id, CLAIM.title)
    if missing:
        return missing
    ang = {p: [s.per_block["ang_prev"][1:] for s in tp.seeds[p]] for p in ("pre", "post")}
    slope_pre = [slope_over_depth(a) for a in ang["pre"]]
    late = {p: [_late_mean(a) for a in v] for p, v in ang.items()}
    predictions = [
        CLAIM.predict("matched loss", matched_gap(tp.pair), threshold=ctx.profile.match_tolerance),
        CLAIM.predict("pre", slope_pre),
        CLAIM.predict("post vs pre",
                      [b - a for a, b in zip(late["pre"], late["post"], strict=True)]),
        CLAIM.predict("pre, deeper half", late["pre"]),
    ]
    at_init = ctx.init_probes()
    init = {p: [late_angle(s.per_block) for s in at_init.seeds[p]] for p in ("pre", "post")}
    change = {p: [a - b for a, b in zip(late[p], init[p], strict=True)] for p in ("pre", "post")}
    same = ctx.same_lr_probes()
    numbers: dict[str, Any] = {}
    if same.found:
        late_same = {p: [late_angle(s.per_block) for s in same.seeds[p]] for p in ("pre", "post")}
        predictions.append(CLAIM.predict("post vs pre, same lr and step", [
            b - a for a, b in zip(late_same["pre"], late_same["post"], strict=True)]))
        numbers["late_angle_same_lr"] = {p: mean_ci(v) for p, v in late_same.items()}
    curves = _seed_mean_curves(ctx, tp, ("ang_prev",))
    result = claim_result(
        CLAIM,
        "Angular distance arccos(cos)/pi between the streams after blocks l and l+1 (blocks 2 to "
        "L; block 1 is compared with the embedding), on trained checkpoints at matched loss, per "
        "seed; the deeper half's mean for the comparison. What training changed is reported as "
        "trained minus each run's own model at step 0 (the value at init restates C1); the "
        "contrast is also read on pre and post trained at one lr and read at their last step "
        "(a diagnostic).",
        predictions,
        {"late_angle_trained": {p: mean_ci(v) for p, v in late.items()},
         "late_angle_trained_minus_init": {p: mean_ci(v) for p, v in change.items()},
         "late_angle_init": {p: mean_ci(v) for p, v in init.items()},
         "matched_pair": tp.pair.to_json(), **numbers,
         "same_lr_pair": same.pair.to_json()},
        _rel(ctx, probe_figures.plot_per_block(curves, "ang_prev", ctx.fig_dir / "c2_angle.svg")),
        note=tp.pair.note())
    # after the verdict's own words: the same-lr pair is a diagnostic beside them
    result.note = " ".join(x for x in (result.note, same_lr_words(same.pair)) if x)
    return result


CLAIM = CLAIM.bind(measure, deep_grids=probed_deep)
