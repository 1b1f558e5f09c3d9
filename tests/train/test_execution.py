"""Execution options change how a run is computed, not what: bf16 attention path, activation
checkpointing, torch.compile, and the FLOPs accounting the throughput benchmark reports."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import normlab.nn.layers as layers
from normlab.config import load_run_config, make_model_config
from normlab.nn import build_model
from normlab.train import train_run
from normlab.train.logging import read_metrics
from normlab.train.perf import gemm_peak_tflops, matmul_params, train_flops_per_token


def _grads(model, x) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    model(x, x).loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


# -- attention ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_explicit_attention_matches_fused_kernel(kind, monkeypatch):
    cfg = make_model_config(kind=kind, n_blocks=2, d_model=32, n_heads=4, max_seq_len=16)
    model = build_model(cfg, seed=0)
    x = torch.randint(0, 256, (3, 16))
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[1, 10:] = 0
    kwargs = {"attention_mask": mask} if kind == "encoder" else {}
    monkeypatch.setattr(layers, "explicit_attention_pays", lambda q: False)
    fused = model.stream(x, **kwargs)
    monkeypatch.setattr(layers, "explicit_attention_pays", lambda q: True)
    explicit = model.stream(x, **kwargs)
    torch.testing.assert_close(explicit, fused, rtol=1e-5, atol=1e-5)


def test_explicit_attention_is_chosen_for_bf16_on_cpu_within_its_memory_bound():
    small = torch.zeros(16, 4, 256, 64, dtype=torch.bfloat16)
    assert layers.explicit_attention_pays(small)
    assert not layers.explicit_attention_pays(small.float())
    huge = torch.zeros(16, 16, 2048, 1, dtype=torch.bfloat16)  # 2^30 scores
    assert not layers.explicit_attention_pays(huge)


def test_bf16_attention_paths_agree():
    q, k, v = (torch.randn(2, 4, 64, 16) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    cfg = make_model_config(n_blocks=1, d_model=64, n_heads=4, max_seq_len=64)
    attn = build_model(cfg).blocks[0].attn.fn
    got, _ = attn._explicit(*(t.bfloat16() for t in (q, k, v)), None, 0.0)
    torch.testing.assert_close(got.float(), ref, rtol=0.05, atol=0.03)


# -- activation checkpointing --------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [
    {"placement": "pre"}, {"placement": "post"}, {"placement": "resi_dual"},
    {"placement": "admin"}, {"placement": "b2t"},
    {"placement": "pre", "residual_attention": True},  # scores carried from block to block
    {"placement": "sandwich", "dropout": 0.1},  # recomputation must redraw the same masks
], ids=lambda o: "-".join(str(v) for v in o.values()))
def test_activation_checkpointing_gives_the_same_gradients(overrides):
    cfg = make_model_config(n_blocks=3, d_model=32, n_heads=2, max_seq_len=16, **overrides)
    x = torch.randint(0, 256, (2, 16))
    grads = []
    for on in (False, True):
        model = build_model(cfg, seed=0)
        model.activation_checkpointing = on
        torch.manual_seed(7)
        grads.append(_grads(model, x))
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


def test_activation_checkpointing_keeps_fewer_activations():
    """Saved-for-backward bytes: with checkpointing only block inputs survive the forward."""
    cfg = make_model_config(n_blocks=8, d_model=32, n_heads=2, max_seq_len=32)
    x = torch.randint(0, 256, (4, 32))
    saved = {}
    for on in (False, True):
        model = build_model(cfg, seed=0)
        model.activation_checkpointing = on
        sizes: list[int] = []

        def pack(t: torch.Tensor, sizes=sizes) -> torch.Tensor:
            sizes.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(x, x).loss
        loss.backward()
        saved[on] = sum(sizes)
    assert saved[True] < saved[False] / 3, saved


# -- runs ----------------------------------------------------------------------------------------
def _cfg(*sets):
    return load_run_config(None, [
        "model.n_blocks=2", "model.d_model=64", "model.n_heads=2", "model.max_seq_len=64",
        "data.seq_len=64", "train.batch_size=8", "train.log_every=1", "train.eval_every=0",
        "train.eval_batches=2", "train.device=cpu", *sets])


def _losses(root, summary) -> list[float]:
    return [r["train_loss"] for r in read_metrics(root / summary["run_id"] / "metrics.jsonl")]


def test_execution_options_keep_the_run_id():
    base = _cfg()
    assert _cfg("train.compile=true").run_id() == base.run_id()
    assert _cfg("train.activation_checkpointing=true").run_id() == base.run_id()
    assert _cfg("train.precision=bf16").run_id() != base.run_id()  # changes the numbers


def test_bf16_run_trains_and_tracks_fp32(tmp_path):
    curves = {}
    for precision in ("fp32", "bf16"):
        s = train_run(_cfg("train.steps=40", f"train.precision={precision}", "train.lr=3e-3"),
                      tmp_path / precision, progress=False)
        assert s["outcome"] == "stalled"  # 40 steps: above the unigram entropy
        curves[precision] = _losses(tmp_path / precision, s)
    fp32, bf16 = curves["fp32"], curves["bf16"]
    assert sum(bf16[-5:]) / 5 < bf16[0] - 1.0  # it learns
    assert abs(sum(bf16[-5:]) - sum(fp32[-5:])) / 5 < 0.05  # and follows fp32


def test_checkpointed_run_resumes_without_checkpointing(tmp_path):
    """Same run folder: started with activation checkpointing, finished without, and the curve
    equals an uninterrupted run without it."""
    plain = train_run(_cfg("train.steps=6"), tmp_path / "a", progress=False)
    first = train_run(_cfg("train.steps=6", "train.activation_checkpointing=true"),
                      tmp_path / "b", progress=False, interrupt_at=3)
    assert first["outcome"] == "interrupted"
    done = train_run(_cfg("train.steps=6"), tmp_path / "b", progress=False)
    assert done["outcome"] == plain["outcome"] == "stalled" and done["run_id"] == plain["run_id"]
    assert _losses(tmp_path / "b", done) == _losses(tmp_path / "a", plain)


def test_compiled_run_matches_eager(tmp_path):
    losses = {}
    for compiled in (False, True):
        s = train_run(_cfg("train.steps=4", f"train.compile={compiled}"),
                      tmp_path / str(compiled), progress=False)
        assert s["outcome"] == "stalled", s
        losses[compiled] = _losses(tmp_path / str(compiled), s)
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)


# -- FLOPs accounting ----------------------------------------------------------------------------
@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_matmul_params_count_the_built_models_linear_weights(mlp):
    cfg = make_model_config(n_blocks=3, d_model=48, n_heads=3, mlp=mlp)
    model = build_model(cfg)
    linear = sum(m.weight.numel() for m in model.blocks.modules()
                 if isinstance(m, torch.nn.Linear))
    assert matmul_params(cfg) == linear + model.lm_head.weight.numel()
    assert train_flops_per_token(cfg, 128) == 6 * matmul_params(cfg) + 12 * 3 * 48 * 128


def test_gemm_peak_is_a_plausible_rate():
    # One thread, so the bounds are per core and a busy second core cannot stall a barrier.
    # Upper: physics. fp32 has no matrix units on x86; AVX-512 with two FMA ports does
    # 2 x 16 lanes x 2 FLOPs = 64 FLOP/cycle, and no core clocks above 6 GHz: 0.384 TFLOP/s.
    # Lower: this machine (AMD EPYC, AVX-512 on 256-bit units, 32 FLOP/cycle) measures
    # 0.10 TFLOP/s for this 128^3 GEMM on one core (0.44 on two for large GEMMs); a tenth of
    # that leaves room for a loaded machine and older CPUs (one AVX2 FMA port at 2 GHz: 0.032
    # peak), and still catches a rate counted off by a factor of n (FLOPs n^2 instead of 2 n^3).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tflops = gemm_peak_tflops(torch.float32, sizes=(128,), seconds=0.05)
    finally:
        torch.set_num_threads(threads)
    assert 0.01 < tflops < 64 * 6e9 / 1e12, tflops


# -- allocator ------------------------------------------------------------------------------------
_FAULTS = """
import resource, sys, torch
from normlab.train.machine import tune_cpu_allocator
print(tune_cpu_allocator(), file=sys.stderr)
for _ in range(6):  # glibc settles on reusing the block after a few rounds
    torch.empty(8 << 20).fill_(1.0)  # 32 MiB
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    torch.empty(8 << 20).fill_(1.0)  # freed and allocated again, as activations are each step
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt")
def test_tuned_allocator_reuses_freed_blocks():
    faults = {}
    for tuning in ("1", "0"):
        env = {**os.environ, "NORMLAB_MALLOC_TUNING": tuning}
        out = subprocess.run([sys.executable, "-c", _FAULTS], env=env, capture_output=True,
                             text=True, check=True)
        faults[tuning] = int(out.stdout.split()[-1])
    block = (32 << 20) // 4096
    assert faults["0"] > 10 * block, faults  # untuned: every block is faulted in again
    # tuned: the block is reused; a stray small allocation may split it and force the odd fresh
    # fault-in (seen once per run on some machines), never one per round
    assert faults["1"] <= 4 * block, faults
