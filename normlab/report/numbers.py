"""Numbers as the report shows them: formatted values with units, in tables the templates render
(`macros.html`), never as raw JSON.

    fmt(0.00123)                       '1.230e-03'
    label("growth_exponent_init")      'growth exponent at init'
    unit("late_drop_dloss")            'nats'
    numbers_blocks(claim.numbers)      [Block(title, table), ...] for a claim's `numbers`

A value becomes a `Cell`: a number, an interval (`{"mean", "ci95", "n"}` from
`normlab.probe.fits.mean_ci`, a fit's `{"slope", "ci95_t"}`, an `Effect`), a short list, a long
series (its summary, every value behind a <details> toggle: nothing is cut), a block of text (a
traceback), a verdict (a badge) or a nested table. Dicts of records become tables with one row per
key; keys made of `|`-separated parts (a study's run grid) are split into columns.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

SHORT_LIST = 8      # lists up to this long are written out in the cell; longer ones fold
MAX_DEPTH = 4       # nested tables deeper than this are summarized

# Key -> how a person names it. Keys not listed: underscores become spaces.
LABELS = {
    "per_seed_effect": "effect per seed",
    "val_loss": "validation loss",
    "train_loss": "training loss",
    "best_val_loss": "best validation loss",
    "ci95": "95% interval",
    "ci95_t": "95% t-interval",
    "ci95_boot": "95% bootstrap interval",
    "n_points": "points",
    "n": "n",
    "lr": "learning rate",
    "tuned_lr": "tuned learning rate",
    "growth_exponent_init": "growth exponent at init",
    "growth_exponent_trained": "growth exponent after training",
    "late_angle_init": "late angular distance at init",
    "late_angle_trained": "late angular distance after training",
    "late_merge_kl": "merge KL, deeper half",
    "late_drop_dloss": "layer-drop loss increase, deeper half",
    "per_seed_slope": "slope per seed",
    "per_seed_accuracy": "accuracy per seed",
    "test_accuracy": "test accuracy",
    "ngram_baseline": "n-gram baseline accuracy",
    "early_update": "early model update",
    "mean_series": "mean series",
    "xiong_lemma2": "Xiong et al., Lemma 2",
    "drop_hidden_cos": "hidden-state change when skipped (1 - cos)",
    "drop_dloss": "loss increase when skipped",
    "drop_kl": "KL when skipped",
    "merge_kl": "merge KL",
    "ang_prev": "angular distance to the previous block",
    "norm": "stream norm",
    "embed_norm": "embedding norm",
    "embed_norm_std": "embedding norm, std",
    "final_norm": "final norm",
    "final_norm_std": "final norm, std",
    "norm_first_block": "norm after the first block",
    "norm_last_block": "norm after the last block",
    "norm_growth": "norm growth (last / first)",
    "norm_max_over_min": "norm max / min",
    "mean_ang_prev": "mean angular distance to the previous block",
    "effective_depth": "effective depth",
    "effective_depth_kl": "effective depth (KL)",
    "lens_gap": "logit-lens gap (raw - normed)",
    "d_model": "width",
    "n_blocks": "blocks",
    "n_heads": "heads",
    "init_depths": "depths at init",
    "init_seeds": "seeds at init",
    "lrs": "learning rates",
    "seq_len": "sequence length",
    "batch_size": "batch size",
    "steps": "steps",
    "warmup": "warmup",
    "elapsed_s": "elapsed",
    "tokens_per_s": "tokens/s",
    "step": "step",
    "outcome": "outcome",
    "reason": "reason",
    "estimate": "estimate",
    "expected": "expected",
    "measured": "measured",
    "paper": "paper",
    "verdict": "verdict",
    "prediction": "prediction",
}

# Units by key: the first pattern that matches a key's words decides. Losses are cross-entropies
# of byte-level models (nats per byte); KL divergences and loss differences are in nats.
_UNITS = (
    (re.compile(r"(^|_)(kl)(_|$)"), "nats"),
    (re.compile(r"dloss|lens_gap"), "nats"),
    (re.compile(r"(^|_)loss(_|$)|lens_(raw|normed)"), "nats/byte"),
    (re.compile(r"per_s$"), ""),  # a rate: its label says per what
    (re.compile(r"(^|_)elapsed(_s)?$|_s$"), "s"),
    (re.compile(r"^warmup$|warmup_steps"), "steps"),
)

# The run grid of a study (`StudyContext.grid`): keys "placement|lr|warmup|seed|variant".
GRID_PARTS = ("placement", "learning rate", "warmup (steps)", "seed", "final norm")
_GRID_VARIANT = {"final": "on", "nofinal": "off"}


def label(key: str) -> str:
    return LABELS.get(key, key.replace("_", " "))


def unit(key: str) -> str:
    return next((u for pattern, u in _UNITS if pattern.search(key)), "")


def heading(key: str) -> str:
    """A column or row heading: the label with its unit, e.g. 'validation loss (nats/byte)'."""
    u = unit(key)
    return f"{label(key)} ({u})" if u else label(key)


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def nonfinite_text(v: Any) -> bool:
    """JSON has no NaN or infinity: they arrive as strings."""
    return isinstance(v, str) and v.strip().lower() in ("nan", "inf", "-inf", "+inf",
                                                         "infinity", "-infinity")


def fmt(v: Any) -> str:
    """A value as short text: 4 significant digits, thousands separators for large integers,
    '-' for None, 'n/a' for NaN."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 100_000 else str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        if math.isinf(v):
            return "∞" if v > 0 else "-∞"
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3e}"
        return f"{v:.4g}"
    if nonfinite_text(v):
        return fmt(float(v))
    return str(v)


def fmt_seconds(s: Any) -> str:
    if not is_number(s) or not math.isfinite(s):
        return "-"
    s = float(s)
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


# ----------------------------------------------------------------------------- cells and tables


@dataclass
class Interval:
    estimate: str
    low: str
    high: str
    n: str = ""
    kind: str = "95% interval"


@dataclass
class Cell:
    kind: str                                        # see the module docstring
    text: str = ""                                   # num, text, pre, verdict, empty
    values: list[str] = field(default_factory=list)  # series: every value
    interval: Interval | None = None
    table: Table | None = None

    @property
    def numeric(self) -> bool:
        return self.kind in ("num", "interval")


@dataclass
class Column:
    title: str
    numeric: bool = False


@dataclass
class Row:
    head: str | None
    cells: list[Cell]


@dataclass
class Table:
    columns: list[Column]
    rows: list[Row]
    kind: str = "numbers"   # a CSS class: numbers, sub, verdicts, runs, settings

    @property
    def has_row_heads(self) -> bool:
        return any(r.head is not None for r in self.rows)


@dataclass
class Block:
    """One titled piece of a claim's numbers: a table, or a single value."""
    title: str
    table: Table | None = None
    cell: Cell | None = None


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, str | int | float | bool)


def as_interval(v: Any) -> Interval | None:
    """An estimate with its interval, from the shapes the study writes; None for anything else."""
    if not isinstance(v, dict):
        return None
    for est, lo_hi, kind in (("mean", "ci95", "95% t-interval"),
                             ("slope", "ci95_t", "95% t-interval"),
                             ("value", "ci95", "95% interval")):
        if est in v and isinstance(v.get(lo_hi), list | tuple) and len(v[lo_hi]) == 2:
            n = v.get("n", v.get("n_points"))
            return Interval(fmt(v[est]), fmt(v[lo_hi][0]), fmt(v[lo_hi][1]),
                            fmt(n) if n is not None else "", kind)
    if {"estimate", "ci_low", "ci_high"} <= set(v):
        return Interval(fmt(v["estimate"]), fmt(v["ci_low"]), fmt(v["ci_high"]),
                        fmt(v.get("n")) if v.get("n") is not None else "")
    return None


def _series(values: list[Any]) -> Cell:
    shown = [fmt(x) for x in values]
    if len(values) <= SHORT_LIST:
        return Cell("list", text=", ".join(shown) if shown else "(none)")
    finite = [float(x) for x in values if is_number(x) and math.isfinite(x)]
    summary = f"{len(values)} values"
    if finite:
        summary += f", from {fmt(values[0])} to {fmt(values[-1])} (min {fmt(min(finite))}, " \
                   f"max {fmt(max(finite))})"
    return Cell("series", text=summary, values=shown)


VERDICT_KEYS = ("verdict",)


def cell(v: Any, key: str = "", depth: int = 0) -> Cell:
    """The cell of one value (see the module docstring)."""
    if key in VERDICT_KEYS and isinstance(v, str):
        return Cell("verdict", text=v)
    if isinstance(v, str) and ("\n" in v or len(v) > 200):
        return Cell("pre", text=v)
    if v is None:
        return Cell("empty", text="-")
    if is_number(v) or nonfinite_text(v):
        return Cell("num", text=fmt(v))
    if _is_scalar(v):
        return Cell("text", text=fmt(v))
    interval = as_interval(v)
    if interval is not None:
        return Cell("interval", interval=interval)
    if isinstance(v, list | tuple) and all(_is_scalar(x) for x in v):
        return _series(list(v))
    if depth >= MAX_DEPTH:
        return Cell("text", text=f"({len(v)} entries, nested too deep to show)")
    table = table_of(v, depth + 1)
    return Cell("table", table=table) if table is not None else Cell("text", text=str(v))


def _grid_key(key: str, n: int) -> list[str]:
    parts = key.split("|")
    if n == len(GRID_PARTS) and parts[-1] in _GRID_VARIANT:
        parts[-1] = _GRID_VARIANT[parts[-1]]
    return parts


def _part_cell(text: str) -> Cell:
    try:
        float(text)
    except ValueError:
        return Cell("text", text=text)
    return Cell("num", text=text)


def _split_columns(keys: list[str]) -> list[str] | None:
    """Column names for keys made of `|`-separated parts, if every key has the same number."""
    counts = {k.count("|") for k in keys}
    if len(counts) != 1 or not counts.pop():
        return None
    n = keys[0].count("|") + 1
    grid = n == len(GRID_PARTS) and all(k.rsplit("|", 1)[-1] in _GRID_VARIANT for k in keys)
    return list(GRID_PARTS) if grid else [f"part {i + 1}" for i in range(n)]


def _record_fields(d: dict[str, Any]) -> list[str] | None:
    """Field names when `d` maps keys to records (dicts) that read well as one table's rows."""
    if not d or not all(isinstance(v, dict) and v for v in d.values()):
        return None
    if any(as_interval(v) is not None for v in d.values()):
        return None  # a dict of intervals: one row each, two columns
    fields = list(dict.fromkeys(k for v in d.values() for k in v))
    return fields if len(fields) <= 12 else None


def table_of(v: Any, depth: int = 1) -> Table | None:
    """A dict or a list as a table: records as rows with one column per field, otherwise one
    row per key with its value."""
    kind = "sub" if depth > 1 else "numbers"
    if isinstance(v, list | tuple):
        items = list(v)
        if items and all(isinstance(x, dict) for x in items):
            fields = list(dict.fromkeys(k for x in items for k in x))
            cols = [Column(heading(f)) for f in fields]
            rows = [Row(None, [cell(x.get(f), f, depth) for f in fields]) for x in items]
            return mark_numeric(Table(cols, rows, kind))
        rows = [Row(str(i + 1), [cell(x, "", depth)]) for i, x in enumerate(items)]
        return Table([Column("#"), Column("value")], rows, kind)
    if not isinstance(v, dict):
        return None
    keys = [str(k) for k in v]
    split = _split_columns(keys)
    fields = _record_fields(v)
    if fields is not None:
        cols = [Column(c) for c in split or []] + [Column(heading(f)) for f in fields]
        rows = []
        for k, rec in v.items():
            parts = [_part_cell(p) for p in _grid_key(str(k), len(split))] if split else []
            rows.append(Row(None if split else label(str(k)),
                            parts + [cell(rec.get(f), f, depth) for f in fields]))
        return mark_numeric(Table(cols, rows, kind))
    rows = [Row(heading(str(k)), [cell(x, str(k), depth)]) for k, x in v.items()]
    return Table([Column("value")], rows, kind)


def mark_numeric(table: Table) -> Table:
    """Right-align the columns whose cells are all numbers."""
    for i, col in enumerate(table.columns):
        cells = [r.cells[i] for r in table.rows if i < len(r.cells)]
        col.numeric = bool(cells) and all(c.numeric or c.kind == "empty" for c in cells)
    return table


def numbers_blocks(numbers: dict[str, Any]) -> list[Block]:
    """A claim's `numbers`: the scalars, intervals and lists together in one table first, then
    each nested value as its own titled table."""
    flat = {k: v for k, v in numbers.items()
            if _is_scalar(v) or as_interval(v) is not None
            or (isinstance(v, list | tuple) and all(_is_scalar(x) for x in v))}
    blocks = []
    if flat:
        blocks.append(Block("", table=table_of(flat)))
    return blocks + [block(k, v) for k, v in numbers.items() if k not in flat]


def block(key: str, value: Any) -> Block:
    """One value under its heading: a table, or a single cell."""
    table = table_of(value)
    return Block(heading(key), table=table) if table is not None \
        else Block(heading(key), cell=cell(value, key))
