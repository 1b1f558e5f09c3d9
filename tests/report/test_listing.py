"""What a run is, as every listing shows it: `normlab runs`, the report's runs table and
TensorBoard's hparams give the settings the placement resolved (Pre's GPT-2 scaled init, Post's
Xavier init and no final norm, DeepNorm's alpha and beta), never `null` or `auto`; a sweep's runs
are listed too, marked by their sweep; a damaged folder reads `damaged`, not Rich markup."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from normlab.cli import app
from normlab.config import load_run_config, make_model_config
from normlab.nn.plan import resolved_settings
from normlab.train import train_run

TINY = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=16",
        "data.seq_len=16", "train.batch_size=4", "train.eval_batches=1", "train.steps=2",
        "train.eval_every=0", "train.device=cpu"]


def tiny(*extra: str):
    return load_run_config(None, TINY + list(extra))


@pytest.fixture(scope="module")
def pre_post(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    for placement in ("pre", "post"):
        train_run(tiny(f"model.placement={placement}"), root, progress=False)
    return root


def table(output: str) -> list[list[str]]:
    """A rich table's body rows, their cells with wrapped lines joined."""
    out: list[list[str]] = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if not cells:
            continue
        if cells[0] or not out:
            out.append(cells)
        else:
            out[-1] = [f"{a} {b}".strip() for a, b in zip(out[-1], cells, strict=True)]
    return out


def rows(output: str) -> dict[str, list[str]]:
    return {r[0]: r for r in table(output)}


def header(output: str) -> list[str]:
    line = next(ln for ln in output.splitlines() if "outcome" in ln)
    return [c.strip() for c in line.split("┃")[1:-1]]


def runs(root: Path) -> str:
    r = CliRunner().invoke(app, ["runs", str(root)], terminal_width=400)
    assert r.exit_code == 0, r.output
    return r.output


def test_resolved_settings_fill_in_what_the_placement_decides():
    pre, post = resolved_settings(make_model_config()), resolved_settings(
        make_model_config(placement="post"))
    assert (pre["init"], pre["final_norm"], post["init"], post["final_norm"]) == (
        "gpt2_scaled", "on", "xavier", "off")
    deep = resolved_settings(make_model_config(placement="deepnorm", n_blocks=6))
    assert deep["deepnorm_alpha"] == pytest.approx(12 ** 0.25)
    assert deep["deepnorm_beta"] == pytest.approx(48 ** -0.25)
    assert resolved_settings(make_model_config(placement="mix", n_blocks=8))["mix_switch"] == 2
    assert resolved_settings(make_model_config(d_model=64))["d_ff"] == 256


def test_runs_shows_the_resolved_init_and_final_norm(pre_post):
    out = runs(pre_post)
    cols = header(out)
    assert "init" in cols and "final_norm" in cols
    table = rows(out)
    by_placement = {r[cols.index("placement")]: r for k, r in table.items() if k != "run"}
    assert by_placement["pre"][cols.index("init")] == "gpt2_scaled"
    assert by_placement["post"][cols.index("init")] == "xavier"
    assert by_placement["pre"][cols.index("final_norm")] == "on"
    assert by_placement["post"][cols.index("final_norm")] == "off"


def test_report_runs_table_shows_the_resolved_settings(pre_post, tmp_path):
    from normlab.report.runs import find_folders, read_runs, runs_view

    folders, _ = find_folders(pre_post)
    rows_ = read_runs(pre_post, folders)
    assert sorted(r.get("model.init") for r in rows_) == ["gpt2_scaled", "xavier"]
    assert sorted(r.get("model.final_norm") for r in rows_) == ["off", "on"]
    view = runs_view(rows_, tmp_path)
    shown = [c.text for line in view.lines for c in line.cells]
    assert "gpt2_scaled" in shown and "xavier" in shown
    shared = {row.head: row.cells[0].text for _, t in view.sections for row in t.rows}
    assert shared["d_ff"] == "128"  # 4 * d_model, not null


def test_hparams_and_summary_hold_the_resolved_settings(pre_post):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    run = next(p for p in pre_post.iterdir() if p.name.startswith("post-"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resolved"]["init"] == "xavier" and summary["resolved"]["final_norm"] == "off"
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    raw = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = HParamsPluginData.FromString(raw).session_start_info.hparams
    assert start["model.init"].string_value == "xavier"
    assert start["model.final_norm"].string_value == "off"


def test_runs_lists_a_sweeps_runs_marked_by_their_sweep(pre_post, tmp_path):
    for p in pre_post.iterdir():
        shutil.copytree(p, tmp_path / p.name)
    sweep = tmp_path / "sweeps" / "warm"
    sweep.mkdir(parents=True)
    (sweep / "sweep.json").write_text(json.dumps({"name": "warmup_grid", "runs": []}))
    moved = next(p for p in pre_post.iterdir() if p.name.startswith("pre-"))
    shutil.copytree(moved, sweep / moved.name)
    out = runs(tmp_path)
    cols = header(out)
    assert cols[:2] == ["run", "sweep"]
    sweep_of = [(r[0], r[1]) for r in table(out)]
    assert sorted(sweep_of) == sorted([(p.name, "-") for p in pre_post.iterdir()]
                                      + [(moved.name, "warmup_grid")])
    assert "3 runs" in out


def test_a_damaged_folder_reads_damaged_not_markup(pre_post, tmp_path):
    run = next(pre_post.iterdir())
    shutil.copytree(run, tmp_path / run.name)
    (tmp_path / run.name / "summary.json").write_text("{cut")
    out = runs(tmp_path)
    assert "[bold red]" not in out and "[/]" not in out
    assert rows(out)[run.name][header(out).index("outcome")] == "damaged"


def test_a_finished_run_whose_weights_are_cut_short_is_listed_damaged(pre_post, tmp_path):
    from normlab.train.rundir import read_run_folder, safetensors_problem

    run = next(pre_post.iterdir())
    assert read_run_folder(run).outcome in ("completed", "stalled")
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    weights = copy / "checkpoint" / "model.safetensors"
    whole = weights.read_bytes()
    assert safetensors_problem(weights) is None
    weights.write_bytes(whole[:-1])  # one byte short: the header still reads
    folder = read_run_folder(copy)
    assert folder.outcome == "damaged"
    assert folder.problems == [f"{weights}: truncated ({len(whole) - 1:,} bytes of "
                               f"{len(whole):,}); the run's weights cannot be loaded (train it "
                               "again, or restore the file)"]
    out = runs(tmp_path)
    assert rows(out)[run.name][header(out).index("outcome")] == "damaged"
    weights.write_bytes(whole[:5])
    assert safetensors_problem(weights) == "truncated (no header)"
    weights.write_bytes((40).to_bytes(8, "little") + b"not json" * 5)
    assert safetensors_problem(weights) == "damaged (its header is not a safetensors header)"


def test_name_and_tags_label_a_run_without_changing_its_id(tmp_path):
    named = tiny("train.name=first try", "train.tags=[baseline, lr-sweep]")
    assert named.run_id() == tiny().run_id()
    s = train_run(named, tmp_path, progress=False)
    assert (s["name"], s["tags"]) == ("first try", ["baseline", "lr-sweep"])
    out = runs(tmp_path)
    cols = header(out)
    row = rows(out)[s["run_id"]]
    assert row[cols.index("name")] == "first try"
    assert row[cols.index("tags")] == "baseline,lr-sweep"
    from normlab.report.runs import find_folders, read_runs, runs_view

    view = runs_view(read_runs(tmp_path, find_folders(tmp_path)[0]), tmp_path)
    titles = [c.title for c in view.config_columns]
    cells = view.lines[0].cells
    assert cells[titles.index("name")].text == "first try"
    assert cells[titles.index("tags")].text == "baseline, lr-sweep"


@pytest.mark.parametrize("setting,why", [
    ("train.tags=[a b]", "tag 'a b'"), ("train.tags=[x, x]", "given twice"),
    ("train.name=" + "n" * 81, "at most 80 characters"), ('train.name="two\\nlines"', "one line")])
def test_bad_names_and_tags_are_refused_by_name(setting, why):
    from normlab.config import ConfigError

    with pytest.raises(ConfigError, match=why):
        tiny(setting)


def test_train_names_the_run_it_finished(tmp_path):
    sets = [f"--set={s}" for s in [*TINY, "train.name=my run"]]
    r = CliRunner().invoke(app, ["train", *sets, f"--root={tmp_path}", "--quiet"])
    assert r.exit_code == 0, r.output
    assert f"{tiny().run_id()} (my run): " in r.output


def test_runs_fit_a_100_column_terminal_without_splitting_a_word(tmp_path):
    """The example runs in a 100-column terminal: too wide with a column per setting, so the
    settings fold into one column of field=value tokens, wrapped between tokens only; every run
    shows whole with its outcome and val loss, and the columns left out (to keep the 36-cell
    `tags=...` of the modern block whole) are named in a note. --wide keeps a column each."""
    from rich.console import Console

    from normlab.cli.runs import list_runs, runs_columns, runs_table
    from normlab.train.rows import left_out_note, terminal_table

    examples = Path(__file__).parents[2] / "examples"
    summaries = [train_run(load_run_config(examples / f"{name}.yaml",
                                           ["train.steps=2", "train.eval_batches=1",
                                            "train.device=cpu"]),
                           tmp_path, progress=False) for name in ("pre", "post", "modern")]
    console = Console(width=100, record=True, force_terminal=False)
    wide = runs_table(tmp_path)
    natural = console.measure(wide, options=console.options.update_width(10_000)).maximum
    assert natural > 100  # a column per setting does not fit
    table, dropped = terminal_table("runs", runs_columns(list_runs(tmp_path), compact=True), 100)
    console.print(table)
    out = console.export_text()
    assert max(len(line) for line in out.splitlines()) <= 100
    heads = [c.strip() for c in out.splitlines()[3].split("┃")[1:-1]]
    assert heads == ["run", "settings", "outcome", "step", "loss"]  # (the second lines)
    assert [c.label for c in dropped] == ["train loss", "best val"]
    assert "train loss, best val" in left_out_note(dropped, 100)
    for s in summaries:
        assert s["run_id"] in out and f"{s['val_loss']:.4f}" in out
    for token in ("name=post baseline", "name=modern block", "init=gpt2_scaled",
                  "init=xavier", "placement=post", "final_norm=off", "positions=rope",
                  "tags=example,pre,rmsnorm,swiglu,rope"):
        assert token in out, token  # on one line, whole


def test_runs_in_a_narrow_terminal_folds_its_settings_unless_wide(pre_post, monkeypatch):
    import io

    from rich.console import Console

    import normlab.cli.runs

    narrow = Console(file=io.StringIO(), width=100, force_terminal=True, markup=False)
    monkeypatch.setattr(normlab.cli.runs, "console", narrow)
    assert CliRunner().invoke(app, ["runs", str(pre_post)]).exit_code == 0
    assert "settings" in narrow.file.getvalue() and "placement=post" in narrow.file.getvalue()
    narrow.file = io.StringIO()
    assert CliRunner().invoke(app, ["runs", str(pre_post), "--wide"]).exit_code == 0
    assert "settings" not in narrow.file.getvalue()


def test_runs_as_json_and_csv_hold_the_same_rows_as_data(pre_post):
    """--format json: a list of row objects with stable keys (config paths, result names) and
    numbers as numbers; --format csv: the same keys as a header row, the same values."""
    import csv
    import io

    r = CliRunner().invoke(app, ["runs", str(pre_post), "--format", "json"])
    assert r.exit_code == 0, r.output
    rows_ = json.loads(r.output)
    assert len(rows_) == 2
    keys = ["run_id", "path", "sweep", "model.final_norm", "model.init", "model.placement",
            "outcome", "reason", "step", "steps_planned", "train_loss", "val_loss",
            "best_val_loss", "val_acc"]
    assert all(list(row) == keys for row in rows_)
    by_placement = {row["model.placement"]: row for row in rows_}
    assert by_placement["post"]["model.init"] == "xavier"
    for row in rows_:
        summary = json.loads((pre_post / row["run_id"] / "summary.json").read_text())
        assert row["path"] == row["run_id"] and row["sweep"] is None
        assert row["outcome"] in ("completed", "stalled")
        assert row["step"] == row["steps_planned"] == 2
        assert isinstance(row["train_loss"], float) and row["train_loss"] == summary["train_loss"]
        assert row["val_acc"] is None  # a text run has none

    r = CliRunner().invoke(app, ["runs", str(pre_post), "--format", "csv"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split(",") == keys
    read = list(csv.DictReader(io.StringIO(r.output)))
    assert [row["run_id"] for row in read] == [row["run_id"] for row in rows_]
    for got, want in zip(read, rows_, strict=True):
        assert float(got["val_loss"]) == want["val_loss"] and got["step"] == "2"
        assert got["sweep"] == "" and got["model.init"] == want["model.init"]

    r = CliRunner().invoke(app, ["runs", str(pre_post), "--format", "yaml"])
    assert r.exit_code == 2 and "'yaml' is not one of table, json, csv" in r.output


def test_runs_as_json_of_a_damaged_folder_says_why(pre_post, tmp_path):
    run = next(pre_post.iterdir())
    shutil.copytree(run, tmp_path / run.name)
    (tmp_path / run.name / "summary.json").write_text("{cut")
    r = CliRunner().invoke(app, ["runs", str(tmp_path), "--format", "json"])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.output)
    assert row["outcome"] == "damaged" and "summary.json: damaged" in row["reason"]
    assert row["train_loss"] is None


def test_runs_of_one_name_are_told_apart_by_a_short_id_prefix(tmp_path):
    """Two runs named alike (different configs, so different ids) show the name with a short
    prefix of each one's id, a prefix `sample` accepts; a name no other run has shows alone."""
    from normlab.cli.runs import id_prefix
    from normlab.train.rundir import find_run

    a = train_run(tiny("train.name=baseline"), tmp_path, progress=False)
    b = train_run(tiny("train.name=baseline", "train.seed=1"), tmp_path, progress=False)
    c = train_run(tiny("train.name=other", "train.seed=2"), tmp_path, progress=False)
    out = runs(tmp_path)
    cols = header(out)
    shown = {k: r[cols.index("name")] for k, r in rows(out).items() if k != "run"}
    prefix = {s["run_id"]: shown[s["run_id"]].split("(")[-1].rstrip(")") for s in (a, b)}
    assert shown[a["run_id"]] == f"baseline ({prefix[a['run_id']]})"
    assert shown[b["run_id"]] == f"baseline ({prefix[b['run_id']]})"
    assert prefix[a["run_id"]] != prefix[b["run_id"]]
    assert shown[c["run_id"]] == "other"
    for run_id, p in prefix.items():  # the prefix names the run where a command takes one
        assert run_id.startswith(p) and len(p) < len(run_id)
        assert find_run(p, tmp_path) == tmp_path / run_id
    # the json keeps the name as it is: run_id tells the rows apart
    r = CliRunner().invoke(app, ["runs", str(tmp_path), "--format", "json"])
    assert sorted(row["train.name"] for row in json.loads(r.output)) == [
        "baseline", "baseline", "other"]
    # the shortest unique prefix, never shorter than the readable part and 4 hash characters
    assert id_prefix("pre-L4-d64-abcdef123456", ["pre-L4-d64-abce00000000"]) == "pre-L4-d64-abcd"
    assert id_prefix("pre-L4-d64-abcdef123456", ["pre-L4-d64-abcd00000000"]) == "pre-L4-d64-abcde"
