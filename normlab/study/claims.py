"""The claims of docs/reference.md as experiments. Each claim states, before any run, a
quantitative prediction per placement (a band or a direction with its threshold, see
`normlab.study.verdict`); the claim's verdict combines them. docs/study.md gives each design and
why it was chosen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from normlab.probe.figures import (
    plot_per_block,
)
from normlab.probe.fits import mean_ci
from normlab.study.experiments import StudyContext
from normlab.study.figures import plot_bars, plot_curves
from normlab.study.schema import ClaimResult
from normlab.study.verdict import Prediction, combine, predict_direction

SCALE = ("Measured on small byte-level models on a CPU; effects reported at scale (hundreds of "
         "millions of parameters, long training) may not show at this size.")


def make_claim(cid: str, title: str, statement: str, source: str, method: str,
               predictions: Sequence[Prediction], paper: str, numbers: dict[str, Any],
               figures: list[str], caveat: str = SCALE, stalled: Sequence[str] = (),
               note: str = "", calibration: str | None = None) -> ClaimResult:
    """A claim's result: the verdict combines its predictions; a side that stalled or diverged
    everywhere is reported, never compared, and leaves the claim inconclusive, as does a
    premise of the test that does not hold (`Prediction.role == "premise"`)."""
    verdict = combine(predictions)
    failed = [p.subject for p in predictions if p.role == "premise" and p.verdict != "supported"]
    if failed:
        note = (note + " " if note else "") + (
            f"Not decided: the test's premise does not hold ({'; '.join(failed)}), so the "
            "comparison it needs was not measured; the numbers are reported.")
    if stalled:
        verdict = "inconclusive"
        note = (note + " " if note else "") + (
            f"Not compared: {', '.join(stalled)} stalled or diverged at every setting tried, so "
            "the claim's premise (a model that trains) does not hold here.")
    diagnosis = "; ".join(f"{p.subject}: {p.diagnosis}" for p in predictions if p.diagnosis)
    return ClaimResult(
        id=cid, title=title, statement=statement, source=source, method=method,
        verdict=verdict,  # type: ignore[arg-type]
        rule="; ".join(f"{p.subject}: {p.rule}" for p in predictions)
        + "; the claim is supported when every prediction is, not supported when any is not",
        effect=deciding(predictions, verdict).effect if predictions else None,
        numbers=numbers, figures=figures, caveat=caveat, note=note,
        predictions=[p.to_dict() for p in predictions], paper=paper, diagnosis=diagnosis,
        stalled=list(stalled), calibration=calibration)


def deciding(predictions: Sequence[Prediction], verdict: str) -> Prediction:
    """The prediction a claim's verdict rests on: the first test that is not supported (of a
    refuted claim), the first premise or test that is not decided (of an inconclusive one),
    else the first."""
    tests = [p for p in predictions if p.role != "premise"]
    if verdict == "not supported":
        return next(p for p in tests if p.verdict == "not supported")
    if verdict == "inconclusive":
        undecided = [p for p in predictions if p.role == "premise" and p.verdict != "supported"]
        undecided += [p for p in tests if p.verdict != "supported"]
        if undecided:
            return undecided[0]
    return predictions[0]


def _rel(ctx: StudyContext, path) -> list[str]:
    return [str(path.relative_to(ctx.out))] if path is not None else []


# -- claims on trained models --------------------------------------------------------------------

def _val(records: Sequence[dict[str, Any]]) -> list[float]:
    return [r["score"] for r in records]


def _tuning_numbers(t: dict[str, Any]) -> dict[str, Any]:
    return {"lrs": t["lrs"], "best_lr": t["best_lr"], "bracketed": t["bracketed"],
            "extensions": t["extensions"], "mean_val_loss": t["mean_score"],
            "outcomes": {lr: [r["outcome"] for r in rs] for lr, rs in t["records"].items()}}


def _stalled(*tuned: dict[str, Any]) -> list[str]:
    return [t["family"] for t in tuned if t["all_stalled"]]


def _bracket_note(*tuned: dict[str, Any]) -> str:
    """Says which family's best lr still lies at an edge once the grid's extensions ran out."""
    edge = [f"{t['family']} (best lr {t['best_lr']:g} of {[float(x) for x in t['lrs']]})"
            for t in tuned if not t["bracketed"] and not t["all_stalled"]]
    if not edge:
        return ""
    return ("Not bracketed: " + "; ".join(edge) + " sits at an edge of its grid after the "
            "profile's extensions, so its tuned loss may be lower still.")


NO_SIZE = "the source gives no size: decided at 0, the size reported"
XIONG = "Xiong et al. 2020 (2002.04745), Sec. 3.1 and Fig. 1"


def _per_seed(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> list[float]:
    """Per seed, score(a) - score(b) (seeds paired by index)."""
    return [x - y for x, y in zip(_val(a), _val(b), strict=True)]


def _trains(records: Sequence[dict[str, Any]]) -> bool:
    return bool(records) and not any(r["failed"] for r in records)


def common_lrs(pre: dict[str, Any], post: dict[str, Any]) -> list[float]:
    """The lrs of both placements' warmup grids where every seed of both trained, post's tuned
    lr first: C6a's common peak lrs."""
    shared = [float(lr) for lr in post["records"] if lr in pre["records"]
              and _trains(pre["records"][lr]) and _trains(post["records"][lr])]
    best = float(post["best_lr"])
    return sorted(shared, key=lambda lr: (lr != best, lr))


def c6a(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    tuned = {pl: ctx.tuned(pl) for pl in ("pre", "post")}
    stalled = _stalled(*tuned.values())
    lrs = common_lrs(tuned["pre"], tuned["post"]) if not stalled else []
    if lrs:
        ctx.prefetch([(pl, lrs, 0) for pl in tuned])
    without = {pl: ctx.runs(pl, lrs, 0) if lrs else {} for pl in tuned}
    predictions, numbers = [], {}
    for lr in lrs:
        w = {pl: tuned[pl]["records"][str(lr)] for pl in tuned}
        wo = {pl: without[pl][lr] for pl in tuned}
        tag = f"lr {lr:g}" + (" (post's tuned)" if lr == float(tuned["post"]["best_lr"]) else "")
        cost = {pl: _per_seed(wo[pl], w[pl]) for pl in tuned}
        vs = _per_seed(wo["pre"], w["post"])
        predictions += [
            predict_direction(f"post, {tag}", "val loss without warmup - with warmup",
                              "Xiong: Post-LN without warmup fails or ends much worse (IWSLT14, "
                              "lr 5e-4: 8.45 BLEU vs ~34 with 4000 warmup steps)", cost["post"],
                              ">", 0.0, 0.0, threshold_source=XIONG + ": " + NO_SIZE),
            predict_direction(f"pre, {tag}", "val loss without warmup - with warmup",
                              "Xiong: Pre-LN's warmup stage 'can be safely removed'",
                              cost["pre"], "<", 0.0, 0.0,
                              threshold_source=XIONG + ": 'safely removed', no margin given: 0"),
            predict_direction(f"pre without vs post with warmup, {tag}",
                              "val loss(pre, no warmup) - val loss(post, warmup)",
                              "Xiong: Pre-LN without warmup reaches 'comparable results' to "
                              "Post-LN with it", vs, "<", 0.0, 0.0,
                              threshold_source=XIONG + ": 'comparable', no margin given: 0")]
        numbers[f"lr {lr:g}"] = {"cost": {pl: mean_ci(v) for pl, v in cost.items()},
                                 "pre without - post with": mean_ci(vs),
                                 "outcomes_without_warmup": {pl: [r["outcome"] for r in rs]
                                                             for pl, rs in wo.items()}}
    numbers["common_lrs"] = lrs
    numbers["tuning"] = {pl: _tuning_numbers(t) for pl, t in tuned.items()}
    fig = None
    if lrs:
        lr = lrs[0]
        curves = {f"{pl}, {'warmup ' + str(p.warmup) if w else 'no warmup'}":
                  [r["run_id"] for r in (tuned[pl]["records"][str(lr)] if w
                                         else without[pl][lr])]
                  for pl in tuned for w in (1, 0)}
        fig = plot_curves(ctx.runs_root, curves, ctx.fig_dir / "c6a_warmup_curves.svg",
                          title=f"both placements at lr {lr:g} (post's tuned), all seeds")
    note = _bracket_note(*tuned.values())
    if not lrs and not stalled:
        note = (note + " " if note else "") + (
            "No lr of the grid where both placements trained with warmup: no common lr to "
            "compare at.")
    return make_claim(
        "C6a", "At a common peak lr, Post-LN needs warmup and Pre-LN does not",
        "Trained with Adam at the same peak learning rate, Post-LN without warmup fails or ends "
        "much worse than with it, while Pre-LN without warmup is comparable to Post-LN with "
        "warmup.", XIONG,
        f"Both placements at the same peak lr: post's tuned lr and every lr of the shared grid "
        f"where both trained with warmup ({p.warmup} = {p.warmup_frac:g} of {p.steps} steps); "
        "each trained again without warmup. Per seed, the cost of dropping warmup in final "
        "validation loss (a diverged run scores ln 256, a stalled one its loss), and pre "
        "without warmup against post with it.",
        predictions, "Xiong Fig. 1 (IWSLT14, lr 5e-4 / 1e-3, Adam beta2 0.98): post without "
        "warmup 8.45 BLEU, with 4000 warmup steps ~34; warmup 500 at lr 1e-3: 2.77; pre without "
        "warmup comparable to post with it.",
        numbers, _rel(ctx, fig), stalled=stalled, note=note)


def c6b(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    tuned = {pl: ctx.tuned(pl) for pl in ("pre", "post")}
    no_w = {pl: ctx.tuned(pl, 0) for pl in ("pre", "post")}
    # no-warmup grids that fail everywhere are the claim's result for post, not a stall
    stalled = _stalled(*tuned.values())
    cost = {pl: _per_seed(no_w[pl]["best"], tuned[pl]["best"]) for pl in tuned}
    lesson = "the warmup lesson (docs/reference.md, section 2): "
    predictions = [
        predict_direction("post", "best val loss over lr without warmup - best with warmup",
                          "lesson: Post-LN warmup 'Required. Training diverges without it.'",
                          cost["post"], ">", 0.0, 0.0, threshold_source=lesson + NO_SIZE),
        predict_direction("pre", "best val loss over lr without warmup - best with warmup",
                          "lesson: Pre-LN warmup 'Not required. Can train with large learning "
                          "rates from the start.'", cost["pre"], "<", 0.0, 0.0,
                          threshold_source=lesson + "'not required', no margin given: 0")]
    bars = {f"{pl}, {'warmup' if w else 'no warmup'} (best lr {t['best_lr']:g})":
            mean_ci(_val(t["best"])) for pl in tuned
            for w, t in ((1, tuned[pl]), (0, no_w[pl]))}
    fig = plot_bars(bars, ctx.fig_dir / "c6b_best_over_lr.svg",
                    ylabel="final validation loss (nats)",
                    title=f"each placement's best over its own grid, {p.seeds} seeds")
    return make_claim(
        "C6b", "Pre-LN needs no warmup even at its own best lr; Post-LN does",
        "Pre-LN does not need warmup and can train with large learning rates from the start; "
        "Post-LN diverges without warmup.",
        "The warmup lesson, 'A Direct Comparison: Stability vs. Performance' (quoted in "
        "docs/reference.md, section 2)",
        f"Each placement tuned twice over its own bracketed grid: with warmup ({p.warmup} of "
        f"{p.steps} steps) and without; per seed, the best cell without warmup minus the best "
        "cell with it (a cell where a seed failed is never the optimum unless every cell "
        "failed; then the least bad, scored ln 256 when diverged).",
        predictions, "The lesson gives no number; Xiong (same lr, not best over lr): post "
        "without warmup 8.45 BLEU vs ~34 with.",
        {"cost": {pl: mean_ci(v) for pl, v in cost.items()},
         "tuning_with_warmup": {pl: _tuning_numbers(t) for pl, t in tuned.items()},
         "tuning_without_warmup": {pl: _tuning_numbers(t) for pl, t in no_w.items()}},
        _rel(ctx, fig), stalled=stalled, note=_bracket_note(*tuned.values(), *no_w.values()))


# C9's pairings under one init: (label, pre family, post family, profile.same_inits key)
SAME_INIT_PAIRS = (("both Xavier", "pre_xavier", "post", "xavier"),
                   ("both GPT-2 scaled", "pre", "post_gpt2", "gpt2_scaled"))


def c9(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    pairs = [q for q in SAME_INIT_PAIRS if q[3] in p.same_inits]
    families = dict.fromkeys(["pre", "post", *(f for q in pairs for f in q[1:3])])
    tuned = {f: ctx.tuned(f) for f in families}
    predictions = []
    for label, pre_f, post_f, _ in pairs:
        predictions.append(predict_direction(
            f"post vs pre ({label})", f"val loss({pre_f}, tuned) - val loss({post_f}, tuned)",
            "B2T: post better than pre at <= 6 layers; the seed: once properly trained",
            _per_seed(tuned[pre_f]["best"], tuned[post_f]["best"]), ">", 0.0, 0.0,
            threshold_source="Takase et al. (B2T) and the seed argument: " + NO_SIZE))
    paper_inits = _per_seed(tuned["pre"]["best"], tuned["post"]["best"])
    numbers: dict[str, Any] = {
        "tuning": {f: _tuning_numbers(t) for f, t in tuned.items()},
        "paper_inits_context": {"pre (GPT-2 scaled) - post (Xavier)": mean_ci(paper_inits),
                                "note": "each placement at its own paper's init: reported, not "
                                "decided (two things differ)"}}
    bars = {f"{f} lr {t['best_lr']:g}": mean_ci(_val(t["best"])) for f, t in tuned.items()}
    fig = plot_bars(bars, ctx.fig_dir / "c9_val_loss.svg", ylabel="final validation loss (nats)",
                    title=f"{p.train_blocks} blocks, warmup {p.warmup}, {p.seeds} seeds, "
                          "each family at its tuned lr")
    return make_claim(
        "C9", "Post-LN ends better when it trains (shallow models)",
        "With warmup and a tuned learning rate, a shallow (L <= 12) Post-LN model reaches a "
        "validation loss at least as good as Pre-LN's.",
        "Seed argument; Takase et al. 2022, B2T (2206.00330)",
        f"Final validation loss of {p.train_blocks}-block models after {p.steps} steps, warmup "
        f"{p.warmup_frac:g} of the run; pre and post compared under one init ("
        + ", ".join(q[0] for q in pairs) + "), every family tuned on its own lr grid extended "
        f"until it brackets the best; paired seeds ({p.seeds}); effect per seed: pre - post. "
        "The paper inits (post Xavier, pre GPT-2 scaled) are reported as context.",
        predictions, "B2T Table (WMT, 6 layers): post 27.4 vs pre 26.9 BLEU, post unstable at "
        ">= 10 layers; ProRes (1.3B): post 11.62 ppl vs pre 10.32.",
        numbers, _rel(ctx, fig), stalled=_stalled(*tuned.values()),
        note=_bracket_note(*tuned.values()))


def c11(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    on = ctx.tuned("pre")
    off = ctx.tuned("pre_nofinal") if p.c11_trained_without else None
    src = "Xiong et al. / GPT-2 (the final norm): " + NO_SIZE
    predictions = []
    if off is not None:
        predictions.append(predict_direction(
            "pre, trained without vs with", "val loss(no final norm, tuned) - val loss(final "
            "norm, tuned)", "GPT-2 / Xiong: pre needs the final norm",
            _per_seed(off["best"], on["best"]), ">", 0.0, 0.0, threshold_source=src))
    shallow = ctx.final_norm_costs(on["best"])
    predictions.append(predict_direction(
        f"pre, {p.train_blocks} blocks", "val loss with the final norm replaced by identity - "
        "with it", "without it the head reads a stream whose scale grows with depth",
        shallow, ">", 0.0, 0.0, threshold_source=src))
    tuned = [on] if off is None else [on, off]
    numbers: dict[str, Any] = {
        "tuning": {"with": _tuning_numbers(on)} | (
            {} if off is None else {"without": _tuning_numbers(off)}),
        f"final_norm_dropped_{p.train_blocks}_blocks": mean_ci(shallow)}
    note = _bracket_note(*tuned)
    if off is None:
        note = ("This profile does not train pre without a final norm on its own grid (the "
                "standard profile does): the mechanism decides alone. " + note).strip()
    if getattr(ctx, "claims", None) is None or "C12" in ctx.claims:
        ctx.prefetch_deep()  # C12 reads the same deep runs: both placements in one go
    deep = ctx.deep_runs("pre")
    deep_cost = ctx.final_norm_costs(deep["records"]) if deep["records"] else []
    if deep_cost:
        n = min(len(deep_cost), len(shallow))
        predictions.append(predict_direction(
            f"pre, {p.deep_blocks} vs {p.train_blocks} blocks",
            "cost of dropping the final norm, deep - shallow (per seed)",
            "the output scale grows with depth, so the norm matters more in the deeper model",
            [a - b for a, b in zip(deep_cost[:n], shallow[:n], strict=True)], ">", 0.0, 0.0,
            threshold_source=src))
        numbers[f"final_norm_dropped_{p.deep_blocks}_blocks"] = mean_ci(deep_cost)
        numbers["deep_lr"] = deep["lr"]
    else:
        why = ("No deeper model in this profile" if not p.deep_blocks else
               f"No {p.deep_blocks}-block pre model trained")
        note = (note + " " if note else "") + (
            f"{why}: the cost of dropping the final norm is measured at {p.train_blocks} blocks "
            "only (the standard profile adds 12 blocks).")
    bars = {"with final norm": mean_ci(_val(on["best"]))} | (
        {} if off is None else {"without final norm": mean_ci(_val(off["best"]))})
    fig = plot_bars(bars, ctx.fig_dir / "c11_final_norm.svg",
                    ylabel="final validation loss (nats)",
                    title=f"pre, each at its tuned lr, {p.seeds} seeds")
    return make_claim(
        "C11", "Pre-LN needs a final norm",
        "Without a final norm before the head, a Pre-LN model's output scale grows with depth "
        "and its loss is worse.",
        "Xiong et al. 2020 (2002.04745); GPT-2",
        f"Final validation loss of pre with and without the final norm, each at its own tuned "
        f"lr (bracketed grids), {p.train_blocks} blocks; and the mechanism: the loss of the "
        "trained pre models with their final norm replaced by the identity minus their loss, at "
        f"{p.train_blocks} blocks and (where the profile trains them) at {p.deep_blocks or '-'} "
        "blocks, per seed.",
        predictions, "GPT-2 added the final norm; no published loss gap at this size.",
        numbers, _rel(ctx, fig), stalled=_stalled(*tuned), note=note)


def _seed_mean_curves(ctx: StudyContext, tp: dict[str, Any], metrics: Sequence[str]
                      ) -> dict[str, Any]:
    """Per-block curves of the trained probes, one list per seed, shaped for plot_per_block
    (drawn as the mean over seeds with a min-max band)."""
    return {p: {str(ctx.profile.train_blocks): {
        m: [s["per_block"][m] for s in tp[p]["seeds"]] for m in metrics}}
        for p in ("pre", "post")}


def _late_mean(values: list[float]) -> float:
    half = values[len(values) // 2:]
    return sum(half) / len(half)


def _pair_note(pair: dict[str, Any]) -> str:
    if "gap" not in pair:
        return pair.get("reason", "")
    state = "matched" if pair["matched"] else "NOT matched"
    return (f"Checkpoints at matched loss: pre at lr {pair['pre_lr']:g} (val "
            f"{pair['pre_val_loss']:.3f}), post at lr {pair['post_lr']:g} (val "
            f"{pair['post_val_loss']:.3f}): gap {pair['gap']:+.3f} nats, {state} (tolerance "
            f"{pair['tolerance']:g}).")


def _trained(ctx: StudyContext, cid: str, title: str) -> tuple[dict[str, Any] | None,
                                                                ClaimResult | None]:
    tp = ctx.trained_probes()
    if "pre" not in tp:
        return None, ClaimResult(
            id=cid, title=title, statement="", source="", method="", verdict="inconclusive",
            rule="", stalled=["pre" if "pre" in tp["pair"].get("reason", "") else "post"],
            note=f"No checkpoints to compare: {tp['pair'].get('reason')}.")
    return tp, None


def slope_over_depth(values: Sequence[float]) -> float:
    """Least-squares slope of `values` (one per block) against relative depth l/(L-1)."""
    n = len(values)
    xs = [i / max(1, n - 1) for i in range(n)]
    mx, my = sum(xs) / n, sum(values) / n
    sxx = sum((x - mx) ** 2 for x in xs) or math.nan
    return sum((x - mx) * (y - my) for x, y in zip(xs, values, strict=True)) / sxx


def c2(ctx: StudyContext) -> ClaimResult:
    title = "Pre-Norm's consecutive blocks become near-identical"
    tp, missing = _trained(ctx, "C2", title)
    if missing:
        return missing
    ang = {p: [s["per_block"]["ang_prev"][1:] for s in tp[p]["seeds"]] for p in ("pre", "post")}
    slope_pre = [slope_over_depth(a) for a in ang["pre"]]
    late = {p: [_late_mean(a) for a in v] for p, v in ang.items()}
    predictions = [
        predict_direction("pre", "slope of angular distance(x_l, x_{l+1}) over relative depth",
                          "Curse of Depth: falls with depth (< 0.2 in deep layers of pre-LN "
                          "LLMs)", slope_pre, "<", 0.0, 0.0,
                          threshold_source="Curse of Depth gives a level (< 0.2 in 30-layer "
                          "LLMs), not a slope: " + NO_SIZE),
        predict_direction("post vs pre", "late angular distance(post) - late(pre)",
                          "seed argument: post's consecutive blocks stay apart",
                          [b - a for a, b in zip(late["pre"], late["post"], strict=True)],
                          ">", 0.0, 0.0, threshold_source="the seed argument: " + NO_SIZE),
    ]

    at_init = ctx.init_probes()
    init = {p: [_late_mean(s["per_block"]["ang_prev"][1:]) for s in at_init[p]["seeds"]]
            for p in ("pre", "post")}
    change = {p: [a - b for a, b in zip(late[p], init[p], strict=True)] for p in ("pre", "post")}
    curves = _seed_mean_curves(ctx, tp, ("ang_prev",))
    return make_claim(
        "C2", title,
        "Under Pre-Norm the angular distance between consecutive blocks' streams falls with "
        "depth; under Post-Norm it stays high.",
        "Seed argument; Curse of Depth (2502.05795); Gromov et al. 2024 (angular distance)",
        "Angular distance arccos(cos)/pi between the streams after blocks l and l+1 (blocks 2 to "
        "L; block 1 is compared with the embedding), on trained checkpoints at matched loss, per "
        "seed; the deeper half's mean for the comparison. What training changed is reported as "
        "trained minus each run's own model at step 0 (the value at init restates C1).",
        predictions, "Gromov et al. / Curse of Depth: in pre-LN LLMs the angular distance of "
        "deep consecutive layers falls below 0.2 (DeepSeek-7B after layer 18).",
        {"late_angle_trained": {p: mean_ci(v) for p, v in late.items()},
         "late_angle_trained_minus_init": {p: mean_ci(v) for p, v in change.items()},
         "late_angle_init": {p: mean_ci(v) for p, v in init.items()},
         "matched_pair": tp["pair"]},
        _rel(ctx, plot_per_block(curves, "ang_prev", ctx.fig_dir / "c2_angle.svg")),
        note=_pair_note(tp["pair"]))


def c3(ctx: StudyContext) -> ClaimResult:
    title = "Pre-LN's depth acts like width"
    tp, missing = _trained(ctx, "C3", title)
    if missing:
        return missing
    n = min(len(tp["pre"]["seeds"]), len(tp["post"]["seeds"]))
    seeds = {p: tp[p]["seeds"][:n] for p in ("pre", "post")}
    kl = {p: [_late_mean(s["per_block"]["merge_kl"]) for s in v] for p, v in seeds.items()}
    drop_kl = {p: [_late_mean(s["per_block"]["drop_kl"][1:]) for s in v]
               for p, v in seeds.items()}
    drop = {p: [_late_mean(s["per_block"]["drop_dloss"]) for s in v] for p, v in seeds.items()}
    ratio = {p: [merge_per_drop(s["per_block"]) for s in v] for p, v in seeds.items()}
    values = [math.log(b / a) for a, b in zip(ratio["pre"], ratio["post"], strict=True)
              if a > 0 and b > 0]
    predictions = [predict_direction(
        "post vs pre", "log(late merge KL / drop KL, post) - log(same, pre)",
        "seed argument: block t+1 run on block t's input acts like a wider layer under pre "
        "(its merge changes little of what the block does), not under post",
        values, ">", 0.0, 0.0, threshold_source="the seed argument ('very close', 'approximately"
        " like a single, wider layer'): " + NO_SIZE)]
    curves = _seed_mean_curves(ctx, tp, ("merge_kl", "drop_dloss"))
    figs = _rel(ctx, plot_per_block(curves, "merge_kl", ctx.fig_dir / "c3_merge.svg"))
    figs += _rel(ctx, plot_per_block(curves, "drop_dloss", ctx.fig_dir / "c3_drop.svg"))
    return make_claim(
        "C3", title,
        "Running block t+1 on block t's input (merge test) or skipping block t changes a "
        "Pre-LN model little for deep t, a Post-LN model much.",
        "Seed argument; Curse of Depth (2502.05795)",
        "On trained checkpoints at matched loss: for each late pair (t, t+1), KL(original || "
        "merged) of the output distribution when block t+1 reads block t's branch inputs, "
        "divided by KL(original || block t+1 dropped), the block's own cost: the share of what "
        "block t+1 does that the merge loses; averaged over the deeper half; effect per seed: "
        "log(ratio post / ratio pre). Both raw numbers (merge KL, drop KL and drop loss) are "
        "reported.",
        predictions, "Curse of Depth: removing a deep layer of a pre-LN LLM costs little; "
        "no merge-test number is published.",
        {"late_merge_per_drop": {p: mean_ci(v) for p, v in ratio.items()},
         "late_merge_kl": {p: mean_ci(v) for p, v in kl.items()},
         "late_drop_kl": {p: mean_ci(v) for p, v in drop_kl.items()},
         "late_drop_dloss": {p: mean_ci(v) for p, v in drop.items()},
         "effective_depth": {p: mean_ci([s["summary"].get("effective_depth_kl") for s in
                                         tp[p]["seeds"]]) for p in ("pre", "post")},
         "matched_pair": tp["pair"]},
        figs, note=_pair_note(tp["pair"]))


def merge_per_drop(per_block: dict[str, Any]) -> float:
    """Mean over the deeper half of the pairs (t, t+1) of merge_kl[t] / drop_kl[t+1]: the merge
    cost of block t+1 in units of that block's own drop cost (nan where a drop costs 0)."""
    merge, drop = per_block["merge_kl"], per_block["drop_kl"]
    ratios = [m / d if d > 0 else math.nan for m, d in zip(merge, drop[1:], strict=True)]
    return _late_mean(ratios)


def c13(ctx: StudyContext) -> ClaimResult:
    title = "Intermediate heads need a norm under Pre-LN"
    tp, missing = _trained(ctx, "C13", title)
    if missing:
        return missing

    def gap(entry: dict[str, Any]) -> float:
        raw, normed = entry["per_block"]["lens_raw"], entry["per_block"]["lens_normed"]
        diffs = [r - n for r, n in zip(raw[:-1], normed[:-1], strict=True)] or [0.0]
        return sum(diffs) / len(diffs)

    gaps = {p: [gap(s) for s in tp[p]["seeds"]] for p in ("pre", "post")}
    predictions = [predict_direction(
        "pre", "mean lens loss raw - through the final norm, blocks 1..L-1 (nats)",
        "seed guidance: with pre-norm you may need a norm at each extraction point",
        gaps["pre"], ">", 0.0, 0.0, threshold_source="the placement guidance (docs/reference.md, "
        "section 2: 'you may need to add explicit normalization at each extraction point'): "
        + NO_SIZE)]
    curves = _seed_mean_curves(ctx, tp, ("lens_raw", "lens_normed"))
    figs = _rel(ctx, plot_per_block(curves, "lens_raw", ctx.fig_dir / "c13_lens_raw.svg"))
    figs += _rel(ctx, plot_per_block(curves, "lens_normed", ctx.fig_dir / "c13_lens_normed.svg"))
    return make_claim(
        "C13", title,
        "Post-LN's block outputs are normalized already; Pre-LN's are not, so a head read at an "
        "intermediate block without a norm at the extraction point does much worse.",
        "Seed guidance (logit lens)",
        "Logit lens on trained pre checkpoints at matched loss: the LM head's loss on each "
        "block's stream (all but the last), raw and through the final norm; per seed, the mean "
        "gap must exceed 0 (the guidance gives no size; the size is reported). Post's gap is "
        "reported only: its block outputs end in a norm, "
        "so it is about 0 by construction.",
        predictions, "No published number; the seed guidance says 'you may need' a norm at each "
        "extraction point.",
        {"lens_gap": {p: mean_ci(v) for p, v in gaps.items()}, "matched_pair": tp["pair"]},
        figs, note=_pair_note(tp["pair"]))


CLAIMS: dict[str, Callable[[StudyContext], ClaimResult]] = {
    "C2": c2, "C3": c3, "C6a": c6a, "C6b": c6b, "C9": c9, "C11": c11, "C13": c13,
}
