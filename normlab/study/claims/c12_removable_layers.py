"""C12: deep pre-LN layers are removable
-------------------------------------

Drop-cost curve of one model: ``d_t``, the increase of the model's own next-token loss on the
validation text when block ``t`` is skipped (``normlab.probe.interventions.layer_drop`` for
normlab models; the same measurement, ``drop_scan``, for Hugging Face ones). The first and the
last block are reported apart and left out of the statistic: in every model they cost the most
(the first turns embeddings into a stream, the last writes the output), whatever the placement.

Statistic per model (:func:`drop_cost_profile`): the *deep-half drop cost*, the mean of ``d_t``
in nats over the deep interior blocks (relative depth ``(t + 0.5) / L`` above 0.5, the last
block apart: for 12 blocks, blocks 7-11 of 12, the deeper half C2 and C3 read). It is a loss
difference, so it is defined for every model whose curve is finite, and a seed whose deep
blocks cost nothing, or whose removal *lowers* the loss, is kept: that is the claim's strongest
case. (The former statistic, the depth slope of ``d_t / median(d_interior)``, divided by a
median that is 0.0005-0.004 nats in a trained Pre-LN, went to -95 or was undefined when the
median fell to 0 or below; it is still reported per model, never decided on.)

Margin (``DROP_MARGIN``): the sources name no size ("minimal degradation of performance",
Gromov et al.; pre-LN LLMs "lose little", Curse of Depth as docs/reference.md gives it), so the
study's fixed margin for "comparable" loss is used, 0.02 nats, about 1% of the 2.0-2.6 nats
these models reach (docs/study.md, Margins, fixed editions before these runs): removing a
block that costs less leaves a model comparable to the whole one, and a post - pre difference
smaller than that is a difference between two removals that both leave the model comparable.
It is a per-block margin: Gromov et al. remove a contiguous deep half at once (and heal it),
which this per-block scan does not do.

Predictions, per seed (paired by seed), 95% t-intervals (:func:`decide_c12`, the study's common
rules over :func:`c12_predictions`):

- pre: deep-half drop cost, non-inferiority at 0.02 (supported if the interval's upper end
  lies below 0.02, not supported if its lower end lies at or above it);
- post vs pre: deep-half drop cost, post - pre, above 0.02 (supported if the whole interval
  lies above 0.02, not supported if it lies at or below);
- post (diagnostic, never decides): post's own deep-half cost above 0.02;
- post vs pre at init (diagnostic): the same contrast on each run's own model at step 0 (its
  config and seed, before any update). A contrast that is already there at init is said to be
  architectural, not learned (the note says so); it does not change the verdict, which is about
  the trained models the sources prune.

The claim is ``supported`` when both claim predictions are, ``not supported`` when either is
not, ``inconclusive`` otherwise (fewer than 2 pairs, an interval across a line).

The real checkpoints (MiniLM: post-LN BERT, 6 blocks; SmolLM2-135M: pre-RMSNorm Llama, 30
blocks) are reported with the same per-model numbers as an illustration only: they differ in
size, depth, objective, data, tuning and quantization, so no verdict rests on them. MiniLM has
no LM head, so its curve is the change of the final hidden state (1 - cos), not a loss. Stream
means of real models leave position 0 out (`normlab.interop.probe_hf.stream_norms`).

Checkpoints come as :class:`Pretrained` records, paired by seed at matched loss
(:func:`normlab.study.claims.common.matched_pairs`, whose doc states the pairing).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from normlab.study.claims.common import (
    COMPARABLE,
    NEAR_IDENTICAL,
    _above,
    _below,
    _detectable,
    _interval,
    late_angle,
    matched_pairs,
    near_identical_premise,
    not_tested_note,
)
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import StudyContext
from normlab.study.schema import PRE_POST, ClaimResult, Pretrained
from normlab.study.verdict import NOT_TESTED, combine, decide

# "Minimal degradation" / "lose little", per deep block (module doc, Margin)
DROP_MARGIN = COMPARABLE
_SRC = ("Gromov et al. ('minimal degradation of performance') and Curse of Depth ('lose "
        f"little') give no size per block: {DROP_MARGIN:g} nats, the study's margin for a "
        "comparable loss (about 1% of the loss these models reach; docs/study.md, Margins)")
_COST = "deep-half drop cost (nats): mean loss increase when one deep interior block is skipped"



@dataclass(frozen=True)
class Settings:
    """C12's own sizes."""

    # real checkpoints (the illustration): passages of text probed; 0: not probed
    real_passages: int = 4
    c12_min_pairs: int = 3  # matched pairs the design asks for


# each profile's
SETTINGS = {"tiny": Settings(real_passages=1), "quick": Settings(real_passages=0),
            "standard": Settings(real_passages=8), "long": Settings(real_passages=8),
            "gpu": Settings(real_passages=8), "full": Settings(real_passages=64)}

CLAIM = Claim(
    id="C12", title="Deep Pre-LN layers are removable",
    statement="In pre-LN models deep layers can be removed at little cost (consecutive deep "
              "layers are close); in post-LN models they cannot.",
    source="Sun et al. 2025, Curse of Depth (2502.05795); Gromov et al. 2024 (2403.17887)",
    quote="minimal degradation of performance until after a large fraction (up to half) of the "
          "layers are removed (Gromov et al.)",
    setting="trained Pre-LN LLMs of 30 layers and more (Llama-2, Qwen, Mistral); post-LN BERT",
    paper="",
    trains=(("pre", True), ("post", True)),
    settings_class=Settings, per_profile=SETTINGS,
    needs=("pre and post models deep enough that pre's deeper half is near-identical (angular "
           f"distance below {NEAR_IDENTICAL:g}), both trained past their warmup to a matched "
           "loss in at least the design's number of seeds (at this width, a deep Post-LN needs "
           "an lr grid below where it stalls and a longer run)"),
    predictions=(
        near_identical_premise("of the deep pre models at their matched checkpoints"),
        PredictionSpec("trained pairs", "matched pre/post pairs of trained checkpoints (both "
                       "past warmup, within the match tolerance, deep-half drop cost finite)",
                       "Gromov et al. and Curse of Depth prune trained models",
                       Rule("setting", ">=", origin="the design's c12_min_pairs pairs of "
                                                    "trained models: the sources prune trained "
                                                    "models, and a checkpoint inside warmup is "
                                                    "not one"),
                       role="premise", scale=True),
        PredictionSpec("pre", _COST,
                       "Gromov et al.: 'minimal degradation of performance' when deep layers "
                       "of pre-LN LLMs are removed",
                       Rule("non_inferiority", ">", margin=DROP_MARGIN, origin=_SRC)),
        PredictionSpec("post vs pre", f"{_COST}: post - pre",
                       "post-LN BERT: every block carries weight",
                       Rule("direction", ">", DROP_MARGIN, meaningful=DROP_MARGIN,
                            origin=_SRC)),
        PredictionSpec("post", _COST, "post-LN: deep blocks are not cheap to remove (reported)",
                       Rule("direction", ">", DROP_MARGIN, meaningful=DROP_MARGIN, origin=_SRC),
                       role="diagnostic"),
        PredictionSpec("post vs pre at init", f"{_COST}: post - pre, each run's model at step 0",
                       "a contrast already present at init is architectural, not learned "
                       "(reported)",
                       Rule("direction", ">", DROP_MARGIN, meaningful=DROP_MARGIN, origin=_SRC),
                       role="diagnostic"),
    ),
)


# -- C12 ------------------------------------------------------------------------------------------

def drop_cost_profile(costs: Sequence[float]) -> dict[str, Any]:
    """The per-model numbers of C12's design from one drop-cost curve (block 0 first).

    Returns ``first``, ``last``, ``interior`` (blocks 1..L-2), ``deep_blocks`` and
    ``deep_cost`` (the statistic: the mean cost of the interior blocks of relative depth above
    0.5; None only for a non-finite cost or no deep interior block, with ``why_undefined``),
    and, reported only, ``median_interior``, ``depth_slope`` (of ``d_t / median``; None when
    the median interior cost is <= 0 or there are fewer than 3 interior blocks) and
    ``removable_share`` (deep interior blocks costing less than half that median).
    """
    # a cached curve keeps a diverged model's cost as None (JSON has no NaN): non-finite
    d = [math.nan if c is None else float(c) for c in costs]
    L = len(d)
    deep = [t for t in range(1, L - 1) if (t + 0.5) / L > 0.5]
    out: dict[str, Any] = {"n_blocks": L, "costs": d, "first": d[0] if d else None,
                           "last": d[-1] if L > 1 else None, "interior": d[1:-1],
                           "deep_blocks": [t + 1 for t in deep], "deep_cost": None,
                           "median_interior": None, "depth_slope": None,
                           "removable_share": None, "why_undefined": None}
    if not all(math.isfinite(v) for v in d):
        out["why_undefined"] = "a non-finite drop cost"
        return out
    if not deep:
        out["why_undefined"] = f"no deep interior block in {L} blocks"
        return out
    out["deep_cost"] = sum(d[t] for t in deep) / len(deep)
    interior = list(range(1, L - 1))
    if len(interior) < 3:
        return out
    med = statistics.median(d[t] for t in interior)
    out["median_interior"] = med
    if med <= 0:  # the slope's unit is gone; the deep cost above stands
        return out
    x = [(t + 0.5) / L for t in interior]
    y = [d[t] / med for t in interior]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxx = sum((a - mx) ** 2 for a in x)
    out["depth_slope"] = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sxx
    out["removable_share"] = sum(d[t] < 0.5 * med for t in deep) / len(deep)
    return out


def decide_c12(costs: Mapping[str, Sequence[float]],
               init: Mapping[str, Sequence[float]] | None = None) -> dict[str, Any]:
    """C12's decision on per-seed deep-half drop costs in nats, ``costs[placement][k]`` paired
    by k (``init``: the same at step 0, reported beside them): the common rules
    (`normlab.study.verdict.combine`) over :func:`c12_predictions`, with the intervals and the
    reason in words."""
    pre, post = list(costs["pre"]), list(costs["post"])
    if len(pre) != len(post):
        raise ValueError("decide_c12 needs the same number of pre and post costs (paired)")
    preds = c12_predictions(costs, init)
    diff = [b - a for a, b in zip(pre, post, strict=True)]
    m = DROP_MARGIN
    _, effect = decide(diff, ">", m, name="deep-half drop cost (nats): post - pre")
    ci = {"pre": _interval(pre), "post": _interval(post), "post - pre": _interval(diff)}
    verdict = combine(preds)
    if len(diff) < 2:
        reason = f"{len(diff)} matched pair(s); at least 2 are needed for an interval"
    elif verdict == "supported":
        reason = (f"pre's deep blocks cost less than {m:g} nats to drop, and post's more than "
                  f"pre's by more than {m:g}")
    elif verdict == "not supported":
        reason = (f"pre's deep blocks cost {m:g} nats or more to drop"
                  if _above(ci["pre"], m, strict=False)
                  else f"post's deep blocks do not cost {m:g} nats more than pre's")
    else:
        reason = f"an interval includes {m:g} nats: too few seeds for an effect of this size"
    if init is not None:
        d0 = [b - a for a, b in zip(init["pre"], init["post"], strict=True)]
        ci["post - pre at init"] = _interval(d0)
        if _above(ci["post - pre at init"], m):
            reason += (f"; the contrast is present at init (post - pre above {m:g} nats at "
                       "step 0): architectural, not learned")
        elif _below(ci["post - pre at init"], m, strict=False):
            reason += f"; at init the contrast is absent (at or below {m:g} nats): learned"
    return {"verdict": verdict, "reason": reason, "effect": effect, "intervals": ci,
            "smallest_detectable": _detectable(ci["post - pre"]),
            "predictions": preds,
            "rule": (f"supported if the upper end of the 95% interval of pre's deep-half drop "
                     f"cost lies below {m:g} nats and the interval of [post - pre] lies above "
                     f"{m:g}; not supported if pre's lower end lies at or above {m:g} or the "
                     f"difference's interval at or below it; otherwise inconclusive; post's own "
                     "cost and the contrast at init are reported (deep-half drop cost: mean "
                     "loss increase over the interior blocks past relative depth 0.5; seeds as "
                     "units, every seed with a finite curve kept)")}


def c12_predictions(costs: Mapping[str, Sequence[float]],
                    init: Mapping[str, Sequence[float]] | None = None) -> list[Any]:
    """C12's predictions as rows of the verdict table, each with its own verdict: pre's
    deep-half cost below the margin and post - pre above it decide; post's own cost and the
    contrast at init (when ``init`` is given) are diagnostics."""
    pre, post = list(costs["pre"]), list(costs["post"])
    rows = [CLAIM.predict("pre", pre),
            CLAIM.predict("post vs pre", [b - a for a, b in zip(pre, post, strict=True)]),
            CLAIM.predict("post", post)]
    if init is not None:
        rows.append(CLAIM.predict("post vs pre at init", [
            b - a for a, b in zip(init["pre"], init["post"], strict=True)]))
    return rows


def _checkpoint_on(run_dir: Path, batches: Sequence[Any], step: int | None, at_init: bool,
                   device: str) -> tuple[Any, Any, list]:
    """A run's model (its last checkpoint, a kept ``step``, or with ``at_init`` its own model at
    step 0: `normlab.study.experiments.model_at_init`) on ``device``, with ``batches`` cut to
    its context and moved there: ``(cfg, model, batches)``."""
    from normlab.probe.inputs import on_device
    from normlab.train import load_trained_model, read_run_config

    if at_init:
        from normlab.study.experiments import model_at_init

        cfg, model = read_run_config(Path(run_dir)), model_at_init(Path(run_dir))
    else:
        cfg, model = load_trained_model(run_dir, step=step)
    seq = cfg.model.max_seq_len
    model, moved = on_device(model, [(x[:, :seq], y[:, :seq]) for x, y in batches], device)
    return cfg, model, moved


def own_drop_curve(run_dir: Path, batches: Sequence[Any], step: int | None = None, *,
                   at_init: bool = False, device: str = "cpu") -> dict[str, Any]:
    """Drop-cost curve (``layer_drop``'s ``drop_dloss``) of a trained run, at its last
    checkpoint or at a ``step`` whose weights it kept; with ``at_init``, of the run's own model
    at step 0; measured on ``device``."""
    from normlab.probe.interventions import layer_drop

    cfg, model, batches = _checkpoint_on(run_dir, batches, step, at_init, device)
    return {"drop_dloss": layer_drop(model, batches)["drop_dloss"],
            "n_blocks": cfg.model.n_blocks}


def own_late_angle(run_dir: Path, batches: Sequence[Any], step: int | None = None, *,
                   device: str = "cpu") -> float:
    """Mean angular distance between consecutive blocks over the deeper half
    (`common.late_angle`) of a trained run at its last checkpoint or a kept ``step``, on
    ``device``: C12's premise reads it on pre's matched checkpoints."""
    from normlab.probe import probe_model

    _cfg, model, batches = _checkpoint_on(run_dir, batches, step, False, device)
    return late_angle(probe_model(model, batches, ("stream",))["per_block"])


def c12_own_models(ctx: StudyContext, checkpoints: Sequence[Pretrained], *,
                   tolerance: float | None = None, trained_from: int = 0) -> dict[str, Any]:
    """C12's decision on normlab's own pre and post models (12-24 blocks) at matched loss.

    ``checkpoints``: one :class:`Pretrained` per placement and seed. Every checkpoint's
    drop-cost curve, and that of its run's model at step 0, is measured on the study's probe
    batches (cached per run folder), the per-model numbers of :func:`drop_cost_profile`
    computed, and matched pairs decided by :func:`decide_c12`; a pair with a checkpoint taken
    before step ``trained_from`` (inside warmup: not yet a trained model) is left out, and so
    is a pair whose deep-half cost is undefined (a non-finite curve), never one whose deep
    blocks cost nothing. Returns the decision with ``per_seed`` numbers and ``left_out``."""
    tol = ctx.profile.match_tolerance if tolerance is None else tolerance
    pairs, left_out = matched_pairs(checkpoints, tol)
    for seed in [s for s, sides in pairs.items()
                 if any(c.step is not None and c.step < trained_from for c in sides.values())]:
        steps = ", ".join(f"{p} step {c.step}" for p, c in pairs.pop(seed).items())
        left_out.append(f"seed {seed}: matched only inside warmup ({steps}; warmup "
                        f"{trained_from} steps)")
    batches = ctx.probe_batches()
    per_seed: dict[int, dict[str, Any]] = {}
    costs: dict[str, list[float]] = {p: [] for p in PRE_POST}
    init: dict[str, list[float]] = {p: [] for p in PRE_POST}
    angles: list[float] = []  # pre's deeper-half angular distance, per kept pair
    for seed, sides in pairs.items():
        row = {}
        for p, c in sides.items():
            name = Path(c.run_dir).name
            at = "" if c.step is None else f"_step{c.step}"
            curve = ctx.cached(f"c12_drop_{name}{at}", lambda c=c: own_drop_curve(
                Path(c.run_dir), batches, c.step, device=ctx.device))
            curve0 = ctx.cached(f"c12_drop_{name}_init", lambda c=c: own_drop_curve(
                Path(c.run_dir), batches, at_init=True, device=ctx.device))
            row[p] = drop_cost_profile(curve["drop_dloss"]) | {
                "val_loss": c.val_loss, "run_id": name, "step": c.step,
                "init": drop_cost_profile(curve0["drop_dloss"])}
            if p == "pre":  # the premise: is pre's deeper half near-identical?
                row[p]["late_angle"] = ctx.cached(f"c12_angle_{name}{at}", lambda c=c: (
                    own_late_angle(Path(c.run_dir), batches, c.step, device=ctx.device)))
        per_seed[seed] = row
        undefined = [p for p in PRE_POST if row[p]["deep_cost"] is None]
        if undefined:
            left_out.append(f"seed {seed}: " + "; ".join(
                f"{p} {row[p]['why_undefined']}" for p in undefined))
            continue
        for p in PRE_POST:
            costs[p].append(row[p]["deep_cost"])
            init[p].append(row[p]["init"]["deep_cost"])
        angles.append(row["pre"]["late_angle"])
    init_ok = all(v is not None for p in PRE_POST for v in init[p])
    decision = decide_c12(costs, init if init_ok else None)
    return decision | {"per_seed": per_seed, "left_out": left_out, "deep_costs": costs,
                       "init_deep_costs": init if init_ok else None, "tolerance": tol,
                       "pre_late_angles": angles}


def c12_real_models(ctx: StudyContext) -> dict[str, Any]:
    """The two real checkpoints' per-model numbers (illustration; no verdict rests on them).
    Raises the interop's CheckpointNotFound / MissingDependency when they cannot be loaded."""
    from normlab.interop import run_hf_probe

    p = ctx.profile
    out = {}
    for name in ("minilm", "smollm2"):
        def compute(name: str = name) -> dict:
            ctx.log(f"probing the real checkpoint {name}")
            return run_hf_probe(name, n_batches=CLAIM.settings(p).real_passages, batch_size=2,
                                seq_len=64, figures=False)
        res = ctx.cached(f"real_v2_{name}", compute)
        drop = res["drop"]
        cost_kind = "drop_dloss" if drop.get("drop_dloss") else "drop_hidden_cos"
        pb = res["per_block"]
        out[name] = {
            "model": {k: res["model"].get(k) for k in ("family", "placement", "norm",
                                                       "n_blocks", "d_model", "objective")},
            "drop_cost": cost_kind, "profile": drop_cost_profile(drop[cost_kind]),
            "hidden_profile": drop_cost_profile(drop["drop_hidden_cos"]),
            "stream_norm": pb["norm"], "stream_norm_median": pb.get("norm_median"),
            "stream_norm_position0": pb.get("norm_first"),
            "stream_norm_all_positions": pb.get("norm_all"),
            "growth_exponent": res["summary"].get("growth_exponent"),
            "growth_exponent_all_positions": res["summary"].get(
                "growth_exponent_all_positions"),
            "ang_prev": pb["ang_prev"], "loss": res["summary"].get("loss"), "_raw": res}
    return out


def measure(ctx: StudyContext, checkpoints: Sequence[Pretrained] | None = None
            ) -> ClaimResult:
    from normlab.interop import CheckpointNotFound, MissingDependency

    title, statement, source = CLAIM.title, CLAIM.statement, CLAIM.source
    numbers: dict[str, Any] = {}
    figures: list[str] = []
    notes = []
    real = None
    if not CLAIM.settings(ctx.profile).real_passages:
        notes.append("real checkpoints not probed: this profile reads no passages of them "
                     "(real_passages 0; the standard profile probes them)")
    else:
        try:
            real = c12_real_models(ctx)
        except (CheckpointNotFound, MissingDependency) as e:  # no checkpoint, or no hf extra
            notes.append(f"real checkpoints not probed: {e}")
    if real is not None:
        from normlab.interop.figures import comparison_figure

        fig = comparison_figure([r["_raw"] for r in real.values()],
                                ctx.fig_dir / "c12_real_models.svg")
        figures += [str(fig.relative_to(ctx.out))] if fig else []
        numbers["real_models_illustration"] = {n: {k: v for k, v in r.items() if k != "_raw"}
                                               for n, r in real.items()}
    own = list(ctx.c12_checkpoints() if checkpoints is None else checkpoints)
    grids = {pl: ctx.deep_grid(pl) for pl in ("pre", "post")} if own else {}
    if own and all(grids.values()):  # the lr each placement's deep models were tuned to
        numbers["deep_tuned"] = {
            pl: {"lr": g.best_lr, "bracketed": g.bracketed, "extensions": list(g.extensions),
                 "all_stalled": g.all_stalled,
                 "mean_score": {str(k): v for k, v in g.mean_score.items()}}
            for pl, g in grids.items() if g is not None}
    method = ("normlab's own pre and post models (12-24 blocks, each placement tuned on its "
              "own lr grid at that depth), paired by seed at matched "
              "validation loss along their training trajectories (each run keeps its weights "
              "at every evaluation; the most trained pair of checkpoints within the tolerance "
              "is compared): each block skipped in turn, its drop cost the "
              "increase of next-token loss on validation text; per model the deep-half drop "
              "cost, the mean drop cost in nats of the interior blocks past relative depth "
              "0.5 (first and last block apart), every seed kept; the same on each run's own "
              "model at step 0, reported beside it. Real checkpoints (MiniLM post-LN, SmolLM2 "
              "pre-RMSNorm) shown with the same numbers as an illustration only: they differ "
              "in far more than the placement.")
    if not own:
        why = ("this profile trains no deep (12-24-block) models; the standard profile does"
               if ctx.profile.deep_blocks == 0
               else "the study provided no matched pre/post models for C12")
        note = "; ".join(notes + [why])
        return ClaimResult(id="C12", title=title, statement=statement, source=source,
                           method=method, verdict="not run", rule="", numbers=numbers,
                           figures=figures, note=note)
    res = c12_own_models(ctx, own, trained_from=ctx.profile.deep_warmup)
    numbers |= {"own_models": {k: res[k] for k in ("per_seed", "left_out", "deep_costs",
                                                   "init_deep_costs", "intervals",
                                                   "tolerance", "pre_late_angles")},
                "smallest_detectable": res["smallest_detectable"], "reason": res["reason"],
                "pairs": len(res["deep_costs"]["pre"])}
    wanted = CLAIM.settings(ctx.profile).c12_min_pairs
    outcomes = {pl: [c.outcome for c in own if c.placement == pl] for pl in PRE_POST}
    stalled = [pl for pl, out in outcomes.items()
               if out and all(o in ("stalled", "diverged") for o in out)]
    if stalled:  # a result to report: no model of that side trained, so nothing is compared
        notes.append(f"{' and '.join(stalled)} stalled or diverged in every seed at its tuned "
                     "lr: no pair to compare")
    n_pairs = len(res["deep_costs"]["pre"])
    if n_pairs < wanted:
        notes.append(f"{n_pairs} matched pair(s) of trained checkpoints along the trajectories, "
                     f"fewer than the {wanted} the design asks for")
    premises = [CLAIM.predict("near-identical blocks", res["pre_late_angles"]),
                CLAIM.predict("trained pairs", [n_pairs], threshold=wanted)]
    predictions = premises + list(res["predictions"])
    verdict = combine(predictions)
    if verdict == NOT_TESTED:
        notes.append(not_tested_note([q.subject for q in premises
                                      if q.verdict == "not supported"], CLAIM.needs))
    return ClaimResult(
        id="C12", title=title, statement=statement, source=source, method=method,
        verdict=verdict, effect=res["effect"], numbers=numbers,  # type: ignore[arg-type]
        rule="; ".join([*(f"{q.subject} (premise): {q.rule}" for q in premises), res["rule"]]),
        predictions=[q.to_dict() for q in predictions],
        needs=CLAIM.needs if verdict == NOT_TESTED else "",
        figures=figures, note="; ".join([res["reason"], *notes]), stalled=stalled,
        caveat="Small byte-level models trained briefly on a CPU; the real checkpoints are "
               "one per placement and differ in size, objective, data and quantization.")



def deep_families(_profile: Any) -> tuple[str, ...]:
    """C12's pairs: pre and post at the deep models' depth."""
    return PRE_POST


CLAIM = CLAIM.bind(measure, deep_grids=deep_families)
