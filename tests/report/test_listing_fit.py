"""`normlab runs` and `normlab sweep summarize` in a terminal of 80, 100 and 200 columns: every
number of every row is shown whole (or its column is named in the note of what was left out),
the settings fold into one column between `key=value` tokens and never inside one, and a
setting shows only for the runs it applies to (`data.khop_*` for k-hop runs, never text runs)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from normlab.cli import app
from normlab.config import load_run_config
from normlab.train import train_run

EXAMPLES = Path(__file__).parents[2] / "examples"
TINY = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=8", "train.steps=2", "train.eval_batches=1",
        "train.eval_every=0", "train.device=cpu", "train.precision=fp32"]
RESULTS = {"step": None, "train loss": "train_loss", "val loss": "val_loss",
           "best val": "best_val_loss", "val acc": "val_acc"}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """Two text examples, two k-hop runs that differ in khop_max_hops, one run of a sweep."""
    root = tmp_path_factory.mktemp("mixed")
    second = ["data.khop_max_hops=2", "model.vocab_size=6", "train.name=k-hop 2"]
    for name, extra in (("pre", []), ("post", []), ("khop", []), ("khop", second)):
        train_run(load_run_config(EXAMPLES / f"{name}.yaml", TINY + extra), root, progress=False)
    sweep = root / "sweeps" / "grid"
    sweep.mkdir(parents=True)
    (sweep / "sweep.json").write_text(json.dumps({"name": "tiny_grid", "runs": []}))
    train_run(load_run_config(None, TINY + ["train.lr=3e-3"]), sweep, progress=False)
    return root


def shown(root: Path, width: int, monkeypatch, *args: str) -> str:
    """What `normlab runs ROOT` prints in a terminal `width` columns wide."""
    import normlab.cli.runs

    term = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None,
                   markup=False)
    monkeypatch.setattr(normlab.cli.runs, "console", term)
    r = CliRunner().invoke(app, ["runs", str(root), *args])
    assert r.exit_code == 0, r.output
    return term.file.getvalue()


def as_data(root: Path) -> list[dict]:
    r = CliRunner().invoke(app, ["runs", str(root), "--format", "json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def parse(out: str) -> tuple[list[str], dict[str, list[list[str]]], str]:
    """The headings (lines joined), each run's rows of cells (one list per printed line), and the
    text after the table."""
    lines = out.splitlines()
    top = next(i for i, ln in enumerate(lines) if ln.startswith("┏"))
    mid = next(i for i, ln in enumerate(lines) if ln.startswith("┡"))
    end = next(i for i, ln in enumerate(lines) if ln.startswith("└"))
    parts = [[c.strip() for c in ln.split("┃")[1:-1]] for ln in lines[top + 1:mid]]
    heads = [" ".join(p[i] for p in parts if p[i]) for i in range(len(parts[0]))]
    rows: dict[str, list[list[str]]] = {}
    name = ""
    for ln in lines[mid + 1:end]:
        cells = [c.strip() for c in ln.split("│")[1:-1]]
        name = cells[0] or name
        rows.setdefault(name, []).append(cells)
    return heads, rows, "\n".join(lines[end + 1:])


def text(v) -> str:
    if v is None or v == []:
        return "-"
    if isinstance(v, list):
        return ",".join(map(str, v))
    return f"{v:g}" if isinstance(v, float) else str(v)


def settings_keys(row: dict) -> list[str]:
    keys = list(row)
    return keys[keys.index("sweep") + 1:keys.index("outcome")]


@pytest.mark.parametrize("width", [80, 100, 200])
def test_runs_fit_the_terminal_with_every_number_and_token_whole(mixed, width, monkeypatch):
    out = shown(mixed, width, monkeypatch)
    assert max(map(len, out.splitlines())) <= width
    heads, rows, after = parse(out)
    data = as_data(mixed)
    assert sorted(rows) == sorted(r["run_id"] for r in data)
    left_out = re.search(rf"left out at {width} columns: ([^(]*) \(", " ".join(after.split()))
    named = left_out.group(1).split(", ") if left_out else []
    for head in [*RESULTS, "sweep"]:  # each result is shown, or named as left out
        assert (head in heads) != (head in named), (head, heads, named)
    for run in data:
        lines = rows[run["run_id"]]
        whole = [" ".join(c for c in col if c) for col in zip(*lines, strict=True)]
        for head, key in RESULTS.items():
            if head not in heads:
                continue
            want = (f"{run['step']}/{run['steps_planned']}" if key is None else
                    "-" if run[key] is None else f"{run[key]:.4f}")
            assert whole[heads.index(head)] == want, (run["run_id"], head)
        setting_lines = [cells[heads.index("settings")] for cells in lines]
        for line in filter(None, setting_lines):  # every line starts a token
            assert re.match(r"[a-z_]+=", line), line
        for key in settings_keys(run):
            token = f"{key.split('.', 1)[-1]}={text(run[key])}"
            if run[key] is None and key.startswith("data.khop_"):
                assert not any(ln.startswith(token[:-1]) or f"  {token[:-1]}" in ln
                               for ln in setting_lines), token
                continue
            assert any(re.search(rf"(^|  ){re.escape(token)}(  |$)", ln)
                       for ln in setting_lines), (token, setting_lines)


def test_khop_settings_show_for_khop_runs_only(mixed, monkeypatch):
    """data.khop_max_hops differs between the two k-hop runs: a column, with a value for each of
    them and null (and no token) for every text run, whose config has no k-hop task."""
    data = as_data(mixed)
    khop = [r for r in data if r["data.task"] == "khop"]
    text_runs = [r for r in data if r["data.task"] is None]
    assert sorted(r["data.khop_max_hops"] for r in khop) == [2, 3]
    assert len(text_runs) == 3 and all(r["data.khop_max_hops"] is None for r in text_runs)
    assert not any(k.startswith("data.khop_") and k != "data.khop_max_hops" for k in data[0])
    _, rows, _ = parse(shown(mixed, 100, monkeypatch))
    for r in data:
        settings = " ".join(" ".join(cells) for cells in rows[r["run_id"]])
        assert ("khop_max_hops=" in settings) == (r in khop), settings


def test_a_narrow_terminal_names_what_it_left_out(mixed, monkeypatch):
    out = shown(mixed, 80, monkeypatch)
    note = " ".join(out.split("└")[-1].split())
    assert "left out at 80 columns:" in note and "--format json or csv" in note
    wide = shown(mixed, 400, monkeypatch)
    assert "left out" not in wide and "settings" not in wide  # a column per setting


def test_sweep_summarize_fits_80_and_100_columns_without_cutting_a_run_id(mixed, monkeypatch):
    """A folder of runs without sweep.json: its axes are the settings in which they differ among
    the runs they apply to; no run id or loss is cut, khop_max_hops shows for k-hop runs only."""
    import normlab.cli.sweep

    r = CliRunner().invoke(app, ["sweep", "summarize", str(mixed), "--format", "json",
                                 "--out", "-"])
    data = json.loads(r.output)
    assert {r["data.khop_max_hops"] for r in data if r["data.task"] is None} == {None}
    for width in (80, 100):
        term = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None,
                       markup=False)
        monkeypatch.setattr(normlab.cli.sweep, "console", term)
        r = CliRunner().invoke(app, ["sweep", "summarize", str(mixed)])
        assert r.exit_code == 0, r.output
        out = term.file.getvalue()
        assert max(map(len, out.splitlines())) <= width
        heads, rows, after = parse(out)
        assert sorted(rows) == sorted(r["run_id"] for r in data)
        for run in data:
            whole = [" ".join(c for c in col if c) for col in zip(*rows[run["run_id"]],
                                                                    strict=True)]
            assert whole[heads.index("val loss")] == f"{run['val_loss']:.4f}"
            assert ("khop_max_hops=" in whole[heads.index("settings")]) == (
                run["data.task"] == "khop")
        for head in ("train loss", "best val", "tok/s", "step"):
            assert head in heads or head in " ".join(after.split()), head
