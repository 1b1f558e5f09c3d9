"""Stability maps: heatmaps of a sweep, one cell per (x, y) pair, one panel per value of `panel`.

Each cell pools the runs that share its x, y and panel values (seeds, and any other axis not on
the map). Its colour is the worst outcome among them: diverged (non-finite loss or gradient) >
loss spike > failed > stalled > not finished > completed. Its text is the mean final validation
loss of the completed runs and, where some diverged or stalled, `k/n div` or `k/n stalled`; where
none completed, the reason and median step of divergence, or `stalled` (a stalled run's loss is
never shown as a trained one). The best cell of each panel has a heavy border.

`loss_curves` draws one small plot per cell with the training loss of the runs in it: per panel
value (placement, in its style from `normlab.sweep.plotting`) the mean over the cell's seeds with a
min-max band, so pre and post can be compared cell by cell.

Matplotlib is used through its Agg canvas directly: importing this module does not change the
caller's backend. The format follows the file suffix (.png or .svg).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.sweep.plotting import (
    mean_band,
    new_figure,
    save_figure,
    seeds_text,
    styles_for,
)
from normlab.sweep.spec import format_value
from normlab.sweep.summarize import SweepTable, collect, varying_paths
from normlab.train.logging import read_metrics

CATEGORIES = ("completed", "stalled", "loss spike", "diverged", "failed", "not finished")
COLORS = {"completed": "#9ed7a5", "stalled": "#b7a9d6", "loss spike": "#f7b267",
          "diverged": "#e4646b", "failed": "#5b5b5b", "not finished": "#e3e3e3"}
_SHORT_REASON = {"loss_spike": "spike", "nonfinite_loss": "nan loss",
                 "nonfinite_grad": "nan grad"}


class MapError(ValueError):
    """An axis that is not in the sweep's configs."""


@dataclass
class Cell:
    runs: list[int] = field(default_factory=list)     # row indices into the table
    n: int = 0
    completed: int = 0
    spike: int = 0
    nonfinite: int = 0
    failed: int = 0
    stalled: int = 0
    losses: list[float] = field(default_factory=list)
    div_steps: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    @property
    def diverged(self) -> int:
        return self.spike + self.nonfinite

    @property
    def category(self) -> str:
        if self.nonfinite:
            return "diverged"
        if self.spike:
            return "loss spike"
        if self.failed:
            return "failed"
        if self.stalled:
            return "stalled"
        if self.completed < self.n:
            return "not finished"
        return "completed"

    @property
    def mean_loss(self) -> float | None:
        return statistics.fmean(self.losses) if self.losses else None

    def text(self) -> str:
        lines = []
        if self.losses:
            lines.append(f"{self.mean_loss:.3f}")
        if self.diverged and self.losses:
            lines.append(f"{self.diverged}/{self.n} div")
        elif self.diverged:
            reason = _SHORT_REASON.get(max(set(self.reasons), key=self.reasons.count), "div")
            lines.append(f"{reason}\n@{int(statistics.median(self.div_steps))}")
            if self.diverged < self.n:
                lines.append(f"{self.diverged}/{self.n} div")
        elif self.failed:
            lines.append(f"failed {self.failed}/{self.n}")
        elif self.stalled:
            lines.append(f"{self.stalled}/{self.n} stalled" if self.losses else "stalled")
        elif not self.losses:
            lines.append("-")
        if (self.completed + self.stalled < self.n and not self.diverged and not self.failed
                and self.losses):
            lines.append(f"{self.completed}/{self.n} done")
        return "\n".join(lines)


@dataclass
class MapInfo:
    path: Path
    x: str
    y: str
    panel: str | None
    x_values: list[Any]
    y_values: list[Any]
    panels: list[Any]
    cells: dict[tuple[Any, Any, Any], Cell]
    n_axes: int


def _sort_key(v: Any) -> tuple:
    return (0, v, "") if isinstance(v, int | float) and not isinstance(v, bool) else (1, 0, str(v))


def map_axes(sweep: dict[str, Any] | None, configs: list[dict[str, Any]]
             ) -> tuple[str, str, str | None]:
    """x, y and panel for a sweep's map: warmup x lr by placement when the sweep varies those,
    otherwise its first varying axes (seeds are pooled, never an axis of the map)."""
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
    if panel is not None:  # only the placement varies: it is the x axis, one row of cells
        return panel, "train.lr", None
    return "train.warmup", "train.lr", panel


def _check_axis(table: SweepTable, path: str, what: str) -> None:
    known = set().union(*(c.keys() for c in table.configs))
    if path not in known:
        varying = varying_paths(table.configs)
        raise MapError(f"{what}: {path!r} is not a config path of these runs; the sweep varies: "
                       f"{', '.join(varying) or 'nothing'}")


def aggregate(table: SweepTable, x: str, y: str, panel: str | None, metric: str = "val_loss"
              ) -> dict[tuple[Any, Any, Any], Cell]:
    """(panel value, y value, x value) -> Cell; panel value None when there is no panel axis."""
    for path, what in ((x, "x"), (y, "y"), (panel, "panel")):
        if path is not None:
            _check_axis(table, path, what)
    cells: dict[tuple[Any, Any, Any], Cell] = {}
    for i, row in enumerate(table.rows):
        key = (table.value(i, panel) if panel else None, table.value(i, y), table.value(i, x))
        cell = cells.setdefault(key, Cell())
        cell.runs.append(i)
        cell.n += 1
        outcome = row["outcome"]
        if outcome == "completed":
            cell.completed += 1
            value = row.get(metric)
            if isinstance(value, float) and math.isfinite(value):
                cell.losses.append(value)
        elif outcome == "diverged":
            if row.get("reason") == "loss_spike":
                cell.spike += 1
            else:
                cell.nonfinite += 1
            cell.div_steps.append(int(row.get("step") or 0))
            cell.reasons.append(str(row.get("reason")))
        elif outcome == "failed":
            cell.failed += 1
        elif outcome == "stalled":
            cell.stalled += 1
    return cells


def _in_sweep_order(table: SweepTable, path: str, values: list[Any]) -> list[Any]:
    """Placements in the order the sweep lists them (pre before post); other values sorted."""
    if path != "model.placement":
        return values
    order = [table.value(i, path) for i in range(len(table.rows))]
    return sorted(values, key=order.index)


def _load(source: SweepTable | Path | str) -> SweepTable:
    return source if isinstance(source, SweepTable) else collect(source)


def _figure(width: float, height: float):
    return new_figure(width, height, dpi=110)  # small panels: a little sharper than the report's


def _label(path: str) -> str:
    return {"train.lr": "learning rate", "train.warmup": "warmup steps",
            "model.n_blocks": "blocks", "model.placement": "placement",
            "train.seed": "seed"}.get(path, path)


def _short(path: str) -> str:
    return {"model.n_blocks": "L", "model.d_model": "d"}.get(path, path.split(".")[-1])


def _fixed_text(table: SweepTable, skip: set[str]) -> str:
    """Settings shared by every run, for the title: depth, width, steps, schedule."""
    parts = []
    for path, fmt in (("model.n_blocks", "L={}"), ("model.d_model", "d={}"),
                      ("train.steps", "{} steps"), ("train.schedule", "{}"),
                      ("train.batch_size", "batch {}"), ("data.seq_len", "seq {}")):
        values = {c.get(path) for c in table.configs}
        if path not in skip and len(values) == 1:
            parts.append(fmt.format(format_value(values.pop())))
    return ", ".join(parts)


def loss_colormap():
    """The greens of completed cells, from dark (the lowest loss on a map, at 0) to pale (the
    highest, at 1): one colormap for every panel, so panels compare, and for a colorbar."""
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap

    return ListedColormap(colormaps["Greens"](np.linspace(0.8, 0.2, 256)), name="normlab_loss")


def shade(colormap, u: float) -> tuple[Any, bool]:
    """The colour at `u` in [0, 1] of `loss_colormap` and whether it is dark (white text)."""
    return colormap(min(max(u, 0.0), 1.0)), u < 0.4


def _loss_shades(losses: list[float | None]):
    """Completed cells: a green from pale (the worst loss on the figure) to dark (the best),
    one scale for every panel so panels compare."""
    values = [v for v in losses if v is not None]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    colormap = loss_colormap()
    return lambda loss: shade(colormap, (loss - lo) / (hi - lo) if hi > lo else 0.5)


def draw_cell(ax, box: tuple[float, float, float, float], center: tuple[float, float],
              color: Any, text: str, *, dark: bool, gid: str | None = None) -> None:
    """One cell of a map: the rectangle `box` (left, bottom, width, height) in `color` with a
    white edge, `text` at `center` (white on a `dark` colour). `gid` names both artists (as
    `gid` and `gid` + " text"), so that what was drawn can be read back."""
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle(box[:2], box[2], box[3], facecolor=color, edgecolor="white",
                           linewidth=1.5, gid=gid))
    ax.text(*center, text, ha="center", va="center", fontsize=7.5,
            color="white" if dark else "black", gid=f"{gid} text" if gid else None)


def mark_cell(ax, box: tuple[float, float, float, float], *, linestyle: Any = "-",
              gid: str | None = None) -> None:
    """The heavy border of a map's best cell, on `box` (a cell's box, a little inset)."""
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle(box[:2], box[2], box[3], fill=False, edgecolor="black",
                           linewidth=2.2, linestyle=linestyle, gid=gid))


def stability_map(source: SweepTable | Path | str, out: Path | str, *, x: str = "train.warmup",
                  y: str = "train.lr", panel: str | None = "model.placement",
                  metric: str = "val_loss", title: str | None = None) -> MapInfo:
    """Write the heatmap PNG to `out`; returns what was drawn."""
    from matplotlib.patches import Patch

    table = _load(source)
    cells = aggregate(table, x, y, panel, metric)
    panels = sorted({k[0] for k in cells}, key=_sort_key) if panel else [None]
    if panel == "model.placement":  # the order the sweep lists them in, e.g. pre before post
        order = [table.value(i, panel) for i in range(len(table.rows))]
        panels = sorted(panels, key=order.index)
    xs = _in_sweep_order(table, x, sorted({k[2] for k in cells}, key=_sort_key))
    ys = sorted({k[1] for k in cells}, key=_sort_key)
    w = max(3.2, 0.95 * len(xs) + 1.6)
    fig = _figure(w * len(panels) + 0.4, max(2.8, 0.62 * len(ys) + 1.9))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    n_seeds = max((c.n for c in cells.values()), default=0)
    loss_shade = _loss_shades([c.mean_loss for c in cells.values() if c.category == "completed"])
    for ax, pv in zip(axes, panels, strict=True):
        best = min(((c.mean_loss, k) for k, c in cells.items()
                    if k[0] == pv and c.mean_loss is not None and c.category == "completed"),
                   default=None)
        for yi, yv in enumerate(ys):
            for xi, xv in enumerate(xs):
                cell = cells.get((pv, yv, xv))
                if cell is None:
                    continue
                cat = cell.category
                color, dark = COLORS[cat], cat in ("failed", "diverged")
                if cat == "completed" and cell.mean_loss is not None:
                    color, dark = loss_shade(cell.mean_loss)
                draw_cell(ax, (xi - 0.5, yi - 0.5, 1, 1), (xi, yi), color, cell.text(),
                          dark=dark)
                if best is not None and best[1] == (pv, yv, xv):
                    mark_cell(ax, (xi - 0.47, yi - 0.47, 0.94, 0.94))
        ax.set_xlim(-0.5, len(xs) - 0.5)
        ax.set_ylim(-0.5, len(ys) - 0.5)
        ax.set_xticks(range(len(xs)), [format_value(v) for v in xs])
        ax.set_yticks(range(len(ys)), [format_value(v) for v in ys])
        ax.set_xlabel(_label(x))
        ax.set_ylabel(_label(y))
        ax.set_title(f"{_label(panel)} = {format_value(pv)}" if panel else table.name)
        for side in ax.spines.values():
            side.set_visible(False)
        ax.tick_params(length=0)
    present = [c for c in CATEGORIES if any(cell.category == c for cell in cells.values())]
    names = {"completed": "completed (darker: lower loss)"}
    fig.legend(handles=[Patch(facecolor=COLORS[c], label=names.get(c, c)) for c in present],
               loc="lower center", ncol=len(present), frameon=False, fontsize=8)
    metric_name = metric.replace("_", " ")
    head = title or f"{table.name}: final {metric_name}, mean over {n_seeds} run(s) per cell"
    fixed = _fixed_text(table, {x, y, panel or ""})
    fig.suptitle(head + (f"\n{fixed}" if fixed else ""), fontsize=9.5)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    panel_text = f", one panel per {_label(panel)}" if panel else ""
    caption = (f"Stability map of sweep {table.name}: {_label(y)} (rows) by {_label(x)} "
               f"(columns){panel_text}. A cell pools up to {n_seeds} run(s) (seeds and any axis "
               f"not on the map); its colour is the worst outcome among them, its number the "
               f"mean final {metric_name} (nats/byte) of the completed runs (darker green: "
               "lower), 'k/n div' counts diverged runs; a heavy border marks each panel's best "
               f"cell.{' Fixed: ' + fixed + '.' if fixed else ''}")
    alt = (f"Heatmap{'s' if len(panels) > 1 else ''} of {_label(y)} by {_label(x)}"
           f"{panel_text}: outcome and final {metric_name} of each cell.")
    out = save_figure(fig, out, alt=alt, caption=caption)
    return MapInfo(path=out, x=x, y=y, panel=panel, x_values=xs, y_values=ys, panels=panels,
                   cells=cells, n_axes=len(fig.axes))


def loss_curves(source: SweepTable | Path | str, out: Path | str, *, x: str = "train.warmup",
                y: str = "train.lr", panel: str | None = "model.placement",
                key: str = "train_loss") -> MapInfo:
    """One small plot per (y, x) cell with the `key` curve of its runs: per panel value the mean
    over the runs it pools (seeds) with a min-max band, in the style of the placement it names;
    an x marks where a run diverged."""
    table = _load(source)
    cells = aggregate(table, x, y, panel)
    panels = sorted({k[0] for k in cells}, key=_sort_key) if panel else [None]
    if panel == "model.placement":
        order = [table.value(i, panel) for i in range(len(table.rows))]
        panels = sorted(panels, key=order.index)
    xs = _in_sweep_order(table, x, sorted({k[2] for k in cells}, key=_sort_key))
    ys = sorted({k[1] for k in cells}, key=_sort_key, reverse=True)  # largest y on top
    fig = _figure(2.3 * len(xs) + 0.6, 1.8 * len(ys) + 0.9)
    grid = fig.subplots(len(ys), len(xs), squeeze=False, sharex=True, sharey=True)
    names = [format_value(pv) for pv in panels]

    def line_name(name: str, yv: Any, xv: Any) -> str:
        """The line's label: its panel value, or the cell's placement when that is an axis."""
        if panel is None and "model.placement" in (x, y):
            return format_value(xv if x == "model.placement" else yv)
        return name

    styles = styles_for(list(dict.fromkeys(line_name(n, yv, xv) for n in names for yv in ys
                                           for xv in xs)))
    lows, highs, ends, counts = [], [], [], []
    labelled: set[str] = set()  # each line in the legend once
    for r, yv in enumerate(ys):
        for c, xv in enumerate(xs):
            ax = grid[r][c]
            for p, (pv, panel_name) in enumerate(zip(panels, names, strict=True)):
                name = line_name(panel_name, yv, xv)
                cell = cells.get((pv, yv, xv))
                series: list[dict[int, float]] = []
                for i in cell.runs if cell else []:
                    rows = read_metrics(table.root / table.rows[i]["run_id"] / "metrics.jsonl")
                    pts = {m["step"]: float(m[key]) for m in rows
                           if isinstance(m.get(key), int | float) and math.isfinite(m[key])}
                    if not pts:
                        continue
                    series.append(pts)
                    lows.append(min(pts.values()))
                    highs.append(pts[min(pts)])
                    if table.rows[i]["outcome"] == "diverged":
                        last = max(pts)
                        ends.append((ax, last, pts[last], styles[name].color))
                if not series:
                    continue
                steps = sorted({s for pts in series for s in pts})
                counts.append(mean_band(ax, steps, [[pts.get(s, math.nan) for s in steps]
                                                    for pts in series],
                                        styles[name], "_" if name in labelled else name,
                                        order=p, markers=False))
                labelled.add(name)
            ax.set_title(f"{_short(y)}={format_value(yv)}, {_short(x)}={format_value(xv)}",
                         fontsize=7.5)
            ax.tick_params(labelsize=7)
            if r == len(ys) - 1:
                ax.set_xlabel("step", fontsize=7.5)
            if c == 0:
                ax.set_ylabel(f"{key.replace('_', ' ')} (nats/byte)", fontsize=7.5)
    if lows:
        top = max(min(max(highs), math.log(256) + 0.6), min(lows) + 0.5)
        grid[0][0].set_ylim(min(lows) - 0.1, top)
        for ax, step, value, color in ends:  # an x where a run diverged, kept inside the plot
            ax.plot(step, min(value, top - 0.05), "x", color=color, markersize=6, clip_on=False)
    by_placement = panel or ("model.placement" if "model.placement" in (x, y) else None)
    if by_placement:
        handles = [h for ax in grid.flat for h in ax.get_lines()
                   if not h.get_label().startswith("_")]
        fig.legend(handles, [h.get_label() for h in handles], loc="lower center",
                   ncol=len(handles), frameon=False, fontsize=8, title=_label(by_placement),
                   title_fontsize=8)
    fig.suptitle(f"{table.name}: one plot per cell of the map", fontsize=9.5)
    fig.tight_layout(rect=(0, 0.06 if by_placement else 0, 1, 1))
    what = key.replace("_", " ")
    caption = (f"{what[:1].upper() + what[1:]} (nats/byte) against step in each cell of the "
               f"stability map ({_label(y)} by {_label(x)})"
               + (f", one line per {_label(panel)}" if panel else "")
               + f"; {seeds_text(counts)}; x: where a run diverged.")
    alt = (f"Grid of {len(ys)} by {len(xs)} line charts of {what} against step"
           + (f" for {', '.join(names)}." if panel else "."))
    out = save_figure(fig, out, alt=alt, caption=caption)
    return MapInfo(path=out, x=x, y=y, panel=panel, x_values=xs, y_values=ys, panels=panels,
                   cells=cells, n_axes=len(fig.axes))


def curves_path(map_path: Path | str) -> Path:
    p = Path(map_path)
    return p.with_name(p.stem + "_curves" + (p.suffix or ".png"))
