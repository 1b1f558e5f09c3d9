"""Figures of a runs report, drawn as SVG in the styles of `normlab.sweep.plotting`:

    loss_curves_svg(curves)    train and val loss, one line per group of runs (mean over its
                               seeds, min-max band), coloured by placement; runs whose losses
                               count different things (bytes, a tokenizer's tokens, a k-hop
                               task's answers) never share an axis (`loss_panels`)
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
    mean_band,
    new_figure,
    placement_order,
    seeds_text,
    styles_for,
)

BYTES = "byte"  # a text run's `tokens` when its loss is per byte
KHOP = "k-hop"  # a k-hop run's `tokens` (`data.task: khop`): its loss counts answered positions
# A byte-level LM starts near ln(256) = 5.55; a diverged curve is clipped a little above that
# (in nats per byte, or the same in bits per byte).
_LOSS_CEILING = math.log(256) + 1.0
_CEILINGS = {"nats/byte": _LOSS_CEILING, "bits/byte": _LOSS_CEILING / math.log(2)}
LEGEND_FONTSIZE = 10


@dataclass
class Curve:
    """One run's curves, as (step, value) pairs with finite values only."""

    label: str                 # the run's name
    group: str                 # runs of one group (its seeds) share a line: its legend entry
    train: list[tuple[int, float]] = field(default_factory=list)
    val: list[tuple[int, float]] = field(default_factory=list)
    diverged: bool = False
    bpb: list[tuple[int, float]] = field(default_factory=list)  # val loss in bits per byte
    acc: list[tuple[int, float]] = field(default_factory=list)  # a synthetic task's accuracy
    # what the loss is counted over: BYTES, KHOP or the tokens of a tokenizer ("bpe:2048 on
    # notes.txt"); runs with different ones never share an axis
    tokens: str = BYTES
    placement: str = ""        # the line's colour and marker


def curve_from_metrics(label: str, group: str, metrics: Sequence[dict[str, Any]],
                       diverged: bool = False, tokens: str = BYTES, placement: str = ""
                       ) -> Curve:
    def points(key: str) -> list[tuple[int, float]]:
        out = []
        for m in metrics:
            v, s = m.get(key), m.get("step")
            if (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                    and isinstance(s, int)):
                out.append((s, float(v)))
        return out

    return Curve(label=label, group=group, train=points("train_loss"), val=points("val_loss"),
                 diverged=diverged, bpb=points("val_bpb"), acc=points("val_acc"),
                 tokens=tokens, placement=placement)


def loss_unit(tokens: str) -> str:
    """The unit of a loss counted over `tokens` (see `Curve.tokens`)."""
    return {BYTES: "nats/byte", KHOP: "nats/answered position"}.get(tokens, "nats/token")


@dataclass
class Panel:
    """One axes of the loss figure: `key` is the Curve series it draws ("train", "val", "bpb",
    "acc"), `unit` what its y axis counts; every curve on it has the same unit."""

    title: str
    key: str
    unit: str
    curves: list[Curve]

    @property
    def ylabel(self) -> str:
        return {"bpb": "bits per byte", "acc": "accuracy"}.get(
            self.key, f"loss ({self.unit})")


def loss_panels(curves: Sequence[Curve]) -> list[Panel]:
    """The panels of the loss figure, so that one axis never mixes units: text runs that count
    one kind of token, training and validation loss in it; text runs of different tokenizers,
    training loss per tokenizer and validation loss in bits per byte of the held-out text (the
    number that compares them; per tokenizer for a run that did not record it); k-hop runs,
    their training and validation loss (per answered position) and their accuracy. Panels with
    no point are left out."""
    text = [c for c in curves if c.tokens != KHOP]
    khop = [c for c in curves if c.tokens == KHOP]
    kinds = list(dict.fromkeys(c.tokens for c in text))

    def named(what: str, tokens: str) -> str:
        return what if tokens == BYTES else f"{what}, {tokens} tokens"

    panels: list[Panel] = []
    if len(kinds) == 1:
        (tokens,) = kinds
        panels += [Panel(named(f"{w} loss", tokens), k, loss_unit(tokens), text)
                   for w, k in (("training", "train"), ("validation", "val"))]
    elif kinds:
        for tokens in kinds:
            of = [c for c in text if c.tokens == tokens]
            panels.append(Panel(named("training loss", tokens), "train", loss_unit(tokens), of))
        panels.append(Panel("validation loss, every tokenizer", "bpb", "bits/byte",
                            [c for c in text if c.bpb]))
        for tokens in kinds:  # a run without bits per byte keeps its own unit
            of = [c for c in text if c.tokens == tokens and not c.bpb]
            panels.append(Panel(named("validation loss", tokens), "val", loss_unit(tokens), of))
    if khop:
        panels += [Panel("k-hop training loss", "train", loss_unit(KHOP), khop),
                   Panel("k-hop validation loss", "val", loss_unit(KHOP), khop),
                   Panel("k-hop validation accuracy", "acc", "accuracy", khop)]
    return [p for p in panels if any(getattr(c, p.key) for c in p.curves)]


def _clip(ax, values: list[float], unit: str) -> None:
    """Y limits around `values`, a diverged run's climb clipped a little above a byte-level
    model's start (nats or bits per byte)."""
    lo, hi = min(values), max(values)
    ceiling = _CEILINGS.get(unit)
    if ceiling is not None and hi > ceiling > lo:
        hi = ceiling
    pad = max(0.02 if unit == "accuracy" else 0.05, 0.05 * (hi - lo))
    ax.set_ylim(lo - pad, hi + pad)


def loss_curves_svg(curves: Sequence[Curve]) -> bytes | None:
    """The loss figure: one panel per series and unit (`loss_panels`), one line per group (its
    legend entry, `Curve.group`): the mean over its runs (seeds) with a min-max band; an x marks
    the last point of a diverged run. One legend below the panels. None when no run has a
    single finite point."""
    from matplotlib.ticker import MaxNLocator

    panels = loss_panels(curves)
    if not panels:
        return None
    # the style key names the placement first, so each line takes its placement's colour
    key = {c.group: f"{c.placement or '?'}: {c.group}" for c in curves}
    groups = sorted(dict.fromkeys(c.group for c in curves), key=lambda g: placement_order(
        key[g]))
    by_key = styles_for([key[g] for g in groups])
    styles = {g: by_key[key[g]] for g in groups}
    ncols = min(len(panels), 3)
    nrows = math.ceil(len(panels) / ncols)
    fig = new_figure(4.6 * ncols + 0.6, 3.6 * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    counts: list[int] = []
    handles: dict[str, Any] = {}
    labels: dict[str, set[str]] = {}  # per group, its line's label on each panel
    values: dict[str, list[float]] = {}  # per unit: panels of one unit share their y limits
    for ax, panel in zip(axes, panels, strict=False):
        drawn: dict[str, list[float]] = {}
        for k, g in enumerate(groups):
            runs = [dict(getattr(c, panel.key)) for c in panel.curves
                    if c.group == g and getattr(c, panel.key)]
            if not runs:
                continue
            steps = sorted({s for r in runs for s in r})
            series = [[r.get(s, math.nan) for s in steps] for r in runs]
            values.setdefault(panel.unit, []).extend(v for r in runs for v in r.values())
            counts.append(mean_band(ax, steps, series, styles[g], g, order=k, drawn=drawn))
            handles.setdefault(g, ax.get_lines()[-1])
            labels.setdefault(g, set()).add(ax.get_lines()[-1].get_label())
            for c in panel.curves:
                pts = getattr(c, panel.key)
                if c.group == g and c.diverged and pts and panel.key != "acc":
                    ax.plot(*pts[-1], "x", color=styles[g].color, markersize=9,
                            markeredgewidth=2, zorder=20)
        ax.set_title(panel.title, fontsize=11)
        ax.set_xlabel("step", fontsize=10)
        ax.set_ylabel(panel.ylabel, fontsize=10)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    for ax, panel in zip(axes, panels, strict=False):
        _clip(ax, values[panel.unit], panel.unit)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    shown = [g for g in groups if g in handles]
    # "a (= b)" (`mean_band`) only where the line lies on b in every panel that draws it
    entries = [next(iter(labels[g])) if len(labels[g]) == 1 else g for g in shown]
    ncol, nrow = _legend_layout(entries, fig.get_figwidth())
    extra = 0.28 * nrow + 0.12
    height = 3.6 * nrows
    fig.set_size_inches(fig.get_figwidth(), height + extra)
    fig.legend([handles[g] for g in shown], entries, loc="lower center", ncol=ncol,
               fontsize=LEGEND_FONTSIZE, frameon=False)
    fig.tight_layout(rect=(0, extra / (height + extra), 1, 1))
    names = "; ".join(groups)
    caption = (f"{'; '.join(p.title + ' (' + p.ylabel + ')' for p in panels)} against step, "
               f"one line per configuration ({names}), in the colour and marker of its "
               f"placement; {seeds_text(counts)}; x: the last finite loss of a run that "
               "diverged. Runs whose losses count different things (bytes, a tokenizer's "
               "tokens, a task's answers) are on separate axes.")
    alt = (f"{len(panels)} line charts against step ("
           f"{'; '.join(p.title + ' in ' + p.ylabel for p in panels)}) for {names}.")
    return figure_bytes(fig, "svg", alt=alt, caption=caption)


def _legend_layout(labels: Sequence[str], width_in: float) -> tuple[int, int]:
    """(columns, rows) of a legend of `labels` across a figure `width_in` inches wide, at
    LEGEND_FONTSIZE (about 0.085 inch per character, plus the line sample)."""
    widest = max(len(s) for s in labels) * 0.085 + 0.8
    ncol = max(1, min(len(labels), int(width_in // widest)))
    return ncol, math.ceil(len(labels) / ncol)


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
