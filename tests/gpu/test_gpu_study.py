"""`normlab study --profile tiny` on a GPU machine, as a user runs it (a fresh process, the
checkout on PYTHONPATH): every claim runs to a verdict or a stated reason, none fails, and the
report is written. The study is pointed at the GPU (`--device cuda`): its runs must record that
they trained there, and study.json the device, its name, CUDA's version and the numerics flags."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import yaml
from gpu_helpers import DEVICE, REPO, needs_gpu
from subprocess_env import subprocess_env

from normlab.study.claims import ALL_CLAIMS

pytestmark = needs_gpu


@pytest.fixture(scope="session")
def gpu_tiny_study(tmp_path_factory):
    """The tiny study, run once (a session fixture: in a parallel run it starts first)."""
    out = tmp_path_factory.mktemp("gpu-study")
    cmd = [sys.executable, "-m", "normlab", "study", "--profile", "tiny", "--out", str(out),
           "--device", DEVICE]
    done = subprocess.run(cmd, cwd=REPO, env=subprocess_env(HF_HUB_OFFLINE="1"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_the_tiny_study_completes(gpu_tiny_study):
    out = gpu_tiny_study
    study = json.loads((out / "study.json").read_text())
    assert [c["id"] for c in study["claims"]] == list(ALL_CLAIMS)
    failed = {c["id"]: c["note"] for c in study["claims"]
              if str(c.get("note") or "").startswith("the experiment failed")}
    assert not failed, failed
    assert (out / "report.html").stat().st_size > 10_000


def test_the_study_trains_where_it_is_told(gpu_tiny_study):
    out = gpu_tiny_study
    devices = {yaml.safe_load(p.read_text())["meta"]["device"].split(":")[0]
               for p in out.glob("runs/*/config.yaml")}
    assert devices == {DEVICE}
    study = json.loads((out / "study.json").read_text())
    assert study["device"] == DEVICE and study["cuda"] == torch.version.cuda
    assert study["device_name"] == torch.cuda.get_device_name()
    assert study["numerics"]["float32_matmul_precision"] in ("highest", "high", "medium")
    assert [p["device"] for p in study["parts"]] == [DEVICE]
    assert set(study["runs_by_device"]) == {"cuda:0"}
