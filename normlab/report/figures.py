"""Figures of a runs report, drawn as SVG in the styles of `normlab.sweep.plotting`:

    loss_curves_svg(groups)    train and val loss, one line per group of runs (mean over its
                               seeds, min-max band), one colour per placement
    sweep_map_svgs(root)       the sweep package's stability map and per-cell curves, if present
                               (on the sweep's own axes: `normlab.sweep.maps.map_axes`)
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.sweep.plotting import (
    figure_bytes,
    legend_outside,
    mean_band,
    new_figure,
    placement_order,
    seeds_text,
    styles_for,
)

# A byte-level LM starts near ln(256) = 5.55; a diverged curve is clipped a little above that.
_LOSS_CEILING = math.log(256) + 1.0


@dataclass
class Curve:
    """One run's loss curves, as (step, value) pairs with finite values only."""

    label: str                 # the run's name
    group: str                 # runs of one group (its seeds) share a line: "pre, lr 0.004"
    train: list[tuple[int, float]] = field(default_factory=list)
    val: list[tuple[int, float]] = field(default_factory=list)
    diverged: bool = False


def curve_from_metrics(label: str, group: str, metrics: Sequence[dict[str, Any]],
                       diverged: bool = False) -> Curve:
    def points(key: str) -> list[tuple[int, float]]:
        out = []
        for m in metrics:
            v, s = m.get(key), m.get("step")
            if (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                    and isinstance(s, int)):
                out.append((s, float(v)))
        return out

    return Curve(label=label, group=group, train=points("train_loss"), val=points("val_loss"),
                 diverged=diverged)


def loss_curves_svg(curves: Sequence[Curve]) -> bytes | None:
    """Two panels (train loss, val loss); one line per group: the mean over its runs (seeds)
    with a min-max band; an x marks the last point of a diverged run. None when no run has a
    single finite point."""
    if not any(c.train or c.val for c in curves):
        return None

    groups = sorted(dict.fromkeys(c.group for c in curves), key=placement_order)
    styles = styles_for(groups)
    fig = new_figure(12.0, 4.0)
    axes = fig.subplots(1, 2, sharey=True)
    values: list[float] = []
    counts: list[int] = []
    for ax, key, name in ((axes[0], "train", "training loss"),
                          (axes[1], "val", "validation loss")):
        drawn: dict[str, list[float]] = {}
        for k, g in enumerate(groups):
            runs = [dict(getattr(c, key)) for c in curves if c.group == g and getattr(c, key)]
            if not runs:
                continue
            steps = sorted({s for r in runs for s in r})
            series = [[r.get(s, math.nan) for s in steps] for r in runs]
            values.extend(v for r in runs for v in r.values())
            n = mean_band(ax, steps, series, styles[g], g, order=k, drawn=drawn)
            if key == "train":
                counts.append(n)
            for c in curves:
                pts = getattr(c, key)
                if c.group == g and c.diverged and pts:
                    ax.plot(*pts[-1], "x", color=styles[g].color, markersize=9,
                            markeredgewidth=2, zorder=20)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("loss (nats/byte)")
    if max(len(g) for g in groups) > 36:  # long labels: below both panels, one per line
        fig.set_size_inches(12.0, 4.0 + 0.22 * len(groups))
        handles, labels = axes[1].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, (0.22 * len(groups) + 0.2) / (4.0 + 0.22 * len(groups)),
                               1, 1))
    else:
        legend_outside(axes[1])
        fig.tight_layout()
    lo, hi = min(values), max(values)
    if hi > _LOSS_CEILING > lo:
        hi = _LOSS_CEILING
    pad = max(0.05, 0.05 * (hi - lo))
    axes[0].set_ylim(lo - pad, hi + pad)
    caption = (f"Training loss (left) and validation loss (right) against step, one line per "
               f"configuration ({'; '.join(groups)}), in the colour and marker of its placement; "
               f"{seeds_text(counts)}; x: the last finite loss of a run that diverged.")
    alt = f"Two line charts of loss in nats/byte against step for {'; '.join(groups)}."
    return figure_bytes(fig, "svg", alt=alt, caption=caption)


def sweep_map_svgs(root: Path) -> tuple[list[bytes], str | None]:
    """The stability map and per-cell loss curves of the sweep at `root` as SVG, drawn by
    `normlab.sweep.maps` (written to a temporary folder, never into the sweep). Returns
    ([svg], note): the note says why there is no map, if there is none."""
    try:
        from normlab.sweep.maps import loss_curves, map_axes, stability_map
        from normlab.sweep.state import read_sweep_file
        from normlab.sweep.summarize import collect
    except ImportError as e:  # the sweep package is optional for the report
        return [], f"stability map unavailable: normlab.sweep cannot be imported ({e})"
    try:
        table = collect(root)
        x, y, panel = map_axes(read_sweep_file(root), table.configs)
        with tempfile.TemporaryDirectory(prefix="normlab-report-") as tmp:
            m = stability_map(table, Path(tmp) / "map.svg", x=x, y=y, panel=panel)
            c = loss_curves(table, Path(tmp) / "curves.svg", x=x, y=y, panel=panel)
            return [m.path.read_bytes(), c.path.read_bytes()], None
    except Exception as e:  # a map is a bonus: its failure must not cost the whole report
        return [], f"stability map unavailable: {type(e).__name__}: {e}"
