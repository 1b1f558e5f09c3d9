"""One table of all the runs of a sweep folder: config axes, outcome, divergence step and reason,
final train/val loss, best val loss, token-varying share of the final stream, tokens/s. As rows
(dicts), JSON, CSV, Parquet or a rich table.

The runs and axes come from `sweep.json`; a folder of runs without one (e.g. several `normlab
train` runs) works too: the axes are then the config fields that differ between its runs. A run
folder that cannot be read is a row `damaged`, with why in `reason`; the others are listed.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from normlab.sweep.spec import format_value
from normlab.sweep.state import read_sweep_file
from normlab.sweep.unfinished import last_progress
from normlab.train.listing import described_config, flatten, varying_paths
from normlab.train.logging import read_metrics
from normlab.train.rundir import read_run_folder, run_folders

RESULT_COLUMNS = ("outcome", "reason", "step", "steps_planned", "diverged_step", "train_loss",
                  "val_loss", "best_val_loss", "token_share", "tokens_per_s")
FORMATS = ("table", "json", "csv", "parquet")


class SummaryError(RuntimeError):
    """A folder that holds no runs, or an output that cannot be written."""


@dataclass
class SweepTable:
    root: Path
    name: str
    axes: list[str]
    rows: list[dict[str, Any]]              # one per run: run_id, axes, RESULT_COLUMNS
    configs: list[dict[str, Any]]           # each run's full config, flattened to dotted paths

    @property
    def columns(self) -> list[str]:
        return ["run_id", *self.axes, *RESULT_COLUMNS]

    def value(self, i: int, path: str) -> Any:
        return self.configs[i].get(path)


def _float(x: Any) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def collect(root: Path | str) -> SweepTable:
    root = Path(root)
    if not root.is_dir():
        raise SummaryError(f"{root}: no such folder")
    sweep = read_sweep_file(root)
    if sweep is not None:
        name, axes = str(sweep.get("name", root.name)), list(sweep.get("axes", []))
        entries = [(r["run_id"], flatten(r["config"])) for r in sweep.get("runs", [])]
    else:
        name = root.name
        # each run as the placement resolved it (init, final norm, constants), as `normlab runs`
        entries = [(p.name, flatten(described_config(read_run_folder(p))))
                   for p in run_folders(root)]
        axes = varying_paths([c for _, c in entries if c])
    if not entries:
        raise SummaryError(f"{root}: no runs here (no sweep.json and no run folders)")
    rows = [_row(root / run_id, run_id, cfg, axes) for run_id, cfg in entries]
    return SweepTable(root=root, name=name, axes=axes, rows=rows, configs=[c for _, c in entries])


def _row(run_dir: Path, run_id: str, cfg: dict[str, Any], axes: list[str]) -> dict[str, Any]:
    folder = read_run_folder(run_dir)
    outcome, s = folder.outcome, folder.summary
    if outcome == "interrupted" and s.get("outcome") == "running":  # killed: read how far it got
        s = {**s, **last_progress(run_dir)}
    row: dict[str, Any] = {"run_id": run_id}
    for axis in axes:
        v = cfg.get(axis)
        row[axis] = format_value(v) if isinstance(v, tuple) else v
    tps = _float(s.get("tokens_per_s"))
    if tps is None and outcome != "pending":  # diverged/interrupted: median over logged steps
        speeds = [_float(r.get("tokens_per_s")) for r in read_metrics(run_dir / "metrics.jsonl")]
        speeds = [x for x in speeds if x is not None]
        tps = statistics.median(speeds) if speeds else None
    row.update({
        "outcome": outcome,
        "reason": "; ".join(folder.problems) if folder.damaged else s.get("reason"),
        "step": s.get("step"),
        "steps_planned": s.get("steps_planned", cfg.get("train.steps")),
        "diverged_step": s.get("step") if outcome == "diverged" else None,
        "train_loss": _float(s.get("train_loss")),
        # a stalled run's final loss is a measurement too; its outcome says it learned no context
        "val_loss": _float(s.get("val_loss")) if outcome in ("completed", "stalled") else None,
        "best_val_loss": _float(s.get("best_val_loss")),
        "token_share": _float(s.get("token_share")),
        "tokens_per_s": tps,
    })
    return row


def _column_types_clean(rows: list[dict[str, Any]], columns: list[str]) -> list[dict[str, Any]]:
    """Parquet wants one type per column: a column mixing numbers and text becomes text."""
    out = [dict(r) for r in rows]
    for col in columns:
        kinds = {type(r[col]) for r in rows if r.get(col) is not None}
        if kinds <= {int, float} and kinds:
            if float in kinds:
                for r in out:
                    r[col] = None if r[col] is None else float(r[col])
        elif len(kinds) > 1:
            for r in out:
                r[col] = None if r[col] is None else format_value(r[col])
    return out


def to_csv(table: SweepTable, path: Path | None = None) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=table.columns, extrasaction="ignore")
    writer.writeheader()
    for row in table.rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    text = buf.getvalue()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return text


def to_json(table: SweepTable, path: Path | None = None) -> str:
    """The rows as a JSON list of objects keyed by `table.columns` (numbers as numbers, a
    non-finite one as null; see `normlab.train.rows`)."""
    from normlab.train.rows import to_json as rows_json

    text = rows_json(table.rows, table.columns)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return text


def to_parquet(table: SweepTable, path: Path) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise SummaryError("Parquet output needs the package pyarrow, which is not installed: "
                           "pip install pyarrow (or use --format csv)") from None
    rows = _column_types_clean(table.rows, table.columns)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), str(path))


def _cell(v: Any, col: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if col == "tokens_per_s":
            return f"{v:,.0f}"
        if col.endswith("loss"):
            return f"{v:.4f}"
        return f"{v:g}"
    return str(v)


_STYLE = {"completed": "green", "stalled": "magenta", "diverged": "red", "failed": "bold red",
          "interrupted": "yellow", "running": "cyan", "pending": "dim", "damaged": "bold red"}


def to_rich(table: SweepTable):
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    t = Table(title=f"sweep {table.name}: {len(table.rows)} runs ({table.root})")
    short = {a: a.split(".")[-1] for a in table.axes}
    cols = ["run_id", *table.axes, "outcome", "step", "train_loss", "val_loss", "best_val_loss",
            "tokens_per_s"]
    heads = {"run_id": "run", "train_loss": "train loss", "val_loss": "val loss",
             "best_val_loss": "best val", "tokens_per_s": "tok/s", **short}
    for c in cols:
        t.add_column(heads.get(c, c), justify="right" if c not in ("run_id", "outcome")
                     and c not in table.axes else "left")
    for row in table.rows:
        cells = []
        for c in cols:
            if c == "outcome":
                text = row["outcome"] + (f" ({row['reason']})" if row.get("reason") else "")
                style = _STYLE.get(row["outcome"])
                cells.append(Text(text, style=style) if style else text)
            elif c == "step":
                cells.append(f"{_cell(row['step'], c)}/{_cell(row['steps_planned'], c)}")
            else:
                cells.append(escape(_cell(row[c], c)))
        t.add_row(*cells)
    return t


def summarize(root: Path | str, fmt: str = "table", out: Path | None = None
              ) -> tuple[SweepTable, Path | None]:
    """Collect the table and write it as `fmt` (json/csv/parquet to `out`, default in the
    folder); returns the table and the file written (None for `table`)."""
    if fmt not in FORMATS:
        raise SummaryError(f"format: {fmt!r} is not one of {', '.join(FORMATS)}")
    table = collect(root)
    path = None if fmt == "table" else out or table.root / f"summary.{fmt}"
    if fmt == "csv":
        to_csv(table, path)
    elif fmt == "json":
        to_json(table, path)
    elif fmt == "parquet":
        to_parquet(table, path)
    return table, path
