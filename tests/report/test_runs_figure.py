"""The runs report's loss figure and runs table read as `normlab runs` does: a legend entry is a
run's name or the few settings that tell its line apart (never the whole config), losses that
count different things (bytes, a tokenizer's tokens, a k-hop task's answers) never share an
axis and each axis names its unit, and a setting is a column only where the runs it applies to
differ in it (`normlab.train.listing.applies`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from normlab.config import load_run_config
from normlab.train import train_run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = ["model.n_blocks=1", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=16",
        "data.seq_len=16", "train.batch_size=4", "train.eval_batches=1", "train.eval_every=2",
        "train.steps=4", "train.log_every=1", "train.device=cpu", "train.precision=fp32"]
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "while", "old", "owl")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """Byte-level pre (two seeds) and post, a named BPE run, two k-hop runs that differ in
    their hop count."""
    root = tmp_path_factory.mktemp("mixed")
    corpus = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    for i in range(4):
        (corpus / f"work{i}.txt").write_text(" ".join(rng.choice(WORDS, size=600)) + "\n")
    mp = pytest.MonkeyPatch()
    mp.setenv("NORMLAB_CACHE", str(tmp_path_factory.mktemp("cache")))
    try:
        for extra in (["model.placement=pre", "train.seed=0"],
                      ["model.placement=pre", "train.seed=1"], ["model.placement=post"],
                      [f"data.source={corpus}", "data.tokenizer=bpe:300", "train.name=bpe"]):
            train_run(load_run_config(None, TINY + extra), root, progress=False)
        for hops in (["model.vocab_size=6", "data.khop_max_hops=2"], []):
            train_run(load_run_config(EXAMPLES / "khop.yaml", TINY + hops), root,
                      progress=False)
    finally:
        mp.undo()
    return root


def _rows(root: Path):
    from normlab.report.runs import find_folders, read_runs

    return read_runs(root, find_folders(root)[0])


def _drawn(monkeypatch, rows):
    """The matplotlib figure `loss_curves_svg` draws for `rows`."""
    import normlab.report.figures as report_figures

    figs = []
    monkeypatch.setattr(report_figures, "figure_bytes",
                        lambda fig, fmt, **kw: figs.append(fig) or b"<svg/>")
    assert report_figures.loss_curves_svg([r.curve for r in rows])
    (fig,) = figs
    return fig


def test_legend_entries_are_names_or_the_settings_that_tell_lines_apart(mixed, monkeypatch):
    rows = _rows(mixed)
    by_setting = {(r.get("data.task"), r.get("train.name"), r.get("model.placement"),
                   r.get("data.khop_max_hops")): r.curve.group for r in rows}
    # pre and post differ in placement, init and final norm: the placement alone tells them
    # apart; the seeds of pre are one line; the runs named are shown by their name
    assert by_setting[(None, None, "pre", 4)] == "pre"
    assert by_setting[(None, None, "post", 4)] == "post"
    assert by_setting[(None, "bpe", "pre", 4)] == "bpe"
    # the two k-hop runs share the example's name: their hop count tells them apart
    assert by_setting[("khop", "k-hop induction heads", "pre", 2)] == (
        "k-hop induction heads (khop_max_hops 2)")
    assert by_setting[("khop", "k-hop induction heads", "pre", 3)] == (
        "k-hop induction heads (khop_max_hops 3)")
    fig = _drawn(monkeypatch, rows)
    (legend,) = fig.legends
    # (a line that lies on top of another says so: "pre (= post)", see `mean_band`)
    assert sorted(t.get_text().split(" (= ")[0] for t in legend.get_texts()) == sorted(
        set(by_setting.values()))
    assert all(t.get_fontsize() >= 9 for t in legend.get_texts())


def test_a_run_without_a_name_is_labelled_by_the_settings_it_differs_in(tmp_path):
    from normlab.report.runs import RunRow, line_labels

    def row(**flat):
        base = {"model.placement": "pre", "model.init": "gpt2_scaled", "train.lr": 1e-3,
                "train.seed": 0, "train.log_every": 10, "data.task": None,
                "data.khop_max_hops": 3}
        return RunRow(folder=tmp_path, name="r", flat=base | flat)

    rows = [row(), row(**{"train.seed": 1}), row(**{"train.lr": 4e-3}),
            row(**{"model.placement": "post", "model.init": "xavier", "train.log_every": 5}),
            row(**{"data.task": "khop", "data.khop_max_hops": 2})]
    # init follows the placement here, logging is bookkeeping, a k-hop setting applies to the
    # k-hop run only: none of them is part of a label
    assert line_labels(rows) == ["pre, lr 0.001", "pre, lr 0.001", "pre, lr 0.004",
                                 "post, lr 0.001", "pre, lr 0.001, task khop"]


def test_losses_in_different_units_are_never_on_one_axis(mixed, monkeypatch):
    rows = _rows(mixed)
    tokens = {r.curve.group: r.curve.tokens for r in rows}
    assert tokens["pre"] == tokens["post"] == "byte"
    assert tokens["bpe"].startswith("bpe:300") and tokens["bpe"] != "byte"
    assert {tokens[g] for g in tokens if g.startswith("k-hop")} == {"k-hop"}
    fig = _drawn(monkeypatch, rows)
    panels = {}
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        groups = {line.get_label().split(" (= ")[0] for line in ax.get_lines()
                  if not line.get_label().startswith("_")}
        panels[ax.get_title()] = (ax.get_ylabel(), {tokens[g] for g in groups})
    # bytes and BPE tokens: training loss each in its own unit, validation in bits per byte
    assert panels["training loss"] == ("loss (nats/byte)", {"byte"})
    assert panels[f"training loss, {tokens['bpe']} tokens"] == ("loss (nats/token)",
                                                                 {tokens["bpe"]})
    assert panels["validation loss, every tokenizer"] == ("bits per byte",
                                                          {"byte", tokens["bpe"]})
    assert panels["k-hop training loss"] == ("loss (nats/answered position)", {"k-hop"})
    assert panels["k-hop validation loss"] == ("loss (nats/answered position)", {"k-hop"})
    assert panels["k-hop validation accuracy"] == ("accuracy", {"k-hop"})
    assert len(panels) == 6
    # bits per byte are what the runs recorded, not their loss relabelled
    bpe = next(r for r in rows if r.curve.group == "bpe")
    assert bpe.curve.bpb and bpe.curve.bpb != bpe.curve.val


def test_runs_of_one_tokenizer_keep_two_panels_in_its_unit(mixed, monkeypatch):
    rows = [r for r in _rows(mixed) if r.curve.tokens == "byte"]
    fig = _drawn(monkeypatch, rows)
    shown = [(ax.get_title(), ax.get_ylabel()) for ax in fig.axes if ax.get_visible()]
    assert shown == [("training loss", "loss (nats/byte)"),
                     ("validation loss", "loss (nats/byte)")]


def test_runs_table_lists_a_setting_only_where_it_applies(mixed, tmp_path):
    from normlab.report.runs import runs_view

    rows = _rows(mixed)
    view = runs_view(rows, tmp_path)
    titles = [c.title for c in view.config_columns]
    assert "data.khop_max_hops" in titles  # the k-hop runs differ in it
    cells = {line.name: line.cells[titles.index("data.khop_max_hops")].text
             for line in view.lines}
    by_name = {r.name: r for r in rows}
    assert {n: c for n, c in cells.items() if by_name[n].get("data.task") != "khop"} == {
        n: "-" for n, r in by_name.items() if r.get("data.task") != "khop"}
    assert sorted(c for n, c in cells.items() if by_name[n].get("data.task") == "khop") == [
        "2", "3"]


def test_a_setting_that_differs_only_where_it_does_not_apply_is_no_column(tmp_path):
    from normlab.report.runs import RunRow, runs_view

    def row(name, **flat):
        return RunRow(folder=tmp_path / name, name=name, flat={"model.placement": "pre",
                                                               "train.seed": 0} | flat)

    rows = [row("text", **{"data.task": None, "data.source": "a.txt", "data.khop_max_hops": 4}),
            row("hop1", **{"data.task": "khop", "data.source": "b.txt", "data.khop_max_hops": 3}),
            row("hop2", **{"data.task": "khop", "data.source": "c.txt", "data.khop_max_hops": 3})]
    view = runs_view(rows, tmp_path)
    titles = [c.title for c in view.config_columns]
    assert "data.task" in titles
    assert "data.source" not in titles and "data.khop_max_hops" not in titles
    shared = {row.head: row.cells[0].text for _, t in view.sections for row in t.rows}
    assert shared["source"] == "a.txt" and shared["khop_max_hops"] == "3"
