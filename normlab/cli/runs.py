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
A setting is shown when the listed runs it applies to differ in it
(`normlab.train.listing.applies`: `data.khop_*` only for `data.task: khop` runs); a run it does
not apply to shows none (`-`, null in `--format json`). In a terminal narrower than the table the
settings fold into one column of `field=value` tokens, wrapped between tokens, never inside one;
numbers and run ids are never cut: where even that does not fit, the columns of least use are left
out (best val, train loss, step, val bpb, sweep, why damaged, val acc, in that order) and a note
below the table names them (`normlab.train.rows.terminal_table`). `--format json|csv` prints the
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
from normlab.train.listing import (
    applied,
    applies,
    described_config,
    differing_paths,
    flatten,
    label_paths,
    varying_paths,
)
from normlab.train.rows import FORMATS, Column, left_out_note, render, terminal_table
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
    if console.is_terminal and not wide:
        if _natural_width(table) > console.width:
            table, dropped = terminal_table(_title(listing), runs_columns(listing, compact=True),
                                            console.width)
            console.print(table)
            note = left_out_note(dropped, console.width)
            if note:
                console.print(Text(note, style="dim"))
            return
        console.print(table)
        return
    # in a file, a pipe or with --wide no cell is folded: as wide as the table needs
    width = console.width
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
                 "val acc": "val\nacc", "val bpb": "val\nbpb", "why damaged": "why\ndamaged"}


def run_columns(folders: list[RunFolder], flats: list[dict[str, Any]]) -> list[str]:
    """The fields in which the readable runs differ (config paths, `flats` being each folder's
    `described_config` flattened), then `meta.*` fields."""
    readable = [(f, flat) for f, flat in zip(folders, flats, strict=True) if not f.damaged]
    configs = [flat for _, flat in readable]
    columns = list(dict.fromkeys([*label_paths(configs), *differing_paths(configs)]))
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
        return sep.join(_text(x) for x in v) if v else "-"
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
    # a setting that does not apply to a run (data.khop_* of a text run) is None for it
    flats = [applied(flatten(described_config(f))) for f in folders]
    names = [f.run_id if f.path.parent == root or f.path in sweeps else
             f.path.relative_to(root).as_posix() for f in folders]
    return RunsListing(root, folders, flats, run_columns(folders, flats), sweeps, names)


def _title(listing: RunsListing) -> Text:
    damaged = sum(f.damaged for f in listing.folders)
    return Text(f"{len(listing.folders)} runs in {listing.root}"
                + (f", {damaged} damaged" if damaged else ""))


# the columns a narrow terminal leaves out, first to last; run, settings, outcome and val loss
# are always shown
DROP_ORDER = ("best val", "train loss", "step", "val bpb", "sweep", "why damaged", "val acc")


def runs_columns(listing: RunsListing, compact: bool = False) -> list[Column]:
    """The columns of `normlab runs`' table (`normlab.train.rows.Column`): a column per setting,
    or in the `compact` form the settings as one column of `field=value` tokens (those that apply
    to the run) and the result headings on two lines. Cells are plain text (never read as Rich
    markup: a path or a value may hold brackets)."""
    folders, flats, columns = listing.folders, listing.flats, listing.columns
    accuracy = any("val_acc" in f.summary for f in folders)  # a synthetic task's runs
    bpb = any("val_bpb" in f.summary and not bytes_as_tokens(f) for f in folders)
    labels = name_labels(listing)  # runs of one name told apart

    def shown(i: int, c: str) -> str:
        if c == "train.name" and i in labels:
            return labels[i]
        return _text(_value(folders[i], flats[i], c))

    def col(head: str, cells: list[Any], fold: str = "whole") -> Column:
        two_lines = COMPACT_HEADS.get(head, head) if compact else head
        return Column(two_lines, cells, fold, name=head,  # type: ignore[arg-type]
                      drop=DROP_ORDER.index(head) if head in DROP_ORDER else None)

    rows = range(len(folders))
    out = [col("run", listing.names)]
    if listing.sweeps:
        out.append(col("sweep", [listing.sweeps.get(f.path, "-") for f in folders]))
    if compact and columns:
        out.append(col("settings", [
            [f"{c.split('.', 1)[-1]}={shown(i, c)}" for c in columns
             if c.startswith("meta.") or applies(c, flats[i])] for i in rows], "tokens"))
    elif not compact:
        out += [col(c.split(".", 1)[-1], [shown(i, c) for i in rows], "words") for c in columns]
    outcomes = [Text("damaged", style="bold red") if f.damaged else Text(
        f.outcome + (f" ({f.summary['reason']})" if f.summary.get("reason") else ""))
        for f in folders]
    steps = []
    for f in folders:
        planned = f.summary.get("steps_planned") or (f.config.train.steps if f.config else None)
        steps.append(f"{_text(f.summary.get('step'))}/{_text(planned)}")
    out += [col("outcome", outcomes, "words"), col("step", steps)]
    for head, key in (("train loss", "train_loss"), ("val loss", "val_loss"),
                      ("best val", "best_val_loss"), *([("val bpb", "val_bpb")] if bpb else []),
                      *([("val acc", "val_acc")] if accuracy else [])):
        out.append(col(head, [_loss(f.summary, key) for f in folders]))
    if any(f.damaged for f in folders):  # the folder's own path is the row's first cell
        out.append(col("why damaged", ["; ".join(p.replace(f"{f.path}/", "") for p in f.problems)
                                       for f in folders], "words"))
    return out


def runs_table(root: Path, compact: bool = False, listing: RunsListing | None = None,
               width: int | None = None):
    """The rich table of `normlab runs`: every run folder below `root`, those of a sweep
    (`runs/sweeps/<name>/`) marked by their sweep; `compact`: the settings in one column (module
    doc). `width`: the terminal's, which the table fits by leaving columns out (see
    `runs_columns`); None: as wide as it needs. `listing`: the folders already read by
    `list_runs(root)`."""
    listing = listing or list_runs(root)
    return terminal_table(_title(listing), runs_columns(listing, compact), width)[0]
