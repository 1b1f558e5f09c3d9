"""Claims whose experiments use other parts of normlab: C10 (fine-tuning transfer) and C12
(removable deep layers). Both compare pre and post checkpoints that the study pretrained to
matched validation loss, with seeds as the statistical units; C12 also shows two real
checkpoints as an illustration. The designs below were fixed before any of their runs.

The study hands the checkpoints over as :class:`Pretrained` records: ``c10(ctx)`` calls
``ctx.c10_checkpoints()`` and ``c12(ctx)`` calls ``ctx.c12_checkpoints()`` when the context has
them (or pass ``checkpoints=`` directly). A pair of one pre and one post checkpoint of the same
seed (same data order) is one unit; a pair whose validation losses differ by more than the
tolerance (``profile.match_tolerance``, default 0.05 nats), or with a side that did not train
(outcome ``stalled`` or ``diverged``), is reported and left out of the comparison.

C10: Post-LN transfers better after fine-tuning
-----------------------------------------------

Prediction: fine-tuned on the genre task (:mod:`normlab.data.genre`), a post checkpoint reaches
a higher test accuracy than the pre checkpoint of the same seed and the same pretraining loss.

Design: passages of ``profile.finetune_passage_bytes`` (at least 256) bytes, read in windows of
the pretraining context when they are longer (:class:`normlab.finetune.SequenceClassifier`);
all weights trained, mean pooling. The fine-tuning lr is tuned per placement on a validation
split cut from the end of each play's training region (never on the test passages): the grid
``profile.finetune_lrs`` (default 3e-4, 1e-3, 3e-3), extended x3 beyond an edge that wins (at
most ``profile.finetune_lr_extensions`` times, default 2; recorded); the lr with the best mean
validation accuracy over seeds is the placement's, and each seed's test accuracy at that lr is
its result. The character-trigram naive Bayes on the same training and test passages is the
baseline.

Transfer baseline: the same architecture fine-tuned from random init (the run's seed) with the
same steps, batch and lr grid. Predictions (:func:`c10_predictions`), 95% t-intervals over
seeds: two *premises* per placement, the model from init learns the task (its test accuracy
above the majority class's share) and pretraining helps (pretrained - from init > 0); and the
test, fine-tuned accuracy post - pre > 0. A premise that does not hold leaves the claim
``inconclusive`` (no transfer was measured, with the numbers); the trigram baseline is context.

C12: deep pre-LN layers are removable
-------------------------------------

Drop-cost curve of one model: ``d_t``, the increase of the model's own next-token loss on the
validation text when block ``t`` is skipped (``normlab.probe.interventions.layer_drop`` for
normlab models; the same measurement, ``drop_scan``, for Hugging Face ones). The first and the
last block are reported apart and left out of the statistic: in every model they cost the most
(the first turns embeddings into a stream, the last writes the output), whatever the placement.

Statistic per model (:func:`drop_cost_profile`): the *depth slope*, the least-squares slope of
``d_t / median(d_interior)`` against relative depth ``(t + 0.5) / L`` over the interior blocks
``t = 1 .. L-2``. Dividing by the model's own median interior cost makes models of different
losses comparable; a negative slope means deeper blocks cost less than the model's typical
block. Reported beside it (not used by the rule): the share of deep interior blocks (relative
depth above 0.5) that cost less than half the median interior cost.

Prediction: pre's depth slope is negative (its deep blocks are the cheap ones); post's is not
(every block carries weight); so slope(post) - slope(pre) > 0.

Rule (:func:`decide_c12`), over seeds (paired by seed), 95% t-intervals:

- ``supported``: the interval of slope(post) - slope(pre) lies above 0, pre's slope interval
  lies below 0, and post's does not lie entirely below 0;
- ``not supported``: the difference's interval lies at or below 0, or pre's slope interval lies
  at or above 0 (pre's deep blocks are not cheaper);
- ``inconclusive`` otherwise (fewer than 2 matched pairs; or both placements' deep blocks
  cheaper, post's less so), with the reason.

The real checkpoints (MiniLM: post-LN BERT, 6 blocks; SmolLM2-135M: pre-RMSNorm Llama, 30
blocks) are reported with the same per-model numbers as an illustration only: they differ in
size, depth, objective, data, tuning and quantization, so no verdict rests on them. MiniLM has
no LM head, so its curve is the change of the final hidden state (1 - cos), not a loss. Stream
means of real models leave position 0 out (`normlab.interop.probe_hf.stream_norms`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from normlab.probe.fits import mean_ci
from normlab.study.experiments import StudyContext
from normlab.study.schema import ClaimResult, Pretrained  # noqa: F401 (re-exported)
from normlab.study.verdict import decide

PLACEMENTS = ("pre", "post")
MATCH_TOLERANCE = 0.05  # nats of validation loss between the two sides of a pair
TRAINED = ("completed",)




# -- pairing by seed at matched loss --------------------------------------------------------------

def matched_pairs(checkpoints: Sequence[Pretrained], tolerance: float = MATCH_TOLERANCE
                  ) -> tuple[dict[int, dict[str, Pretrained]], list[str]]:
    """Pre/post pairs by seed whose validation losses lie within ``tolerance`` and whose runs
    both trained; with the reasons each left-out seed was left out."""
    by_seed: dict[int, dict[str, Pretrained]] = {}
    for c in checkpoints:
        if c.placement not in PLACEMENTS:
            raise ValueError(f"checkpoint placement must be one of {PLACEMENTS}, got "
                             f"{c.placement!r} ({c.run_dir})")
        by_seed.setdefault(c.seed, {})[c.placement] = c
    pairs, left_out = {}, []
    for seed, sides in sorted(by_seed.items()):
        missing = [p for p in PLACEMENTS if p not in sides]
        if missing:
            left_out.append(f"seed {seed}: no {' or '.join(missing)} checkpoint")
            continue
        bad = [f"{p} {sides[p].outcome}" for p in PLACEMENTS if sides[p].outcome not in TRAINED]
        if bad:
            left_out.append(f"seed {seed}: {', '.join(bad)}")
            continue
        gap = sides["post"].val_loss - sides["pre"].val_loss
        if not math.isfinite(gap) or abs(gap) > tolerance:
            left_out.append(f"seed {seed}: validation loss pre {sides['pre'].val_loss:.3f}, "
                            f"post {sides['post'].val_loss:.3f}, not within {tolerance:g}")
            continue
        pairs[seed] = sides
    return pairs, left_out


def _interval(values: Sequence[float]) -> dict[str, Any]:
    ci = mean_ci(list(values))
    return {"mean": ci["mean"], "ci95": list(ci["ci95"]), "n": ci["n"]}


def _above(ci: Mapping[str, Any], threshold: float = 0.0, strict: bool = True) -> bool:
    low = ci["ci95"][0]
    return ci["n"] >= 2 and math.isfinite(low) and (low > threshold if strict
                                                    else low >= threshold)


def _below(ci: Mapping[str, Any], threshold: float = 0.0, strict: bool = True) -> bool:
    high = ci["ci95"][1]
    return ci["n"] >= 2 and math.isfinite(high) and (high < threshold if strict
                                                     else high <= threshold)


def _detectable(ci: Mapping[str, Any]) -> float | None:
    """The smallest effect this many units could have told from 0: the interval's half-width."""
    low, high = ci["ci95"]
    return (high - low) / 2 if ci["n"] >= 2 and math.isfinite(high - low) else None


# -- C12 ------------------------------------------------------------------------------------------

def drop_cost_profile(costs: Sequence[float]) -> dict[str, Any]:
    """The per-model numbers of C12's design from one drop-cost curve (block 0 first).

    Returns ``first``, ``last``, ``interior`` (blocks 1..L-2), ``median_interior``,
    ``depth_slope`` (the statistic; None when it is undefined: fewer than 3 interior blocks, a
    non-finite cost, or a median interior cost <= 0) and ``removable_share``.
    """
    d = [float(c) for c in costs]
    L = len(d)
    out: dict[str, Any] = {"n_blocks": L, "costs": d, "first": d[0] if d else None,
                           "last": d[-1] if L > 1 else None, "interior": d[1:-1],
                           "median_interior": None, "depth_slope": None,
                           "removable_share": None, "why_undefined": None}
    interior = list(range(1, L - 1))
    if len(interior) < 3 or not all(math.isfinite(v) for v in d):
        out["why_undefined"] = "fewer than 3 interior blocks or a non-finite cost"
        return out
    med = statistics.median(d[t] for t in interior)
    out["median_interior"] = med
    if med <= 0:
        out["why_undefined"] = f"median interior drop cost {med:.3g} <= 0"
        return out
    x = [(t + 0.5) / L for t in interior]
    y = [d[t] / med for t in interior]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxx = sum((a - mx) ** 2 for a in x)
    out["depth_slope"] = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sxx
    deep = [t for t in interior if (t + 0.5) / L > 0.5]
    out["removable_share"] = (sum(d[t] < 0.5 * med for t in deep) / len(deep)) if deep else None
    return out


def decide_c12(slopes: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """C12's rule (module doc) on per-seed depth slopes, ``slopes[placement][k]`` paired by k."""
    pre, post = list(slopes["pre"]), list(slopes["post"])
    if len(pre) != len(post):
        raise ValueError("decide_c12 needs the same number of pre and post slopes (paired)")
    diff = [b - a for a, b in zip(pre, post, strict=True)]
    name = "depth slope of the drop cost: post - pre"
    _, effect = decide(diff, ">", 0.0, name=name)
    ci = {"pre": _interval(pre), "post": _interval(post), "post - pre": _interval(diff)}
    if len(diff) < 2:
        verdict, reason = "inconclusive", f"{len(diff)} matched pair(s); at least 2 are needed"
    elif _below(ci["post - pre"], strict=False):
        verdict, reason = "not supported", "post's slope is not above pre's"
    elif _above(ci["pre"], strict=False):
        verdict, reason = "not supported", "pre's deep blocks are not cheaper than its shallow ones"
    elif _above(ci["post - pre"]) and _below(ci["pre"]) and not _below(ci["post"]):
        verdict, reason = "supported", "pre's deep blocks are cheaper; post's are not"
    elif _above(ci["post - pre"]) and _below(ci["pre"]):
        verdict = "inconclusive"
        reason = "both placements' deep blocks are cheaper, post's less so"
    else:
        verdict = "inconclusive"
        reason = "the intervals include 0: too few seeds for an effect of this size"
    return {"verdict": verdict, "reason": reason, "effect": effect, "intervals": ci,
            "smallest_detectable": _detectable(ci["post - pre"]),
            "rule": ("supported if the 95% interval of [slope(post) - slope(pre)] lies above 0, "
                     "pre's slope interval below 0 and post's not entirely below 0; not "
                     "supported if the difference's interval lies at or below 0 or pre's slope "
                     "interval at or above 0; otherwise inconclusive (slope: drop cost / median "
                     "interior drop cost against relative depth, interior blocks; seeds as "
                     "units)")}


C12_MIN_PAIRS = 3  # matched pairs the design asks for (of the standard profile's 4 seeds)


def c12_predictions(slopes: Mapping[str, Sequence[float]]) -> list[Any]:
    """C12's rule (:func:`decide_c12`) as rows of the verdict table, each with its own verdict:
    pre's depth slope < 0, and slope(post) - slope(pre) > 0 (post's own slope is reported by
    the rule, which also refuses "both decline")."""
    from normlab.study.verdict import predict_direction

    src = ("Gromov et al. ('minimal degradation of performance until after a large fraction "
           "(up to half) of the layers are removed') and Curse of Depth: no size given: decided "
           "at 0, the size reported")
    pre, post = list(slopes["pre"]), list(slopes["post"])
    return [
        predict_direction("pre", "depth slope of drop cost / median interior drop cost",
                          "Curse of Depth: pre-LN LLMs lose little when deep layers are removed",
                          pre, "<", 0.0, 0.0, threshold_source=src),
        predict_direction("post vs pre", "depth slope: post - pre",
                          "post-LN BERT: every block carries weight",
                          [b - a for a, b in zip(pre, post, strict=True)], ">", 0.0, 0.0,
                          threshold_source=src)]


def own_drop_curve(run_dir: Path, batches: Sequence[Any], step: int | None = None
                   ) -> dict[str, Any]:
    """Drop-cost curve (``layer_drop``'s ``drop_dloss``) of a trained run, at its last
    checkpoint or at a ``step`` whose weights it kept."""
    from normlab.probe.interventions import layer_drop
    from normlab.train import load_trained_model

    cfg, model = load_trained_model(run_dir, step=step)
    seq = cfg.model.max_seq_len
    batches = [(x[:, :seq], y[:, :seq]) for x, y in batches]
    return {"drop_dloss": layer_drop(model, batches)["drop_dloss"],
            "n_blocks": cfg.model.n_blocks}


def c12_own_models(ctx: StudyContext, checkpoints: Sequence[Pretrained], *,
                   tolerance: float | None = None) -> dict[str, Any]:
    """C12's decision on normlab's own pre and post models (12-24 blocks) at matched loss.

    ``checkpoints``: one :class:`Pretrained` per placement and seed. Every checkpoint's
    drop-cost curve is measured on the study's probe batches (cached per run folder), the
    per-model numbers of :func:`drop_cost_profile` computed, and matched pairs decided by
    :func:`decide_c12`. Returns the decision with ``per_seed`` numbers and ``left_out``."""
    tol = getattr(ctx.profile, "match_tolerance", MATCH_TOLERANCE) if tolerance is None \
        else tolerance
    pairs, left_out = matched_pairs(checkpoints, tol)
    batches = ctx.probe_batches()
    per_seed: dict[int, dict[str, Any]] = {}
    slopes: dict[str, list[float]] = {p: [] for p in PLACEMENTS}
    for seed, sides in pairs.items():
        row = {}
        for p, c in sides.items():
            at = "" if c.step is None else f"_step{c.step}"
            curve = ctx.cached(f"c12_drop_{Path(c.run_dir).name}{at}",
                               lambda c=c: own_drop_curve(Path(c.run_dir), batches, c.step))
            row[p] = drop_cost_profile(curve["drop_dloss"]) | {
                "val_loss": c.val_loss, "run_id": Path(c.run_dir).name, "step": c.step}
        if any(row[p]["depth_slope"] is None for p in PLACEMENTS):
            left_out.append(f"seed {seed}: " + "; ".join(
                f"{p} {row[p]['why_undefined']}" for p in PLACEMENTS
                if row[p]["depth_slope"] is None))
            per_seed[seed] = row
            continue
        per_seed[seed] = row
        for p in PLACEMENTS:
            slopes[p].append(row[p]["depth_slope"])
    decision = decide_c12(slopes)
    return decision | {"per_seed": per_seed, "left_out": left_out, "slopes": slopes,
                       "tolerance": tol}


def c12_real_models(ctx: StudyContext) -> dict[str, Any]:
    """The two real checkpoints' per-model numbers (illustration; no verdict rests on them).
    Raises the interop's CheckpointNotFound / MissingDependency when they cannot be loaded."""
    from normlab.interop import run_hf_probe

    p = ctx.profile
    out = {}
    for name in ("minilm", "smollm2"):
        def compute(name: str = name) -> dict:
            ctx.log(f"probing the real checkpoint {name}")
            return run_hf_probe(name, n_batches=p.real_passages, batch_size=2, seq_len=64,
                                figures=False)
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


def _checkpoints(ctx: StudyContext, name: str, given: Sequence[Pretrained] | None
                 ) -> list[Pretrained] | None:
    if given is not None:
        return list(given)
    provider: Callable[[], Sequence[Pretrained]] | None = getattr(ctx, name, None)
    return list(provider()) if provider is not None else None


def c12(ctx: StudyContext, checkpoints: Sequence[Pretrained] | None = None) -> ClaimResult:
    from normlab.interop import CheckpointNotFound, MissingDependency

    title = "Deep Pre-LN layers are removable"
    statement = ("In pre-LN models deep layers can be removed at little cost (consecutive deep "
                 "layers are close); in post-LN models they cannot.")
    source = "Sun et al. 2025, Curse of Depth (2502.05795); Gromov et al. 2024 (2403.17887)"
    numbers: dict[str, Any] = {}
    figures: list[str] = []
    notes = []
    try:
        real = c12_real_models(ctx)
    except (CheckpointNotFound, MissingDependency) as e:  # no checkpoint, or no hf extra
        real = None
        notes.append(f"real checkpoints not probed: {e}")
    if real is not None:
        from normlab.interop.figures import comparison_figure

        fig = comparison_figure([r["_raw"] for r in real.values()],
                                ctx.fig_dir / "c12_real_models.svg")
        figures += [str(fig.relative_to(ctx.out))] if fig else []
        numbers["real_models_illustration"] = {n: {k: v for k, v in r.items() if k != "_raw"}
                                               for n, r in real.items()}
    own = _checkpoints(ctx, "c12_checkpoints", checkpoints)
    deep_runs = getattr(ctx, "deep_runs", None)
    if own and deep_runs is not None:  # the lr each placement's deep models were tuned to
        numbers["deep_tuned"] = {pl: {k: v for k, v in deep_runs(pl).items() if k != "records"}
                                 for pl in ("pre", "post")}
    method = ("normlab's own pre and post models (12-24 blocks, each placement tuned on its "
              "own lr grid at that depth), paired by seed at matched "
              "validation loss along their training trajectories (each run keeps its weights "
              "at every evaluation; the most trained pair of checkpoints within the tolerance "
              "is compared): each block skipped in turn, its drop cost the "
              "increase of next-token loss on validation text; per model the depth slope of "
              "drop cost / median interior drop cost over relative depth, first and last "
              "block apart. Real checkpoints (MiniLM post-LN, SmolLM2 pre-RMSNorm) shown with "
              "the same numbers as an illustration only: they differ in far more than the "
              "placement.")
    if not own:
        why = ("this profile trains no deep (12-24-block) models; the standard profile does"
               if getattr(ctx.profile, "deep_blocks", 1) == 0
               else "the study provided no matched pre/post models for C12")
        note = "; ".join(notes + [why])
        return ClaimResult(id="C12", title=title, statement=statement, source=source,
                           method=method, verdict="not run", rule="", numbers=numbers,
                           figures=figures, note=note)
    res = c12_own_models(ctx, own)
    numbers |= {"own_models": {k: res[k] for k in ("per_seed", "left_out", "slopes",
                                                   "intervals", "tolerance")},
                "smallest_detectable": res["smallest_detectable"], "reason": res["reason"],
                "pairs": len(res["slopes"]["pre"])}
    wanted = _setting(ctx, "c12_min_pairs", C12_MIN_PAIRS)
    outcomes = {pl: [c.outcome for c in own if c.placement == pl] for pl in PLACEMENTS}
    stalled = [pl for pl, out in outcomes.items()
               if out and all(o in ("stalled", "diverged") for o in out)]
    if stalled:  # a result to report: no model of that side trained, so nothing is compared
        notes.append(f"{' and '.join(stalled)} stalled or diverged in every seed at its tuned "
                     "lr: no pair to compare")
    if len(res["slopes"]["pre"]) < wanted:
        notes.append(f"{len(res['slopes']['pre'])} matched pair(s) along the trajectories, "
                     f"fewer than the {wanted} the design asks for")
    return ClaimResult(
        id="C12", title=title, statement=statement, source=source, method=method,
        verdict=res["verdict"], rule=res["rule"], effect=res["effect"], numbers=numbers,
        predictions=[p.to_dict() for p in c12_predictions(res["slopes"])],
        figures=figures, note="; ".join([res["reason"], *notes]), stalled=stalled,
        caveat="Small byte-level models trained briefly on a CPU; the real checkpoints are "
               "one per placement and differ in size, objective, data and quantization.")


# -- C10 ------------------------------------------------------------------------------------------

def _setting(ctx: StudyContext, name: str, default: Any) -> Any:
    return getattr(ctx.profile, name, default)


def c10_settings(ctx: StudyContext) -> dict[str, Any]:
    """The fine-tuning settings C10 reads from the profile (defaults where it has none)."""
    steps = _setting(ctx, "finetune_steps", 200)
    passage = _setting(ctx, "finetune_passage_bytes", 256)
    if passage < 256:
        raise ValueError(f"profile.finetune_passage_bytes: C10 needs passages of at least 256 "
                         f"bytes, got {passage}")
    return {"steps": steps, "batch_size": _setting(ctx, "finetune_batch_size", 32),
            "warmup": _setting(ctx, "finetune_warmup", max(1, steps // 10)),
            "passage_bytes": passage, "test_max": _setting(ctx, "finetune_test_max", None),
            "val_fraction": _setting(ctx, "finetune_val_fraction", 0.1),
            "val_max": _setting(ctx, "finetune_val_max", 512),
            "train_eval_max": _setting(ctx, "finetune_train_eval_max", 256),
            "standardize": _setting(ctx, "finetune_standardize", 512)}


def tune_lr(score: Callable[[float], tuple[float, float]], grid: Sequence[float],
            extensions: int = 2, factor: float = 3.0) -> dict[str, Any]:
    """The grid lr with the best ``score(lr) = (mean validation accuracy, -mean validation
    loss)``; while the best lies at an edge, one more lr beyond it (x or / ``factor``), at most
    ``extensions`` times. Returns ``best``, ``scores`` (lr -> score), ``extended`` (the lrs
    added) and ``bracketed`` (the best lies inside the grid)."""
    lrs = sorted(float(v) for v in grid)
    scores: dict[float, tuple[float, float]] = {}
    extended: list[float] = []
    while True:
        for lr in lrs:
            if lr not in scores:
                scores[lr] = score(lr)
        best = max(lrs, key=lambda v: scores[v])
        if len(extended) >= extensions or len(lrs) < 2 or best not in (lrs[0], lrs[-1]):
            break
        new = best / factor if best == lrs[0] else best * factor
        extended.append(new)
        lrs = sorted([*lrs, new])
    return {"best": best, "scores": {f"{lr:g}": list(scores[lr]) for lr in lrs},
            "extended": extended, "bracketed": best not in (lrs[0], lrs[-1])}


def _window(run_dir: Path, passage: int) -> int | None:
    """The window a pretrained run reads passages in (`normlab.finetune.finetune`'s default),
    given explicitly to the same architecture at init so both read the text alike."""
    from normlab.train import read_run_config

    cfg = read_run_config(run_dir)
    context = cfg.data.seq_len
    if cfg.model.positions == "learned" and passage > context and passage % context == 0:
        return context
    return None


def c10_finetune(ctx: StudyContext, checkpoints: Sequence[Pretrained], *,
                 tolerance: float | None = None) -> dict[str, Any]:
    """C10's measurements: every matched pre/post pair fine-tuned on the genre task, and the
    same architecture fine-tuned from random init (the run's seed) with the same budget, each
    with its lr tuned on validation passages (module doc); the trigram baseline on the same
    passages as context. Fine-tuning results are cached in each run folder."""
    from normlab.data.genre import genre_task, naive_bayes_baseline
    from normlab.finetune import finetune, finetune_many

    tol = _setting(ctx, "match_tolerance", MATCH_TOLERANCE) if tolerance is None else tolerance
    s = c10_settings(ctx)
    pairs, left_out = matched_pairs(checkpoints, tol)
    seeds = sorted(pairs)
    arms = {"pretrained": False, "scratch": True}
    runs: dict[str, dict[str, dict[str, dict[int, dict[str, Any]]]]] = {
        arm: {p: {} for p in PLACEMENTS} for arm in arms}

    def kwargs(arm: str, placement: str, lr: float, seed: int) -> dict[str, Any]:
        kw = {"task": "genre", "lr": lr, "seed": seed, "device": "cpu", **s}
        if arms[arm]:
            kw |= {"from_init": True,
                   "window": _window(pairs[seed][placement].run_dir, s["passage_bytes"])}
        return kw

    def run(arm: str, placement: str, lr: float, seed: int) -> dict[str, Any]:
        res = finetune(pairs[seed][placement].run_dir, **kwargs(arm, placement, lr, seed))
        keep = ("test_accuracy", "val_accuracy", "val_loss", "train_accuracy", "outcome",
                "time_s", "settings")
        runs[arm][placement].setdefault(f"{lr:g}", {})[seed] = {k: res.get(k) for k in keep}
        return res

    def mean_score(arm: str, placement: str, lr: float) -> tuple[float, float]:
        ctx.log(f"C10: fine-tuning {placement} ({arm}) at lr {lr:g} ({len(seeds)} seeds)")
        got = [run(arm, placement, lr, seed) for seed in seeds]
        acc = [r["val_accuracy"] for r in got]
        loss = [r["val_loss"] if isinstance(r["val_loss"], float) else math.inf for r in got]
        return sum(acc) / len(acc), -sum(loss) / len(loss)

    tuned: dict[str, dict[str, Any]] = {arm: {} for arm in arms}
    accuracy: dict[str, dict[str, list[float]]] = {arm: {} for arm in arms}
    if seeds:
        grid = _setting(ctx, "finetune_lrs", (3e-4, 1e-3, 3e-3))
        extensions = _setting(ctx, "finetune_lr_extensions", 2)
        workers = _setting(ctx, "workers", 1)
        ctx.log(f"C10: fine-tuning {len(seeds)} pair(s), pretrained and from init, at lrs "
                f"{list(grid)} on {workers} worker(s)")
        finetune_many([(pairs[seed][p].run_dir, kwargs(arm, p, lr, seed)) for arm in arms
                       for p in PLACEMENTS for lr in grid for seed in seeds], workers)
        for arm in arms:  # reads the results just computed; trains only grid extensions
            for p in PLACEMENTS:
                tuned[arm][p] = tune_lr(lambda lr, a=arm, p=p: mean_score(a, p, lr), grid,
                                        extensions)
                chosen = runs[arm][p][f"{tuned[arm][p]['best']:g}"]
                accuracy[arm][p] = [chosen[seed]["test_accuracy"] for seed in seeds]
    task = genre_task("genre", passage_bytes=s["passage_bytes"], val_fraction=s["val_fraction"])
    baseline = ctx.cached(
        f"c10_baseline_{s['passage_bytes']}_{s['val_fraction']}_{s['test_max']}",
        lambda: naive_bayes_baseline(task, test_max=s["test_max"]))
    return {"settings": s, "seeds": seeds, "left_out": left_out, "tolerance": tol,
            "tuned_lr": tuned, "accuracy": accuracy, "runs": runs,
            "val_loss_pretrained": {p: [pairs[k][p].val_loss for k in seeds]
                                    for p in PLACEMENTS},
            "baseline": baseline, "chance": task.chance, "majority": task.majority}


def c10_predictions(accuracy: Mapping[str, Mapping[str, Sequence[float]]], majority: float
                    ) -> list[Any]:
    """C10's predictions on per-seed test accuracies (`accuracy[arm][placement]`, arms
    "pretrained" and "scratch", paired by seed). Premises: each placement's model from init
    learns the task (beats the majority class) and pretraining helps it (pretrained - from
    init > 0); the test: post's fine-tuned accuracy above pre's."""
    from normlab.study.verdict import predict_direction

    none = "the source gives no size: decided at 0, the size reported"
    out = []
    for p in PLACEMENTS:
        out.append(predict_direction(
            f"{p} from init", "test accuracy from init - majority-class share",
            "the design: fine-tuning long enough that a model from init learns the task",
            [a - majority for a in accuracy["scratch"][p]], ">", 0.0, 0.0,
            threshold_source="the design (learning the task at all): 0", role="premise"))
    for p in PLACEMENTS:
        out.append(predict_direction(
            f"{p} transfer", "test accuracy pretrained - from init (same budget)",
            "the claim presumes pretraining helps fine-tuning",
            [a - b for a, b in zip(accuracy["pretrained"][p], accuracy["scratch"][p],
                                   strict=True)], ">", 0.0, 0.0,
            threshold_source="the design (any transfer): 0", role="premise"))
    out.append(predict_direction(
        "post vs pre", "fine-tuned test accuracy post - pre",
        "seed blog: Post Norm's fine-tuning performance is 'noticeably better' at matched "
        "pretraining loss", [b - a for a, b in zip(accuracy["pretrained"]["pre"],
                                                     accuracy["pretrained"]["post"],
                                                     strict=True)], ">", 0.0, 0.0,
        threshold_source="the seed blog ('noticeably better'): " + none))
    return out


def c10(ctx: StudyContext, checkpoints: Sequence[Pretrained] | None = None) -> ClaimResult:
    from normlab.study.figures import plot_bars

    title = "Post-LN transfers better after fine-tuning"
    statement = ("Pretrained Post-LN models fine-tune to better downstream accuracy than Pre-LN "
                 "ones, even when pretraining losses match.")
    source = "Seed blog"
    given = _checkpoints(ctx, "c10_checkpoints", checkpoints)
    s = c10_settings(ctx)
    method = (f"Pre and post runs pretrained to matched validation loss (within "
              f"{_setting(ctx, 'match_tolerance', MATCH_TOLERANCE):g} nats), paired by seed, "
              f"fine-tuned on the Shakespeare genre task (comedy/history/tragedy of a "
              f"{s['passage_bytes']}-byte passage, read in windows of the pretraining context; "
              f"speaker headings and stage directions stripped; per play: first 70% train, "
              f"next 10% validation, last 20% test), {s['steps']} AdamW steps, all weights, "
              "mean pooling, standardized features; the same architecture fine-tuned from "
              "random init with the same steps is the transfer baseline; every lr tuned per "
              "placement and arm on validation accuracy over a bracketing grid. Decided only "
              "where the models from init learn the task and pretraining helps both "
              "placements; effect per seed: fine-tuned test accuracy post - pre. A "
              "character-trigram naive Bayes on the same passages is context.")
    if not given:
        return ClaimResult(id="C10", title=title, statement=statement, source=source,
                           method=method, verdict="not run", rule="",
                           note="the study provided no pretrained pre/post runs for C10")
    res = c10_finetune(ctx, given)
    base = res["baseline"]["test_accuracy"]
    numbers = {k: res[k] for k in ("settings", "seeds", "left_out", "tolerance", "tuned_lr",
                                   "accuracy", "runs", "val_loss_pretrained", "chance",
                                   "majority")}
    numbers["ngram_baseline_context"] = base
    caveat = ("Small byte-level models pretrained briefly on a CPU; the character-trigram "
              "baseline is context (it tests the task, not transfer).")
    if not res["seeds"]:
        return ClaimResult(id="C10", title=title, statement=statement, source=source,
                           method=method, verdict="inconclusive", rule="", numbers=numbers,
                           note="no matched pre/post pair: " + "; ".join(res["left_out"]),
                           caveat=caveat)
    bars = {f"{p} {arm}": mean_ci(v) for arm, acc in res["accuracy"].items()
            for p, v in acc.items()}
    bars["char-trigram naive Bayes"] = {"mean": base, "ci95": [base, base]}
    fig = plot_bars(bars, ctx.fig_dir / "c10_transfer.svg", ylabel="genre test accuracy",
                    title=f"{s['passage_bytes']}-byte passages, majority {res['majority']:.2f}")
    from normlab.study.claims import make_claim

    return make_claim(
        "C10", title, statement, source, method,
        c10_predictions(res["accuracy"], res["majority"]),
        "The seed blog: at roughly the same pretraining results, Post Norm's fine-tuning "
        "performance is noticeably better (no number published).", numbers,
        [str(fig.relative_to(ctx.out))] if fig else [], caveat=caveat)
