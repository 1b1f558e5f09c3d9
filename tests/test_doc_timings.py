"""The times the docs quote between `<!-- time:NAME -->` markers are the ones
`python scripts/doc_timings.py` measured and recorded in docs/timings.json, with their date and
machine: a figure edited by hand, or a record measured again without the docs rewritten, fails
here. Nothing is run."""

from __future__ import annotations

import doc_timings


def test_every_managed_figure_in_the_docs_is_the_recorded_one():
    assert doc_timings.problems() == [], "run python scripts/doc_timings.py (or --only NAME)"
    assert doc_timings.main(["--check"]) == 0


def test_the_stale_figures_of_the_report_are_managed():
    """docs/data.md's prepare and BPE sweep times, the README's example runs and the k-hop
    example are quoted from the record, each with its date and machine."""
    record = doc_timings.read_record()
    shown = {m.group(1) for p in doc_timings.DOCS
             for m in doc_timings.MARKER.finditer(p.read_text(encoding="utf-8"))}
    assert {"prepare_bpe", "bpe_sweep", "khop_example", "example_pre"} <= shown
    assert shown <= set(record) <= set(doc_timings.COMMANDS)
    for entry in record.values():
        assert entry["seconds"] == min(entry["repeats"]) > 0  # the fastest repeat
        assert entry["cores"] >= 1 and entry["cpu"]
        assert len(entry["date"]) == 10 and entry["date"][4] == "-"


def test_a_stale_figure_is_found_and_rewritten(tmp_path):
    entry = {"seconds": 2.84, "date": "2026-12-05", "cores": 2, "cpu": "Some CPU"}
    doc = tmp_path / "doc.md"
    doc.write_text("prepare takes <!-- time:prepare_bpe -->about 20 s<!-- /time --> here.\n")
    found = doc_timings.problems([doc], {"prepare_bpe": entry})
    assert len(found) == 1 and "about 20 s" in found[0]
    assert doc_timings.problems([doc], {}) == [
        "doc.md: time:prepare_bpe is not in timings.json"]
    fixed = doc_timings.rewrite(doc.read_text(), {"prepare_bpe": entry})
    assert fixed == ("prepare takes <!-- time:prepare_bpe -->2.8 s (measured 2026-12-05 on 2 "
                     "cores of Some CPU)<!-- /time --> here.\n")
    doc.write_text(fixed)
    assert doc_timings.problems([doc], {"prepare_bpe": entry}) == []


def test_durations_read_naturally():
    assert [doc_timings.duration_text(s) for s in (2.84, 34.4, 119.0, 570.0)] == [
        "2.8 s", "34 s", "119 s", "9.5 min"]
