"""Tables of results as data: the `--format json` and `--format csv` of the commands that print a
table (`normlab runs`, `normlab sweep summarize`).

A table is a list of rows, each a mapping from a column's key (a stable name such as `run_id`,
`model.placement` or `val_loss`, never a display heading) to its value. Every row has every key.
JSON is a list of row objects; numbers stay numbers, a list stays a list, a non-finite number
(a diverged run's loss) is `null`. CSV has a header row of the keys; a missing value is empty and
a list is joined with commas.

In a terminal the same tables fit the terminal's width (`terminal_table`): a number or a run id
is never cut (its column is as wide as its widest cell), the settings fold into one column of
`key=value` tokens that wraps between tokens, never inside one, and where even that is too wide
the columns of least use are left out, lowest `drop` first, with a note that names them
(`left_out_note`).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

FORMATS = ("table", "json", "csv")


def json_value(v: Any) -> Any:
    """A value as JSON holds it: tuples as lists, non-finite floats as null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (tuple, list)):
        return [json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): json_value(x) for k, x in v.items()}
    return v


def csv_value(v: Any) -> Any:
    """A value as a CSV cell: None empty, a list joined with commas."""
    if v is None:
        return ""
    if isinstance(v, (tuple, list)):
        return ",".join(str(csv_value(x)) for x in v)
    return v


def to_json(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """The rows as a JSON list of objects with the keys `columns`, in that order."""
    data = [{c: json_value(r.get(c)) for c in columns} for r in rows]
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def to_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """The rows as CSV: a header row of `columns`, then one line per row."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        writer.writerow([csv_value(r.get(c)) for c in columns])
    return buf.getvalue()


def render(rows: Sequence[dict[str, Any]], columns: Sequence[str], fmt: str) -> str:
    """`to_json` or `to_csv` by `fmt` ("json" or "csv")."""
    return (to_json if fmt == "json" else to_csv)(rows, columns)


@dataclass(eq=False)
class Column:
    """One column of a terminal table. `head`: its heading (lines split by newlines); `cells`:
    one per row, text (a `str` or a rich `Text`), or for `fold="tokens"` a list of `key=value`
    tokens. `fold`: how it may narrow: `whole` never (numbers, ids: as wide as its widest cell),
    `words` at spaces (an outcome with its reason), `tokens` between tokens only. `drop`: None
    for a column always shown, else its rank among the columns left out when the table does not
    fit (the lowest first)."""

    head: str
    cells: list[Any]
    fold: Literal["whole", "words", "tokens"] = "whole"
    drop: int | None = None
    justify: Literal["left", "right"] = "left"
    name: str | None = None  # what a note calls it (default: the heading on one line)

    @property
    def label(self) -> str:
        return self.name or " ".join(self.head.split())

    def _heads(self) -> int:
        return max(cell_len(h) for h in self.head.split("\n"))

    @property
    def least(self) -> int:
        """The narrowest it can be without cutting a number, a word or a token."""
        if self.fold == "tokens":
            parts = [t for cell in self.cells for t in cell]
        elif self.fold == "words":
            parts = [w for cell in self.cells for w in str(cell).split()]
        else:
            parts = [line for cell in self.cells for line in str(cell).split("\n")]
        return max([self._heads(), *map(cell_len, parts)])

    @property
    def natural(self) -> int:
        """Its width with nothing folded."""
        if self.fold == "tokens":
            lines = [TOKEN_GAP.join(cell) for cell in self.cells]
        else:
            lines = [line for cell in self.cells for line in str(cell).split("\n")]
        return max([self._heads(), *map(cell_len, lines)])


TOKEN_GAP = "  "  # between the key=value tokens of one line


def cell_len(text: Any) -> int:
    from rich.cells import cell_len as width

    return width(str(text))


def table_width(widths: Sequence[int]) -> int:
    """The printed width of a table with columns of these content widths (rich's default box:
    a border between and around the columns and one space of padding on each side)."""
    return sum(widths) + 3 * len(widths) + 1


def fit_columns(columns: Sequence[Column], width: int | None
                ) -> tuple[list[Column], list[int], list[Column]]:
    """The columns shown in `width` terminal columns (None: every column at its natural width),
    each one's width, and the columns left out. Columns are left out, lowest `drop` first, until
    the rest fit at their `least` width; the width left over goes to the token column, then to
    those that fold at words, up to their natural width. Where even the columns always shown do
    not fit, the folding columns shrink below their least width (a token wider than the terminal
    leaves is then folded: nothing else can show it)."""
    kept = list(columns)
    if width is None:
        return kept, [c.natural for c in kept], []
    dropped: list[Column] = []
    for c in sorted((c for c in columns if c.drop is not None), key=lambda c: c.drop or 0):
        if table_width([k.least for k in kept]) <= width:
            break
        kept.remove(c)
        dropped.append(c)
    widths = [c.least for c in kept]
    spare = width - table_width(widths)
    flexible = sorted((i for i, c in enumerate(kept) if c.fold != "whole"),
                      key=lambda i: kept[i].fold != "tokens")
    for i in flexible:
        if spare < 0:  # too narrow for the columns always shown: squeeze what folds
            cut = min(-spare, widths[i] - max(kept[i]._heads(), 8))
            widths[i] -= max(cut, 0)
            spare += max(cut, 0)
        else:
            grow = min(spare, kept[i].natural - widths[i])
            widths[i] += grow
            spare -= grow
    return kept, widths, [c for c in columns if c in dropped]


def pack_tokens(tokens: Sequence[str], width: int) -> str:
    """`key=value` tokens as lines of at most `width` cells, a line broken only between two
    tokens. A token wider than `width` (only where the terminal is too narrow for the columns
    always shown) stands on lines of its own, broken after the commas of its list if it has
    one."""
    lines: list[str] = []
    joins = False  # whether the next token may join the last line (not a broken token's)
    for token in tokens:
        if joins and cell_len(lines[-1]) + len(TOKEN_GAP) + cell_len(token) <= width:
            lines[-1] += TOKEN_GAP + token
        elif cell_len(token) <= width:
            lines.append(token)
            joins = True
        else:
            joins, start = False, len(lines)
            for part in re.split(r"(?<=,)", token):
                if len(lines) > start and cell_len(lines[-1]) + cell_len(part) <= width:
                    lines[-1] += part
                else:
                    lines.append(part)
    return "\n".join(lines)


def terminal_table(title: Any, columns: Sequence[Column], width: int | None = None):
    """A rich table of `columns` that fits `width` terminal columns (`fit_columns`; None: at its
    natural width), and the columns left out."""
    from rich.table import Table
    from rich.text import Text

    kept, widths, dropped = fit_columns(columns, width)
    table = Table(title=title)
    for c, w in zip(kept, widths, strict=True):
        table.add_column(c.head, width=w, justify=c.justify, no_wrap=c.fold == "whole",
                         overflow="fold")
    for row in range(len(columns[0].cells) if columns else 0):
        cells = []
        for c, w in zip(kept, widths, strict=True):
            v = c.cells[row]
            cells.append(Text(pack_tokens(v, w)) if c.fold == "tokens" else
                         v if isinstance(v, Text) else Text(str(v)))
        table.add_row(*cells)
    return table, dropped


def left_out_note(dropped: Sequence[Column], width: int) -> str | None:
    """One line naming the columns a `width`-column terminal left out, and where to see them."""
    if not dropped:
        return None
    return (f"left out at {width} columns: {', '.join(c.label for c in dropped)} (a wider "
            "terminal shows them; --format json or csv gives every column)")
