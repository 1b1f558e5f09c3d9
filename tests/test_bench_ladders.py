"""benchmarks/bench_ladders.py: a smoke run of its --quick mode (what it prints and whether it
checks that both contenders measured the same numbers, not how fast either is)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench_ladders(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("bench_ladders")


def test_quick_run_times_both_contenders_on_the_same_numbers(bench_ladders, capsys, tmp_path):
    out_file = tmp_path / "ladders.json"
    assert bench_ladders.main(["--quick", "--out", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert "round 1: here " in out and "workers" in out and "Speed-up" in out
    assert not out_file.exists()  # --quick records nothing


def test_numbers_that_differ_between_the_contenders_fail_the_run(bench_ladders, monkeypatch,
                                                                 capsys, tmp_path):
    real = bench_ladders.in_process

    def off(ctx, fn, cells):  # "here" measures something else
        rows = real(ctx, fn, cells)
        for row in rows:
            row["perturb_change"] *= 1.01
        return rows

    monkeypatch.setattr(bench_ladders, "in_process", off)
    assert bench_ladders.main(["--quick", "--out", str(tmp_path / "x.json")]) == 1
    assert "not float noise" in capsys.readouterr().out
