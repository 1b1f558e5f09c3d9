"""The random generators a checkpoint saves and restores, for the device a run trains on, and
that nothing a run measures besides itself (the progress line's GEMM peak) draws from them. The
CUDA branches run without a GPU: torch.cuda's generator calls are replaced."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from normlab.config import load_run_config
from normlab.train import train_run
from normlab.train.checkpoint import CheckpointError, restore_rng_states, rng_states
from normlab.train.perf import quick_peak_tflops
from normlab.train.rundir import read_metrics

WHERE = Path("ckpt/rng.safetensors")


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's per-device generator calls on a machine without a GPU: `saved[i]` is device
    i's state, `restored` lists (device, state) set."""
    saved = {i: torch.full((8,), i, dtype=torch.uint8) for i in range(2)}
    restored: list[tuple[int, int]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state",
                        lambda device="cuda": saved[torch.device(device).index or 0])
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": restored.append(
        (torch.device(device).index or 0, int(state[0]))))

    def refuse(*args, **kwargs):
        raise AssertionError("every device's state is neither saved nor restored")

    monkeypatch.setattr(torch.cuda, "get_rng_state_all", refuse)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", refuse)
    return saved, restored


def test_only_the_training_devices_state_is_saved_under_a_key_without_its_index(fake_cuda):
    states = rng_states(torch.device("cuda", 1))
    assert sorted(states) == ["torch_cpu", "torch_cuda"]
    assert int(states["torch_cuda"][0]) == 1  # device 1's, not device 0's
    assert list(rng_states(torch.device("cpu"))) == ["torch_cpu"]  # a CPU run saves none


def test_a_state_saved_on_one_gpu_restores_on_another(fake_cuda):
    """Saved where the run trained on cuda:1 (eight GPUs visible), resumed where it is cuda:0."""
    _, restored = fake_cuda
    states = rng_states(torch.device("cuda", 1))
    restore_rng_states(states, torch.device("cuda", 0), WHERE)
    assert restored == [(0, 1)]


def test_an_earlier_checkpoint_with_two_devices_resumes_where_one_is_visible(fake_cuda):
    """Earlier versions saved every visible GPU's state (`torch_cuda_0`, `torch_cuda_1`) and
    restored them all, an `IndexError` where fewer GPUs were visible; now the training device's
    own is read."""
    _, restored = fake_cuda
    cpu = torch.get_rng_state()
    legacy = {"torch_cpu": cpu, "torch_cuda_0": torch.full((8,), 7, dtype=torch.uint8),
              "torch_cuda_1": torch.full((8,), 9, dtype=torch.uint8)}
    restore_rng_states(legacy, torch.device("cuda", 0), WHERE)
    assert restored == [(0, 7)]
    restore_rng_states(legacy, torch.device("cpu"), WHERE)  # a CPU run's: ignored
    assert restored == [(0, 7)]
    with pytest.raises(CheckpointError, match=re.escape(
            f"{WHERE}: the checkpoint holds the RNG states of CUDA devices [0, 1], none for "
            "cuda:3, so its random numbers (dropout) would not continue. Resume it on the device "
            "it was trained on (train.device), or delete the checkpoint folder to restart the run "
            "from step 0")):
        restore_rng_states(legacy, torch.device("cuda", 3), WHERE)


@pytest.mark.parametrize("saved_on, resumed_on, what", [
    ("cuda", "cpu", "the run trains on cpu but its checkpoint was written by a run on a CUDA "
     "device (it holds a CUDA RNG state)"),
    ("cpu", "cuda", "the run trains on cuda:0 but its checkpoint was written by a run on the CPU "
     "(no CUDA RNG state)"),
])
def test_a_missing_or_extra_cuda_state_is_a_clear_error(fake_cuda, saved_on, resumed_on, what):
    states = rng_states(torch.device(saved_on, 0) if saved_on == "cuda" else torch.device("cpu"))
    device = torch.device(resumed_on, 0) if resumed_on == "cuda" else torch.device("cpu")
    with pytest.raises(CheckpointError, match="^" + re.escape(f"{WHERE}: {what}, so its random")):
        restore_rng_states(states, device, WHERE)


TINY = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=8", "train.eval_batches=2", "train.steps=6",
        "train.log_every=1", "train.eval_every=3", "train.device=cpu", "model.dropout=0.2"]


def test_the_progress_line_does_not_change_a_run_with_dropout(tmp_path, monkeypatch):
    """The progress line measures the GEMM peak (its MFU's denominator) once per process, after
    the run was seeded: drawn from the global generator, it shifted every dropout mask after it,
    so a run with dropout trained otherwise with `--quiet` than without."""
    cfg = load_run_config(None, TINY)
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))  # no peak cached on disk...
    quick_peak_tflops.cache_clear()  # ...nor in this process: measured in this run
    loud = train_run(cfg, tmp_path / "loud", progress=True)
    quiet = train_run(cfg, tmp_path / "quiet", progress=False)
    assert loud["outcome"] == quiet["outcome"] and loud["step"] == 6
    losses = [[r.get("train_loss") for r in read_metrics(root / cfg.run_id() / "metrics.jsonl")]
              for root in (tmp_path / "loud", tmp_path / "quiet")]
    assert losses[0] == losses[1]
