"""The GPU checks on a CPU: benchmarks/gpu_check.py and gpu_peers.py (their smoke runs, what they
record, and that without a GPU they say so and exit 0), and gpu_check_all.py, what `make
gpu-check` runs (its stages, their log and summary, a failing stage, the no-GPU exit). How fast a
GPU runs is not tested here (docs/performance.md records it); tests/gpu runs on one."""

from __future__ import annotations

import importlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def gpu_check(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("gpu_check")


def test_without_a_gpu_it_says_so_and_exits_0(gpu_check, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "gpu.json"
    assert gpu_check.main(["--out", str(out)]) == 0
    assert "no CUDA GPU on this machine, so nothing was checked" in capsys.readouterr().out
    assert not out.exists()


def test_smoke_run_times_every_placement_and_records_nothing(gpu_check, capsys, tmp_path):
    out = tmp_path / "gpu.json"
    assert gpu_check.main(["--smoke", "--placements", "pre", "post", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["pre"], ["post"])]
    assert [r[0] for r in rows] == ["pre", "post"]
    for r in rows:
        params, tokens = int(r[1].replace(",", "")), float(r[4].replace(",", ""))
        assert params > 0 and tokens > 0 and r[5].endswith("%")
    assert "bf16 autocast, fused AdamW, eager" in text and not out.exists()


def test_the_gpt2_small_shape_and_the_nominal_peaks(gpu_check):
    cfg = gpu_check.model_config("pre", gpu_check.GPT2_SMALL)
    assert gpu_check.BATCH == 8
    assert (cfg.n_blocks, cfg.d_model, cfg.n_heads, cfg.max_seq_len, cfg.vocab_size) == (
        12, 768, 12, 1024, 50257)
    assert cfg.tie_embeddings and cfg.ff_width == 4 * 768
    assert gpu_check.nominal_peak("NVIDIA H100 80GB HBM3") == 989.4
    assert gpu_check.nominal_peak("NVIDIA H100 PCIe") == 756.0
    assert gpu_check.nominal_peak("NVIDIA H200") == 989.4
    assert gpu_check.nominal_peak("Some GPU") is None


def test_bad_arguments_exit_2_naming_them(gpu_check, capsys):
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--placements", "nope"])
    assert e.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--steps", "0"])
    assert e.value.code == 2 and "--steps and --warmup must be at least 1" in \
        capsys.readouterr().err


# -- what gpu_check.py records --------------------------------------------------------------------

def test_the_record_names_the_device_versions_date_and_commit(gpu_check):
    row = {"placement": "pre", "params": 124_439_808, "first_step_s": 41.2, "step_s": 0.0512,
           "tokens_per_s": 160_000.0, "mfu_measured": 0.45, "mfu_nominal": 0.41,
           "first_loss": 10.98, "last_loss": 9.1, "steps": 20, "flops_per_token": 1.0}
    report = {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda": "13.0",
              "date": "2026-12-04 18:00 UTC", "commit": "abc123", "model": gpu_check.GPT2_SMALL,
              "batch": 8, "compile": True, "steps": 20, "warmup": 3,
              "bf16_gemm_peak_measured_tflops": 700.0, "bf16_peak_nominal_tflops": 989.4,
              "rows": [row, row | {"placement": "post", "mfu_nominal": None}]}
    text = gpu_check.markdown(report)
    for words in ("NVIDIA H200", "torch 2.11.0+cu130", "CUDA 13.0", "2026-12-04 18:00 UTC",
                  "commit abc123", "torch.compile", "989.4 TFLOP/s", "12 blocks, width 768"):
        assert words in text, words
    assert "| pre | 124,439,808 | 41.2 s | 51.2 ms | 160,000 | 45.0% | 41.0% |" in text
    assert "| post |" in text and "| 45.0% | - |" in text


# -- gpu_peers.py: the compiled side by side with bench_peers' reference --------------------------

@pytest.fixture
def gpu_peers(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("gpu_peers")


def test_peers_without_a_gpu_say_so_and_exit_0(gpu_peers, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "peers.json"
    assert gpu_peers.main(["--out", str(out)]) == 0
    assert "gpu_peers.py: no CUDA GPU on this machine" in capsys.readouterr().out
    assert not out.exists()


def test_peers_time_bench_peers_reference_like_for_like(gpu_peers):
    bench_peers = importlib.import_module("bench_peers")
    assert gpu_peers.ReferenceDecoder is bench_peers.ReferenceDecoder  # one reference, reused
    shape = gpu_peers.GPT2_SMALL
    assert (shape.blocks, shape.width, shape.heads, shape.seq_len, shape.batch) == (
        12, 768, 12, 1024, 8)
    cfg = gpu_peers.model_config(shape, "pre", gpu_peers.GPT2_VOCAB)
    want = bench_peers.normlab_config(shape, "pre").to_dict() | {"vocab_size": 50257}
    assert cfg.to_dict() == want
    assert (cfg.positions, cfg.bias, cfg.norm_bias, cfg.tie_embeddings, cfg.mlp) == (
        "learned", True, True, True, "gelu")
    # at a vocabulary other than bench_peers' bytes: the same parameters, the same function
    small = gpu_peers.Shape(blocks=2, width=32, heads=2, seq_len=12, batch=2)
    cs = gpu_peers.contenders(small, 100, torch.device("cpu"), compile_model=False)
    assert [c.name for c in cs] == list(gpu_peers.CONTENDERS)
    params = {c.name: c.params for c in cs}
    assert params["normlab-pre"] == params["reference"]
    assert params["normlab-post"] == params["reference"] - 2 * small.width
    check = gpu_peers.same_function(small, 100, torch.device("cpu"))
    assert check["agrees"] and check["loss_abs_diff"] < 1e-5, check


def test_peers_smoke_run_reports_every_contender(gpu_peers, capsys, tmp_path):
    out = tmp_path / "peers.json"
    assert gpu_peers.main(["--smoke", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = [line.split() for line in text.splitlines()
            if line.split()[:1] and line.split()[0] in gpu_peers.CONTENDERS
            and line.split()[1].replace(",", "").isdigit()]  # name, params, ...
    assert [r[0] for r in rows] == list(gpu_peers.CONTENDERS)
    assert "normlab-pre computes the reference's function" in text
    assert not out.exists() and not out.with_suffix(".md").exists()  # a smoke run records nothing

    report = gpu_peers.run(gpu_peers.parse_args(["--smoke"]))
    for key in ("device", "torch", "cuda", "date", "commit"):
        assert key in report, key
    rows = report["contenders"]
    assert rows["reference"]["vs_reference"] == rows["reference"]["vs_reference_paired"] == 1.0
    for r in rows.values():
        assert r["tokens_per_s"] > 0 and len(r["round_step_s"]) == 2
        assert math.isfinite(r["first_loss"]) and math.isfinite(r["last_loss"])
    md = gpu_peers.markdown(report)
    assert md.count("| normlab-") == 2 and "| reference |" in md
    assert report["device"] in md and f"torch {report['torch']}" in md
    assert "Post-LN" in md and "Settings that differ" in md


# -- gpu_check_all.py: the stages of `make gpu-check` ---------------------------------------------

@pytest.fixture
def gpu_check_all(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("gpu_check_all")


def test_make_gpu_check_without_a_gpu_says_so_and_exits_0(tmp_path):
    """The target itself, with this Python: a CPU machine runs and writes nothing."""
    if torch.cuda.is_available() or shutil.which("make") is None:
        pytest.skip("needs `make` and a machine without a CUDA GPU")
    done = subprocess.run(["make", "-s", "gpu-check", f"GPU_PY={sys.executable}",
                           f"GPU_CHECK_ARGS=--out-dir {tmp_path / 'out'}"],
                          cwd=BENCHMARKS.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "no CUDA GPU on this machine, so nothing was checked" in done.stdout
    assert not (tmp_path / "out").exists()


def test_all_stages_without_a_gpu_exit_0_and_write_nothing(gpu_check_all, monkeypatch, capsys,
                                                           tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_check_all, "nvidia_smi_gpus", lambda: [])
    assert gpu_check_all.main(["--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gpu_check_all.py: no CUDA GPU on this machine, so nothing was checked" in out
    assert "torch.cuda.is_available() is false" in out and list(tmp_path.iterdir()) == []
    # a GPU that nvidia-smi lists but torch cannot use: the check is broken, not skipped
    monkeypatch.setattr(gpu_check_all, "nvidia_smi_gpus", lambda: ["GPU 0: NVIDIA H200 (UUID)"])
    assert gpu_check_all.main(["--out-dir", str(tmp_path)]) == 1
    assert "nvidia-smi lists 1 GPU(s)" in capsys.readouterr().err


def test_the_gpu_commands_parse(gpu_check_all, monkeypatch, tmp_path):
    """The benchmark stages' GPU command lines are accepted by their scripts (run here without a
    GPU, each says so after parsing them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = gpu_check_all.parse_args(["--out-dir", str(tmp_path)])
    stages = {s.name: s for s in gpu_check_all.stages(args, tmp_path)}
    assert list(stages) == ["tests", "placements", "peers"]
    assert stages["tests"].argv[1:] == ["-m", "pytest", "tests/gpu", "-n", "8", "-q", "-rs", "-p",
                                        "no:cacheprovider", "--durations=10"]
    assert stages["tests"].env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert args.budget <= 8 * 60  # all stages together, whatever each one's own limit
    assert stages["placements"].argv[2:5] == ["--placements", "pre", "post"]
    for name, script in (("placements", "gpu_check"), ("peers", "gpu_peers")):
        argv = stages[name].argv
        assert argv[1] == f"benchmarks/{script}.py" and str(tmp_path) in argv[-1]
        monkeypatch.syspath_prepend(str(BENCHMARKS))
        assert importlib.import_module(script).main(argv[2:]) == 0
    # normlab from this checkout first, the entries already on PYTHONPATH kept after it
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    env = gpu_check_all.stage_env(stages["tests"], "abc")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(BENCHMARKS.parent), "/tmp/site"]
    assert env["NORMLAB_COMMIT"] == "abc" and "PYTEST_XDIST_WORKER" not in env
    only = gpu_check_all.parse_args(["--stages", "peers", "--python", "python3"])
    assert [(s.name, s.argv[0]) for s in gpu_check_all.stages(only, tmp_path)] == [
        ("peers", "python3")]


def test_stages_run_to_the_end_and_any_failure_fails_the_check(gpu_check_all, monkeypatch,
                                                              capsys, tmp_path):
    py = sys.executable
    fake = [gpu_check_all.Stage("tests", "passes", [py, "-c", "print('3 passed in 1.0s')"], 30),
            gpu_check_all.Stage("placements", "fails", [py, "-c", "import sys; print('boom');"
                                                        " sys.exit(3)"], 30),
            gpu_check_all.Stage("peers", "hangs", [py, "-c", "import time; print('zz', "
                                                   "flush=True); time.sleep(60)"], 2)]
    monkeypatch.setattr(gpu_check_all, "stages", lambda args, out_dir: fake)
    assert gpu_check_all.main(["--smoke", "--out-dir", str(tmp_path)]) == 1
    printed = capsys.readouterr().out
    assert "boom" in printed and "=== peers: timed out" in printed and "FAILED" in printed
    report = json.loads((tmp_path / "gpu_check_all.json").read_text())
    got = {s["name"]: (s["status"], s["returncode"]) for s in report["stages"]}
    assert got == {"tests": ("passed", 0), "placements": ("failed", 3),
                   "peers": ("timed out", None)}
    assert report["stages"][0]["summary"] == "3 passed in 1.0s" and not report["passed"]
    for key in ("device", "torch", "cuda", "date", "commit"):
        assert key in report, key
    log = (tmp_path / "gpu_check_all.log").read_text()
    assert "3 passed" in log and "boom" in log and "zz" in log
    md = (tmp_path / "gpu_check_all.md").read_text()
    assert "**FAILED**" in md and "## placements: failed" in md
    assert "| tests | passed (3 passed in 1.0s) |" in md

    # a budget spent before a stage starts: it is not run, and that fails the check too
    assert gpu_check_all.main(["--smoke", "--out-dir", str(tmp_path), "--budget", "5"]) == 1
    report = json.loads((tmp_path / "gpu_check_all.json").read_text())
    assert {s["status"] for s in report["stages"]} == {"not run"}


def test_smoke_run_of_every_stage(gpu_check_all, capsys, tmp_path):
    """The real stages in their CPU forms (tests/gpu skipped, the benchmarks' smoke runs): all
    pass, and the summary says so."""
    assert gpu_check_all.main(["--smoke", "--out-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_check_all.json").read_text())
    assert [(s["name"], s["status"]) for s in report["stages"]] == [
        ("tests", "passed"), ("placements", "passed"), ("peers", "passed")]
    assert "skipped" in report["stages"][0]["summary"]
    assert "all stages passed" in capsys.readouterr().out
    assert "All stages passed" in (tmp_path / "gpu_check_all.md").read_text()


def test_the_summary_quotes_the_benchmarks_that_passed(gpu_check_all, tmp_path):
    (tmp_path / "gpu_check.json").write_text(json.dumps({"rows": [
        {"placement": "pre", "tokens_per_s": 150_000.0, "mfu_measured": 0.41,
         "mfu_nominal": 0.38, "first_step_s": 52.0}]}))
    (tmp_path / "gpu_peers.json").write_text(json.dumps({
        "contenders": {"reference": {"tokens_per_s": 140_000.0, "vs_reference": 1.0,
                                     "vs_reference_paired": 1.0, "mfu_measured": 0.36},
                       "normlab-pre": {"tokens_per_s": 147_000.0, "vs_reference": 1.05,
                                       "vs_reference_paired": 1.04, "mfu_measured": 0.38}},
        "normlab_pre_is_reference": {"agrees": True, "loss_abs_diff": 2e-6}}))
    lines = gpu_check_all.highlights(tmp_path, {"placements", "peers"})
    assert lines == [
        "placements: pre 150,000 tokens/s, MFU 41.0% of the measured bf16 peak, 38.0% of the "
        "data sheet's, compiled in 52 s",
        "peers: reference 140,000 tokens/s, 1.000x the reference (paired 1.000), MFU 36.0%",
        "peers: normlab-pre 147,000 tokens/s, 1.050x the reference (paired 1.040), MFU 38.0%",
        "peers: normlab-pre computes the reference's function with its weights (loss "
        "difference 2.0e-06)"]
    # results left from an earlier run are not quoted for a stage that failed in this one
    assert gpu_check_all.highlights(tmp_path, {"peers"})[0].startswith("peers: reference")
    assert gpu_check_all.highlights(tmp_path, set()) == []


def test_on_a_gpu_machine_the_summary_names_it(gpu_check_all, monkeypatch, capsys, tmp_path):
    """The GPU path's bookkeeping, with the GPU and the stages faked: the device in the summary,
    the commit passed to the stages, the numbers of a benchmark that passed."""
    monkeypatch.setattr(gpu_check_all, "gpu_present", lambda: (True, "NVIDIA H200"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    rows = {"rows": [{"placement": "post", "tokens_per_s": 9.0e4, "mfu_measured": 0.3,
                      "mfu_nominal": None, "first_step_s": 40.0}]}
    write = (f"import json, os, pathlib; pathlib.Path({str(tmp_path / 'gpu_check.json')!r})"
             f".write_text(json.dumps({rows!r})); print(os.environ['NORMLAB_COMMIT'])")
    fake = [gpu_check_all.Stage("placements", "writes its results", [sys.executable, "-c", write],
                                30, ["gpu_check.json"])]
    monkeypatch.setattr(gpu_check_all, "stages", lambda args, out_dir: fake)
    assert gpu_check_all.main(["--out-dir", str(tmp_path)]) == 0
    assert "all stages passed" in capsys.readouterr().out
    report = json.loads((tmp_path / "gpu_check_all.json").read_text())
    assert report["device"] == "NVIDIA H200" and report["passed"] and not report["smoke"]
    assert report["stages"][0]["tail"] == [report["commit"]]  # the stages are told the commit
    assert report["highlights"] == ["placements: post 90,000 tokens/s, MFU 30.0% of the "
                                    "measured bf16 peak, compiled in 40 s"]
    md = (tmp_path / "gpu_check_all.md").read_text()
    assert md.startswith("# make gpu-check (") and "NVIDIA H200; torch " in md
    assert "**All stages passed**" in md and "`gpu_check.json`" in md
