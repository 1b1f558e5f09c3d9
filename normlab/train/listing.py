"""`normlab runs`: the run folders under a root as one table, every folder shown.

Columns: the run id, the settings in which the listed runs differ (config fields, and the thread
count or versions they ran with), the outcome, the step and the losses. A damaged folder is a row
`damaged` with why (see `normlab.train.rundir.read_run_folder`); it never hides the others.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from normlab.train.rundir import RunFolder, read_run_folder, run_folders

# meta fields of config.yaml that can differ between runs of equal configs' numbers
META_COLUMNS = ("threads", "world_size", "torch", "normlab")


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as flat `section.field` keys (lists become tuples)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = tuple(v) if isinstance(v, list) else v
    return out


def varying_paths(configs: list[dict[str, Any]]) -> list[str]:
    """The config paths (flat `section.field` keys) whose value differs between runs, sorted."""
    keys = sorted({k for c in configs for k in c})
    return [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]


def run_columns(folders: list[RunFolder]) -> list[str]:
    """The fields in which the readable runs differ: config paths, then `meta.*` fields."""
    readable = [f for f in folders if not f.damaged]
    columns = varying_paths([flatten(f.raw_config) for f in readable])
    meta = varying_paths([{f"meta.{k}": f.meta.get(k) for k in META_COLUMNS} for f in readable])
    return columns + meta


def _value(folder: RunFolder, path: str) -> Any:
    if path.startswith("meta."):
        return folder.meta.get(path[len("meta."):])
    return flatten(folder.raw_config).get(path)


def _text(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, tuple):
        return ",".join(_text(x) for x in v)
    return str(v)


def _loss(summary: dict[str, Any], key: str) -> str:
    v = summary.get(key)
    return f"{v:.4f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def runs_table(root: Path):
    """The rich table of `normlab runs` for the run folders directly under `root`."""
    from rich.markup import escape
    from rich.table import Table

    folders = [read_run_folder(p) for p in run_folders(root)]
    columns = run_columns(folders)
    damaged = sum(f.damaged for f in folders)
    title = f"{len(folders)} runs in {escape(str(root))}" + (
        f", {damaged} damaged" if damaged else "")
    table = Table(title=title)
    heads = ["run", *(c.split(".", 1)[-1] for c in columns), "outcome", "step", "train loss",
             "val loss", "best val"] + (["why damaged"] if damaged else [])
    for head in heads:
        table.add_column(head)
    for f in folders:
        s = f.summary
        outcome = f.outcome + (f" ({s['reason']})" if s.get("reason") else "")
        planned = s.get("steps_planned") or (f.config.train.steps if f.config else None)
        cells = [f.run_id, *(_text(_value(f, c)) for c in columns), outcome,
                 f"{_text(s.get('step'))}/{_text(planned)}", _loss(s, "train_loss"),
                 _loss(s, "val_loss"), _loss(s, "best_val_loss")]
        if damaged:  # the folder's own path is the row's first cell: say the rest
            cells.append("; ".join(p.replace(f"{f.path}/", "") for p in f.problems))
        row = [escape(c) for c in cells]
        if f.damaged:
            row[len(columns) + 1] = "[bold red]damaged[/]"
        table.add_row(*row)
    return table
