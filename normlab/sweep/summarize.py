"""One table of all the runs of a sweep folder: config axes, outcome, divergence step and reason,
final train/val loss, best val loss, token-varying share of the final stream, tokens/s. As rows
(dicts), JSON, CSV, Parquet or a rich table.

The runs and axes come from `sweep.json`; a folder of runs without one (e.g. several `normlab
train` runs) works too: the axes are then the config fields that differ between its runs. A run
folder that cannot be read is a row `damaged`, with why in `reason`; the others are listed. An
axis that does not apply to a run (`normlab.train.listing.applies`: `data.khop_*` of a text run,
`gelu_approx` of a SwiGLU one) is null for it. In a terminal the table fits its width as `normlab
runs`' does (`normlab.train.rows.terminal_table`): the axes fold into one column of `axis=value`
tokens when a column each is too wide, and tok/s, best val, train loss and step are left out, in
that order, with a note, before a run id or a number is cut.
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
from normlab.train.listing import applies, described_config, differing_paths, flatten
from normlab.train.listing import varying_paths as varying_paths  # (for the maps and report)
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
        axes = differing_paths([c for _, c in entries if c])
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
        v = cfg.get(axis) if applies(axis, cfg) else None
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


# the columns a narrow terminal leaves out, first to last
DROP_ORDER = ("tokens_per_s", "best_val_loss", "train_loss", "step")


def summary_columns(table: SweepTable, compact: bool = False):
    """The columns of the terminal table (`normlab.train.rows.Column`): a column per axis, or in
    the `compact` form the axes as one column of `axis=value` tokens (those that apply to the
    run) and the loss headings on two lines."""
    from rich.text import Text

    from normlab.train.rows import Column

    heads = {"run_id": "run", "train_loss": "train loss", "val_loss": "val loss",
             "best_val_loss": "best val", "tokens_per_s": "tok/s"}
    rows = table.rows

    def col(c: str, cells: list[Any], fold: str = "whole", right: bool = True) -> Column:
        head = heads.get(c, c)
        return Column(head.replace(" ", "\n") if compact else head, cells,
                      fold, name=head,  # type: ignore[arg-type]
                      drop=DROP_ORDER.index(c) if c in DROP_ORDER else None,
                      justify="right" if right else "left")

    out = [col("run_id", [r["run_id"] for r in rows], right=False)]
    if compact and table.axes:
        out.append(Column("settings", [
            [f"{a.split('.')[-1]}={_cell(r[a], a)}" for a in table.axes
             if applies(a, table.configs[i])] for i, r in enumerate(rows)], "tokens"))
    elif not compact:
        out += [Column(a.split(".")[-1], [_cell(r[a], a) for r in rows], "words")
                for a in table.axes]
    outcomes = []
    for r in rows:
        text = r["outcome"] + (f" ({r['reason']})" if r.get("reason") else "")
        outcomes.append(Text(text, style=_STYLE.get(r["outcome"], "")))
    out += [col("outcome", outcomes, "words", right=False),
            col("step", [f"{_cell(r['step'], 'step')}/{_cell(r['steps_planned'], 'step')}"
                         for r in rows])]
    out += [col(c, [_cell(r[c], c) for r in rows])
            for c in ("train_loss", "val_loss", "best_val_loss", "tokens_per_s")]
    return out


def _title(table: SweepTable) -> str:
    return f"sweep {table.name}: {len(table.rows)} runs ({table.root})"


def to_rich(table: SweepTable, width: int | None = None):
    """The rich table of `table`, a column per axis, as wide as it needs (`width` None), else
    fitted to a terminal of `width` columns (`fit_rich`, whose note this drops)."""
    from normlab.train.rows import terminal_table

    if width is not None:
        return fit_rich(table, width)[0]
    return terminal_table(_title(table), summary_columns(table))[0]


def fit_rich(table: SweepTable, width: int):
    """The rich table of `table` in a terminal of `width` columns: a column per axis where that
    fits, else the axes in one column and columns left out as needed; and the note that names
    those left out (None when none is)."""
    from normlab.train.rows import fit_columns, left_out_note, table_width, terminal_table

    wide = summary_columns(table)
    if table_width(fit_columns(wide, None)[1]) <= width:
        return terminal_table(_title(table), wide)[0], None
    fitted, dropped = terminal_table(_title(table), summary_columns(table, compact=True), width)
    return fitted, left_out_note(dropped, width)


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
