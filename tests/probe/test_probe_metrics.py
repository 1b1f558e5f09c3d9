"""The table of probe metrics (normlab.probe.metrics): every number a probe returns has its row,
a key without one is an error, the suite, the figures, the CLI and the report read it, a new
metric is one function and one row, and docs/probes.md's lists of measures are what
`python scripts/probe_docs.py` writes from it."""

from __future__ import annotations

import subprocess
import sys

import probe_docs
import pytest

from normlab.probe import metrics
from normlab.probe.metrics import (
    METRICS,
    NEEDS,
    NORMLAB,
    PER_BATCH,
    PER_BLOCK,
    SERIES,
    SUMMARY,
    Metric,
    UnknownMetric,
    place,
)


@pytest.fixture(scope="module")
def tiny():
    from normlab.config import make_model_config
    from normlab.nn import build_model
    from normlab.probe import text_batches

    cfg = make_model_config(placement="resi_dual", n_blocks=3, d_model=16, n_heads=2,
                            max_seq_len=32, tie_embeddings=False)
    return build_model(cfg, seed=0), text_batches(n_batches=2, batch_size=2, seq_len=8)


# --- the table -------------------------------------------------------------------------------

def test_every_row_is_complete_and_its_functions_resolve():
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    for m in METRICS:
        assert m.per in (PER_BLOCK, SUMMARY, SERIES), m.name
        assert m.needs in NEEDS, m.name
        assert m.doc and m.unit, m.name
        assert m.models, f"{m.name}: no probe computes it"
        assert (m.needs == "metrics") == bool(m.inputs), m.name
        assert all(i in metrics.BY_NAME for i in m.inputs), m.name
        for f in (m.compute, m.real):
            if isinstance(f, metrics.Fn):
                assert callable(f.resolve()), f.path
        assert not (m.spread or m.in_summary) or m.per == SUMMARY, m.name
        assert not m.per_batch or m.per == PER_BLOCK, m.name
    assert metrics.PROBES == ("stream", "grads", "merge", "drop", "skip", "lens", "perturb",
                              "update")
    # skip runs as many forwards as drop again; update trains a copy: both when asked for
    assert metrics.DEFAULT_PROBES == ("stream", "grads", "merge", "drop", "lens", "perturb")
    assert all(m.per == PER_BLOCK for m in METRICS if m.matrix)


def test_keys_go_where_the_table_says_and_an_unknown_key_is_an_error():
    assert place("norm") == PER_BLOCK and place("update_size") == SERIES
    assert place("loss") == place("loss_std") == place("effective_depth_kl_std") == SUMMARY
    assert place("drop_kl_per_batch") == PER_BATCH
    for key in ("no_such_metric", "growth_exponent_std", "loss_per_batch"):
        with pytest.raises(UnknownMetric, match=key):
            place(key)


def test_every_number_of_every_probe_has_its_row(tiny):
    from normlab.probe import probe_model

    model, batches = tiny
    res = probe_model(model, batches, metrics.PROBES, update_steps=2, perturb_draws=1)
    produced = {k for part in ("per_block", "summary", "series") for k in res[part]}
    normlab_rows = {m.name for m in METRICS if NORMLAB in m.models}
    assert produced - normlab_rows <= {f"{m.name}_std" for m in METRICS if m.spread}
    assert normlab_rows <= produced  # ResiDual, untied head: every row of normlab's probes
    for part in ("per_block", "series"):
        assert all(metrics.metric(k).per == part for k in res[part])
    assert set(res["per_batch"]) == {f"{m.name}_per_batch" for m in METRICS if m.per_batch}


def test_a_result_key_without_a_row_is_refused_not_made_a_summary(tiny):
    from normlab.probe.suite import organize

    model, _ = tiny
    with pytest.raises(UnknownMetric, match="mystery"):
        organize(model, ["stream"], {"norm": [1.0, 2.0, 3.0], "mystery": 0.5}, [])


# --- a new metric is one function and one row ------------------------------------------------

def mean_branch_ratio(run):
    """A toy probe function: per block, the mean of the two branch ratios."""
    from normlab.probe import stream_stats

    s = stream_stats(run.model, run.batches)
    return {"branch_mean": [(a + m) / 2 for a, m in zip(s["branch_attn"], s["branch_mlp"],
                                                        strict=True)]}


def test_a_new_metric_is_one_function_and_one_row(tiny, monkeypatch):
    from normlab.probe import probe_model

    rows = (
        Metric("branch_mean", PER_BLOCK, "stream", "stream", compute=mean_branch_ratio,
               unit="ratio", label="mean branch ratio", column="branch",
               doc="the mean of `branch_attn` and `branch_mlp`"),
        Metric("branch_mean_last", SUMMARY, "stream", "metrics", compute=metrics.last,
               inputs=("branch_mean",), unit="ratio", doc="`branch_mean[L-1]`"),
    )
    table = METRICS + rows
    monkeypatch.setattr(metrics, "METRICS", table)
    monkeypatch.setattr(metrics, "BY_NAME", {m.name: m for m in table})
    model, batches = tiny
    res = probe_model(model, batches, ("stream",))
    ratio = res["per_block"]["branch_mean"]
    assert len(ratio) == 3 and res["summary"]["branch_mean_last"] == ratio[-1]
    assert ("branch_mean", "branch") in metrics.per_block_columns()
    assert metrics.figure_labels()["branch_mean"] == "mean branch ratio"
    doc = probe_docs.render()
    assert "| `branch_mean` | block | ratio | stream |  | the mean of `branch_attn`" in doc
    assert doc.index("`branch_mean`") < doc.index("<!-- end of the measures of `stream` -->")


# --- the readers -----------------------------------------------------------------------------

def test_the_figures_cli_and_report_read_the_table():
    from normlab.cli import probe as command
    from normlab.probe import figures
    from normlab.probe.sweep import LINEAR_METRICS, LOGLOG_METRICS
    from normlab.report import numbers

    assert metrics.figure_labels() == figures.LABELS and "norm" in figures.LOG_Y
    assert figures.label("ang_prev") == "angular distance to the previous block (fraction of pi)"
    assert command.PER_BLOCK_COLUMNS[:3] == (("norm", "norm"), ("rel_update", "rel upd"),
                                             ("ang_prev", "ang prev"))
    assert ("effective_depth_kl", "eff depth KL") in command.SWEEP_KEYS
    assert command.SUMMARY_KEYS[0] == "loss" and "n_costly_kl" in command.SUMMARY_KEYS
    assert numbers.label("drop_kl") == "KL when skipped"
    assert numbers.label("embed_norm_std") == "embedding norm, std"
    assert all(numbers.LABELS[k] == v for k, v in metrics.report_labels().items())
    for key in LOGLOG_METRICS + LINEAR_METRICS:  # the depth sweep fits metrics of the table
        assert metrics.metric(key).per == SUMMARY


def test_reading_the_table_imports_no_torch():
    code = ("import sys, normlab.probe.metrics, normlab.report.numbers\n"
            "print(' '.join(m for m in ('torch', 'numpy', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == ""


# --- docs/probes.md --------------------------------------------------------------------------

def test_the_committed_lists_of_measures_match_the_table():
    assert probe_docs.DOC.read_text(encoding="utf-8") == probe_docs.render(), (
        "docs/probes.md is out of date: run python scripts/probe_docs.py")
    assert probe_docs.main(["--check"]) == 0


def test_check_fails_on_a_stale_file(tmp_path):
    stale = tmp_path / "probes.md"
    stale.write_text(probe_docs.render().replace("| `norm_attn` | block |",
                                                 "| `norm_attn` | model |"))
    assert probe_docs.main(["--check", "--out", str(stale)]) == 1
    assert probe_docs.main(["--out", str(stale)]) == 0
    assert stale.read_text() == probe_docs.render()


def test_a_probe_without_its_list_is_refused():
    text = probe_docs.render()
    begin = text.index("<!-- measures of `lens`")
    end_mark = "<!-- end of the measures of `lens` -->\n"
    end = text.index(end_mark)
    with pytest.raises(ValueError, match="no list of the measures of lens"):
        probe_docs.render(text[:begin] + text[end + len(end_mark):])


def test_every_row_is_listed_once_with_its_unit():
    text = probe_docs.render()
    per = {PER_BLOCK: "block", SUMMARY: "model", SERIES: "step"}
    for m in METRICS:
        head = f"| `{m.name}` | {per[m.per]} | {m.unit} |"
        assert len([line for line in text.splitlines() if line.startswith(head)]) == 1, m.name
