"""Memory checks look at the device the work runs on: `normlab probe` runs on the CPU, so its
check reads the RAM even where a GPU is visible; a run in `precision: auto` on a GPU is counted
at bf16's size, the precision `auto` picks there."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from normlab.cli.app import app
from normlab.config import ConfigError, load_run_config
from normlab.train import memory


def test_probe_checks_the_memory_of_the_cpu_it_runs_on(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    asked = []

    def available(device: str = "cpu"):
        asked.append(device)
        raise ConfigError("checked")  # stop here: the probe itself is not the point

    monkeypatch.setattr(memory, "available_bytes", available)
    r = CliRunner().invoke(app, ["probe", "--width", "32", "--blocks", "2"])
    assert r.exit_code == 2 and "checked" in r.output, r.output
    assert asked == ["cpu"]


@pytest.mark.parametrize("gpu, device, bytes_", [
    (True, "auto", 2), (True, "cuda", 2), (True, "cpu", 4), (False, "auto", 4)])
def test_auto_precision_is_counted_at_bf16s_size_on_a_gpu(monkeypatch, gpu, device, bytes_):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    assert memory.activation_bytes("auto", device) == bytes_
    cfg = load_run_config(None, [f"train.device={device}", "train.precision=auto"])
    fp32 = load_run_config(None, [f"train.device={device}", "train.precision=fp32"])
    bf16 = load_run_config(None, [f"train.device={device}", "train.precision=bf16"])
    want = bf16 if bytes_ == 2 else fp32
    assert memory.run_estimate(cfg) == memory.run_estimate(want)
