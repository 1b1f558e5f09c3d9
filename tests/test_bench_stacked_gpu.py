"""benchmarks/bench_stacked_gpu.py: its --quick mode on the CPU (what it measures and prints, not
how fast anything is): the engine's rows against the lone run, the profile of a group's step by
phase, the stacked step's modes, and its groups laid out as the study's lr x seed grids."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("bench_stacked_gpu")


def test_a_group_is_an_lr_by_seed_grid(bench):
    class Args:
        seq_len, batch, precision, device = 16, 2, "fp32", "cpu"

    cfgs = bench.configs(2, 32, 20, Args)
    lrs = sorted({c.train.lr for c in cfgs})
    assert len(lrs) == bench.GRID_LRS and lrs[0] == pytest.approx(1e-4)
    assert lrs[-1] == pytest.approx(3e-3, rel=1e-3)
    assert [c.train.seed for c in cfgs] == [i // 8 for i in range(20)]
    assert len({c.run_id() for c in cfgs}) == 20


def test_quick_run_measures_the_engine_the_profile_and_the_step(bench, capsys):
    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "one run" in out and "group of   2" in out and "group of   3" in out
    assert "x one after another" in out
    # every phase of the step was seen by the profiler, and the step holds the others
    profile = next(line for line in out.splitlines() if "profile of 3 x 2 blocks" in line)
    for phase in bench.PHASES.values():
        assert phase in profile, phase
    assert "| step (all of it) |" in out and "aten::" in out
    assert "stacked step           eager" in out


def test_a_failed_run_says_why(bench):
    assert bench.why({"outcome": "failed", "reason": "OutOfMemoryError", "message": "CUDA out"}) \
        == "failed (OutOfMemoryError: CUDA out)"
    assert bench.why({"outcome": "diverged", "reason": None}) == "diverged"
