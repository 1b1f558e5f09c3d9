"""The claims of REFERENCE.md section 2 as experiments: each returns a `ClaimResult` whose verdict
comes from `normlab.study.verdict.decide` on one effect measured per seed."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from normlab.probe.figures import plot_per_block, plot_update, plot_vs_depth
from normlab.probe.fits import loglog_fit, mean_ci
from normlab.study.experiments import StudyContext
from normlab.study.figures import plot_bars, plot_curves
from normlab.study.schema import ClaimResult
from normlab.study.verdict import decide, rule_text

SCALE = ("Measured on small byte-level models on a CPU; effects reported at scale (hundreds of "
         "millions of parameters, long training) may not show at this size.")


def _claim(cid: str, title: str, statement: str, source: str, method: str, values: Sequence[float],
           expected: str, threshold: float, effect_name: str, numbers: dict[str, Any],
           figures: list[str], caveat: str = SCALE) -> ClaimResult:
    verdict, effect = decide(values, expected, threshold, name=effect_name)  # type: ignore[arg-type]
    return ClaimResult(id=cid, title=title, statement=statement, source=source, method=method,
                       verdict=verdict, rule=rule_text(effect_name, expected, threshold),  # type: ignore[arg-type]
                       effect=effect, numbers={"per_seed_effect": list(values), **numbers},
                       figures=figures, caveat=caveat)


def _runs(ctx: StudyContext, placement: str) -> list[dict[str, Any]]:
    return ctx.init_sweep()[placement]["runs"]


def _seeds(runs: list[dict[str, Any]]) -> list[int]:
    return sorted({r["seed"] for r in runs})


def _deepest(runs: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    mine = [r for r in runs if r["seed"] == seed]
    return max(mine, key=lambda r: r["n_blocks"])["result"]


def _per_seed_slope(runs: list[dict[str, Any]], metric: str) -> dict[int, float]:
    out = {}
    for seed in _seeds(runs):
        pts = [(r["n_blocks"], r["result"]["summary"].get(metric), seed) for r in runs
               if r["seed"] == seed]
        out[seed] = loglog_fit([p for p in pts if isinstance(p[1], (int, float))],
                               n_boot=0)["slope"]
    return out


def _fig(ctx: StudyContext, name: str) -> str:
    return f"figures/{name}"


def _rel(ctx: StudyContext, path) -> list[str]:
    return [str(path.relative_to(ctx.out))] if path is not None else []


def _init_block_figure(ctx: StudyContext, metric: str, placements: Sequence[str], name: str
                       ) -> list[str]:
    sweep = ctx.init_sweep()
    curves = {p: sweep[p]["per_block_mean"][p] for p in placements}
    deepest = str(max(ctx.profile.init_depths))
    curves = {p: {deepest: c[deepest]} for p, c in curves.items() if deepest in c}
    return _rel(ctx, plot_per_block(curves, metric, ctx.fig_dir / name))


def _init_depth_figure(ctx: StudyContext, metric: str, placements: Sequence[str], name: str
                       ) -> list[str]:
    sweep = ctx.init_sweep()
    runs = [r for p in placements for r in sweep[p]["runs"]]
    fits = {p: sweep[p]["fits"] for p in placements}
    return _rel(ctx, plot_vs_depth(runs, fits, metric, ctx.fig_dir / name))


def _fits(ctx: StudyContext, metric: str, placements: Sequence[str]) -> dict[str, Any]:
    sweep = ctx.init_sweep()
    return {p: {k: sweep[p]["fits"].get(metric, {}).get(k) for k in ("slope", "ci95_t",
                                                                      "ci95_boot", "n_points")}
            for p in placements}


# -- claims on models at init --------------------------------------------------------------------

def c1(ctx: StudyContext) -> ClaimResult:
    pre, post = _runs(ctx, "pre"), _runs(ctx, "post")
    seeds = _seeds(pre)
    exp_pre = [_deepest(pre, s)["summary"]["growth_exponent"] for s in seeds]
    exp_post = [_deepest(post, s)["summary"]["growth_exponent"] for s in seeds]
    trained = ctx.trained_probes()
    trained_exp = {p: [s["summary"].get("growth_exponent") for s in trained[p]["seeds"]]
                   for p in ("pre", "post")}
    return _claim(
        "C1", "Pre-Norm's stream grows with depth; Post-Norm's stays constant",
        "The mean token norm of the residual stream grows with depth under Pre-Norm (at init "
        "like sqrt(l), Xiong's Lemma 2; faster after training per Curse of Depth) and stays "
        "constant under Post-Norm.",
        "Xiong et al. 2020 (2002.04745) Lemma 2; Sun et al. 2025 (2502.05795)",
        "Growth exponent = slope of log(mean token norm after block l) against log(l), at init "
        f"(Xavier) in the deepest model (L={max(ctx.profile.init_depths)}), per seed; also on "
        "the trained checkpoints.",
        [a - b for a, b in zip(exp_pre, exp_post, strict=True)], ">", 0.1,
        "growth exponent(pre) - growth exponent(post)",
        {"growth_exponent_init": {"pre": mean_ci(exp_pre), "post": mean_ci(exp_post)},
         "growth_exponent_trained": {p: mean_ci([v for v in vs if v is not None])
                                     for p, vs in trained_exp.items()},
         "xiong_lemma2": "(1+l/2)d <= E||x_l||^2 <= (1+3l/2)d: exponent 0.5"},
        _init_block_figure(ctx, "norm", ("pre", "post", "admin", "deepnorm"), "c1_norm.png"))


def c2(ctx: StudyContext) -> ClaimResult:
    pre, post = _runs(ctx, "pre"), _runs(ctx, "post")

    def late_angle(result: dict[str, Any]) -> float:
        ang = result["per_block"]["ang_prev"]
        half = ang[len(ang) // 2:]
        return sum(half) / len(half)

    seeds = _seeds(pre)
    a_pre = [late_angle(_deepest(pre, s)) for s in seeds]
    a_post = [late_angle(_deepest(post, s)) for s in seeds]
    trained = ctx.trained_probes()
    late_trained = {p: mean_ci([late_angle(s) for s in trained[p]["seeds"]])
                    for p in ("pre", "post")}
    return _claim(
        "C2", "Pre-Norm's consecutive blocks become near-identical",
        "Under Pre-Norm the angular distance between consecutive blocks' streams falls with "
        "depth; under Post-Norm it stays high.",
        "Seed argument; Curse of Depth (2502.05795); Gromov et al. 2024 (angular distance)",
        "Angular distance arccos(cos)/pi between the streams after blocks l and l+1, averaged "
        "over the deeper half of the blocks, at init (deepest model) per seed; trained "
        "checkpoints reported alongside.",
        [b - a for a, b in zip(a_pre, a_post, strict=True)], ">", 0.0,
        "late angular distance(post) - late angular distance(pre)",
        {"late_angle_init": {"pre": mean_ci(a_pre), "post": mean_ci(a_post)},
         "late_angle_trained": late_trained},
        _init_block_figure(ctx, "ang_prev", ("pre", "post"), "c2_angle.png"))


def c4(ctx: StudyContext) -> ClaimResult:
    s_pre = _per_seed_slope(_runs(ctx, "pre"), "last_fc_out_grad")
    s_post = _per_seed_slope(_runs(ctx, "post"), "last_fc_out_grad")
    seeds = sorted(s_pre)
    return _claim(
        "C4", "Xiong Theorem 1: the last layer's gradient vs depth",
        "At init, the gradient of the last MLP output weight is flat in L for Post-LN and falls "
        "like 1/sqrt(L) for Pre-LN: log-log slopes about 0 and -0.5.",
        "Xiong et al. 2020 (2002.04745) Theorem 1",
        "Frobenius norm of the gradient of the last block's MLP output weight at init (Xavier), "
        f"depths {list(ctx.profile.init_depths)}; log-log slope per seed.",
        [s_pre[s] - s_post[s] for s in seeds], "<", -0.2,
        "slope(pre) - slope(post) of log grad vs log L",
        {"slopes": _fits(ctx, "last_fc_out_grad", ("pre", "post", "admin", "deepnorm")),
         "per_seed_slope": {"pre": [s_pre[s] for s in seeds], "post": [s_post[s] for s in seeds]},
         "expected": {"post": 0.0, "pre": -0.5}},
        _init_depth_figure(ctx, "last_fc_out_grad", ("pre", "post"), "c4_last_grad.png"))


def c5(ctx: StudyContext) -> ClaimResult:
    pre, post = _runs(ctx, "pre"), _runs(ctx, "post")

    def trend(result: dict[str, Any]) -> float:
        pb = result["per_block"]
        g = [math.hypot(a, m) for a, m in zip(pb["attn_grad"], pb["mlp_grad"], strict=True)]
        L = len(g)
        xs = [i / max(1, L - 1) for i in range(L)]
        ys = [math.log(max(v, 1e-30)) for v in g]
        mx, my = sum(xs) / L, sum(ys) / L
        sxx = sum((x - mx) ** 2 for x in xs)
        return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx

    seeds = _seeds(pre)
    t_pre = [trend(_deepest(pre, s)) for s in seeds]
    t_post = [trend(_deepest(post, s)) for s in seeds]
    return _claim(
        "C5", "Per-layer gradients at init: Post grows toward the output, Pre is flat",
        "At init the gradient norm of each block's weights grows toward the output under "
        "Post-LN and is roughly flat under Pre-LN.",
        "Xiong et al. 2020 (2002.04745), Fig. 3",
        "Gradient norm of each block's attention and MLP weights at init (Xavier), deepest "
        "model; trend = slope of log(grad norm) against relative depth l/(L-1), per seed.",
        [b - a for a, b in zip(t_pre, t_post, strict=True)], ">", 0.0,
        "log-grad trend over depth(post) - trend(pre)",
        {"trend": {"pre": mean_ci(t_pre), "post": mean_ci(t_post)}},
        _init_block_figure(ctx, "mlp_grad", ("pre", "post"), "c5_block_grads.png"))


def c7(ctx: StudyContext) -> ClaimResult:
    upd = ctx.update_sizes()
    series = upd["series"]
    k = max(1, upd["steps"] // 3)

    def early(label: str) -> list[float]:
        return [sum(s[1:k + 1]) / k for s in series[label]]

    post0, dn0, postw = early("post, no warmup"), early("deepnorm, no warmup"), early(
        "post, warmup")
    values = [math.log(a / b) for a, b in zip(post0, dn0, strict=True) if a > 0 and b > 0]
    mean_series = {label: [sum(col) / len(col) for col in zip(*runs, strict=True)]
                   for label, runs in series.items()}
    fig = plot_update(mean_series, ctx.fig_dir / "c7_update_size.png")
    return _claim(
        "C7", "DeepNet: Post-LN's early model update explodes without warmup",
        "Post-LN without warmup makes a large change of the model output in the first steps, "
        "then flattens; warmup and DeepNorm grow slowly.",
        "Wang et al. 2022, DeepNet (2203.00555), Fig. 3",
        f"||f(x; theta_t) - f(x; theta_0)|| over the first {upd['steps']} AdamW steps at lr "
        f"{upd['lr']:g}, {upd['n_blocks']} blocks; early = mean over steps 1..{k}; per seed.",
        values, ">", 0.0, "log(early update post no warmup / early update DeepNorm no warmup)",
        {"early_update": {"post, no warmup": mean_ci(post0), "post, warmup": mean_ci(postw),
                          "deepnorm, no warmup": mean_ci(dn0),
                          "pre, no warmup": mean_ci(early("pre, no warmup"))},
         "mean_series": mean_series},
        _rel(ctx, fig))


def c8(ctx: StudyContext) -> ClaimResult:
    s_pre = _per_seed_slope(_runs(ctx, "pre"), "perturb_change")
    s_post = _per_seed_slope(_runs(ctx, "post"), "perturb_change")
    seeds = sorted(s_pre)
    return _claim(
        "C8", "Admin: output sensitivity to weight perturbation grows with depth",
        "E||f(x; w) - f(x; w + delta)||^2 grows like O(L) for Post-LN, O(log L) for Pre-LN, and "
        "stays bounded for Admin.",
        "Liu et al. 2020, Admin (2004.08249), Theorem 2 and Fig. 5",
        "Output change under a small random relative weight perturbation at init, depths "
        f"{list(ctx.profile.init_depths)}; log-log slope per seed.",
        [s_post[s] - s_pre[s] for s in seeds], ">", 0.0,
        "slope(post) - slope(pre) of log output change vs log L",
        {"slopes": _fits(ctx, "perturb_change", ("pre", "post", "admin", "deepnorm")),
         "expected": {"post": 1.0, "pre": "O(log L): slope near 0", "admin": "bounded"}},
        _init_depth_figure(ctx, "perturb_change", ("pre", "post", "admin"),
                           "c8_perturbation.png"))


# -- claims on trained models --------------------------------------------------------------------

def _grid_scores(ctx: StudyContext, placement: str, lr: float, warmup: int,
                 variant: str = "final") -> list[float]:
    grid = ctx.grid()
    return [grid[f"{placement}|{lr}|{warmup}|{s}|{variant}"]["score"]
            for s in range(ctx.profile.seeds)]


def _grid_table(ctx: StudyContext) -> dict[str, Any]:
    return {k: {f: v[f] for f in ("outcome", "reason", "step", "val_loss")}
            for k, v in ctx.grid().items()}


def c6(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    lr = max(p.lrs)
    cells = {(pl, w): _grid_scores(ctx, pl, lr, w) for pl in ("pre", "post") for w in (0, p.warmup)}
    values = [(cells["post", 0][s] - cells["post", p.warmup][s])
              - (cells["pre", 0][s] - cells["pre", p.warmup][s]) for s in range(p.seeds)]
    grid = ctx.grid()
    curves = {f"{pl}, warmup {w}": grid[f"{pl}|{lr}|{w}|0|final"]["run_id"]
              for pl in ("pre", "post") for w in (0, p.warmup)}
    fig = plot_curves(ctx.runs_root, curves, ctx.fig_dir / "c6_warmup_curves.png",
                      title=f"training loss at lr {lr:g}, seed 0")
    return _claim(
        "C6", "Post-LN needs learning-rate warmup; Pre-LN does not",
        "Trained with Adam at a high learning rate, Post-LN without warmup fails or ends much "
        "worse than with warmup, while Pre-LN trains without warmup.",
        "Xiong et al. 2020 (2002.04745), Sec. 3 and Fig. 1 (IWSLT14: 8.45 BLEU without warmup)",
        f"Final validation loss at lr {lr:g} with warmup 0 and {p.warmup} steps, "
        f"{p.train_blocks} blocks, {p.steps} steps; a diverged run scores ln 256. Effect per "
        "seed: the cost of dropping warmup for post minus that for pre.",
        values, ">", 0.0, "[post(w=0) - post(w)] - [pre(w=0) - pre(w)] in val loss",
        {"val_loss": {f"{pl}, warmup {w}": mean_ci(v) for (pl, w), v in cells.items()},
         "runs": _grid_table(ctx)},
        _rel(ctx, fig))


def c9(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    lr_pre, lr_post = ctx.tuned_lr("pre"), ctx.tuned_lr("post")
    pre = _grid_scores(ctx, "pre", lr_pre, p.warmup)
    post = _grid_scores(ctx, "post", lr_post, p.warmup)
    bars = {f"{pl} lr {lr:g}": mean_ci(_grid_scores(ctx, pl, lr, p.warmup))
            for pl in ("pre", "post") for lr in p.lrs}
    fig = plot_bars(bars, ctx.fig_dir / "c9_val_loss.png", ylabel="final validation loss",
                    title=f"{p.train_blocks} blocks, warmup {p.warmup}, {p.seeds} seeds")
    return _claim(
        "C9", "Post-LN ends better when it trains (shallow models)",
        "With warmup and a tuned learning rate, a shallow (L <= 12) Post-LN model reaches a "
        "validation loss at least as good as Pre-LN's.",
        "Seed argument; Takase et al. 2022, B2T (2206.00330): post better at <= 6 layers",
        f"Final validation loss of {p.train_blocks}-block models, warmup {p.warmup}, each "
        f"placement at its best lr from {list(p.lrs)}; effect per seed: pre - post.",
        [a - b for a, b in zip(pre, post, strict=True)], ">", 0.0,
        "val loss(pre, tuned lr) - val loss(post, tuned lr)",
        {"tuned_lr": {"pre": lr_pre, "post": lr_post}, "val_loss": bars},
        _rel(ctx, fig))


def c11(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    lr = ctx.tuned_lr("pre")
    on = _grid_scores(ctx, "pre", lr, p.warmup)
    off = _grid_scores(ctx, "pre", lr, p.warmup, variant="nofinal")
    bars = {"pre with final norm": mean_ci(on), "pre without final norm": mean_ci(off)}
    fig = plot_bars(bars, ctx.fig_dir / "c11_final_norm.png", ylabel="final validation loss",
                    title=f"pre, lr {lr:g}, {p.seeds} seeds")
    return _claim(
        "C11", "Pre-LN needs a final norm",
        "Without a final norm before the head, a Pre-LN model's output scale grows with depth "
        "and its loss is worse.",
        "Xiong et al. 2020 (2002.04745); GPT-2",
        f"Final validation loss of pre with and without the final norm at pre's tuned lr "
        f"({lr:g}), {p.train_blocks} blocks; effect per seed: without - with.",
        [b - a for a, b in zip(on, off, strict=True)], ">", 0.0,
        "val loss(no final norm) - val loss(final norm)", {"val_loss": bars}, _rel(ctx, fig))


def _seed_mean_curves(ctx: StudyContext, tp: dict[str, Any], metrics: Sequence[str]
                      ) -> dict[str, Any]:
    """Per-block curves of the trained probes averaged over seeds, shaped for plot_per_block."""
    return {p: {str(ctx.profile.train_blocks): {
        m: [sum(c) / len(c) for c in zip(*[s["per_block"][m] for s in tp[p]["seeds"]],
                                         strict=True)] for m in metrics}}
        for p in ("pre", "post")}


def _late_mean(values: list[float]) -> float:
    half = values[len(values) // 2:]
    return sum(half) / len(half)


def c3(ctx: StudyContext) -> ClaimResult:
    tp = ctx.trained_probes()
    seeds = range(min(len(tp["pre"]["seeds"]), len(tp["post"]["seeds"])))
    kl = {p: [_late_mean(tp[p]["seeds"][s]["per_block"]["merge_kl"]) for s in seeds]
          for p in ("pre", "post")}
    drop = {p: [_late_mean(tp[p]["seeds"][s]["per_block"]["drop_dloss"]) for s in seeds]
            for p in ("pre", "post")}
    values = [math.log(b / a) for a, b in zip(kl["pre"], kl["post"], strict=True)
              if a > 0 and b > 0]
    curves = _seed_mean_curves(ctx, tp, ("merge_kl", "drop_dloss"))
    figs = _rel(ctx, plot_per_block(curves, "merge_kl", ctx.fig_dir / "c3_merge.png"))
    figs += _rel(ctx, plot_per_block(curves, "drop_dloss", ctx.fig_dir / "c3_drop.png"))
    return _claim(
        "C3", "Pre-LN's depth acts like width",
        "Running block t+1 on block t's input (merge test) or skipping block t changes a "
        "Pre-LN model little for deep t, a Post-LN model much.",
        "Seed argument; Curse of Depth (2502.05795)",
        "On the tuned trained checkpoints: KL(original || merged) of the output distribution "
        "when block t+1 reads block t's branch inputs, averaged over the deeper half of the "
        "pairs; effect per seed: log(KL post / KL pre). Layer-drop loss increases alongside.",
        values, ">", 0.0, "log(late merge KL post / late merge KL pre)",
        {"late_merge_kl": {p: mean_ci(v) for p, v in kl.items()},
         "late_drop_dloss": {p: mean_ci(v) for p, v in drop.items()},
         "effective_depth": {p: mean_ci([s["summary"].get("effective_depth_kl") for s in
                                         tp[p]["seeds"]]) for p in ("pre", "post")}},
        figs)


def c13(ctx: StudyContext) -> ClaimResult:
    tp = ctx.trained_probes()

    def gap(entry: dict[str, Any]) -> float:
        raw, normed = entry["per_block"]["lens_raw"], entry["per_block"]["lens_normed"]
        diffs = [r - n for r, n in zip(raw[:-1], normed[:-1], strict=True)] or [0.0]
        return sum(diffs) / len(diffs)

    seeds = range(min(len(tp["pre"]["seeds"]), len(tp["post"]["seeds"])))
    gaps = {p: [gap(tp[p]["seeds"][s]) for s in seeds] for p in ("pre", "post")}
    curves = _seed_mean_curves(ctx, tp, ("lens_raw", "lens_normed"))
    figs = _rel(ctx, plot_per_block(curves, "lens_raw", ctx.fig_dir / "c13_lens_raw.png"))
    figs += _rel(ctx, plot_per_block(curves, "lens_normed", ctx.fig_dir / "c13_lens_normed.png"))
    return _claim(
        "C13", "Intermediate heads need a norm under Pre-LN",
        "Post-LN's block outputs are normalized already; Pre-LN's are not, so a head read at an "
        "intermediate block without a norm at the extraction point does much worse.",
        "Seed guidance (logit lens)",
        "Logit lens on the tuned trained checkpoints: the LM head's loss on each block's stream "
        "(all but the last), through the final norm and raw; effect per seed: "
        "mean(raw - normed) for pre minus the same for post.",
        [a - b for a, b in zip(gaps["pre"], gaps["post"], strict=True)], ">", 0.0,
        "lens gap (raw - normed) of pre - lens gap of post",
        {"lens_gap": {p: mean_ci(v) for p, v in gaps.items()}}, figs)


CLAIMS: dict[str, Callable[[StudyContext], ClaimResult]] = {
    "C1": c1, "C2": c2, "C3": c3, "C4": c4, "C5": c5, "C6": c6, "C7": c7, "C8": c8, "C9": c9,
    "C11": c11, "C13": c13,
}
