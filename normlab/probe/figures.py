"""PNG figures of the probes (matplotlib, Agg backend: no display needed).

    block_<metric>.png   metric against block index, one line per placement, one panel per depth
    depth_<metric>.png   metric against depth on log-log axes: one point per seed, the fitted
                         line per placement, slopes with 95% intervals in the legend
    update_size.png      output change against optimizer step (when the update probe ran)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator, NullFormatter, ScalarFormatter  # noqa: E402

LABELS = {
    "norm": "mean token norm of the stream after the block",
    "norm_attn": "stream norm after the attention sublayer",
    "rel_update": "relative update ||x_{l+1}-x_l|| / ||x_l||",
    "cos_prev": "cos(x_l, x_{l+1})",
    "ang_prev": "angular distance to the previous block",
    "cos_last": "cos(x_{l+1}, x_L)",
    "ang_last": "angular distance to the last block",
    "branch_attn": "attention branch / stream norm",
    "branch_mlp": "MLP branch / stream norm",
    "dual_norm": "ResiDual second-stream norm",
    "attn_grad": "attention weights gradient norm",
    "mlp_grad": "MLP weights gradient norm",
    "stream_grad": "stream gradient norm",
    "merge_dloss": "merge test: loss change (block t+1 on block t's input)",
    "merge_kl": "merge test: KL(original || merged)",
    "drop_dloss": "layer drop: loss increase",
    "drop_kl": "layer drop: KL(original || dropped)",
    "lens_normed": "logit lens loss, through a norm",
    "lens_raw": "logit lens loss, no norm",
    "last_fc_out_grad": "last MLP output weight gradient norm (Xiong Thm 1)",
    "last_norm": "stream norm after the last block",
    "total_grad": "total gradient norm",
    "perturb_change": "output change under weight perturbation",
    "effective_depth": "effective depth (participation ratio, loss)",
    "effective_depth_kl": "effective depth (participation ratio, KL)",
    "update_size_final": "output change after the update steps",
}
LOG_Y = {"norm", "norm_attn", "rel_update", "branch_attn", "branch_mlp", "dual_norm",
         "attn_grad", "mlp_grad", "stream_grad", "merge_kl", "drop_kl"}


def _positive(values: Sequence[float]) -> bool:
    return all(v is not None and math.isfinite(v) and v > 0 for v in values)


def plot_per_block(curves: Mapping[str, Mapping[str, Mapping[str, Sequence[float]]]],
                   metric: str, path: Path) -> Path | None:
    """`curves[placement][depth][metric]` -> one panel per depth, one line per placement."""
    depths = sorted({int(L) for by_L in curves.values() for L in by_L
                     if metric in by_L[L]})
    if not depths:
        return None
    fig, axes = plt.subplots(1, len(depths), figsize=(4.2 * len(depths) + 0.8, 3.6),
                             squeeze=False)
    for ax, L in zip(axes[0], depths, strict=True):
        log = metric in LOG_Y
        for placement, by_L in curves.items():
            ys = by_L.get(str(L), {}).get(metric)
            if not ys:
                continue
            xs = list(range(1, len(ys) + 1))
            log = log and _positive(ys)
            ax.plot(xs, ys, marker="." if len(ys) <= 48 else None, label=placement)
        if log:
            ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("block index l" + (" (pair t, t+1)" if metric.startswith("merge") else ""))
        ax.set_title(f"L = {L}", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(LABELS.get(metric, metric), fontsize=8)
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(LABELS.get(metric, metric), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_vs_depth(runs: Sequence[Mapping], fits: Mapping[str, Mapping[str, Mapping]],
                  metric: str, path: Path) -> Path | None:
    """Per-seed points and the fitted power law per placement, log-log axes."""
    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    drawn = False
    for i, placement in enumerate(dict.fromkeys(r["placement"] for r in runs)):
        pts = [(r["n_blocks"], r["result"]["summary"].get(metric)) for r in runs
               if r["placement"] == placement]
        pts = [(x, y) for x, y in pts if isinstance(y, (int, float)) and math.isfinite(y) and y > 0]
        if not pts:
            continue
        color = f"C{i}"
        ax.scatter([x for x, _ in pts], [y for _, y in pts], color=color, s=14, alpha=0.7)
        fit = fits.get(placement, {}).get(metric)
        label = placement
        if fit and math.isfinite(fit.get("slope", math.nan)):
            xs = sorted({x for x, _ in pts})
            ax.plot(xs, [math.exp(fit["intercept"]) * x ** fit["slope"] for x in xs],
                    color=color)
            lo, hi = fit["ci95_t"]
            label = f"{placement}: slope {fit['slope']:.2f} [{lo:.2f}, {hi:.2f}]"
        ax.plot([], [], color=color, label=label)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xscale("log")
    ax.set_yscale("log")
    depths = sorted({r["n_blocks"] for r in runs})
    ax.set_xticks(depths)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("depth L (blocks)")
    ax.set_ylabel(LABELS.get(metric, metric), fontsize=8)
    ax.set_title(f"{LABELS.get(metric, metric)}\nat init, fitted log-log slope (95% t-interval)",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_update(series: Mapping[str, Sequence[float]], path: Path) -> Path | None:
    """`series[label]` = update sizes per step -> one line per model."""
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    for label, ys in series.items():
        ax.plot(range(len(ys)), ys, label=label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean token ||f(x; theta_t) - f(x; theta_0)||", fontsize=8)
    ax.set_title("update size (DeepNet)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_figures(runs: Sequence[Mapping], out: Path,
                  fits: Mapping[str, Mapping[str, Mapping]] | None = None,
                  per_block_mean: Mapping | None = None) -> list[Path]:
    """All figures for a list of runs (`{"placement", "n_blocks", "seed", "result"}`)."""
    out.mkdir(parents=True, exist_ok=True)
    if per_block_mean is None:
        per_block_mean = {}
        for r in runs:
            per_block_mean.setdefault(r["placement"], {})[str(r["n_blocks"])] = \
                r["result"]["per_block"]
    metrics = list(dict.fromkeys(k for by_L in per_block_mean.values() for pb in by_L.values()
                                 for k in pb))
    written = [plot_per_block(per_block_mean, m, out / f"block_{m}.png") for m in metrics]
    if fits and len({r["n_blocks"] for r in runs}) >= 2:
        for metric in dict.fromkeys(m for f in fits.values() for m in f):
            written.append(plot_vs_depth(runs, fits, metric, out / f"depth_{metric}.png"))
    series = {f"{r['placement']} L={r['n_blocks']} seed={r['seed']}":
              r["result"]["series"]["update_size"] for r in runs
              if "update_size" in r["result"].get("series", {})}
    written.append(plot_update(series, out / "update_size.png"))
    return [p for p in written if p is not None]
