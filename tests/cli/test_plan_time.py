"""`normlab plan --time`: a steady forward+backward time, warm-up steps not counted."""

import time

from typer.testing import CliRunner

from normlab.cli import app
from normlab.train import perf


def test_steady_step_seconds_leaves_out_the_first_calls():
    calls = []

    def step():
        calls.append(1)
        time.sleep(0.2 if len(calls) <= 2 else 0.001)  # slow first calls, as cold caches are

    seconds = perf.steady_step_seconds(step, warmup=2, repeats=5)
    assert len(calls) == 7
    assert seconds < 0.1


def test_plan_time_prints_the_steady_step(monkeypatch):
    monkeypatch.setattr(perf, "gemm_peak_tflops", lambda dtype: 0.5)  # a fixed peak: 500 GFLOP/s
    r = CliRunner().invoke(app, ["plan", "--placement", "pre", "--blocks", "1", "--set",
                                 "d_model=16", "--set", "n_heads=1", "--time"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("placement pre, 1 blocks")
    line = r.output.strip().splitlines()[-1]
    assert line.startswith("steady forward+backward, batch 8 x 128 tokens: ")
    assert "median of 10 after 3 warm-up steps" in line and "(500 GFLOP/s)" in line
    assert "steady" not in CliRunner().invoke(app, ["plan", "--placement", "pre"]).output


def test_demo_command_is_gone():
    assert CliRunner().invoke(app, ["demo"]).exit_code == 2
