"""Study figures not covered by the probe figures: loss curves of runs and bar charts of
means with 95% intervals (matplotlib, Agg)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from normlab.train.logging import read_metrics  # noqa: E402


def plot_curves(runs_root: Path, runs: Mapping[str, str], path: Path, title: str = ""
                ) -> Path | None:
    """Training loss (and validation points) of each `label -> run_id`."""
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    drawn = False
    for i, (label, run_id) in enumerate(runs.items()):
        rows = read_metrics(runs_root / run_id / "metrics.jsonl")
        pts = [(r["step"], r["train_loss"]) for r in rows
               if isinstance(r.get("train_loss"), float) and math.isfinite(r["train_loss"])]
        if not pts:
            continue
        ax.plot([s for s, _ in pts], [v for _, v in pts], color=f"C{i}", label=label, lw=1.2)
        val = [(r["step"], r["val_loss"]) for r in rows if isinstance(r.get("val_loss"), float)]
        if val:
            ax.scatter([s for s, _ in val], [v for _, v in val], color=f"C{i}", s=18, zorder=3)
        diverged = [r for r in rows if r.get("diverged")]
        if diverged:
            ax.axvline(diverged[-1]["step"], color=f"C{i}", ls=":", lw=1)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/byte); dots: validation")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_bars(values: Mapping[str, Mapping], path: Path, ylabel: str, title: str = ""
              ) -> Path | None:
    """`label -> {"mean", "ci95": [lo, hi]}` as bars with interval whiskers."""
    labels = [k for k, v in values.items() if math.isfinite(v.get("mean", math.nan))]
    if not labels:
        return None
    means = [values[k]["mean"] for k in labels]
    err = [[max(0.0, m - (values[k]["ci95"][0] if math.isfinite(values[k]["ci95"][0]) else m))
            for k, m in zip(labels, means, strict=True)],
           [max(0.0, (values[k]["ci95"][1] if math.isfinite(values[k]["ci95"][1]) else m) - m)
            for k, m in zip(labels, means, strict=True)]]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(labels) + 1.5), 3.8))
    ax.bar(range(len(labels)), means, yerr=err, capsize=4,
           color=[f"C{0 if 'pre' in k else 1}" for k in labels])
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    low = min(m - e for m, e in zip(means, err[0], strict=True))
    ax.set_ylim(bottom=max(0.0, low - 0.2 * (max(means) - low + 0.1)))
    ax.set_ylabel(ylabel, fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
