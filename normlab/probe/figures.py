"""Figures of the probes, in the placement styles of `normlab.sweep.plotting` (matplotlib's Agg
canvas, no pyplot; the format follows the file suffix, .svg or .png).

    block_<metric>.png   metric against block index, one line per placement (mean over seeds,
                         min-max band), one panel per depth
    depth_<metric>.png   metric against depth on log-log axes: one point per seed, the fitted
                         line per placement, slopes with 95% intervals in the legend
    update_size.png      output change against optimizer step (when the update probe ran)
    matrix_<metric>.png  a per-block metric with a row per block (the skip effect): a heatmap
                         per placement and depth (mean over seeds), skipped block against the
                         block measured
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.ticker import MaxNLocator, NullFormatter, ScalarFormatter

from normlab.probe.metrics import figure_captions, figure_labels, log_scale, matrices
from normlab.sweep.plotting import (
    BLOCK_AXIS,
    SAME_TEXT,
    legend_outside,
    mean_band,
    new_figure,
    per_seed,
    placement_order,
    plain_log_ticks,
    save_figure,
    seeds_text,
    style,
    styles_for,
)

# What each metric is, as an axis label with its unit (losses and KL divergences in nats: the
# models are byte-level, so a loss is nats per byte); what each per-block metric measures, for
# captions; which metrics are drawn on a log axis. All from the table of metrics.
LABELS = figure_labels()
WHAT = figure_captions()
LOG_Y = log_scale()
MATRICES = matrices()


def axis_label(metric: str, width: int = 40) -> str:
    """`label(metric)` wrapped onto lines of at most `width` characters: a long label (the merge
    KL's) is taller than the figure's panel in one line, and the saved file would cut it."""
    return "\n".join(textwrap.wrap(label(metric), width))


def label(metric: str) -> str:
    return LABELS.get(metric, metric.replace("_", " "))


def _positive(series: Sequence[Any]) -> bool:
    flat = [v for s in series for v in (s if isinstance(s, list | tuple) else [s])]
    return all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in flat)


def plot_per_block(curves: Mapping[str, Mapping[str, Mapping[str, Sequence[Any]]]],
                   metric: str, path: Path) -> Path | None:
    """`curves[placement][depth][metric]` -> one panel per depth, one line per placement. A
    value is one list (a single seed, or a mean computed elsewhere) or a list of per-seed lists,
    drawn as their mean with a min-max band."""
    depths = sorted({int(L) for by_L in curves.values() for L in by_L if metric in by_L[L]})
    if not depths:
        return None
    placements = sorted(curves, key=placement_order)
    fig = new_figure(4.4 * len(depths) + 2.2, 3.7)
    axes = fig.subplots(1, len(depths), squeeze=False)[0]
    counts: list[int] = []
    same = False
    for ax, L in zip(axes, depths, strict=True):
        log = metric in LOG_Y
        drawn: dict[str, list[float]] = {}
        for k, placement in enumerate(placements):
            ys = curves[placement].get(str(L), {}).get(metric)
            if not ys:
                continue
            log = log and _positive(ys)
            n = max(len(s) for s in per_seed(ys))
            counts.append(mean_band(ax, range(n), ys, style(placement), placement,
                                    order=k, drawn=drawn))
        same = same or any("(=" in t.get_label() for t in ax.get_lines())
        if log:
            ax.set_yscale("log")
            plain_log_ticks(ax.yaxis)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(f"{BLOCK_AXIS}, merged with the next" if metric.startswith("merge")
                      else BLOCK_AXIS)
        ax.set_title(f"L = {L} blocks", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(axis_label(metric), fontsize=8.5)
    legend_outside(axes[-1], title="placement", title_fontsize=8)
    fig.tight_layout()
    what = WHAT.get(metric, label(metric)[:1].upper() + label(metric)[1:])
    depth_text = ", ".join(str(L) for L in depths)
    caption = (f"{what}, in models of {depth_text} blocks ({'log' if log else 'linear'} scale), "
               f"one line per placement ({', '.join(placements)}); {seeds_text(counts)}"
               + (f"; {SAME_TEXT}." if same else "."))
    alt = (f"Line chart, one panel per depth ({depth_text} blocks): {label(metric)} against "
           f"block index for {', '.join(placements)}.")
    return save_figure(fig, path, alt=alt, caption=caption)


def plot_vs_depth(runs: Sequence[Mapping], fits: Mapping[str, Mapping[str, Mapping]],
                  metric: str, path: Path) -> Path | None:
    """Per-seed points and the fitted power law per placement, log-log axes."""
    fig = new_figure(7.6, 4.2)
    ax = fig.subplots()
    drawn = []
    placements = sorted(dict.fromkeys(r["placement"] for r in runs), key=placement_order)
    for k, placement in enumerate(placements):
        pts = [(r["n_blocks"], r["result"]["summary"].get(metric)) for r in runs
               if r["placement"] == placement]
        pts = [(x, y) for x, y in pts if isinstance(y, int | float) and math.isfinite(y) and y > 0]
        if not pts:
            continue
        st = style(placement)
        ax.scatter([x for x, _ in pts], [y for _, y in pts], color=st.color, marker=st.marker,
                   s=22, alpha=0.75, zorder=3 + k)
        fit = fits.get(placement, {}).get(metric)
        text = placement
        if fit and math.isfinite(fit.get("slope") or math.nan):
            xs = sorted({x for x, _ in pts})
            ax.plot(xs, [math.exp(fit["intercept"]) * x ** fit["slope"] for x in xs],
                    color=st.color, linestyle=st.linestyle, linewidth=max(1.0, 2.2 - 0.4 * k),
                    zorder=3 + k)
            lo, hi = fit["ci95_t"]
            text = f"{placement}: slope {fit['slope']:.2f} [{lo:.2f}, {hi:.2f}]"
        ax.plot([], [], label=text, **st.line())
        drawn.append(placement)
    if not drawn:
        return None
    ax.set_xscale("log")
    ax.set_yscale("log")
    depths = sorted({r["n_blocks"] for r in runs})
    ax.set_xticks(depths)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    plain_log_ticks(ax.yaxis)
    ax.set_xlabel("depth (blocks)")
    ax.set_ylabel(axis_label(metric), fontsize=8.5)
    legend_outside(ax, title="placement: fitted slope\n[95% t-interval]", title_fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    n_seeds = len({r.get("seed") for r in runs})
    caption = (f"{label(metric)[:1].upper() + label(metric)[1:]} at initialization against "
               f"depth ({', '.join(map(str, depths))} blocks) on log-log axes: one marker per "
               f"model and seed ({n_seeds} seed(s)), the fitted power law per placement as a "
               "line; the legend gives each fitted slope with its 95% t-interval.")
    alt = (f"Log-log scatter plot with fitted lines: {label(metric)} against depth for "
           f"{', '.join(drawn)}.")
    return save_figure(fig, path, alt=alt, caption=caption)


def plot_update(series: Mapping[str, Sequence[Any]], path: Path) -> Path | None:
    """`series[label]` = update sizes per step (one list, or per-seed lists drawn as their mean
    with a min-max band) -> one line per label, in the style of the placement it names."""
    if not series:
        return None
    fig = new_figure(7.6, 4.0)
    ax = fig.subplots()
    labels = sorted(series, key=placement_order)
    styles = styles_for(labels)
    counts: list[int] = []
    drawn: dict[str, list[float]] = {}
    for k, name in enumerate(labels):
        ys = series[name]
        n = max(len(s) for s in per_seed(ys))
        counts.append(mean_band(ax, range(n), ys, styles[name], name, order=k, drawn=drawn))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("output change from init (mean token norm)", fontsize=8.5)
    legend_outside(ax)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    caption = ("How far the model's output moves from its initial output over the first "
               f"optimizer steps (DeepNet's model update), one line per setting; "
               f"{seeds_text(counts)}.")
    alt = f"Line chart: output change against optimizer step for {', '.join(labels)}."
    return save_figure(fig, path, alt=alt, caption=caption)


def plot_matrix(runs: Sequence[Mapping], metric: str, path: Path) -> Path | None:
    """A metric with one row per block (row `i`: block `i` changed, one value per block `j`) as
    heatmaps, one panel per placement and depth, each the mean over that model's seeds."""
    groups: dict[tuple[str, int], list[list[list[float]]]] = {}
    for r in runs:
        rows = r["result"].get("per_block", {}).get(metric)
        if rows:
            groups.setdefault((r["placement"], int(r["n_blocks"])), []).append(rows)
    if not groups:
        return None
    keys = sorted(groups, key=lambda k: (placement_order(k[0]), k[1]))
    fig = new_figure(3.4 * len(keys) + 1.2, 3.6)
    axes = fig.subplots(1, len(keys), squeeze=False)[0]
    means = {}
    for key in keys:
        seeds = groups[key]
        n = len(seeds[0])
        means[key] = [[sum(s[i][j] for s in seeds) / len(seeds) for j in range(n)]
                      for i in range(n)]
    top = max(1.0, *(v for m in means.values() for row in m for v in row if math.isfinite(v)))
    image = None
    for ax, key in zip(axes, keys, strict=True):  # one colour scale for every panel
        image = ax.imshow(means[key], origin="lower", vmin=0.0, vmax=top, cmap="viridis",
                          interpolation="nearest")
        ax.set_title(f"{key[0]}, L = {key[1]}", fontsize=10)
        ax.set_xlabel("block measured", fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("block skipped", fontsize=9)
    fig.colorbar(image, ax=list(axes), label="\n".join(textwrap.wrap(label(metric), 30)))
    what = WHAT.get(metric, label(metric)[:1].upper() + label(metric)[1:])
    names = ", ".join(f"{p} (L = {L})" for p, L in keys)
    caption = f"{what}, for {names}; mean over each model's seeds."
    alt = f"Heatmaps, one per model ({names}): {label(metric)}, skipped block against block."
    return save_figure(fig, path, alt=alt, caption=caption)


def per_seed_block_curves(runs: Sequence[Mapping]) -> dict[str, dict[str, dict[str, list]]]:
    """`{placement: {depth: {metric: [per-seed list, ...]}}}` from a list of probe runs."""
    out: dict[str, dict[str, dict[str, list]]] = {}
    for r in runs:
        by_metric = out.setdefault(r["placement"], {}).setdefault(str(r["n_blocks"]), {})
        for metric, values in r["result"].get("per_block", {}).items():
            by_metric.setdefault(metric, []).append(values)
    return out


def write_figures(runs: Sequence[Mapping], out: Path,
                  fits: Mapping[str, Mapping[str, Mapping]] | None = None,
                  per_block_mean: Mapping | None = None, suffix: str = ".png") -> list[Path]:
    """All figures for a list of runs (`{"placement", "n_blocks", "seed", "result"}`). Per-block
    lines are the mean over the runs' seeds with a min-max band; `per_block_mean` is drawn only
    when the runs carry no per-block values."""
    out.mkdir(parents=True, exist_ok=True)
    curves = per_seed_block_curves(runs)
    if not any(curves.values()) and per_block_mean:
        curves = dict(per_block_mean)
    metrics = list(dict.fromkeys(k for by_L in curves.values() for pb in by_L.values()
                                 for k in pb))
    written = [plot_per_block(curves, m, out / f"block_{m}{suffix}") for m in metrics
               if m not in MATRICES]
    written += [plot_matrix(runs, m, out / f"matrix_{m}{suffix}") for m in metrics
                if m in MATRICES]
    if fits and len({r["n_blocks"] for r in runs}) >= 2:
        for metric in dict.fromkeys(m for f in fits.values() for m in f):
            written.append(plot_vs_depth(runs, fits, metric, out / f"depth_{metric}{suffix}"))
    series: dict[str, list] = {}
    for r in runs:
        if "update_size" in r["result"].get("series", {}):
            series.setdefault(f"{r['placement']} L={r['n_blocks']}", []).append(
                r["result"]["series"]["update_size"])
    written.append(plot_update(series, out / f"update_size{suffix}"))
    return [p for p in written if p is not None]
