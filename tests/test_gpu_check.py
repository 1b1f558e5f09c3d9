"""benchmarks/gpu_check.py: its logic on the CPU (the smoke run), and that without a GPU it says
so and exits 0. How fast a GPU runs is not tested here (docs/performance.md records it)."""

from __future__ import annotations

import importlib
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
