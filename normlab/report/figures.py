"""PNG figures for the report, drawn on matplotlib's Agg canvas directly (no pyplot, so importing
or calling this module never changes the caller's backend or global figure state).

    loss_curves_png(runs)      train and val loss of many runs, one colour per placement
    sweep_map_pngs(root)       the sweep package's stability map (+ per-cell curves), if present
    png_data_uri(data)         `data:image/png;base64,...` for embedding in the HTML
"""

from __future__ import annotations

import base64
import io
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.config import PLACEMENTS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# A byte-level LM starts near ln(256) = 5.55; a diverged curve is clipped a little above that.
_LOSS_CEILING = math.log(256) + 1.0
_DPI = 100


def is_png(data: bytes) -> bool:
    return data[:8] == PNG_MAGIC


def png_data_uri(data: bytes) -> str:
    if not is_png(data):
        raise ValueError("not a PNG image")
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def new_figure(width: float, height: float, dpi: int = _DPI):
    """A Figure bound to an Agg canvas (no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def figure_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    return buf.getvalue()


@dataclass
class Curve:
    """One run's loss curves, as (step, value) pairs with finite values only."""

    label: str                 # the run's name in the legend/table
    group: str                 # runs of one group share a colour (the placement)
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


def _placement_order(name: str) -> tuple[int, str]:
    """Placements in the order of `normlab.config.PLACEMENTS` (post before pre), whatever order
    the runs were found in; unknown groups after them, by name."""
    return (PLACEMENTS.index(name), "") if name in PLACEMENTS else (len(PLACEMENTS), name)


def loss_curves_png(curves: Sequence[Curve], title: str = "") -> bytes | None:
    """Two panels (train loss, val loss); every run a line, coloured by its group so that runs of
    one placement overlay each other; an x marks the last point of a diverged run. None when no
    run has a single finite point."""
    if not any(c.train or c.val for c in curves):
        return None
    groups = sorted(dict.fromkeys(c.group for c in curves), key=_placement_order)
    colors = {g: f"C{i % 10}" for i, g in enumerate(groups)}
    fig = new_figure(10.0, 3.8)
    axes = fig.subplots(1, 2, sharey=True)
    values: list[float] = []
    for ax, key, name in ((axes[0], "train", "train loss"), (axes[1], "val", "val loss")):
        per_group = {g: 0 for g in groups}
        for c in curves:
            pts = getattr(c, key)
            if not pts:
                continue
            steps, ys = zip(*pts, strict=True)
            values.extend(ys)
            n = per_group[c.group]
            per_group[c.group] += 1
            ax.plot(steps, ys, color=colors[c.group], linewidth=1.1,
                    alpha=0.9 if n == 0 else 0.55, marker="o" if len(pts) < 4 else None,
                    markersize=3,
                    label=c.group if n == 0 else None)
            if c.diverged:
                ax.plot(steps[-1], ys[-1], "x", color=colors[c.group], markersize=8,
                        markeredgewidth=2)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(title="placement", fontsize=8, title_fontsize=8)
    axes[0].set_ylabel("loss (nats/byte)")
    lo, hi = min(values), max(values)
    if hi > _LOSS_CEILING and lo < _LOSS_CEILING:
        hi = _LOSS_CEILING
    pad = max(0.05, 0.05 * (hi - lo))
    axes[0].set_ylim(lo - pad, hi + pad)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return figure_png(fig)


def _map_axes(sweep: dict[str, Any] | None, configs: list[dict[str, Any]]
              ) -> tuple[str, str, str | None]:
    """x, y and panel for a sweep's map: warmup x lr by placement when the sweep varies those,
    otherwise its first varying axes (seeds are pooled, never an axis of the map)."""
    from normlab.sweep.summarize import varying_paths

    axes = list((sweep or {}).get("axes") or []) or varying_paths(configs)
    axes = [a for a in axes if not a.endswith(".seed")]
    panel = "model.placement" if "model.placement" in axes or any(
        "model.placement" in c for c in configs) else None
    rest = [a for a in axes if a != panel]
    preferred = [a for a in ("train.warmup", "train.lr") if a in rest]
    others = [a for a in rest if a not in preferred]
    chosen = (preferred + others)[:2]
    if len(chosen) == 2:
        return chosen[0], chosen[1], panel
    if len(chosen) == 1:  # one axis: a single row of cells
        return chosen[0], "model.n_blocks" if chosen[0] != "model.n_blocks" else "train.lr", panel
    return "train.warmup", "train.lr", panel


def sweep_map_pngs(root: Path) -> tuple[list[tuple[str, bytes]], str | None]:
    """The stability map and per-cell loss curves of the sweep at `root`, drawn by
    `normlab.sweep.maps` (written to a temporary folder, never into the sweep). Returns
    ([(caption, png)], note): the note says why there is no map, if there is none."""
    try:
        from normlab.sweep.maps import loss_curves, stability_map
        from normlab.sweep.state import read_sweep_file
        from normlab.sweep.summarize import collect
    except ImportError as e:  # the sweep package is optional for the report
        return [], f"stability map unavailable: normlab.sweep cannot be imported ({e})"
    try:
        table = collect(root)
        x, y, panel = _map_axes(read_sweep_file(root), table.configs)
        out: list[tuple[str, bytes]] = []
        with tempfile.TemporaryDirectory(prefix="normlab-report-") as tmp:
            info = stability_map(table, Path(tmp) / "map.png", x=x, y=y, panel=panel)
            out.append((f"stability map: {y} (rows) x {x} (columns)"
                        + (f", one panel per {panel}" if panel else ""),
                        info.path.read_bytes()))
            curves = loss_curves(table, Path(tmp) / "curves.png", x=x, y=y, panel=panel)
            out.append(("training loss of every run, one plot per map cell",
                        curves.path.read_bytes()))
        return out, None
    except Exception as e:  # a map is a bonus: its failure must not cost the whole report
        return [], f"stability map unavailable: {type(e).__name__}: {e}"
