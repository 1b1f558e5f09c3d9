"""Numbers as the report shows them: formatted values with units, in tables the templates render
(`macros.html`), never as raw JSON.

    fmt(0.00123)                       '1.230e-03'
    fmt_lr(0.000333333)                '0.000333' (every learning rate: a decimal, 3 digits)
    label("growth_exponent_init")      'growth exponent at init'
    unit("late_drop_dloss")            'nats'
    numbers_blocks(claim.numbers)      [Block(title, table), ...] for a claim's `numbers`

Learning rates are written in one format wherever they appear (a column of keys, a value, a list:
`fmt_lr`) and their columns and rows are in increasing order, as are all keys that are numbers.

A value that fits in one cell becomes a `Cell`: a number, an interval (`{"mean", "ci95", "n"}`
from `normlab.probe.fits.mean_ci`, a fit's `{"slope", "ci95_t"}`, an `Effect`), a short list, a
long series (its summary, every value behind a <details> toggle: nothing is cut), a block of text
(a traceback) or a verdict (a badge). A structured value is laid out flat, never as a table
inside a cell: a tree of dicts becomes one table per kind of record, its keys (placement, learning
rate, seed...) the first columns; keys made of `|`-separated parts (a study's run grid) are split
into columns the same way. A table with more than `WIDE_AT` columns shows the fields that are the
same in every row once, in a table of their own, so that what varies fits on the page.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from normlab.probe.metrics import report_labels

SHORT_LIST = 8      # lists up to this long are written out in the cell; longer ones fold
MAX_DEPTH = 4       # levels of keys a table's rows may stand for

# Key -> how a person names it: the study's and the runs' keys, and the probe metrics' names
# from their table (normlab.probe.metrics). Keys not listed: underscores become spaces.
LABELS = {
    "val_loss": "validation loss",
    "train_loss": "training loss",
    "best_val_loss": "best validation loss",
    "val_bpb": "validation bits per byte",
    "ci95": "95% interval",
    "ci95_t": "95% t-interval",
    "ci95_boot": "95% bootstrap interval",
    "n_points": "points",
    "n": "n",
    "lr": "learning rate",
    "tuned_lr": "tuned learning rate",
    "late_angle_init": "late angular distance at init",
    "late_angle_trained": "late angular distance after training",
    "late_merge_kl": "merge KL, deeper half",
    "late_drop_dloss": "layer-drop loss increase, deeper half",
    "test_accuracy": "test accuracy",
    "ngram_baseline_context": "character-trigram baseline (context)",
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
    "paper": "paper",
    "verdict": "verdict",
} | report_labels()

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
    """A column or row heading: the label with its unit, e.g. 'validation loss (nats/byte)';
    a key ending in `_s` is named without it ('time_s' -> 'time (s)')."""
    u = unit(key)
    if u == "s" and key.endswith("_s") and key not in LABELS:
        return f"{label(key[:-2])} (s)"
    return f"{label(key)} ({u})" if u else label(key)


# Keys whose values are learning rates: "lr", "lrs", "best_lr", "pre_lr", "common_lrs"... and,
# inside a value keyed by one of them (C10's `tuned_lr`), the fields that name one of its lrs.
_LR_KEY = re.compile(r"(^|_)lrs?$|^learning_rates?$")
LR_FIELDS_INSIDE = ("best", "extended")


def is_lr_key(key: str) -> bool:
    return bool(_LR_KEY.search(key))


def as_float(text: Any) -> float | None:
    """A key or value that is a finite number, as a float; None otherwise."""
    if isinstance(text, bool):
        return None
    try:
        v = float(text)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def fmt_lr(v: Any) -> str:
    """A learning rate, in the one format the report writes them in: a decimal with at most 3
    significant digits (0.00075, 0.0015, 0.000333, 0.009), never in exponent notation."""
    x = as_float(v)
    if x is None or x <= 0:
        return fmt(v)
    return format(Decimal(f"{x:.3g}"), "f")


def numeric_order(keys: list[str]) -> list[str]:
    """Keys in increasing order of their value when every one is a number (learning rates,
    seeds, depths); otherwise as given."""
    values = [as_float(k) for k in keys]
    if not keys or any(v is None for v in values):
        return list(keys)
    return [k for _, k in sorted(zip(values, keys, strict=True), key=lambda t: t[0])]



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

    @property
    def numeric(self) -> bool:
        return self.kind in ("num", "interval")


@dataclass
class Column:
    title: str
    numeric: bool = False
    verdict: bool = False  # every cell a verdict: the column stays in view (see report.css)


@dataclass
class Row:
    head: str | None
    cells: list[Cell]


@dataclass
class Table:
    columns: list[Column]
    rows: list[Row]
    kind: str = "numbers"   # a CSS class: numbers, verdicts, runs, settings
    corner: str = ""        # the heading above the row headings: what the rows are

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


def _series(values: list[Any], f=fmt) -> Cell:
    shown = [f(x) for x in values]
    if len(values) <= SHORT_LIST:
        return Cell("list", text=", ".join(shown) if shown else "(none)", values=shown)
    finite = [float(x) for x in values if is_number(x) and math.isfinite(x)]
    summary = f"{len(values)} values"
    if finite:
        summary += f", from {f(values[0])} to {f(values[-1])} (min {f(min(finite))}, " \
                   f"max {f(max(finite))})"
    return Cell("series", text=summary, values=shown)


VERDICT_KEYS = ("verdict",)


def cellable(v: Any) -> bool:
    """Whether `v` fits in one table cell: a scalar, an interval or a list of scalars."""
    return (_is_scalar(v) or as_interval(v) is not None
            or (isinstance(v, list | tuple) and all(_is_scalar(x) for x in v)))


def cell(v: Any, key: str = "", *, lr: bool = False) -> Cell:
    """The cell of one value that fits in a cell (see `cellable`); anything structured is laid
    out as tables of its own by `blocks`, never as a table inside a cell. Learning rates (`lr`,
    or a key that names them) are written by `fmt_lr`."""
    if lr or is_lr_key(key):
        if is_number(v):
            return Cell("num", text=fmt_lr(v))
        if isinstance(v, list | tuple) and v and all(is_number(x) for x in v):
            return _series(list(v), fmt_lr)
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
    n = len(v) if isinstance(v, dict | list | tuple) else 0
    return Cell("text", text=f"({n} entries)")


# What the keys of a structured value's levels may be, by the value's key, in order: the rows of
# `numbers["runs"]` are placement, then learning rate, then seed. A name is given to the first
# level below whose keys fit it (`_fits`: a placement, a learning rate, a seed), so that a level
# the list does not expect (C10's pretrained and from-scratch arms above the placements) never
# shifts the names onto the wrong columns. Other levels are named by their keys (LEVEL_WORDS,
# "placement" when every key is one) or left unnamed.
ROW_LEVELS = {
    "runs": ("placement", "learning rate", "seed"),
    "tuning": ("placement",),
    "tuned_lr": ("placement",),
    "real_models_illustration": ("model",),
}
LEVEL_WORDS = {frozenset({"pretrained", "scratch"}): "initial weights",
               frozenset({"with", "without"}): "final norm"}
# Fields whose keys are values of a setting: their table is titled "... by learning rate".
KEYED_BY = {"mean_val_loss": "learning rate", "outcomes": "learning rate",
            "scores": "learning rate", "mean_score": "learning rate"}
TRANSPOSE_AT = 6    # a table of few rows and more fields than this is laid out transposed
WIDE_AT = 10        # a table of more columns than this shows its constant fields apart
LR = "learning rate"


def _is_placement(key: str) -> bool:
    """'pre', 'post', and a variant of one: 'post_gpt2', 'pre xavier'."""
    from normlab.config import PLACEMENTS

    return re.split(r"[_ ]", key, maxsplit=1)[0] in PLACEMENTS


def _fits(name: str, keys: list[str]) -> bool:
    if name == "placement":
        return all(_is_placement(k) for k in keys)
    if name == LR:
        return all((v := as_float(k)) is not None and 0 < v < 1 for k in keys)
    if name == "seed":
        return all(k.isdigit() for k in keys)
    return True


def _level_name(keys: list[str], hints: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """The name of a level of keys, and the hints left for the levels below it."""
    for i, hint in enumerate(hints):
        if _fits(hint, keys):
            return hint, hints[i + 1:]
    words = LEVEL_WORDS.get(frozenset(keys))
    if words:
        return words, hints
    return ("placement" if keys and all(_is_placement(k) for k in keys) else ""), hints


def _key_cell(text: str, name: str) -> Cell:
    if name == LR and as_float(text) is not None:
        return Cell("num", text=fmt_lr(text))
    try:
        float(text)
    except ValueError:
        return Cell("text", text=text)
    return Cell("num", text=text)


def _grid_key(key: str, n: int) -> list[str]:
    parts = key.split("|")
    if n == len(GRID_PARTS) and parts[-1] in _GRID_VARIANT:
        parts[-1] = _GRID_VARIANT[parts[-1]]
    return parts


def _split_columns(keys: list[str]) -> list[str] | None:
    """Column names for keys made of `|`-separated parts, if every key has the same number."""
    counts = {k.count("|") for k in keys}
    if len(counts) != 1 or not counts.pop():
        return None
    n = keys[0].count("|") + 1
    grid = n == len(GRID_PARTS) and all(k.rsplit("|", 1)[-1] in _GRID_VARIANT for k in keys)
    return list(GRID_PARTS) if grid else [f"part {i + 1}" for i in range(n)]


def _as_dict(v: Any) -> dict[str, Any] | None:
    """A dict with string keys, in increasing order when every key is a number (see
    `numeric_order`); a list of records as one keyed by index (0 = first)."""
    if isinstance(v, dict):
        d = {str(k): x for k, x in v.items()}
        return {k: d[k] for k in numeric_order(list(d))}
    if isinstance(v, list | tuple) and not cellable(v):
        return {str(i): x for i, x in enumerate(v)}
    return None


KeyPath = tuple[str, ...]


def _descend(items: list[tuple[KeyPath, Any]], names: list[str], hints: tuple[str, ...]
             ) -> tuple[list[tuple[KeyPath, dict[str, Any]]], list[str]] | None:
    """Go down the levels of a tree of dicts until its nodes hold values that fit in cells: the
    nodes there are the rows of one table, their paths its first columns, named by
    `_level_name`. None if the tree is not regular (a node that is not a dict at a level where
    the others are)."""
    rows = [(p, _as_dict(x)) for p, x in items]
    for _ in range(MAX_DEPTH):
        if not rows or any(d is None for _, d in rows):
            return None
        if any(cellable(v) for _, d in rows for v in d.values()) or \
                not all(d for _, d in rows):
            return [(p, d) for p, d in rows if d is not None], names
        keys = numeric_order(list(dict.fromkeys(k for _, d in rows for k in d)))
        name, hints = _level_name(keys, hints)
        names = [*names, name]
        rows = [(p + (k,), _as_dict(d[k])) for p, d in rows for k in keys if k in d]
    return None


# Keys that name a kind rather than a measure when their values are words: a model's "norm" is
# its normalization ("rmsnorm"), not the stream norm that LABELS names for numbers.
KIND_LABELS = {"norm": "norm", "final_norm": "final norm"}


@dataclass
class _Fields:
    """How the fields of a table's records are named and written: by their own key, or, for the
    keys of a value keyed by a setting (`KEYED_BY`), as values of that setting."""
    keyed_by: str = ""      # "learning rate": the fields are learning rates
    lr_inside: bool = False  # inside a value keyed by an lr key: `LR_FIELDS_INSIDE` are lrs

    def title(self, f: str, words: bool) -> str:
        if self.keyed_by == LR and as_float(f) is not None:
            return fmt_lr(f)
        return KIND_LABELS[f] if words and f in KIND_LABELS else heading(f)

    def cell(self, v: Any, f: str) -> Cell:
        return cell(v, f, lr=self.lr_inside and f in LR_FIELDS_INSIDE)


def _record_table(rows: list[tuple[KeyPath, dict[str, Any]]], names: list[str],
                  fields: list[str], kind: str, how: _Fields) -> Table:
    """One row per path (its parts as the first columns, or as row headings when there is one
    part), one column per field; transposed when it has few rows and many fields."""
    def field_heading(f: str) -> str:
        return how.title(f, all(isinstance(d.get(f), str) for _, d in rows
                                if d.get(f) is not None))

    def head(p: KeyPath) -> str:
        return fmt_lr(p[0]) if names[0] == LR and as_float(p[0]) is not None else label(p[0])

    if len(names) == 1 and len(rows) <= 3 and len(fields) > TRANSPOSE_AT:
        cols = [Column(head(p)) for p, _ in rows]
        body = [Row(field_heading(f), [how.cell(d.get(f), f) for _, d in rows]) for f in fields]
        return mark_numeric(Table(cols, body, kind, corner=names[0]))
    if len(names) == 1:
        cols = [Column(field_heading(f)) for f in fields]
        body = [Row(head(p), [how.cell(d.get(f), f) for f in fields]) for p, d in rows]
        return _mark_decisions(mark_numeric(Table(cols, body, kind, corner=names[0])), fields)
    cols = [Column(n or f"key {i + 1}") for i, n in enumerate(names)]
    cols += [Column(field_heading(f)) for f in fields]
    body = [Row(None, [_key_cell(x, n) for x, n in zip(p, names, strict=True)]
                + [how.cell(d.get(f), f) for f in fields]) for p, d in rows]
    return _mark_decisions(mark_numeric(Table(cols, body, kind)), [""] * len(names) + fields)


# Fields that say what came of a row (a verdict, a run's outcome): their column stays in view
# when the table scrolls, like a column of verdicts.
_DECISION = re.compile(r"^(verdict|outcomes?)(_|$)")


def _mark_decisions(table: Table, fields: list[str]) -> Table:
    for col, f in zip(table.columns, fields, strict=True):
        col.verdict = col.verdict or bool(_DECISION.match(f))
    return table


def _constant_fields(rows: list[tuple[KeyPath, dict[str, Any]]], fields: list[str]
                     ) -> list[str]:
    """The fields with one and the same value in every row."""
    return [f for f in fields
            if all(f in d for _, d in rows) and len({repr(d[f]) for _, d in rows}) == 1]


def _repeats_key(rows: list[tuple[KeyPath, dict[str, Any]]], names: list[str], f: str,
                 how: _Fields) -> bool:
    """Whether field `f` is, in every row, the row's own key of the level named like it."""
    title = how.title(f, False)
    return any(n and n == title and all(
        how.cell(d.get(f), f).text == _key_cell(p[i], n).text for p, d in rows)
        for i, n in enumerate(names))


def _tree_blocks(title: str, items: list[tuple[KeyPath, Any]], names: list[str],
                 hints: tuple[str, ...], kind: str, how: _Fields) -> list[Block]:
    found = _descend(items, names, hints)
    if found is None:  # irregular: each item on its own
        out = []
        for p, x in items:
            out += blocks(f"{title}: {', '.join(p)}" if title else ", ".join(p), x)
        return out
    rows, names = found
    fields = numeric_order(list(dict.fromkeys(k for _, d in rows for k in d)))
    flat = [f for f in fields if all(cellable(d[f]) for _, d in rows if f in d)]
    structured = [f for f in fields if f not in flat]
    out = []
    if flat:
        # A wide table says once, apart, what is the same in every row, and leaves out a field
        # that repeats one of the row's keys (a run's lr under its learning-rate key).
        same: list[str] = []
        if len(rows) > 1 and len(names) + len(flat) > WIDE_AT:
            same = _constant_fields(rows, flat)
            flat = [f for f in flat if f not in same and not _repeats_key(rows, names, f, how)]
        if flat:
            out.append(Block(title, table=_record_table(rows, names, flat, kind, how)))
        if same:
            d0 = rows[0][1]
            body = [Row(how.title(f, isinstance(d0[f], str)), [how.cell(d0[f], f)])
                    for f in same]
            out.append(Block((f"{title}: " if title else "") + "the same in every row",
                             table=mark_numeric(Table([Column("value")], body, kind))))
    for f in structured:
        sub = [(p, d[f]) for p, d in rows if f in d and d[f] not in ({}, [], None)]
        if not sub:
            continue
        by = KEYED_BY.get(f)
        sub_title = heading(f) + (f", by {by}" if by else "")
        sub_how = _Fields(keyed_by=by or "", lr_inside=how.lr_inside or is_lr_key(f))
        out += _tree_blocks(f"{title}: {sub_title}" if title else sub_title, sub, names, (),
                            kind, sub_how)
    return out


def blocks(title: str, v: Any, key: str = "") -> list[Block]:
    """A value under its heading, laid out flat: a single cell; or tables in which every cell
    holds one value. A tree of dicts becomes one table per kind of record (its keys as the first
    columns, e.g. placement, learning rate, seed), so no table ever sits inside another. Empty
    values give no block at all."""
    if cellable(v):
        return [Block(title, cell=cell(v, key))]
    d = _as_dict(v)
    if not d:
        return []
    keys = list(d)
    how = _Fields(keyed_by=KEYED_BY.get(key, ""), lr_inside=is_lr_key(key))
    split = _split_columns(keys)
    if split is not None:  # "pre|0.001|2|0|final": the parts are the rows' first columns
        items = [(tuple(_grid_key(k, len(split))), x) for k, x in d.items()]
        if all(isinstance(x, dict) and x and all(cellable(y) for y in x.values())
               for _, x in items):
            return _tree_blocks(title, items, split, (), "numbers", how)
    flat = {k: x for k, x in d.items() if cellable(x)}
    out = []
    if flat:
        body = [Row(how.title(k, isinstance(x, str)), [how.cell(x, k)]) for k, x in flat.items()]
        out.append(Block(title, table=mark_numeric(Table([Column("value")], body, "numbers"))))
    nested = [((k,), x) for k, x in d.items() if k not in flat and x not in ({}, [], None)]
    if nested:
        name, hints = _level_name([p[0] for p, _ in nested], ROW_LEVELS.get(key, ()))
        out += _tree_blocks(title, nested, [name], hints, "numbers", how)
    return out


def table_of(v: Any) -> Table | None:
    """A dict or list whose values all fit in cells, as one table; None for anything else."""
    found = blocks("", v)
    return found[0].table if len(found) == 1 and found[0].table is not None else None


def mark_numeric(table: Table) -> Table:
    """Right-align the columns whose cells are all numbers; mark those of verdicts."""
    for i, col in enumerate(table.columns):
        cells = [r.cells[i] for r in table.rows if i < len(r.cells)]
        col.numeric = bool(cells) and all(c.numeric or c.kind == "empty" for c in cells)
        col.verdict = any(c.kind == "verdict" for c in cells) and \
            all(c.kind in ("verdict", "empty") for c in cells)
    return table


def numbers_blocks(numbers: dict[str, Any]) -> list[Block]:
    """A claim's `numbers`: the values that fit in a cell together in one table first, then each
    structured value as its own titled tables (see `blocks`); empty ones are left out."""
    flat = {k: v for k, v in numbers.items() if cellable(v)}
    out = []
    if flat:
        out += blocks("", flat)
    for k, v in numbers.items():
        if k not in flat:
            out += blocks(heading(k), v, k)
    return out
