"""benchmarks/bench_peers.py: a smoke run of its --quick mode (what it prints and records, not how
fast anything is), and the reference decoder it times normlab against."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest
import torch

from normlab.train.machine import native_bf16

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench_peers(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("bench_peers")


def test_quick_run_prints_every_row_with_positive_ratios(bench_peers, monkeypatch, capsys,
                                                         tmp_path):
    reports = []
    real_record = bench_peers.record

    def keep(args, report, markdown):
        reports.append(report)
        real_record(args, report, markdown)

    monkeypatch.setattr(bench_peers, "record", keep)
    out_file = tmp_path / "peers.json"
    assert bench_peers.main(["--quick", "--out", str(out_file)]) == 0
    out = capsys.readouterr().out

    precisions = ["fp32", "bf16"] if native_bf16() else ["fp32"]
    names = {s.name for s in bench_peers.QUICK_SHAPES}
    rows = [line.split() for line in out.splitlines() if line.split()[:1]
            and line.split()[0] in names]
    assert [tuple(r[:3]) for r in rows] == [
        (s.name, p, c) for s in bench_peers.QUICK_SHAPES for p in precisions
        for c in bench_peers.CONTENDERS]
    for row in rows:
        ratio, paired, peak = float(row[6]), float(row[7]), float(row[9].rstrip("%"))
        for value in (ratio, paired, peak):
            assert math.isfinite(value) and value > 0, row
        if row[2] == "reference":
            assert ratio == paired == 1.0
    assert "normlab-pre computes the reference's function" in out
    assert "settings that differ from the reference:" in out and "Post-LN" in out
    assert "GEMM peak fp32" in out

    # --quick records nothing; the report says what machine it ran on
    assert not out_file.exists() and not out_file.with_suffix(".md").exists()
    (report,) = reports
    assert report["cpu"] and isinstance(report["cpu_flags"], str)
    assert report["precisions"] == precisions and report["native_bf16"] == native_bf16()
    text = bench_peers.markdown(report)
    assert text.count("| normlab-post |") == len(rows) // 3
    assert "Settings that differ" in text


def test_reference_decoder_is_normlab_pre_with_the_same_weights(bench_peers):
    shape = bench_peers.Shape(blocks=3, width=48, heads=3, seq_len=12, batch=2)
    check = bench_peers.same_function(shape)
    assert check["same_parameter_shapes"] and check["agrees"], check
    ref = bench_peers.ReferenceDecoder(shape)
    model = bench_peers.build_model(bench_peers.normlab_config(shape, "pre"))
    count = sum(p.numel() for p in ref.parameters())
    assert count == sum(p.numel() for p in model.parameters())
    assert ref.head.weight is ref.tokens.weight  # tied
    post = bench_peers.build_model(bench_peers.normlab_config(shape, "post"))
    assert sum(p.numel() for p in post.parameters()) == count - 2 * shape.width


def test_reference_decoder_is_causal(bench_peers):
    shape = bench_peers.Shape(blocks=2, width=32, heads=2, seq_len=8, batch=1)
    torch.manual_seed(0)
    ref = bench_peers.ReferenceDecoder(shape)

    def stream(idx: torch.Tensor) -> torch.Tensor:
        h = ref.tokens(idx) + ref.positions(torch.arange(8))
        for block in ref.blocks:
            h = block(h)
        return h

    x = torch.randint(0, 256, (1, 8))
    changed = x.clone()
    changed[0, -1] = (x[0, -1] + 1) % 256
    with torch.no_grad():
        a, b = stream(x), stream(changed)
    assert torch.equal(a[:, :-1], b[:, :-1]) and not torch.equal(a[:, -1], b[:, -1])


def test_quick_mode_sizes_are_small(bench_peers):
    args = bench_peers.parse_args(["--quick"])
    assert args.quick and args.rounds <= 2 and args.steps == 1
    assert all(s.width <= 32 for s in bench_peers.QUICK_SHAPES)
    full = bench_peers.parse_args([])
    assert (full.rounds, full.steps, full.warmup) == (10, 3, 3)
    assert [(s.blocks, s.width, s.seq_len, s.batch) for s in bench_peers.SHAPES] == [
        (6, 64, 64, 16), (24, 64, 64, 16), (6, 256, 256, 16)]
