"""Training on the real corpus: loss goes down, divergence is data, resume is exact."""

import copy
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from subprocess_env import subprocess_env

from normlab.config import ConfigError, TrainConfig, load_run_config
from normlab.data.batches import BatchSampler
from normlab.train import CheckpointError, RunFolderError, read_summary, train_run
from normlab.train.divergence import SpikeDetector
from normlab.train.logging import read_metrics
from normlab.train.schedules import lr_at

TINY = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=8", "train.eval_batches=2", "train.log_every=1",
        "train.device=cpu"]
# Runs this short end above the byte unigram entropy of Shakespeare (3.33 nats): they come out
# `stalled` (trained every step, learned no context), never `completed`.
TIMING = ("time_s", "tokens_per_s")


def tiny(*extra: str):
    return load_run_config(None, TINY + list(extra))


def losses(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(
        run_dir / "metrics.jsonl")]


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_trains_and_lowers_loss(tmp_path, placement):
    cfg = tiny(f"model.placement={placement}", "train.steps=40", "train.lr=3e-3",
               "train.warmup=5", "train.eval_every=20")
    s = train_run(cfg, tmp_path, progress=False)
    assert s["outcome"] == "stalled" and s["step"] == 40
    rows = read_metrics(tmp_path / s["run_id"] / "metrics.jsonl")
    first, last = rows[0]["train_loss"], rows[-1]["train_loss"]
    assert last < first - 0.8, (first, last)
    assert s["val_loss"] < 4.5 < math.log(256)
    run_dir = tmp_path / s["run_id"]
    for name in ("config.yaml", "summary.json", "checkpoint/model.safetensors", "tb"):
        assert (run_dir / name).exists(), name


def test_absurd_lr_diverges_cleanly(tmp_path):
    cfg = tiny("model.placement=post", "train.steps=60", "train.lr=50", "train.grad_clip=null",
               "train.schedule=constant")
    s = train_run(cfg, tmp_path, progress=False)
    assert s["outcome"] == "diverged"
    assert s["reason"] in ("nonfinite_loss", "nonfinite_grad", "loss_spike")
    assert 1 <= s["step"] < 60
    rows = read_metrics(tmp_path / s["run_id"] / "metrics.jsonl")
    assert rows[-1]["step"] == s["step"] and rows[-1]["diverged"] == s["reason"]
    # a finished run is a result: asking again returns it without training
    assert train_run(cfg, tmp_path, progress=False) == s


def test_resume_is_bit_exact(tmp_path):
    args = ("train.steps=24", "train.eval_every=6", "train.block_stats_every=4",
            "train.warmup=4", "model.dropout=0.1", "train.grad_accum=2")
    full = train_run(tiny(*args), tmp_path / "a", progress=False)
    part = train_run(tiny(*args), tmp_path / "b", progress=False, interrupt_at=10)
    assert part["outcome"] == "interrupted" and part["step"] == 10
    # an extra metrics line written after the checkpoint (as after a crash) must not survive
    run_b = tmp_path / "b" / part["run_id"]
    with (run_b / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 11, "train_loss": 0.0}) + "\n")
    resumed = train_run(tiny(*args), tmp_path / "b", progress=False)
    assert resumed["outcome"] == full["outcome"] == "stalled"
    a, b = losses(tmp_path / "a" / full["run_id"]), losses(run_b)
    assert len(a) == len(b) == 24
    assert a == b  # every loss, lr, grad norm, val loss and block statistic identical
    assert full["val_loss"] == resumed["val_loss"]


def test_same_config_same_folder_and_seed_changes_it():
    assert tiny().run_id() == tiny().run_id()
    assert tiny().run_id() != tiny("train.seed=1").run_id()


def test_mismatched_and_corrupted_checkpoints(tmp_path):
    cfg = tiny("train.steps=6")
    s = train_run(cfg, tmp_path, progress=False, interrupt_at=3)
    ckpt = tmp_path / s["run_id"] / "checkpoint"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    (ckpt / "trainer_state.json").write_text(json.dumps(state | {"config_hash": "other"}))
    with pytest.raises(CheckpointError, match="another config"):
        train_run(cfg, tmp_path, progress=False)
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    (ckpt / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="corrupted"):
        train_run(cfg, tmp_path, progress=False)


def test_resume_refuses_without_checkpoint(tmp_path):
    with pytest.raises(RunFolderError, match="no checkpoint"):
        train_run(tiny("train.steps=2"), tmp_path, resume="require", progress=False)


def test_schedules():
    c = TrainConfig(lr=1.0, steps=100, warmup=0, schedule="cosine", min_lr_ratio=0.1)
    assert lr_at(0, c) == pytest.approx(1.0, abs=1e-3)
    assert lr_at(99, c) == pytest.approx(0.1)
    w = TrainConfig(lr=1.0, steps=100, warmup=10, schedule="linear", min_lr_ratio=0.0)
    assert [lr_at(i, w) for i in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert lr_at(99, w) == pytest.approx(0.0)
    inv = TrainConfig(lr=1.0, steps=100, warmup=4, schedule="inv_sqrt")
    assert lr_at(3, inv) == 1.0 and lr_at(15, inv) == pytest.approx(0.5)
    const = TrainConfig(lr=2.0, steps=10, schedule="constant")
    assert {lr_at(i, const) for i in range(10)} == {2.0}
    with pytest.raises(ValueError, match="warmup"):
        TrainConfig(schedule="inv_sqrt", warmup=0)


def test_spike_detector_fires_on_plateau_not_on_noise():
    d = SpikeDetector(factor=1.5, patience=5)
    assert not any(d.update(2.0 + 0.1 * ((-1) ** i)) for i in range(50))
    fired = [d.update(5.5) for _ in range(5)]
    assert fired == [False] * 4 + [True]


def test_bf16_autocast_trains(tmp_path):
    s = train_run(tiny("train.steps=10", "train.precision=bf16", "train.lr=3e-3"), tmp_path,
                  progress=False)
    assert s["outcome"] == "stalled" and s["train_loss"] < math.log(256)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "normlab", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          env=subprocess_env())


def test_cli_bad_config_exits_2_without_writing(tmp_path):
    r = _cli("train", "--set", "train.lr=-1", "--root", "runs", cwd=tmp_path)
    assert r.returncode == 2 and "train.lr" in r.stderr and "Traceback" not in r.stderr
    r = _cli("train", "--set", "data.source=missing.txt", "--root", "runs", cwd=tmp_path)
    assert r.returncode == 2 and "missing.txt" in r.stderr
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ConfigError, match="seq_len"):
        tiny("data.seq_len=64")


def test_cli_diverged_exits_0_and_sigterm_checkpoints(tmp_path):
    args = [*(f"--set={a}" for a in TINY), "--set=train.lr=50", "--set=train.grad_clip=null",
            "--set=train.steps=60", "--set=train.schedule=constant", "--quiet"]
    r = _cli("train", *args, cwd=tmp_path)
    assert r.returncode == 0 and "diverged" in r.stdout, r.stderr

    long = [*(f"--set={a}" for a in TINY), "--set=train.steps=100000", "--quiet",
            "--root=long"]
    proc = subprocess.Popen([sys.executable, "-m", "normlab", "train", *long], cwd=tmp_path,
                            env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = tmp_path / "long"
    deadline = time.time() + 60
    while time.time() < deadline:
        m = list(runs.glob("*/metrics.jsonl"))
        if m and len(m[0].read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    run_dir = [p for p in runs.iterdir() if read_summary(p)["outcome"] == "interrupted"][0]
    s = read_summary(run_dir)
    assert s["reason"] == "signal" and s["step"] >= 3
    state = json.loads((run_dir / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == s["step"]
    assert len(read_metrics(run_dir / "metrics.jsonl")) == s["step"]


def test_grad_accum_2x8_equals_one_batch_of_16(tmp_path, monkeypatch):
    """Two micro-batches of 8 and one batch of the same 16 sequences give the same step: the same
    mean loss, the same gradients (whole-model and per-block norms, before clipping) and so the
    same parameters, step after step. The model runs in float64; its cross-entropy runs in float32
    (the model casts logits to float32 for bf16's sake), so values agree to float32's ~1e-7,
    where a wrong division of the loss or a dropped micro-batch is off by percents."""
    halves = BatchSampler.offsets

    def offsets(self, step):  # the 16-sequence batch k holds the 8-sequence batches 2k and 2k+1
        if self.batch_size != 16:
            return halves(self, step)
        eight = copy.copy(self)
        eight.batch_size = 8
        return np.concatenate([halves(eight, 2 * step), halves(eight, 2 * step + 1)])

    monkeypatch.setattr(BatchSampler, "offsets", offsets)
    torch.set_default_dtype(torch.float64)
    try:
        common = ("train.steps=3", "train.block_stats_every=1", "train.eval_every=0",
                  "train.grad_clip=0.5", "train.lr=3e-3", "train.warmup=0")
        accum = train_run(tiny(*common, "train.grad_accum=2"), tmp_path / "a", progress=False)
        whole = train_run(tiny(*common, "train.batch_size=16"), tmp_path / "b", progress=False)
    finally:
        torch.set_default_dtype(torch.float32)
    assert accum["step"] == whole["step"] == 3, (accum, whole)
    ra, rb = (read_metrics(tmp_path / d / s["run_id"] / "metrics.jsonl")
              for d, s in (("a", accum), ("b", whole)))
    assert len(ra) == len(rb) == 3
    for a, b in zip(ra, rb, strict=True):
        keys = [k for k in a if k == "train_loss" or k.endswith("grad_norm")]
        assert len(keys) >= 6 and set(keys) <= set(b)  # loss, total and per-block grad norms
        for k in keys:
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=0), (a["step"], k)
        assert a["grad_norm"] > 0.5  # clipping was active, so it is checked too
    pa, pb = (load_file(tmp_path / d / s["run_id"] / "checkpoint" / "model.safetensors")
              for d, s in (("a", accum), ("b", whole)))
    assert pa.keys() == pb.keys()
    for k in pa:
        assert pa[k].dtype == torch.float64
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-6, atol=1e-9, msg=k)
