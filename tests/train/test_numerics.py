"""The numerics a run computes with besides its config (float32 matmul precision, TF32 flags,
deterministic algorithms): recorded in its meta and checkpoint; a resume under other flags
trains under the recorded ones and says so; the caller's flags are back when a run ends."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from normlab.config import load_run_config
from normlab.train import train_run
from normlab.train.checkpoint import CheckpointError, check_trainer_state
from normlab.train.numerics import (
    CUBLAS_WORKSPACE,
    FUSED_ATTENTION_ENABLED,
    deterministic_algorithms,
    kept_numerics,
    numerics_in_force,
)
from normlab.warnings import NormlabWarning

TINY = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=8", "train.eval_batches=1", "train.steps=4",
        "train.eval_every=2", "train.checkpoint_every=2", "train.device=cpu"]


@pytest.fixture
def flags():
    """The process's flags, put back after the test whatever it set."""
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    deterministic = torch.are_deterministic_algorithms_enabled()
    workspace = os.environ.get(CUBLAS_WORKSPACE)
    yield
    torch.set_float32_matmul_precision(before[0])
    torch.backends.cudnn.allow_tf32 = before[1]
    torch.use_deterministic_algorithms(deterministic)
    if workspace is None:
        os.environ.pop(CUBLAS_WORKSPACE, None)
    else:
        os.environ[CUBLAS_WORKSPACE] = workspace


def meta(run: Path) -> dict:
    return yaml.safe_load((run / "config.yaml").read_text())["meta"]


def saved_numerics(run: Path) -> dict:
    return json.loads((run / "checkpoint" / "trainer_state.json").read_text())["numerics"]


def test_the_flags_are_recorded_in_meta_and_checkpoint(tmp_path, flags):
    torch.set_float32_matmul_precision("high")  # a script that turned TF32 on
    cfg = load_run_config(None, TINY)
    s = train_run(cfg, tmp_path, progress=False)
    run = tmp_path / s["run_id"]
    want = {"float32_matmul_precision": "high", "cuda_matmul_allow_tf32": True,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32, "deterministic": False}
    assert meta(run)["numerics"] == want
    assert saved_numerics(run) == want


def test_a_resume_under_other_flags_trains_under_the_recorded_ones(tmp_path, flags):
    cfg = load_run_config(None, TINY)
    torch.set_float32_matmul_precision("highest")
    first = train_run(cfg, tmp_path, progress=False, interrupt_at=2)
    assert first["outcome"] == "interrupted"
    run = tmp_path / first["run_id"]
    torch.set_float32_matmul_precision("high")  # the resuming process has TF32 on
    with pytest.warns(NormlabWarning, match="resuming with the float32 matmul flags it was "
                      "trained with, float32_matmul_precision=highest \\(not high\\)"):
        done = train_run(cfg, tmp_path, progress=False)
    assert done["outcome"] in ("completed", "stalled") and done["step"] == 4
    assert saved_numerics(run)["float32_matmul_precision"] == "highest"  # trained under them
    assert torch.get_float32_matmul_precision() == "high"  # and the caller's are back


def test_deterministic_is_recorded_and_ends_with_the_run(tmp_path, flags, monkeypatch):
    monkeypatch.delenv(CUBLAS_WORKSPACE, raising=False)
    cfg = load_run_config(None, [*TINY, "train.deterministic=true"])
    assert cfg.run_id() == load_run_config(None, TINY).run_id()  # how, not what, is computed
    s = train_run(cfg, tmp_path, progress=False)
    run = tmp_path / s["run_id"]
    assert meta(run)["numerics"]["deterministic"] is True
    assert os.environ[CUBLAS_WORKSPACE] == ":4096:8"  # set for cuBLAS before the first CUDA call
    assert numerics_in_force()["deterministic"] is False
    # the fused attention kernels (atomics in their backward) were off for the run only
    assert all(enabled() for enabled in FUSED_ATTENTION_ENABLED.values())


def test_deterministic_runs_attention_on_the_math_kernel_and_refuses_what_has_none(flags):
    with kept_numerics():
        deterministic_algorithms()
        assert not any(enabled() for enabled in FUSED_ATTENTION_ENABLED.values())
        assert torch.backends.cuda.math_sdp_enabled()
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()  # raises, not warns
    assert all(enabled() for enabled in FUSED_ATTENTION_ENABLED.values())
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("numerics, what", [
    ([], "numerics is [], not an object"),
    ({"float32_matmul_precision": "high", "cuda_matmul_allow_tf32": True,
      "cudnn_allow_tf32": True}, "numerics.deterministic is None, not a bool"),
    ({"float32_matmul_precision": "fast", "cuda_matmul_allow_tf32": True,
      "cudnn_allow_tf32": True, "deterministic": False},
     "numerics.float32_matmul_precision is 'fast', not one of highest, high, medium"),
])
def test_malformed_numerics_are_refused(numerics, what):
    state = {"step": 3, "best_val_loss": 2.5, "spike": {}, "numerics": numerics}
    with pytest.raises(CheckpointError, match=f"malformed checkpoint state \\({what}\\)"
                       .replace("[", "\\[").replace("]", "\\]")):
        check_trainer_state(state, Path("f.json"))
