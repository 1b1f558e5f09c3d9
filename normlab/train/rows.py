"""Tables of results as data: the `--format json` and `--format csv` of the commands that print a
table (`normlab runs`, `normlab sweep summarize`).

A table is a list of rows, each a mapping from a column's key (a stable name such as `run_id`,
`model.placement` or `val_loss`, never a display heading) to its value. Every row has every key.
JSON is a list of row objects; numbers stay numbers, a list stays a list, a non-finite number
(a diverged run's loss) is `null`. CSV has a header row of the keys; a missing value is empty and
a list is joined with commas.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from typing import Any

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
