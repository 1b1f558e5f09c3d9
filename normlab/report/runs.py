"""Run folders as the report shows them: every run below a folder (a folder with `config.yaml`),
its outcome and losses, the settings all runs share, the ones in which they differ (among the
runs each applies to, the rule of `normlab runs`: `normlab.train.listing`), and links to
each run's folder and TensorBoard log when the page sits above them (a page written elsewhere
ships without its runs: it names them and links nowhere).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from normlab.report.figures import BYTES, KHOP, Curve, curve_from_metrics
from normlab.report.numbers import (
    Cell,
    Column,
    Row,
    Table,
    fmt,
    fmt_lr,
    heading,
    is_lr_key,
    is_number,
    mark_numeric,
    nonfinite_text,
)

# Config paths shown as columns whether or not they vary, and short names for group labels.
ALWAYS = ("model.placement", "train.seed")
# Settings that do not change what a run is (how often it logs, evaluates or saves, where and
# how fast it computes): never listed as a difference between runs, never part of a group.
BOOKKEEPING = ("train.checkpoint_every", "train.log_every", "train.eval_every",
               "train.block_stats_every", "train.device", "train.threads", "train.compile",
               "train.activation_checkpointing", "train.name", "train.tags")
SHORT = {"model.placement": "", "train.lr": "lr", "train.warmup": "warmup",
         "model.n_blocks": "L", "model.d_model": "d", "model.final_norm": "final norm",
         "train.seed": "seed"}
_PATH_LABELS = {"model.placement": "placement", "model.n_blocks": "blocks",
                "model.d_model": "width", "model.n_heads": "heads", "train.lr": "learning rate",
                "train.warmup": "warmup (steps)", "train.seed": "seed", "train.steps": "steps",
                "train.batch_size": "batch size", "data.seq_len": "sequence length",
                "model.final_norm": "final norm", "model.norm": "norm",
                "train.precision": "precision", "train.schedule": "lr schedule",
                "model.init": "init", "model.d_ff": "MLP width",
                "train.name": "name", "train.tags": "tags"}


def path_label(path: str) -> str:
    """'train.lr' -> 'learning rate'; other paths keep their section: 'model.mlp'."""
    return _PATH_LABELS.get(path, path)


@dataclass
class RunRow:
    folder: Path
    name: str                       # path relative to the report folder
    config: dict[str, Any] = field(default_factory=dict)
    flat: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    outcome: str = "pending"
    problem: str = ""               # why the config could not be read, if it could not
    curve: Curve | None = None

    def get(self, dotted: str) -> Any:
        return self.flat.get(dotted)


def find_folders(root: Path) -> tuple[list[Path], list[Path]]:
    """(run folders, sweep roots) below `root`, sorted; run folders are not searched inside."""
    from normlab.train.rundir import find_run_folders

    return find_run_folders(root)


def one_line(text: str) -> str:
    """Whitespace (a traceback's line breaks) folded to single spaces; nothing is cut."""
    return " ".join(text.split())


def tokens_of(flat: dict[str, Any], meta: dict[str, Any]) -> str:
    """What a run's loss is counted over (`normlab.report.figures.Curve.tokens`): a k-hop
    task's answered positions, bytes, or the tokens of its tokenizer on its source (a BPE is
    trained on its source's text, so the same spec on two corpora is two tokenizers)."""
    if flat.get("data.task") == "khop":
        return KHOP
    tokenizer = flat.get("data.tokenizer") or BYTES
    if "token_files" in meta:  # a folder of token files: its own tokenizer, or bytes
        return BYTES if meta.get("tokenizer") == BYTES else Path(
            str(meta["token_files"])).name
    if tokenizer == BYTES:
        return BYTES
    source = flat.get("data.source")
    where = Path(str(source)).name if isinstance(source, str) else None
    return f"{tokenizer} on {where}" if where else str(tokenizer)


def read_run(run_dir: Path, base: Path) -> RunRow:
    """One row of the runs table, read by the run-folder reader: a damaged folder is a row
    `damaged` with why, and never stops the report."""
    from normlab.train.listing import described_config, flatten
    from normlab.train.logging import read_metrics
    from normlab.train.rundir import read_run_folder

    name = str(run_dir.relative_to(base)) if run_dir != base else run_dir.name
    folder = read_run_folder(run_dir)
    row = RunRow(folder=run_dir, name=name, summary=folder.summary or {},
                 outcome=folder.outcome, problem="; ".join(one_line(p) for p in folder.problems))
    # resolved by the plan when this normlab can validate it; the raw YAML otherwise
    row.config = dict(described_config(folder) or {})
    row.config.pop("meta", None)
    row.flat = flatten(row.config)
    placement = row.get("model.placement")
    row.curve = curve_from_metrics(name, "?", read_metrics(run_dir / "metrics.jsonl"),
                                   diverged=row.outcome == "diverged",
                                   tokens=tokens_of(row.flat, folder.meta),
                                   placement=str(placement) if placement else "")
    return row


def read_runs(root: Path, folders: list[Path]) -> list[RunRow]:
    """Every run, its curve labelled by its line of the loss figure (`line_labels`)."""
    rows = [read_run(f, root) for f in folders]
    for r, text in zip(rows, line_labels(rows), strict=True):
        if r.curve is not None:
            r.curve.group = text
    return rows


def differing_paths(rows: list[RunRow]) -> list[str]:
    """The settings in which the runs differ among the runs they apply to, as `normlab runs`
    lists them (`normlab.train.listing.differing_paths`), bookkeeping left out (BOOKKEEPING)."""
    from normlab.train.listing import differing_paths as listed

    return [p for p in listed([r.flat for r in rows]) if p not in BOOKKEEPING]


def applies_to(row: RunRow, path: str) -> bool:
    """Whether the setting `path` is used by the run (`normlab.train.listing.applies`)."""
    from normlab.train.listing import applies

    return applies(path, row.flat)


def _setting_text(path: str, value: Any) -> str:
    short = SHORT.get(path, path.rsplit(".", 1)[-1])
    text = fmt_lr(value) if is_lr_key(path.rsplit(".", 1)[-1]) and is_number(value) else fmt(
        value)
    return f"{short} {text}" if short else text


def telling_paths(rows: list[RunRow]) -> list[str]:
    """The settings that tell the runs' lines apart: of the settings in which they differ
    (`differing_paths`, the seed left out: a line is the mean over its seeds), the placement
    first, then the others in SHORT's order and by name, each kept only when it splits runs
    the settings kept before it do not. A setting that follows from those (the init each
    placement resolves to) would only lengthen the label: the runs table lists it."""
    varying = [p for p in differing_paths(rows) if p != "train.seed"]
    order = [p for p in SHORT if p in varying] + sorted(p for p in varying if p not in SHORT)
    kept: list[str] = []

    def groups(paths: list[str]) -> int:
        return len({tuple(repr(r.get(p)) if applies_to(r, p) else "-" for p in paths)
                    for r in rows})

    for p in order:
        if groups([*kept, p]) > groups(kept):
            kept.append(p)
    return kept


def line_labels(rows: list[RunRow]) -> list[str]:
    """Each run's legend entry in the loss figure: its `train.name` where it has one, else the
    values of the settings that tell it apart from the other runs without a name
    (`telling_paths`: "post, lr 0.004"), those that apply to it only. Runs of one name that
    differ in more than their seed add what tells them apart to the name: "baseline (lr
    0.004)". Runs with one label are one line (their seeds)."""

    def name(r: RunRow) -> str:
        v = r.get("train.name")
        return v if isinstance(v, str) else ""

    def settings(r: RunRow, paths: list[str]) -> str:
        return ", ".join(_setting_text(p, r.get(p)) for p in paths
                         if applies_to(r, p) and r.get(p) is not None)

    by_name: dict[str, list[RunRow]] = {}
    for r in rows:
        by_name.setdefault(name(r), []).append(r)
    telling = {n: telling_paths(group) for n, group in by_name.items()}
    out = []
    for r in rows:
        n = name(r)
        told = settings(r, telling[n])
        if not n:
            out.append(told or str(r.get("model.placement") or "runs"))
        else:
            out.append(f"{n} ({told})" if told else n)
    return out


def href(target: Path, page_dir: Path) -> str:
    """A link from the page to a local folder below the page's own, relative so that the
    folder can move with the page; "" for a folder elsewhere, which does not travel with the
    page (a recorded report copied without its runs): no link, rather than one that leads
    nowhere or into the machine that wrote it."""
    target, page_dir = Path(os.path.abspath(target)), Path(os.path.abspath(page_dir))
    if not target.is_relative_to(page_dir):
        return ""
    return quote(target.relative_to(page_dir).as_posix()) + "/"


# ----------------------------------------------------------------------------- tables


def _config_cell(v: Any, path: str = "") -> Cell:
    lr = is_lr_key(path.rsplit(".", 1)[-1])
    if isinstance(v, tuple):
        return Cell("text", text=", ".join(fmt_lr(x) if lr else fmt(x) for x in v))
    if lr and is_number(v):
        return Cell("num", text=fmt_lr(v))
    if is_number(v):
        return Cell("num", text=f"{v:g}" if isinstance(v, float) else fmt(v))
    return Cell("empty", text="-") if v is None else Cell("text", text=fmt(v))


def _loss_cell(v: Any) -> Cell:
    if is_number(v):
        return Cell("num", text=f"{v:.4f}" if math.isfinite(v) else fmt(v))
    if nonfinite_text(v):
        return Cell("num", text=fmt(v))
    return Cell("empty", text="-")


@dataclass
class RunLine:
    """One row of the runs table: the link cells and the rest."""
    name: str
    folder_href: str
    tb_href: str
    problem: str
    outcome: str
    outcome_detail: str
    cells: list[Cell]


# Shared settings shown first; the others are behind a toggle, one table per config section.
KEY_SETTINGS = ("model.placement", "model.norm", "model.n_blocks", "model.d_model",
                "model.n_heads", "data.seq_len", "train.steps", "train.batch_size", "train.lr",
                "train.warmup", "train.schedule", "train.precision", "train.seed")


@dataclass
class RunsView:
    config_columns: list[Column]
    result_columns: list[Column]
    lines: list[RunLine]
    shared: Table                         # the key settings every run shares
    sections: list[tuple[str, Table]]     # all shared settings, by config section
    n_shared: int
    counts: dict[str, int]

    @property
    def columns(self) -> list[Column]:
        """The columns after the run's own: its settings, then its results."""
        return self.config_columns + self.result_columns


RESULTS = ("train_loss", "val_loss", "best_val_loss", "tokens_per_s")


def reads_tokens(summary: dict[str, Any]) -> bool:
    """Whether a run's bits per byte say something its loss does not: a run on bytes has
    `val_bpb` = `val_loss` / ln 2; a run on a tokenizer's or token files' ids does not."""
    bpb, loss = summary.get("val_bpb"), summary.get("val_loss")
    return is_number(bpb) and is_number(loss) and abs(bpb - loss / math.log(2)) > 1e-6 * max(
        1.0, abs(bpb))


def result_keys(rows: list[RunRow]) -> tuple[str, ...]:
    """The result columns: `RESULTS`, with bits per byte after the losses when a listed run
    reads tokens other than bytes (the number that compares runs of different tokenizers)."""
    if any(reads_tokens(r.summary) for r in rows):
        return (*RESULTS[:3], "val_bpb", *RESULTS[3:])
    return RESULTS


def runs_view(rows: list[RunRow], page_dir: Path) -> RunsView:
    from normlab.train.listing import label_paths

    flats = [r.flat for r in rows]
    results = result_keys(rows)
    columns = list(dict.fromkeys([*ALWAYS, *label_paths(flats), *differing_paths(rows)]))
    # shared: one value among the runs a setting applies to (and some run it applies to)
    shared_paths = [p for p in sorted({k for f in flats for k in f} - set(columns))
                    if len({repr(r.get(p)) for r in rows if applies_to(r, p)}) == 1]

    def shared_value(p: str) -> Any:
        return next(r.get(p) for r in rows if applies_to(r, p))

    def settings(paths: list[str], names: dict[str, str]) -> Table:
        return mark_numeric(Table([Column("value")], [
            Row(names.get(p, p), [_config_cell(shared_value(p), p)]) for p in paths],
            "settings"))

    def value(r: RunRow, p: str) -> Any:
        return r.get(p) if applies_to(r, p) else None  # shown as "-", as `normlab runs` does

    shared = settings([p for p in KEY_SETTINGS if p in shared_paths], _PATH_LABELS)
    sections = []
    for section in dict.fromkeys(p.split(".", 1)[0] for p in shared_paths):
        paths = [p for p in shared_paths if p.split(".", 1)[0] == section]
        sections.append((section, settings(paths, {p: p.split(".", 1)[-1] for p in paths})))
    lines = []
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
        s = r.summary
        detail = []
        if s.get("reason"):
            detail.append(str(s["reason"]))
        if s.get("step") is not None:
            planned = s.get("steps_planned") or r.get("train.steps")
            detail.append(f"step {fmt(s['step'])}" + (f" of {fmt(planned)}" if planned else ""))
        if s.get("message") and (r.outcome == "failed" or s.get("outcome") == "failed"):
            detail.append(one_line(str(s["message"])))
        cells = [_config_cell(value(r, p), p) for p in columns]
        cells += [_loss_cell(s.get(k)) if k != "tokens_per_s" else
                  (Cell("num", text=f"{s[k]:,.0f}") if is_number(s.get(k)) else
                   Cell("empty", text="-")) for k in results]
        tb = r.folder / "tb"
        lines.append(RunLine(r.name, href(r.folder, page_dir),
                             href(tb, page_dir) if tb.is_dir() else "", r.problem, r.outcome,
                             ", ".join(detail), cells))
    config_columns = [Column(path_label(p), numeric=all(
        is_number(value(r, p)) or value(r, p) is None for r in rows)) for p in columns]
    # with runs on a tokenizer's ids listed, a loss is per token, not per byte
    per_token = "val_bpb" in results
    result_columns = [Column(heading(k).replace("nats/byte", "nats/token") if per_token
                             else heading(k), numeric=True) for k in results]
    return RunsView(config_columns, result_columns, lines, shared, sections,
                    len(shared_paths), counts)
