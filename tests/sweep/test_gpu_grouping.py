"""How a sweep groups runs where they train: on a CPU as before (at most `MAX_GROUP` a group,
split to keep the workers busy), on CUDA as many runs a group as the GPU's free memory allows
by the memory estimate, and one local worker per GPU by default. The GPU is faked: CUDA's
availability, its free memory and its device count are monkeypatched."""

from __future__ import annotations

import math

import pytest
import torch

from normlab.config import load_run_config
from normlab.sweep.executors import CPU_WORKERS, default_workers
from normlab.sweep.grouping import MAX_GROUP, GroupTask, RunTask, group_limit, plan_tasks
from normlab.sweep.spec import PlannedRun
from normlab.train.memory import GPU_GROUP_MARGIN, group_estimate, run_estimate, runs_that_fit

SHAPE = ["model.n_blocks=6", "model.d_model=64", "model.n_heads=2", "model.max_seq_len=64",
         "data.seq_len=64", "train.batch_size=16"]
GIB = 2**30


def runs(n: int, device: str, *sets: str) -> list[PlannedRun]:
    """`n` runs of one shape on `device`: an lr x seed grid."""
    return [PlannedRun(i, {}, load_run_config(None, [*SHAPE, f"train.device={device}",
                                                     f"train.lr={1e-4 * (1 + i // 4)}",
                                                     f"train.seed={i % 4}", *sets]))
            for i in range(n)]


def sizes(tasks) -> list[int]:
    return [len(t.members) if isinstance(t, GroupTask) else 1 for t in tasks]


@pytest.fixture
def gpu(monkeypatch):
    """A fake GPU with `free[0]` bytes free; counts the reads of its free memory."""
    free, reads = [80 * GIB], []

    def mem_get_info(device=None):
        reads.append(device)
        return free[0], 80 * GIB

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    return free, reads


# -- CPU: unchanged ------------------------------------------------------------------------------

@pytest.mark.parametrize(("n", "workers", "expected"), [
    (8, 2, [4, 4]), (10, 1, [5, 5]), (20, 1, [7, 7, 6]), (3, 4, [2, 1]), (64, 2, [8] * 8),
    (17, 3, [6, 6, 5])])
def test_cpu_groups_are_planned_as_before(gpu, n, workers, expected):
    """CPU runs (device cpu; also on a machine with CUDA) keep the rule they had: groups of at
    most MAX_GROUP, near-equal, at least as many as the workers; the GPU's memory is not read."""
    _, reads = gpu
    for cuda_available in (False, True):
        tasks, _ = plan_tasks(runs(n, "cpu"), "stacked", workers, cuda_available=cuda_available)
        assert sizes(tasks) == expected
        assert [type(t) for t in tasks] == [GroupTask if k > 1 else RunTask for k in expected]
    assert group_limit(runs(1, "cpu")[0].config, True) == MAX_GROUP
    assert reads == []


def test_auto_runs_without_cuda_are_cpu_runs(gpu):
    tasks, _ = plan_tasks(runs(20, "auto"), "stacked", 1, cuda_available=False)
    assert sizes(tasks) == [7, 7, 6]


# -- CUDA: sized by memory -----------------------------------------------------------------------

def test_group_estimate_is_m_members_and_their_flat_gradients():
    cfg = runs(1, "cuda")[0].config
    one = run_estimate(cfg)
    est = group_estimate(cfg, 64)
    assert est.params == 64 * one.params
    assert est.weight_bytes == 64 * (one.weight_bytes + 4 * one.params)
    assert est.activation_bytes == 64 * one.activation_bytes
    per = group_estimate(cfg, 1).total_bytes
    assert runs_that_fit(cfg, 10 * per) == int(10 * GPU_GROUP_MARGIN)  # 8: the margin held back
    assert runs_that_fit(cfg, per // 2) == 1


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_a_gpu_grid_of_one_shape_is_one_group(gpu, device):
    """64 runs on one GPU with room for them: one group of 64 (not eight of 8)."""
    tasks, notes = plan_tasks(runs(64, device), "auto", workers=1, cuda_available=True)
    assert sizes(tasks) == [64]
    assert notes == ["engine auto: 64 runs in 1 stacked group(s) (64), 0 separate"]


def test_gpu_groups_are_limited_by_free_memory(gpu):
    free, reads = gpu
    cfg = runs(1, "cuda")[0].config
    per = group_estimate(cfg, 1).total_bytes
    free[0] = math.ceil(20 * per / GPU_GROUP_MARGIN)  # room for 20 members within the margin
    assert group_limit(cfg, True) == 20
    tasks, _ = plan_tasks(runs(64, "cuda"), "stacked", workers=1, cuda_available=True)
    assert sizes(tasks) == [16, 16, 16, 16]  # ceil(64 / 20) = 4 groups, near-equal
    assert all(len(t.members) <= 20 for t in tasks)
    assert reads  # the GPU's free memory was read
    free[0] = per  # room for one: every run separate
    tasks, notes = plan_tasks(runs(4, "cuda"), "stacked", workers=1, cuda_available=True)
    assert sizes(tasks) == [1, 1, 1, 1] and all(isinstance(t, RunTask) for t in tasks)


def test_gpu_groups_keep_every_worker_busy(gpu):
    """Two workers (two GPUs): one group each."""
    tasks, _ = plan_tasks(runs(64, "cuda"), "auto", workers=2, cuda_available=True)
    assert sizes(tasks) == [32, 32]


def test_gpu_groups_share_compile(gpu):
    tasks, _ = plan_tasks([*runs(4, "cuda"), *runs(4, "cuda", "train.compile=true")],
                          "stacked", workers=1, cuda_available=True)
    assert sizes(tasks) == [4, 4]


# -- workers -------------------------------------------------------------------------------------

def test_one_worker_per_gpu_where_every_run_trains_on_cuda(gpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    cuda, auto, cpu = (runs(2, d) for d in ("cuda", "auto", "cpu"))
    configs = [r.config for r in cuda + auto]
    assert default_workers(configs, cuda_available=True) == 3
    assert default_workers([r.config for r in auto], cuda_available=False) == CPU_WORKERS == 2
    assert default_workers([r.config for r in cuda + cpu], cuda_available=True) == CPU_WORKERS
    assert default_workers([], cuda_available=True) == CPU_WORKERS


SPEC = """
base:
  model: {n_blocks: 2, d_model: 32, n_heads: 2, max_seq_len: 32}
  data: {seq_len: 32}
  train: {steps: 4, batch_size: 8, device: DEVICE}
engine: stacked
axes:
  train.lr: [1e-4, 3e-4, 1e-3, 3e-3]
  train.seed: [0, 1, 2, 3]
"""


@pytest.mark.parametrize(("device", "expected"), [
    ("cuda", "16 runs in 1 stacked group(s) (16)"), ("cpu", "16 runs in 2 stacked group(s) (8+8)")])
def test_sweep_plan_defaults_to_one_worker_per_gpu(gpu, tmp_path, device, expected):
    from typer.testing import CliRunner

    from normlab.cli.sweep import sweep_app

    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC.replace("DEVICE", device))
    r = CliRunner().invoke(sweep_app, ["plan", str(spec), "--root", str(tmp_path / "none")])
    assert r.exit_code == 0, r.output
    assert expected in " ".join(r.output.split())
