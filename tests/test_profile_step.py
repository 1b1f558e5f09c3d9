"""benchmarks/profile_step.py: a smoke run of its --quick mode (what it prints, groups and
records), not how fast anything is."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def profile_step(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    threads = torch.get_num_threads()
    yield importlib.import_module("profile_step")
    torch.set_num_threads(threads)


def test_quick_run_groups_every_operator_and_records_nothing(profile_step, monkeypatch, capsys,
                                                            tmp_path):
    out = tmp_path / "p.json"
    rows = []
    real = profile_step.profile_shape

    def keep(*args, **kwargs):
        rows.append(real(*args, **kwargs))
        return rows[-1]

    monkeypatch.setattr(profile_step, "profile_shape", keep)
    assert profile_step.main(["--quick", "--steps", "1", "--warmup", "1", "--threads", "1",
                              "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert len(rows) == len(profile_step.QUICK_SHAPES) and not out.exists()
    for row in rows:
        shares = [g["share"] for g in row["groups"].values()]
        assert sum(shares) == pytest.approx(1.0) and all(s >= 0 for s in shares)
        assert row["groups"]["matrix products"]["ms"] > 0 and row["step_ms"] > 0
        assert f"{row['words']}: " in text


def test_operators_fall_in_their_groups(profile_step):
    g = profile_step.group_of
    assert g("aten::addmm") == g("aten::mm") == "matrix products"
    assert g("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention kernel"
    assert g("aten::gelu_backward") == "GELU"
    assert g("aten::native_layer_norm_backward") == "LayerNorm"
    assert g("aten::_fused_adamw_") == "optimizer (fused AdamW, zero_grad)"
    assert g("aten::view") == profile_step.OTHER
