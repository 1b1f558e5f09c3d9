"""The study's stability map: every lr grid the study tuned, in one figure near the top of its
report, so that where each placement trains and where it fails reads at a glance.

    grids = tuned_grids(claims)        # rows read from the claims' numbers, and notes
    svg = study_map_svg(grids)         # None when the study tuned nothing

A claim records the grids it tuned in its numbers, under a key that starts with `tuning`
(`tuning`, `tuning_with_warmup`, `tuning_without_warmup`, ...): a family (a placement with its
init or schedule, `pre_xavier_wsd`; a k-hop family at a depth, `pre, 3 blocks`) mapped to
`{lrs, best_lr, bracketed, mean_val_loss, outcomes}` (`normlab.study.context.TunedGrid.numbers`).
Families are read as they are named, never from a list of placements. A key that says `without`
warmup holds grids trained without it; every other, grids trained with the profile's warmup.

One row per grid: the same grid read by several claims (the study tunes a family at a warmup
once, and every claim that needs it reads that grid) is one row, found by its recorded cells
being the same, and named by the first of its names that names a placement (C11's `with` is
the `pre` grid). What sets a row apart beyond its family and warmup is in its label: the depth
a claim tuned at (its numbers' `blocks`), a k-hop task (its numbers' `task` with `hops`), the
rest of the key's name.

The columns are the learning rates on a log axis, each cell at its own lr. A cell is coloured by
its mean final validation loss above the row's best (in nats, a loss counted per byte or per
answered position alike: rows of different tasks compare by that difference), in the greens of
the sweep package's stability map; a cell where every seed stalled or diverged takes that
outcome's colour instead. The row's best lr has the heavy border of the sweep map's best cell,
dashed when it lies at the grid's edge (not bracketed). The cells are drawn with
`normlab.sweep.maps.draw_cell`, so both maps read alike.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from normlab.report.numbers import is_number
from normlab.sweep.plotting import PLACEMENT_STYLES, figure_bytes, new_figure

TUNING_PREFIX = "tuning"
# Differences above the row's best are coloured on 0..scale, scale at least this and at most
# MAX_SCALE nats (a larger difference takes the palest green; the colorbar says so).
MIN_SCALE, MAX_SCALE = 0.1, 1.0


@dataclass
class GridCell:
    """One lr of a grid: its mean final validation loss (as the study scores it: a diverged
    run counts the uniform predictor's loss, a stalled one its loss) and each seed's outcome."""

    lr: float
    mean_loss: float | None
    outcomes: list[str]

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def diverged(self) -> int:
        return self.outcomes.count("diverged")

    @property
    def stalled(self) -> int:
        return self.outcomes.count("stalled")

    @property
    def all_failed(self) -> bool:
        return self.n > 0 and self.diverged + self.stalled == self.n

    def text(self) -> str:
        """The cell's words: its mean loss, then `k/n div` and `k/n stalled` where any did."""
        lines = [f"{self.mean_loss:.3f}" if self.mean_loss is not None else "-"]
        lines += [f"{k}/{self.n} {what}" for k, what in ((self.diverged, "div"),
                                                        (self.stalled, "stalled")) if k]
        return "\n".join(lines)


@dataclass
class GridRow:
    """One tuned grid: its family as recorded, whether it trained with warmup, what else sets
    it apart (`qualifiers`), the claims that read it and its cells in lr order."""

    family: str
    warmup: bool
    qualifiers: list[str]
    claims: list[str]
    cells: list[GridCell]
    best_lr: float | None
    bracketed: bool
    task: str = ""  # "k-hop" for a grid trained on the k-hop task

    @property
    def label(self) -> str:
        """"post; no warmup (C6b)", "k-hop pre, 3 blocks; warmup (C14)"; a family named by
        a claim's own word and no placement is prefixed with the claim: "C11 without"."""
        family = self.family if names_placement(self.family) or len(self.claims) > 1 \
            else f"{self.claims[0]} {self.family}"
        parts = [", ".join([f"{self.task} {family}".strip(), *self.qualifiers]),
                 "warmup" if self.warmup else "no warmup"]
        return f"{'; '.join(parts)} ({', '.join(self.claims)})"

    @property
    def lrs(self) -> list[float]:
        return [c.lr for c in self.cells]

    @property
    def best_loss(self) -> float | None:
        """The loss the row's colours are measured from: its best lr's, else the lowest among
        the cells where every seed trained, else none (the row is coloured by outcome only)."""
        by_lr = {c.lr: c.mean_loss for c in self.cells}
        if self.best_lr is not None and by_lr.get(self.best_lr) is not None:
            return by_lr[self.best_lr]
        trained = [c.mean_loss for c in self.cells if c.mean_loss is not None
                   and not c.diverged and not c.stalled]
        return min(trained, default=None)

    def above_best(self, cell: GridCell) -> float | None:
        best = self.best_loss
        return None if cell.mean_loss is None or best is None else cell.mean_loss - best


@dataclass
class TunedGrids:
    """The rows of the map, in the order the claims first read them, and a note for each
    tuning entry left out (damaged)."""

    rows: list[GridRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class DamagedGrid(ValueError):
    """A tuning entry that is not a grid: the message says what is wrong."""


def names_placement(family: str) -> bool:
    """Whether a family's name starts with a placement's: "post", "pre_xavier_wsd",
    "deepnorm, 3 blocks" (only the label depends on it, never which grids are drawn)."""
    word = re.match(r"[a-z0-9_]*", family.lower()).group(0)
    return any(word == p or word.startswith(p + "_") for p in PLACEMENT_STYLES)


def _number(v: Any) -> float | None:
    return float(v) if is_number(v) and math.isfinite(v) else None


def _by_lr(raw: Any, what: str) -> dict[float, Any]:
    """A `{str(lr): value}` table of a grid keyed by lr; a key that is not a number is damage."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise DamagedGrid(f"{what} is {type(raw).__name__}, not a table by lr")
    out = {}
    for k, v in raw.items():
        try:
            out[float(k)] = v
        except (TypeError, ValueError):
            raise DamagedGrid(f"{what} has the key {k!r}, not a learning rate") from None
    return out


def grid_cells(raw: Any) -> tuple[list[GridCell], float | None, bool]:
    """(cells, best lr, bracketed) of one recorded grid; DamagedGrid if it is not one."""
    if not isinstance(raw, dict):
        raise DamagedGrid(f"a {type(raw).__name__}, not a grid")
    lrs = raw.get("lrs")
    if not (isinstance(lrs, list) and lrs and all(_number(v) and v > 0 for v in lrs)):
        raise DamagedGrid("its lrs are not a list of positive learning rates")
    losses = _by_lr(raw.get("mean_val_loss"), "mean_val_loss")
    outcomes = _by_lr(raw.get("outcomes"), "outcomes")
    if not losses and not outcomes:
        raise DamagedGrid("it records neither a loss nor an outcome at any lr")
    cells = []
    for lr in sorted({float(v) for v in lrs}):
        seeds = outcomes.get(lr, [])
        if not (isinstance(seeds, list) and all(isinstance(o, str | None) for o in seeds)):
            raise DamagedGrid(f"its outcomes at lr {lr:g} are not a list of outcomes")
        cells.append(GridCell(lr, _number(losses.get(lr)), [str(o) for o in seeds]))
    best = _number(raw.get("best_lr"))
    return cells, best if best in {c.lr for c in cells} else None, raw.get("bracketed") is True


def _warmup(key: str) -> bool:
    return not re.search(r"(without|no)_warmup", key)


def _qualifiers(key: str, family: str, numbers: dict[str, Any]) -> list[str]:
    """What sets a claim's grids apart beyond family, warmup and task: the rest of the tuning
    key's name, the depth it tuned at."""
    out = []
    rest = re.sub(r"(with|without|no)_warmup", "", key[len(TUNING_PREFIX):]).strip("_")
    if rest:
        out.append(rest.replace("_", " "))
    blocks = numbers.get("blocks")
    if isinstance(blocks, int) and not isinstance(blocks, bool) and "blocks" not in family:
        out.append(f"{blocks} blocks")
    return out


def _task(numbers: dict[str, Any]) -> str:
    task = numbers.get("task")
    return "k-hop" if isinstance(task, dict) and "hops" in task else ""


def _fingerprint(raw: dict[str, Any]) -> str:
    """What makes two recorded grids one: the same cells, losses and outcomes."""
    return json.dumps({k: raw.get(k) for k in ("lrs", "mean_val_loss", "outcomes")},
                      sort_keys=True, default=str)


def tuned_grids(claims: Sequence[tuple[str, dict[str, Any]]]) -> TunedGrids:
    """The map's rows from each claim's (id, numbers): every grid under a key starting with
    `tuning`, one row per distinct grid at each warmup (see the module docstring); a damaged
    entry is left out with a note."""
    out = TunedGrids()
    seen: dict[tuple[bool, str], GridRow] = {}
    for claim, numbers in claims:
        if not isinstance(numbers, dict):
            continue
        for key, grids in numbers.items():
            if not str(key).startswith(TUNING_PREFIX):
                continue
            if not isinstance(grids, dict):
                out.notes.append(f"{claim}'s {key}: left out of the map (a "
                                 f"{type(grids).__name__}, not a table of grids)")
                continue
            warmup = _warmup(key)
            for family, raw in grids.items():
                try:
                    cells, best, bracketed = grid_cells(raw)
                except DamagedGrid as e:
                    out.notes.append(f"{claim}'s {key}, {family}: left out of the map ({e})")
                    continue
                name, same = str(family), (warmup, _fingerprint(raw))
                row = seen.get(same)
                if row is None:
                    row = GridRow(name, warmup, _qualifiers(key, name, numbers), [claim], cells,
                                  best, bracketed, _task(numbers))
                    seen[same] = row
                    out.rows.append(row)
                    continue
                if claim not in row.claims:
                    row.claims.append(claim)
                if not names_placement(row.family) and names_placement(name):
                    row.family = name
    return out


def _scale(rows: Sequence[GridRow]) -> tuple[float, bool]:
    """(top of the colour scale in nats above the row's best, whether some cell lies past
    it)."""
    above = [d for r in rows for c in r.cells if not c.all_failed
             for d in [r.above_best(c)] if d is not None]
    top = max(above, default=0.0)
    return min(max(top, MIN_SCALE), MAX_SCALE), top > MAX_SCALE


def _half_width(lrs: Sequence[float]) -> float:
    """Half a cell's width on the log axis: half the smallest gap between two columns."""
    logs = sorted({math.log(v) for v in lrs})
    gaps = [b - a for a, b in zip(logs, logs[1:], strict=False)]
    return 0.5 * min(gaps, default=math.log(2))


def cell_gid(row: int, lr: float) -> str:
    """The id of a drawn cell (its text's is this + " text"), so that it can be read back."""
    return f"map cell {row} {lr:g}"


def best_gid(row: int) -> str:
    return f"map best {row}"


def study_map_figure(grids: TunedGrids):
    """The figure (a matplotlib Figure on an Agg canvas), or None when there is no row.
    Row 0 is drawn on top. Each cell's artists carry `cell_gid`, each best lr's border
    `best_gid`."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.patches import Patch

    # here, not at the top: the sweep's map module reads runs (torch), and the report's tables
    # are read without torch
    from normlab.sweep.maps import COLORS, draw_cell, loss_colormap, mark_cell, shade

    rows = grids.rows
    if not rows:
        return None
    columns = sorted({lr for r in rows for lr in r.lrs})
    h = _half_width(columns)
    span = math.log(columns[-1]) - math.log(columns[0]) + 2 * h
    widest = max(len(r.label) for r in rows)
    width = 1.0 + 0.075 * widest + 0.95 * span / (2 * h) + 1.4
    fig = new_figure(width, 0.46 * len(rows) + 1.9)
    ax = fig.subplots()
    colormap = loss_colormap()
    top, clipped = _scale(rows)
    for i, row in enumerate(rows):
        y = len(rows) - 1 - i
        for c in row.cells:
            box = (c.lr * math.exp(-h), y - 0.5, c.lr * (math.exp(h) - math.exp(-h)), 1.0)
            d = row.above_best(c)
            if c.all_failed:
                outcome = "diverged" if c.diverged >= c.stalled else "stalled"
                color, dark = COLORS[outcome], outcome == "diverged"
            elif d is None:
                color, dark = COLORS["not finished"], False
            else:
                color, dark = shade(colormap, d / top)
            draw_cell(ax, box, (c.lr, y), color, c.text(), dark=dark, gid=cell_gid(i, c.lr))
        if row.best_lr is not None:
            k = math.exp(0.94 * h)
            mark_cell(ax, (row.best_lr / k, y - 0.47, row.best_lr * (k - 1 / k), 0.94),
                      linestyle="-" if row.bracketed else (0, (3, 1.5)), gid=best_gid(i))
    ax.set_xscale("log")
    ax.set_xlim(columns[0] * math.exp(-h), columns[-1] * math.exp(h))
    ax.set_ylim(-0.5, len(rows) - 0.5)
    ax.set_xticks(columns, [f"{v:g}" for v in columns], rotation=45 if len(columns) > 6 else 0)
    ax.minorticks_off()
    ax.set_yticks(range(len(rows)), [r.label for r in reversed(rows)], fontsize=8.5)
    ax.set_xlabel("learning rate (log scale)")
    for side in ax.spines.values():
        side.set_visible(False)
    ax.tick_params(length=0)
    bar = fig.colorbar(ScalarMappable(Normalize(0, top), colormap), ax=ax, fraction=0.04,
                       pad=0.02, extend="max" if clipped else "neither")
    bar.set_label("mean final val loss above the row's best (nats)", fontsize=8)
    bar.ax.tick_params(labelsize=7.5)
    present = [o for o in ("diverged", "stalled") if any(
        c.all_failed and ("diverged" if c.diverged >= c.stalled else "stalled") == o
        for r in rows for c in r.cells)]
    handles = [Patch(facecolor=COLORS[o], label=f"every seed {o}") for o in present]
    if any(r.above_best(c) is None and not c.all_failed for r in rows for c in r.cells):
        handles.append(Patch(facecolor=COLORS["not finished"], label="no loss recorded"))
    handles.append(Patch(fill=False, edgecolor="black", linewidth=2.2, label="best lr"))
    if not all(r.bracketed for r in rows if r.best_lr is not None):
        handles.append(Patch(fill=False, edgecolor="black", linewidth=2.2, linestyle="--",
                             label="best lr at the grid's edge"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False,
               fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def study_map_svg(grids: TunedGrids, warmup_steps: Any = None) -> bytes | None:
    """The map as SVG, with its alt text and caption; None when the study tuned nothing.
    `warmup_steps` (the profile's) is named in the caption where known."""
    fig = study_map_figure(grids)
    if fig is None:
        return None
    rows = grids.rows
    steps = f" ({warmup_steps} steps at the profile's depth)" if is_number(warmup_steps) else ""
    caption = (
        f"Stability map: every learning-rate grid the study tuned ({len(rows)}), one row per "
        f"family (placement, with its init or schedule where it has one) with warmup{steps} "
        "or without, labelled with the claims that read it (a grid tuned once and read by "
        "several claims is one row; a depth or a k-hop task sets a row apart). A cell is one "
        "learning rate of that grid (log scale): its number is the mean final validation loss "
        "over the seeds (a diverged seed counts the uniform predictor's loss, a stalled one "
        "its loss), its colour how far that lies above the row's best (darker green: closer; "
        "the colorbar in nats); 'k/n div' and 'k/n stalled' count the seeds that diverged or "
        "stalled there, and a cell where every seed did takes that outcome's colour. A heavy "
        "border marks the row's best learning rate, dashed where it lies at the grid's edge "
        "(the optimum is not bracketed: it may lie beyond).")
    alt = (f"Heatmap of {len(rows)} tuned grids by learning rate: "
           + "; ".join(f"{r.label}, best lr {r.best_lr:g}" if r.best_lr else r.label
                     for r in rows) + ".")
    return figure_bytes(fig, "svg", alt=alt, caption=caption)
