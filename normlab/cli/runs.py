"""`normlab runs`: the run folders under a root (at any depth: a sweep's runs too) as one table,
every folder shown.

Columns: the run id, its sweep, the settings in which the listed runs differ (config fields as
the placement resolved them, and the thread count or versions they ran with), the outcome, the
step and the losses, the validation loss in bits per byte of the held-out text when a listed run
reads tokens other than bytes (a tokenizer or token files: the number that compares runs of
different tokenizers), and the validation accuracy when a run has one (a synthetic task's,
`data.task`). Runs that share a `train.name` show, after it, a short prefix of their id (what
`normlab sample` takes in place of the name). A damaged folder is a row
`damaged` with why (see `normlab.train.rundir.read_run_folder`); it never hides the others.
In `compact` form (a terminal narrower than the table) the settings fold into one column, one
`field=value` per line, and the result headers take two lines, so that a 100-column terminal
shows every run with its outcome and losses and no word is split. `--format json|csv` prints the
same rows as data (`normlab.train.rows`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from normlab.cli.app import app
from normlab.cli.console import console, fail
from normlab.sweep.state import read_sweep_file
from normlab.train.listing import described_config, flatten, label_paths, varying_paths
from normlab.train.rows import FORMATS, render
from normlab.train.rundir import RunFolder, find_run_folders, read_run_folder


def output_format(value: str) -> str:
    """Option callback for `--format`: one of `FORMATS`, named in the error otherwise."""
    if value not in FORMATS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(FORMATS)}")
    return value


@app.command()
def runs(root: Annotated[Path, typer.Argument(
        metavar="ROOT", help="folder of run folders")] = Path("runs"),
         wide: Annotated[bool, typer.Option(
             help="a column per setting, however wide the terminal")] = False,
         format: Annotated[str, typer.Option(
             "--format", callback=output_format,
             help="table, json (a list of row objects) or csv (a header row, then a row per run)")
         ] = "table",
         ) -> None:
    """List the runs under ROOT.

    Shows the settings in which they differ, the outcome and the final losses; a damaged folder
    is listed as damaged, with why. In a terminal narrower than the table the settings fold into
    one column (--wide: a column each). --format json or csv prints the same rows as data, keyed
    by config path (model.placement) and result (val_loss), numbers unformatted."""
    if not root.is_dir():
        fail(f"{root}: no such folder of runs")
    listing = list_runs(root)
    if format != "table":
        sys.stdout.write(render(listing.records(), listing.record_keys, format))
        return
    table = runs_table(root, listing=listing)
    if console.is_terminal:
        if not wide and _natural_width(table) > console.width:
            table = runs_table(root, compact=True, listing=listing)
        console.print(table)
        return
    width = console.width  # in a file or a pipe no cell is folded: as wide as the table needs
    console.width = max(width, _natural_width(table))
    try:
        console.print(table)
    finally:
        console.width = width


def _natural_width(table: Table) -> int:
    """The width at which `table` needs no folding."""
    return console.measure(table, options=console.options.update_width(10_000)).maximum


# meta fields of config.yaml that can differ between runs of equal configs' numbers
META_COLUMNS = ("threads", "world_size", "torch", "normlab")
RESULT_HEADS = ("outcome", "step", "train loss", "val loss", "best val")
COMPACT_HEADS = {"train loss": "train\nloss", "val loss": "val\nloss", "best val": "best\nval",
                 "val acc": "val\nacc", "val bpb": "val\nbpb"}


def run_columns(folders: list[RunFolder], flats: list[dict[str, Any]]) -> list[str]:
    """The fields in which the readable runs differ (config paths, `flats` being each folder's
    `described_config` flattened), then `meta.*` fields."""
    readable = [(f, flat) for f, flat in zip(folders, flats, strict=True) if not f.damaged]
    configs = [flat for _, flat in readable]
    columns = list(dict.fromkeys([*label_paths(configs), *varying_paths(configs)]))
    meta = varying_paths([{f"meta.{k}": f.meta.get(k) for k in META_COLUMNS}
                          for f, _ in readable])
    return columns + meta


def _value(folder: RunFolder, flat: dict[str, Any], path: str) -> Any:
    if path.startswith("meta."):
        return folder.meta.get(path[len("meta."):])
    return flat.get(path)


def _text(v: Any, sep: str = ",") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, tuple):
        return sep.join(_text(x) for x in v)
    return str(v)


def _loss(summary: dict[str, Any], key: str) -> str:
    v = summary.get(key)
    return f"{v:.4f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def bytes_as_tokens(folder: RunFolder) -> bool:
    """Whether a run read text as bytes (its bits per byte are its loss over ln 2, nothing new):
    the default tokenizer, and no token files."""
    tokenizer = folder.raw_config.get("data", {}).get("tokenizer", "byte") if isinstance(
        folder.raw_config.get("data"), dict) else "byte"
    return tokenizer == "byte" and "token_files" not in folder.meta


def sweep_names(root: Path, folders: list[Path]) -> dict[Path, str]:
    """The sweep each run folder belongs to (the `name` in its parent's sweep.json, else the
    parent's path below `root`), for the runs that belong to one."""
    out: dict[Path, str] = {}
    for parent in dict.fromkeys(f.parent for f in folders):
        if (parent / "sweep.json").is_file():
            sweep = read_sweep_file(parent) or {}
            label = sweep.get("name")
            if not isinstance(label, str) or not label:
                label = parent.relative_to(root).as_posix() if parent != root else parent.name
            out.update((f, label) for f in folders if f.parent == parent)
    return out


RECORD_RESULTS = ("outcome", "reason", "step", "steps_planned", "train_loss", "val_loss",
                  "best_val_loss", "val_acc")


@dataclass
class RunsListing:
    """What `normlab runs` lists under `root`: every run folder, read; the settings in which they
    differ (`columns`: config paths, then `meta.*`); the sweep of each run that belongs to one;
    the name each is shown by (its id in ROOT or a sweep, else its path below ROOT)."""

    root: Path
    folders: list[RunFolder]
    flats: list[dict[str, Any]]
    columns: list[str]
    sweeps: dict[Path, str]
    names: list[str]

    @property
    def record_keys(self) -> list[str]:
        """The keys of each of `records`' rows, in order."""
        return ["run_id", "path", "sweep", *self.columns, *RECORD_RESULTS]

    def records(self) -> list[dict[str, Any]]:
        """One row per run, with the values as they are (numbers as numbers, lists as tuples):
        the `--format json|csv` of `normlab runs`. `reason` is the summary's (why a run
        diverged or stalled), or for a damaged folder why it is damaged."""
        out = []
        for f, flat in zip(self.folders, self.flats, strict=True):
            s = f.summary
            row: dict[str, Any] = {"run_id": f.run_id,
                                   "path": f.path.relative_to(self.root).as_posix(),
                                   "sweep": self.sweeps.get(f.path)}
            row.update((c, _value(f, flat, c)) for c in self.columns)
            planned = _number(s.get("steps_planned"))
            row.update({
                "outcome": f.outcome,
                "reason": "; ".join(f.problems) if f.damaged else s.get("reason"),
                "step": _number(s.get("step")),
                "steps_planned": planned if planned is not None else (
                    f.config.train.steps if f.config else None),
                **{k: _number(s.get(k)) for k in RECORD_RESULTS[4:]},
            })
            out.append(row)
        return out


def _number(v: Any) -> int | float | None:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def id_prefix(run_id: str, others: list[str]) -> str:
    """The shortest prefix of `run_id` that starts none of `others` (other runs' ids), and at
    least the readable part and 4 characters of the hash (`pre-L4-d64-f232`): what `normlab
    sample` and the other commands that take a run accept in place of the whole id."""
    start = run_id.rfind("-") + 5
    for n in range(min(start, len(run_id)), len(run_id) + 1):
        if not any(o.startswith(run_id[:n]) for o in others):
            return run_id[:n]
    return run_id


def name_labels(listing: RunsListing) -> dict[int, str]:
    """For each run (by its index) whose `train.name` another listed run shares, the name with
    what tells them apart: a short prefix of its id, or its path when the ids are the same too
    (one run copied into two folders)."""
    by_name: dict[str, list[int]] = {}
    for i, flat in enumerate(listing.flats):
        name = flat.get("train.name")
        if isinstance(name, str) and name:
            by_name.setdefault(name, []).append(i)
    every_id = [f.run_id for f in listing.folders]
    labels = {}
    for name, group in by_name.items():
        if len(group) < 2:
            continue
        ids = [every_id[i] for i in group]
        for i, run_id in zip(group, ids, strict=True):
            if ids.count(run_id) == 1:  # a prefix that no other listed run's id starts with
                tell = id_prefix(run_id, [o for o in every_id if o != run_id])
            else:
                tell = listing.folders[i].path.relative_to(listing.root).as_posix()
            labels[i] = f"{name} ({tell})"
    return labels


def list_runs(root: Path) -> RunsListing:
    """Read every run folder below `root` (see `RunsListing`)."""
    paths = find_run_folders(root)[0]  # a run in ROOT or a sweep is named by its id, else its path
    sweeps = sweep_names(root, paths)
    folders = [read_run_folder(p) for p in paths]
    flats = [flatten(described_config(f)) for f in folders]
    names = [f.run_id if f.path.parent == root or f.path in sweeps else
             f.path.relative_to(root).as_posix() for f in folders]
    return RunsListing(root, folders, flats, run_columns(folders, flats), sweeps, names)


def runs_table(root: Path, compact: bool = False, listing: RunsListing | None = None):
    """The rich table of `normlab runs`: every run folder below `root`, those of a sweep
    (`runs/sweeps/<name>/`) marked by their sweep; `compact`: the settings in one column (module
    doc). Cells are plain text (never read as Rich markup: a path or a value may hold
    brackets). `listing`: the folders already read by `list_runs(root)`."""
    listing = listing or list_runs(root)
    folders, flats, columns = listing.folders, listing.flats, listing.columns
    sweeps, names = listing.sweeps, listing.names
    damaged = sum(f.damaged for f in folders)
    accuracy = any("val_acc" in f.summary for f in folders)  # a synthetic task's runs
    bpb = any("val_bpb" in f.summary and not bytes_as_tokens(f) for f in folders)
    title = f"{len(folders)} runs in {root}" + (f", {damaged} damaged" if damaged else "")
    table = Table(title=Text(title))
    settings = (["settings"] if columns else []) if compact else [
        c.split(".", 1)[-1] for c in columns]
    results = [*RESULT_HEADS, *(["val bpb"] if bpb else []), *(["val acc"] if accuracy else [])]
    heads = ["run", *(["sweep"] if sweeps else []), *settings,
             *(COMPACT_HEADS.get(h, h) if compact else h for h in results)] + (
        ["why damaged"] if damaged else [])
    # a run's name, its outcome, step and losses are never cut or broken; settings fold onto
    # more lines rather than end in "..."
    table.add_column(heads[0], no_wrap=True, min_width=max(map(len, names), default=3))
    shown = {COMPACT_HEADS.get(h, h) for h in results} | set(results)
    for head in heads[1:]:
        whole = head in shown and head != "outcome"
        table.add_column(head, no_wrap=whole or (head == "outcome" and not compact),
                         overflow="ellipsis" if whole else "fold",
                         # in the compact form neither shrinks to nothing in a narrow terminal
                         min_width={"settings": 14, "outcome": 9}.get(head) if compact else None)
    labels = name_labels(listing)  # runs of one name told apart
    for i, (f, flat, name) in enumerate(zip(folders, flats, names, strict=True)):
        s = f.summary
        outcome = f.outcome + (f" ({s['reason']})" if s.get("reason") else "")
        planned = s.get("steps_planned") or (f.config.train.steps if f.config else None)
        # folded at spaces only: a list's items joined by ", " in the compact form
        values = [labels[i] if c == "train.name" and i in labels else
                  _text(_value(f, flat, c), ", " if compact else ",") for c in columns]
        if compact:  # one `field=value` per line
            values = ["\n".join(f"{c.split('.', 1)[-1]}={v}" for c, v in
                                zip(columns, values, strict=True))] if columns else []
        cells = [Text(name), *([Text(sweeps.get(f.path, "-"))] if sweeps else []),
                 *(Text(v) for v in values),
                 Text("damaged", style="bold red") if f.damaged else Text(outcome),
                 Text(f"{_text(s.get('step'))}/{_text(planned)}"), Text(_loss(s, "train_loss")),
                 Text(_loss(s, "val_loss")), Text(_loss(s, "best_val_loss"))]
        if bpb:
            cells.append(Text(_loss(s, "val_bpb")))
        if accuracy:
            cells.append(Text(_loss(s, "val_acc")))
        if damaged:  # the folder's own path is the row's first cell: say the rest
            cells.append(Text("; ".join(p.replace(f"{f.path}/", "") for p in f.problems)))
        table.add_row(*cells)
    return table

