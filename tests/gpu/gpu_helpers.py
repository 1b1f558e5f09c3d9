"""What the tests of tests/gpu share: the device they train on, their skip mark, small run configs
and how two run folders are compared.

These tests train on a CUDA GPU; without one they are skipped, with the reason. `make gpu-check`
runs them (with `pytest -n 8`) together with the GPU benchmarks (benchmarks/README.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from normlab.config import RunConfig, load_run_config
from normlab.train.logging import read_metrics

# cuBLAS reads its workspace setting when it creates its handle, at the process's first matrix
# product on the GPU: set here, at collection, before any test runs one. Deterministic algorithms
# (the bit-exact resume tests) refuse cuBLAS products without it.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

DEVICE = "cuda"  # where these tests train
REPO = Path(__file__).resolve().parents[2]

needs_gpu = pytest.mark.skipif(
    DEVICE == "cuda" and not torch.cuda.is_available(),
    reason="no CUDA GPU on this machine (tests/gpu trains on one; `make gpu-check` runs them)")

# the values a run logs that depend on the wall clock, not on what it computed
TIMING = ("time_s", "tokens_per_s", "mfu")

# a small Pre-LN run on Shakespeare bytes: 2 blocks of width 64 (4 heads of 16), batch 8
SMALL = ["model.placement=pre", "model.n_blocks=2", "model.d_model=64", "model.n_heads=4",
         "train.batch_size=8", "train.eval_batches=2", "train.log_every=1",
         f"train.device={DEVICE}"]


def run_config(*sets: str, context: int = 64) -> RunConfig:
    """A run of `SMALL` at `context` tokens, with `sets` (FIELD=VALUE) on top."""
    return load_run_config(None, [*SMALL, f"model.max_seq_len={context}",
                                  f"data.seq_len={context}", *sets])


def logged(run_dir: Path) -> list[dict]:
    """metrics.jsonl's records without their timings."""
    return [{k: v for k, v in r.items() if k not in TIMING}
            for r in read_metrics(run_dir / "metrics.jsonl")]


def tensors(run_dir: Path, name: str = "model") -> dict[str, torch.Tensor]:
    """A run's checkpointed `name` tensors (model or optimizer)."""
    return load_file(run_dir / "checkpoint" / f"{name}.safetensors")


def key_bias_free(name: str, t: torch.Tensor) -> torch.Tensor:
    """`t` without the attention key bias, where `name` is a fused Q/K/V projection's bias
    (`...attn.fn.qkv.bias`, [Q | K | V]): softmax is unchanged by adding one number to every
    score of a row, and q.b_k is such a number, so the key bias has no gradient but rounding
    noise, which Adam's normalised steps turn into moves of +-lr that differ between any two
    implementations. Every other tensor is returned whole."""
    if not name.endswith("attn.fn.qkv.bias"):
        return t
    d = t.shape[-1] // 3
    return torch.cat([t[..., :d], t[..., 2 * d:]], dim=-1)


def weight_differences(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]
                       ) -> dict[str, float]:
    """Per tensor (the key bias left out): |a - b| / |a|, in float64."""
    assert a.keys() == b.keys()
    out = {}
    for name in a:
        x, y = (key_bias_free(name, t).double() for t in (a[name], b[name]))
        out[name] = ((x - y).norm() / x.norm().clamp_min(1e-12)).item()
    return out
