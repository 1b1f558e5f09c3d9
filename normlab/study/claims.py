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
from normlab.probe.fits import loglog_fit, mean_ci
from normlab.study.experiments import StudyContext
from normlab.study.figures import plot_bars, plot_curves
from normlab.study.schema import ClaimResult
from normlab.study.verdict import Prediction, combine, predict_direction

SCALE = ("Measured on small byte-level models on a CPU; effects reported at scale (hundreds of "
         "millions of parameters, long training) may not show at this size.")


def make_claim(cid: str, title: str, statement: str, source: str, method: str,
               predictions: Sequence[Prediction], paper: str, numbers: dict[str, Any],
               figures: list[str], caveat: str = SCALE, stalled: Sequence[str] = (),
               note: str = "") -> ClaimResult:
    """A claim's result: the verdict combines its predictions; a side that stalled or diverged
    everywhere is reported, never compared, and leaves the claim inconclusive."""
    verdict = combine(predictions)
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
        effect=predictions[0].effect if predictions else None,
        numbers=numbers, figures=figures, caveat=caveat, note=note,
        predictions=[p.to_dict() for p in predictions], paper=paper, diagnosis=diagnosis,
        stalled=list(stalled))


def not_run(cid: str, title: str, why: str) -> ClaimResult:
    return ClaimResult(id=cid, title=title, statement="", source="", method="",
                       verdict="not run", rule="", note=why)


def _runs(ctx: StudyContext, placement: str) -> list[dict[str, Any]]:
    return ctx.init_sweep()[placement]["runs"]


def _seeds(runs: list[dict[str, Any]]) -> list[int]:
    return sorted({r["seed"] for r in runs})


def _deepest(runs: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    mine = [r for r in runs if r["seed"] == seed]
    return max(mine, key=lambda r: r["n_blocks"])["result"]


def _per_seed_slope(runs: list[dict[str, Any]], metric: str) -> list[float]:
    """Log-log slope of `metric` against depth, one per seed (seeds are the units)."""
    out = []
    for seed in _seeds(runs):
        pts = [(r["n_blocks"], r["result"]["summary"].get(metric), seed) for r in runs
               if r["seed"] == seed]
        out.append(loglog_fit([p for p in pts if isinstance(p[1], (int, float))],
                              n_boot=0)["slope"])
    return out


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


def c6(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    tuned = {pl: ctx.tuned(pl) for pl in ("pre", "post")}
    stalled = _stalled(*tuned.values())
    with_w = {pl: t["best"] for pl, t in tuned.items()}
    ctx.prefetch([(pl, [t["best_lr"]], 0) for pl, t in tuned.items()])
    without = {pl: ctx.runs(pl, [t["best_lr"]], 0)[t["best_lr"]] for pl, t in tuned.items()}
    cost = {pl: [a - b for a, b in zip(_val(without[pl]), _val(with_w[pl]), strict=True)]
            for pl in tuned}
    predictions = [
        predict_direction("post", "val loss without warmup - with warmup, at post's tuned lr",
                          "Xiong: post without warmup fails or ends much worse (IWSLT14: 8.45 "
                          "vs ~34 BLEU)", cost["post"], ">", 0.1, 0.1),
        predict_direction("pre", "val loss without warmup - with warmup, at pre's tuned lr",
                          "Xiong: pre trains without warmup at no cost", cost["pre"], "<", 0.1,
                          0.1),
    ]
    curves = {f"{pl}, {'warmup ' + str(p.warmup) if w else 'no warmup'}":
              [r["run_id"] for r in (with_w if w else without)[pl]]
              for pl in tuned for w in (1, 0)}
    fig = plot_curves(ctx.runs_root, curves, ctx.fig_dir / "c6_warmup_curves.svg",
                      title="each placement at its tuned lr, all seeds")
    return make_claim(
        "C6", "Post-LN needs learning-rate warmup; Pre-LN does not",
        "Trained with Adam at a high learning rate, Post-LN without warmup fails or ends much "
        "worse than with warmup, while Pre-LN trains without warmup.",
        "Xiong et al. 2020 (2002.04745), Sec. 3 and Fig. 1",
        f"Each placement at its own tuned lr (best of the bracketed grid with warmup "
        f"{p.warmup} = {p.warmup_frac:g} of {p.steps} steps), trained again without warmup; "
        "per seed, the cost of dropping warmup in final validation loss (a diverged run scores "
        "ln 256; a stalled one its loss, the failure the claim predicts). Post must lose more "
        "than 0.1 nats, pre less.",
        predictions, "Xiong Fig. 1 (IWSLT14, lr 5e-4 / 1e-3): post without warmup 8.45 BLEU, "
        "with 4000 warmup steps ~34; pre without warmup reaches post's best.",
        {"cost": {pl: mean_ci(v) for pl, v in cost.items()},
         "outcomes_without_warmup": {pl: [r["outcome"] for r in rs] for pl, rs in
                                     without.items()},
         "tuning": {pl: _tuning_numbers(t) for pl, t in tuned.items()}},
        _rel(ctx, fig), stalled=stalled, note=_bracket_note(*tuned.values()))


def c9(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    tuned = {pl: ctx.tuned(pl) for pl in ("pre", "post")}
    stalled = _stalled(*tuned.values())
    diff = [a - b for a, b in zip(_val(tuned["pre"]["best"]), _val(tuned["post"]["best"]),
                                  strict=True)]
    predictions = [predict_direction(
        "post vs pre (paper inits)", "val loss(pre, tuned) - val loss(post, tuned)",
        "B2T: post better than pre at <= 6 layers", diff, ">", 0.0, 0.05)]
    numbers: dict[str, Any] = {"tuning": {pl: _tuning_numbers(t) for pl, t in tuned.items()}}
    if p.cross_inits:
        # the other placement's init, at the lr tuned for the placement's own init
        ctx.prefetch([("pre_xavier", [tuned["pre"]["best_lr"]], p.warmup),
                      ("post_gpt2", [tuned["post"]["best_lr"]], p.warmup)])
        pre_x = ctx.runs("pre_xavier", [tuned["pre"]["best_lr"]], p.warmup)
        post_g = ctx.runs("post_gpt2", [tuned["post"]["best_lr"]], p.warmup)
        pre_x, post_g = pre_x[tuned["pre"]["best_lr"]], post_g[tuned["post"]["best_lr"]]
        predictions.append(predict_direction(
            "post vs pre (both Xavier)", "val loss(pre, Xavier) - val loss(post, Xavier)",
            "the claim is about placement, not init", [a - b for a, b in zip(
                _val(pre_x), _val(tuned["post"]["best"]), strict=True)], ">", 0.0, 0.05))
        predictions.append(predict_direction(
            "post vs pre (both GPT-2 init)", "val loss(pre, GPT-2) - val loss(post, GPT-2)",
            "the claim is about placement, not init", [a - b for a, b in zip(
                _val(tuned["pre"]["best"]), _val(post_g), strict=True)], ">", 0.0, 0.05))
        numbers["crossed_inits"] = {"pre, Xavier": mean_ci(_val(pre_x)),
                                    "post, GPT-2 scaled": mean_ci(_val(post_g))}
    bars = {f"{pl} lr {lr}": mean_ci(_val(rs)) for pl, t in tuned.items()
            for lr, rs in t["records"].items() if not any(r["failed"] for r in rs)}
    fig = plot_bars(bars, ctx.fig_dir / "c9_val_loss.svg", ylabel="final validation loss (nats)",
                    title=f"{p.train_blocks} blocks, warmup {p.warmup}, {p.seeds} seeds")
    return make_claim(
        "C9", "Post-LN ends better when it trains (shallow models)",
        "With warmup and a tuned learning rate, a shallow (L <= 12) Post-LN model reaches a "
        "validation loss at least as good as Pre-LN's.",
        "Seed argument; Takase et al. 2022, B2T (2206.00330)",
        f"Final validation loss of {p.train_blocks}-block models after {p.steps} steps, warmup "
        f"{p.warmup_frac:g} of the run, each placement at its best lr of a grid extended until "
        f"it brackets the best; paired seeds ({p.seeds}); paper inits (post Xavier, pre GPT-2 "
        "scaled)" + (", then the inits crossed" if p.cross_inits else "") + "; effect per seed: "
        "pre - post.",
        predictions, "B2T Table (WMT, 6 layers): post 27.4 vs pre 26.9 BLEU, post unstable at "
        ">= 10 layers; ProRes (1.3B): post 11.62 ppl vs pre 10.32.",
        numbers, _rel(ctx, fig), stalled=stalled, note=_bracket_note(*tuned.values()))


def c11(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    on, off = ctx.tuned("pre"), ctx.tuned("pre_nofinal")
    diff = [b - a for a, b in zip(_val(on["best"]), _val(off["best"]), strict=True)]
    predictions = [predict_direction(
        "pre", "val loss(no final norm, tuned) - val loss(final norm, tuned)",
        "GPT-2 / Xiong: pre needs the final norm", diff, ">", 0.0, 0.05)]
    bars = {"with final norm": mean_ci(_val(on["best"])),
            "without final norm": mean_ci(_val(off["best"]))}
    fig = plot_bars(bars, ctx.fig_dir / "c11_final_norm.svg",
                    ylabel="final validation loss (nats)",
                    title=f"pre, each at its tuned lr, {p.seeds} seeds")
    return make_claim(
        "C11", "Pre-LN needs a final norm",
        "Without a final norm before the head, a Pre-LN model's output scale grows with depth "
        "and its loss is worse.",
        "Xiong et al. 2020 (2002.04745); GPT-2",
        f"Final validation loss of pre with and without the final norm, each at its own tuned "
        f"lr (bracketed grids), {p.train_blocks} blocks; effect per seed: without - with.",
        predictions, "GPT-2 added the final norm; no published loss gap at this size.",
        {"tuning": {"with": _tuning_numbers(on), "without": _tuning_numbers(off)}},
        _rel(ctx, fig), stalled=_stalled(on, off), note=_bracket_note(on, off))


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


def _slope_over_depth(values: Sequence[float]) -> float:
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
    slope_pre = [_slope_over_depth(a) for a in ang["pre"]]
    late = {p: [_late_mean(a) for a in v] for p, v in ang.items()}
    predictions = [
        predict_direction("pre", "slope of angular distance(x_l, x_{l+1}) over relative depth",
                          "Curse of Depth: falls with depth (< 0.2 in deep layers of pre-LN "
                          "LLMs)", slope_pre, "<", 0.0, 0.05),
        predict_direction("post vs pre", "late angular distance(post) - late(pre)",
                          "seed argument: post's consecutive blocks stay apart",
                          [b - a for a, b in zip(late["pre"], late["post"], strict=True)],
                          ">", 0.0, 0.05),
    ]

    def late_angle(result: dict[str, Any]) -> float:
        return _late_mean(result["per_block"]["ang_prev"])

    init = {p: mean_ci([late_angle(_deepest(_runs(ctx, p), s)) for s in _seeds(_runs(ctx, p))])
            for p in ("pre", "post")}
    curves = _seed_mean_curves(ctx, tp, ("ang_prev",))
    return make_claim(
        "C2", title,
        "Under Pre-Norm the angular distance between consecutive blocks' streams falls with "
        "depth; under Post-Norm it stays high.",
        "Seed argument; Curse of Depth (2502.05795); Gromov et al. 2024 (angular distance)",
        "Angular distance arccos(cos)/pi between the streams after blocks l and l+1 (blocks 2 to "
        "L; block 1 is compared with the embedding), on trained checkpoints at matched loss, per "
        "seed; the deeper half's mean for the comparison. Values at init reported alongside.",
        predictions, "Gromov et al. / Curse of Depth: in pre-LN LLMs the angular distance of "
        "deep consecutive layers falls below 0.2 (DeepSeek-7B after layer 18).",
        {"late_angle_trained": {p: mean_ci(v) for p, v in late.items()},
         "late_angle_init": init, "matched_pair": tp["pair"]},
        _rel(ctx, plot_per_block(curves, "ang_prev", ctx.fig_dir / "c2_angle.svg")),
        note=_pair_note(tp["pair"]))


def c3(ctx: StudyContext) -> ClaimResult:
    title = "Pre-LN's depth acts like width"
    tp, missing = _trained(ctx, "C3", title)
    if missing:
        return missing
    n = min(len(tp["pre"]["seeds"]), len(tp["post"]["seeds"]))
    kl = {p: [_late_mean(tp[p]["seeds"][s]["per_block"]["merge_kl"]) for s in range(n)]
          for p in ("pre", "post")}
    drop = {p: [_late_mean(tp[p]["seeds"][s]["per_block"]["drop_dloss"]) for s in range(n)]
            for p in ("pre", "post")}
    values = [math.log(b / a) for a, b in zip(kl["pre"], kl["post"], strict=True)
              if a > 0 and b > 0]
    predictions = [predict_direction(
        "post vs pre", "log(late merge KL post / late merge KL pre)",
        "seed argument: merging deep consecutive blocks changes pre little, post much",
        values, ">", 0.0, math.log(2))]
    curves = _seed_mean_curves(ctx, tp, ("merge_kl", "drop_dloss"))
    figs = _rel(ctx, plot_per_block(curves, "merge_kl", ctx.fig_dir / "c3_merge.svg"))
    figs += _rel(ctx, plot_per_block(curves, "drop_dloss", ctx.fig_dir / "c3_drop.svg"))
    return make_claim(
        "C3", title,
        "Running block t+1 on block t's input (merge test) or skipping block t changes a "
        "Pre-LN model little for deep t, a Post-LN model much.",
        "Seed argument; Curse of Depth (2502.05795)",
        "On trained checkpoints at matched loss: KL(original || merged) of the output "
        "distribution when block t+1 reads block t's branch inputs, averaged over the deeper "
        "half of the pairs; effect per seed: log(KL post / KL pre). Layer-drop loss increases "
        "alongside.",
        predictions, "Curse of Depth: removing a deep layer of a pre-LN LLM costs little; "
        "no merge-test number is published.",
        {"late_merge_kl": {p: mean_ci(v) for p, v in kl.items()},
         "late_drop_dloss": {p: mean_ci(v) for p, v in drop.items()},
         "effective_depth": {p: mean_ci([s["summary"].get("effective_depth_kl") for s in
                                         tp[p]["seeds"]]) for p in ("pre", "post")},
         "matched_pair": tp["pair"]},
        figs, note=_pair_note(tp["pair"]))


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
        "seed guidance: without a norm at the extraction point the lens is much worse",
        gaps["pre"], ">", 0.1, 0.1)]
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
        "gap must exceed 0.1 nats. Post's gap is reported only: its block outputs end in a norm, "
        "so it is about 0 by construction.",
        predictions, "No published number; the seed guidance says 'much worse'.",
        {"lens_gap": {p: mean_ci(v) for p, v in gaps.items()}, "matched_pair": tp["pair"]},
        figs, note=_pair_note(tp["pair"]))


CLAIMS: dict[str, Callable[[StudyContext], ClaimResult]] = {
    "C2": c2, "C3": c3, "C6": c6, "C9": c9, "C11": c11, "C13": c13,
}
