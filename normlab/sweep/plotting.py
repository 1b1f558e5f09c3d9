"""What every figure of normlab shares: one colour, marker and line style per placement, a
figure bound to matplotlib's Agg canvas (no pyplot: drawing never changes the caller's backend or
global figure state), a line of the mean across seeds with a min-max band, and saving with an
accessible title and a caption stored in the file itself.

    style("pre")                 # Style(color="#0072B2", marker="s", dashes=...)
    fig = new_figure(6, 4); ax = fig.subplots()
    mean_band(ax, xs, per_seed, style("post"), label="post")
    save_figure(fig, "c1.svg", alt="...", caption="...")

The colours of the first placements are the Okabe-Ito palette, which stays distinct under the
common colour-vision deficiencies; the marker and the dash pattern tell placements apart on
their own too (and where two lines coincide, the later one is drawn thinner and dashed on top of
the earlier one, so both stay visible).

A figure saved as SVG keeps its text as text (crisp, searchable, zoomable) and carries `<title>`
(the alt text) and `<desc>` (the caption); a PNG carries them as its `Title` and `Description`
text chunks. `figure_text` reads them back for the report.

It lives in the sweep package, the lowest that draws (its stability maps and loss curves), so
that every package above it (probe, interop, study, report) draws in the same styles without an
import that climbs.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from normlab.config import PLACEMENTS


@dataclass(frozen=True)
class Style:
    color: str
    marker: str
    linestyle: Any  # a matplotlib line style: "-" or (offset, (on, off, ...))
    hollow: bool = False  # white-filled markers: a second variant of one placement

    def line(self, **extra: Any) -> dict[str, Any]:
        """Keyword arguments for `Axes.plot`."""
        face = {"markerfacecolor": "white"} if self.hollow else {}
        return {"color": self.color, "marker": self.marker, "linestyle": self.linestyle,
                **face, **extra}


# Placement -> style, in the order of normlab.config.PLACEMENTS. The first eight colours: Okabe &
# Ito, "Color Universal Design" (2008), with black for the last one.
_COLORS = ("#D55E00", "#0072B2", "#E69F00", "#56B4E9", "#009E73", "#CC79A7", "#7F3C8D",
           "#000000", "#8C564B", "#B8860B", "#17BECF", "#7F7F7F", "#BCBD22", "#393B79")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p", "d", "8")
_DASHES: tuple[Any, ...] = ("-", (0, (5, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)),
                            (0, (3, 1, 1, 1, 1, 1)), (0, (8, 3)))
PLACEMENT_STYLES: dict[str, Style] = {
    p: Style(_COLORS[i % len(_COLORS)], _MARKERS[i % len(_MARKERS)], _DASHES[i % len(_DASHES)])
    for i, p in enumerate(PLACEMENTS)}
OTHER = Style("#555555", "o", "-")

BAND_ALPHA = 0.18
BAND_TEXT = "shaded band: min to max over the seeds"


def placement_of(label: str) -> str | None:
    """The placement a label names first: "post, warmup 2" -> "post"; None if it names none."""
    for word in re.findall(r"[a-z_0-9]+", label.lower()):
        if word in PLACEMENT_STYLES:
            return word
    return None


def style(label: str) -> Style:
    """The style of the placement `label` names (see `placement_of`), grey if it names none."""
    p = placement_of(label)
    return PLACEMENT_STYLES[p] if p else OTHER


def placement_order(label: str) -> tuple[int, str]:
    """Sort key: labels in the order of `normlab.config.PLACEMENTS`, then the others by name."""
    p = placement_of(label)
    return (PLACEMENTS.index(p), label) if p else (len(PLACEMENTS), label)


def styles_for(labels: Sequence[str]) -> dict[str, Style]:
    """A style per label: the placement's colour and marker; labels that name the same placement
    (e.g. "post, warmup 0" and "post, warmup 2") get hollow markers and the next dash patterns
    after the first, so they differ while keeping the placement's colour."""
    out: dict[str, Style] = {}
    seen: dict[str, int] = {}
    others = 0
    for label in labels:
        p = placement_of(label)
        if p is None:  # no placement named: grey, told apart by marker and dashes
            out[label] = Style(OTHER.color, _MARKERS[others % len(_MARKERS)],
                               _DASHES[others % len(_DASHES)])
            others += 1
            continue
        base = PLACEMENT_STYLES[p]
        k = seen.get(p, 0)
        seen[p] = k + 1
        if k:
            start = _DASHES.index(base.linestyle) if base.linestyle in _DASHES else 0
            base = Style(base.color, base.marker, _DASHES[(start + k) % len(_DASHES)],
                         hollow=True)
        out[label] = base
    return out


# ----------------------------------------------------------------------------- figures


def new_figure(width: float, height: float, dpi: int = 100):
    """A Figure bound to an Agg canvas (no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def figure_bytes(fig, fmt: str, *, alt: str, caption: str, dpi: int = 110) -> bytes:
    """The figure as SVG or PNG bytes, with `alt` and `caption` stored in it."""
    import matplotlib

    buf = io.BytesIO()
    if fmt == "svg":
        # Text as <text> (crisp and searchable), no creation date (reproducible bytes).
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "normlab"}):
            fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
        text = buf.getvalue().decode("utf-8")
        head = (f"<title>{escape(alt, quote=False)}</title>"
                f"<desc>{escape(caption, quote=False)}</desc>")
        match = re.search(r"<svg\b[^>]*>", text)
        if match is None:
            raise ValueError("matplotlib wrote an SVG without an <svg> element")
        return (text[:match.end()] + head + text[match.end():]).encode("utf-8")
    if fmt != "png":
        raise ValueError(f"figure format {fmt!r}: expected svg or png")
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Title": alt, "Description": caption})
    return buf.getvalue()


def save_figure(fig, path: Path | str, *, alt: str, caption: str, dpi: int = 110) -> Path:
    """Write the figure in the format its suffix names (.svg or .png); returns the path."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".") or "png"
    data = figure_bytes(fig, fmt, alt=alt, caption=caption, dpi=dpi)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def figure_text(data: bytes) -> tuple[str, str]:
    """(alt, caption) stored in an SVG or PNG written by `save_figure`; empty strings if none."""
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        try:
            from PIL import Image

            with Image.open(io.BytesIO(data)) as im:
                info = getattr(im, "text", {}) or {}
            return str(info.get("Title", "")), str(info.get("Description", ""))
        except Exception:
            return "", ""
    from xml.etree import ElementTree

    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError:
        return "", ""
    found = {child.tag.rsplit("}", 1)[-1]: (child.text or "").strip() for child in root}
    return found.get("title", ""), found.get("desc", "")


# ----------------------------------------------------------------------------- lines


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def per_seed(values: Sequence[Any]) -> list[list[float]]:
    """A series as a list of per-seed series: a flat list is one seed."""
    if values and all(isinstance(v, list | tuple) for v in values):
        return [[float(x) if _finite(x) else math.nan for x in v] for v in values]
    return [[float(x) if _finite(x) else math.nan for x in values]]


def band(series: Sequence[Sequence[float]]) -> tuple[list[float], list[float], list[float]]:
    """(mean, min, max) at each position over the seeds' series (NaN where no seed is finite;
    shorter series count where they have values)."""
    n = max((len(s) for s in series), default=0)
    mean, lo, hi = [], [], []
    for i in range(n):
        col = [s[i] for s in series if i < len(s) and math.isfinite(s[i])]
        mean.append(sum(col) / len(col) if col else math.nan)
        lo.append(min(col) if col else math.nan)
        hi.append(max(col) if col else math.nan)
    return mean, lo, hi


def coincides(a: Sequence[float], b: Sequence[float], rtol: float = 0.005) -> bool:
    """Whether two lines lie on top of each other: equal length, every finite pair within
    `rtol` of the larger magnitude."""
    if len(a) != len(b) or not a:
        return False
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if math.isfinite(x) and math.isfinite(y)]
    return bool(pairs) and all(abs(x - y) <= rtol * max(abs(x), abs(y), 1e-12) for x, y in pairs)


def mean_band(ax, xs: Sequence[float], series: Sequence[Any], st: Style, label: str, *,
              order: int = 0, markers: bool = True, drawn: dict[str, list[float]] | None = None
              ) -> int:
    """Draw the mean over seeds as a line with the placement's style and, with two or more
    seeds, the min-max band. `order` is the series' position on the axes: later series are drawn
    thinner and on top, so that one that coincides with an earlier one does not hide it. With
    `drawn` (label -> mean of the lines already on these axes), a line that coincides with one
    of them says so in the legend: "admin (= post)". Returns the number of seeds."""
    seeds = per_seed(list(series))
    mean, lo, hi = band(seeds)
    xs = list(xs)[:len(mean)]
    if drawn is not None:
        same = [name for name, other in drawn.items() if coincides(mean, other)]
        drawn[label] = mean
        if same and not label.startswith("_"):
            label = f"{label} (= {same[0]})"
    if len(seeds) > 1:
        ax.fill_between(xs, lo[:len(xs)], hi[:len(xs)], color=st.color, alpha=BAND_ALPHA,
                        linewidth=0)
    ax.plot(xs, mean[:len(xs)], label=label, zorder=3 + order,
            **st.line(linewidth=max(1.0, 2.6 - 0.5 * order),
                      markersize=max(3.5, 7.0 - 1.2 * order) if markers else 0,
                      markevery=_markevery(len(xs))))
    return len(seeds)


def _markevery(n: int) -> int:
    return max(1, n // 12)


def seeds_text(counts: Sequence[int]) -> str:
    """'mean over 3 seeds (line), min to max (band)' for the caption."""
    k = sorted(set(counts))
    if not k:
        return ""
    if k == [1]:
        return "one seed per line (no band)"
    n = str(k[0]) if len(k) == 1 else f"{k[0]} to {k[-1]}"
    return f"line: mean over {n} seeds; {BAND_TEXT}"


SAME_TEXT = "a legend entry 'a (= b)' marks a line that lies on top of line b"


# ----------------------------------------------------------------------------- axes


BLOCK_AXIS = "block (0 = first)"  # blocks are numbered from 0 everywhere: figures, tables, JSON


def plain_log_ticks(axis) -> None:
    """Tick labels of a log-scale axis as plain numbers (6, 7, 10, 20; 0.004), never 6x10^0."""
    from matplotlib.ticker import LogFormatter

    axis.set_major_formatter(LogFormatter())
    axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def legend_outside(ax, *, below: bool = False, **kwargs: Any):
    """The legend outside the plot area, to the right of the axes (or below them, for a grid of
    panels), so it never covers a line; `tight_layout` then makes room for it. None when the
    axes have nothing labelled."""
    if not ax.get_legend_handles_labels()[0]:
        return None
    kwargs.setdefault("fontsize", 8)
    if below:
        return ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), borderaxespad=0.0,
                         **kwargs)
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kwargs)
