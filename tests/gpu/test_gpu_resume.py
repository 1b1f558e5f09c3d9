"""Resume on a GPU: a run interrupted midway and resumed ends exactly as the same run trained in
one go (every logged value, the final weights and the optimizer state), at context 256 in fp32
and in bf16, with dropout (the GPU's generator state travels in the checkpoint).

Comparing a resumed run with an uninterrupted one compares two executions of the first steps
too, so the kernels must repeat themselves. Three settings, so that a failure says which part
broke: as a run trains by default; with torch's deterministic algorithms for the whole process
(`torch.use_deterministic_algorithms(True)`: an operation without a deterministic implementation
raises; this isolates normlab's checkpoint and resume from the kernels); and with the run's own
`train.deterministic: true`."""

from __future__ import annotations

import math

import pytest
import torch
from gpu_helpers import logged, needs_gpu, run_config, tensors

from normlab.config import TrainConfig
from normlab.train import read_summary, train_run

pytestmark = needs_gpu

STEPS, STOP = 30, 13  # the interruption falls between checkpoints (every 5 steps)
RUN = [f"train.steps={STEPS}", "train.eval_every=10", "train.checkpoint_every=5",
       "train.block_stats_every=4", "train.warmup=5", "train.lr=3e-3", "model.dropout=0.1"]
PRECISIONS = ["fp32", "bf16"]


@pytest.fixture
def deterministic():
    """Deterministic algorithms for the test (an operation without one raises), then the
    process's setting back."""
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def train_twice(tmp_path, *sets: str):
    """The run trained in one go (under a/) and interrupted at STOP then resumed (under b/);
    returns both run folders."""
    cfg = run_config(*RUN, *sets, context=256)
    full = train_run(cfg, tmp_path / "a", progress=False)
    part = train_run(cfg, tmp_path / "b", progress=False, interrupt_at=STOP)
    assert part["outcome"] == "interrupted" and part["step"] == STOP
    resumed = train_run(cfg, tmp_path / "b", progress=False)
    assert resumed["step"] == full["step"] == STEPS
    assert resumed["outcome"] == full["outcome"] != "diverged"
    a, b = tmp_path / "a" / cfg.run_id(), tmp_path / "b" / cfg.run_id()
    assert read_summary(a)["precision"] == read_summary(b)["precision"] == cfg.train.precision
    return a, b


def first_difference(la: list[dict], lb: list[dict]) -> str:
    """Where two runs' records first differ, and by how much (relative)."""
    for ra, rb in zip(la, lb, strict=True):
        for key in ra:
            x, y = ra[key], rb.get(key)
            if x != y:
                rel = (abs(x - y) / max(abs(x), 1e-30) if isinstance(x, float)
                       and isinstance(y, float) and math.isfinite(x) else None)
                return (f"first difference at step {ra['step']}, {key}: {x!r} vs {y!r}"
                        + (f" (relative {rel:.1e})" if rel is not None else ""))
    return "records equal"


def assert_identical(a, b) -> None:
    la, lb = logged(a), logged(b)
    assert len(la) == len(lb) == STEPS
    assert [r["step"] for r in la] == [r["step"] for r in lb]
    assert any(k.startswith("blocks.") for r in la for k in r)  # block statistics were logged
    # every loss, lr, grad norm, val loss and block statistic
    assert la == lb, f"not bit for bit: {first_difference(la, lb)}"
    for name in ("model", "optimizer"):
        ta, tb = tensors(a, name), tensors(b, name)
        assert ta.keys() == tb.keys()
        for key in ta:
            assert torch.equal(ta[key], tb[key]), (name, key)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_resume_is_bit_exact(tmp_path, precision):
    assert not torch.are_deterministic_algorithms_enabled()
    assert_identical(*train_twice(tmp_path, f"train.precision={precision}"))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_resume_is_bit_exact_under_deterministic_algorithms(tmp_path, deterministic, precision):
    assert_identical(*train_twice(tmp_path, f"train.precision={precision}"))


@pytest.mark.skipif("deterministic" not in TrainConfig.model_fields,
                    reason="this normlab has no train.deterministic")
@pytest.mark.parametrize("precision", PRECISIONS)
def test_train_deterministic_resumes_bit_exact(tmp_path, precision):
    """The run's own setting gives the same guarantee, and leaves the process's setting as it
    found it."""
    assert not torch.are_deterministic_algorithms_enabled()
    assert_identical(*train_twice(tmp_path, f"train.precision={precision}",
                                  "train.deterministic=true"))
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("precision", PRECISIONS)
def test_muon_trains_and_resumes_bit_exact_on_the_gpu(tmp_path, precision):
    """`train.optimizer: muon` (torch.optim.Muon for the blocks' matrices, AdamW for the rest,
    `normlab.train.optim`) on CUDA: the loss falls, and an interrupted run resumes bit for bit
    (both optimizers' states land on the GPU)."""
    a, b = train_twice(tmp_path, f"train.precision={precision}", "train.optimizer=muon",
                       "train.lr=2e-3")
    assert_identical(a, b)
    losses = [r["train_loss"] for r in logged(a) if "train_loss" in r]
    assert losses[-1] < losses[0] - 0.5, losses
