"""On a GPU a stacked group keeps its members' token data on the device and gathers their batches
there (`BatchSampler.to`): the batches are the host sampler's, and a compiled group
(`train.compile`) trains as the eager one."""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import DEVICE, logged, needs_gpu, run_config

from normlab.data import load_run_data
from normlab.data.batches import BatchSampler
from normlab.train.group import train_group

pytestmark = needs_gpu

RUN = ["train.steps=6", "train.eval_every=3", "train.checkpoint_every=0"]


def test_device_batches_are_the_host_batches():
    cfg = run_config(*RUN)
    data = load_run_data(cfg.data, cfg.model)
    host = data.sampler(8, 64, seed=2)
    device = host.to(DEVICE)
    for step in (0, 5, 123):
        hx, hy = host.batch(step)
        dx, dy = device.batch(step)
        assert dx.device.type == DEVICE
        assert torch.equal(dx.cpu(), hx) and torch.equal(dy.cpu(), hy)


def test_a_group_gathers_its_batches_on_the_gpu(tmp_path, monkeypatch):
    devices = []
    real = BatchSampler.batch

    def spy(self, step):
        x, y = real(self, step)
        devices.append(x.device.type)
        return x, y

    monkeypatch.setattr(BatchSampler, "batch", spy)
    cfgs = [run_config(*RUN, f"train.lr={lr}") for lr in (1e-3, 3e-3)]
    summaries = train_group(cfgs, tmp_path, progress=False)
    assert all(s["step"] == 6 for s in summaries.values()), summaries
    # the members' first batches build their models on the host; every training step's is on
    # the GPU
    assert devices.count(DEVICE) == 2 * 6 and set(devices) <= {"cpu", DEVICE}


def test_a_compiled_group_trains_as_the_eager_group(tmp_path):
    losses = {}
    for compiled in (False, True):
        cfgs = [run_config(*RUN, f"train.lr={lr}", "train.precision=fp32",
                           f"train.compile={compiled}") for lr in (1e-3, 3e-3)]
        train_group(cfgs, tmp_path / str(compiled), progress=False)
        losses[compiled] = [r["train_loss"] for c in cfgs
                            for r in logged(tmp_path / str(compiled) / c.run_id())
                            if "train_loss" in r]
    assert losses[True] == pytest.approx(losses[False], rel=1e-3)
