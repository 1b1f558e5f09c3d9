"""Processes and GPUs: a CUDA run on more processes than visible GPUs is refused before any
process starts, and so are a torchrun rank past the last GPU and a gloo group around a CUDA run.
Without a GPU: torch.cuda is faked to one visible device."""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as tdist
from typer.testing import CliRunner

from normlab.cli.app import app
from normlab.config import ConfigError
from normlab.train import distributed

TINY = ["--set", "model.n_blocks=2", "--set", "model.d_model=32", "--set", "model.n_heads=2",
        "--set", "model.max_seq_len=32", "--set", "data.seq_len=32",
        "--set", "train.batch_size=8", "--set", "train.steps=2"]


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (80 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a fake GPU")

    def started(*args, **kwargs):
        raise AssertionError("processes were started")

    monkeypatch.setattr(distributed, "launch", started)


def test_nproc_2_on_one_gpu_is_refused_before_anything_starts(one_gpu, tmp_path):
    r = CliRunner().invoke(app, ["train", *TINY, "--set", "train.device=cuda", "--nproc", "2",
                                 "--root", str(tmp_path / "runs")], terminal_width=300)
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert ("--nproc 2: a CUDA run takes one GPU a process, and 1 is visible; train on one GPU "
            "with --nproc 1, or on 2 CPU processes with --set train.device=cpu") in text
    assert not (tmp_path / "runs").exists()  # nothing written


def test_processes_are_counted_against_the_visible_gpus(one_gpu):
    with pytest.raises(ConfigError, match="^--nproc 3: a CUDA run takes one GPU a process"):
        distributed.check_gpus(torch.device("cuda"), 3)
    distributed.check_gpus(torch.device("cuda"), 1)  # one process, one GPU
    distributed.check_gpus(torch.device("cpu"), 3)  # CPU processes need no GPU


def test_a_torchrun_rank_past_the_last_gpu_is_refused(one_gpu, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ConfigError, match="^" + re.escape(
            "LOCAL_RANK=1: a CUDA run takes one GPU a process, and 1 is visible; start at most 1 "
            "process(es) a node (torchrun --nproc-per-node 1), or train on one GPU with --nproc "
            "1, or on 2 CPU processes with --set train.device=cpu")), \
            distributed.process_group(torch.device("cuda")):
        pass
    monkeypatch.setenv("LOCAL_RANK", "0")
    distributed.check_local_rank(torch.device("cuda"))


def test_a_gloo_group_around_a_cuda_run_is_refused():
    tdist.init_process_group("gloo", rank=0, world_size=1, store=tdist.HashStore())
    try:
        with pytest.raises(ConfigError, match="^a CUDA run in a gloo process group: initialise "
                           "it with the nccl backend"), \
                distributed.process_group(torch.device("cuda")):
            pass
        with distributed.process_group(torch.device("cpu")) as dist:  # a CPU run may use it
            assert dist.world_size == 1
    finally:
        tdist.destroy_process_group()
