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
    (out / "log.txt").write_text(done.stdout + done.stderr)
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
    # meta.device as the run resolved it ("cuda": torch's current device)
    assert {d.split(":")[0] for d in study["runs_by_device"]} == {DEVICE}


def test_the_ladders_at_init_measure_on_the_gpu(gpu_tiny_study):
    log = (gpu_tiny_study / "log.txt").read_text()
    assert f"seeds at init on {DEVICE}" in log, log[-3000:]


def test_the_ladders_on_the_gpu_equal_those_on_the_cpu(tmp_path):
    """The models at init are the CPU's (built there, then moved): their statistics, Admin's
    output change and the init-to-init distances agree in fp32; the first updates are finite
    (dropout draws differ between the devices' generators)."""
    import math

    from normlab.study.experiments import StudyFolder
    from normlab.study.ladders import fairseq_ladder
    from normlab.study.profiles import PROFILES

    p = PROFILES["tiny"]
    rungs = fairseq_ladder(p.width, p.heads)[:2]
    got = {}
    for device in ("cpu", DEVICE):
        folder = StudyFolder(tmp_path / device, p, log=lambda _m: None, device=device)
        got[device] = (folder.init_ladder("init", rungs, ["pre", "post"], p.init_depths,
                                          perturb=True),
                       folder.update_ladder("update", [(rungs[0], 5e-4)], p.init_depths,
                                            steps=2, warmup=1))
    (cpu_init, cpu_update), (dev_init, dev_update) = got["cpu"], got[DEVICE]
    for key, rows in cpu_init.items():
        for placement, want in rows.items():
            have = dev_init[key][placement]
            for a, b in zip(want, have, strict=True):
                assert b["perturb_change"] == pytest.approx(a["perturb_change"], rel=1e-2)
                for name, value in a["stats"]["summary"].items():
                    assert b["stats"]["summary"][name] == pytest.approx(value, rel=1e-2,
                                                                        abs=1e-6), name
    for key, want in cpu_update.items():
        have = dev_update[key]
        assert [r["distance"] for r in have["init_distance"]] == pytest.approx(
            [r["distance"] for r in want["init_distance"]], rel=1e-3)
        assert all(math.isfinite(u) for rows in have["series"].values() for r in rows
                   for u in r["update"])
