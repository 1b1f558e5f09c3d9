"""Performance accounting: the model FLOPs a training step needs, and the GEMM peak a machine
reaches, so throughput can be stated as model FLOPs utilization (MFU).

MFU follows PaLM (Chowdhery et al. 2022, arXiv 2204.02311, App. B): a trained token costs
`6 N + 12 L d T` FLOPs, where N counts the weights that take part in matrix multiplies (every
block's projections and the output head; embeddings are lookups), L the blocks, d the width and T
the context. The attention term counts the full T x T score matrix, as PaLM does, although a
causal model needs only half of it. Norms, activations and the optimizer are not counted, so MFU
is the share of the measured GEMM peak that went into the model's own matrix work.
"""

from __future__ import annotations

import functools
import statistics
import time

import torch

from normlab.config import ModelConfig
from normlab.train.machine import kept_measurement


def matmul_params(cfg: ModelConfig) -> int:
    """Weights used in matrix multiplies: attention and MLP projections, and the output head."""
    d, f = cfg.d_model, cfg.ff_width
    mlp_in = 2 * f if cfg.mlp == "swiglu" else f
    per_block = 3 * d * d + d * d + d * mlp_in + f * d
    head = d * cfg.vocab_size if cfg.kind == "decoder" else d * cfg.n_classes
    return cfg.n_blocks * per_block + head


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Forward plus backward FLOPs of one trained token (PaLM's accounting, see above)."""
    return 6 * matmul_params(cfg) + 12 * cfg.n_blocks * cfg.d_model * seq_len


def gemm_peak_tflops(dtype: torch.dtype, device: torch.device | str = "cpu", *,
                     sizes: tuple[int, ...] = (1024, 2048, 4096), seconds: float = 1.0) -> float:
    """The best TFLOP/s of square matrix multiplies of the given sizes, each for about `seconds`.

    The best, not the mean, of many repeats: a peak is what the hardware reaches when nothing else
    runs, and the denominator of MFU should not absorb other load.
    """
    return max(_gemm_tflops(dtype, torch.device(device), n, seconds) for n in sizes)


def _gemm_tflops(dtype: torch.dtype, device: torch.device, size: int, seconds: float) -> float:
    # its own generator: a peak measured in the middle of a run (the progress line's MFU) must
    # not draw from the global one, which the run's dropout uses
    gen = torch.Generator(device).manual_seed(0)
    a = torch.randn(size, size, device=device, generator=gen).to(dtype)
    b = torch.randn(size, size, device=device, generator=gen).to(dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):
        torch.mm(a, b, out=out)
    sync()
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best / 1e12


PEAK_FILE = "gemm_peak.json"


@functools.cache
def quick_peak_tflops(dtype: torch.dtype, device_type: str) -> float:
    """`gemm_peak_tflops` in about 0.2 s: the denominator of the MFU that a training run's
    progress line shows (benchmarks measure the peak longer). Measured once per machine, not per
    process (`normlab.train.machine.kept_measurement`, in `PEAK_FILE`), keyed by the device,
    dtype, torch version and CPU thread count. Re-measured in every process, a shared CPU's peak
    swung by 3x, and with it the MFU of the same step."""
    sizes = (2048, 4096) if device_type == "cuda" else (512, 1024)
    return kept_measurement(PEAK_FILE, peak_key(dtype, device_type), "tflops", lambda: (
        gemm_peak_tflops(dtype, device_type, sizes=sizes, seconds=0.1)))


def peak_key(dtype: torch.dtype, device_type: str) -> str:
    """What a cached peak belongs to: the device by name, the dtype, torch, the CPU threads."""
    from normlab.train.machine import cpu_model

    device = torch.cuda.get_device_name() if device_type == "cuda" else cpu_model()
    threads = f", {torch.get_num_threads()} threads" if device_type == "cpu" else ""
    dtype_name = str(dtype).removeprefix("torch.")
    return f"{device_type}: {device}, {dtype_name}, torch {torch.__version__}{threads}"


def steady_step_seconds(step, *, warmup: int = 3, repeats: int = 10,
                        device: torch.device | str = "cpu") -> float:
    """The median time of `step()` (e.g. a forward and backward) after `warmup` untimed calls:
    the first calls pay for allocation, lazy initialization and cold caches, so they say nothing
    about the steady rate."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def steady_step_report(cfg: ModelConfig, *, batch: int = 8, seq_len: int | None = None,
                       warmup: int = 3, repeats: int = 10, seed: int = 0,
                       precision: str = "fp32") -> str:
    """One line on the steady forward+backward time of the model of `cfg` on random tokens:
    the median of `repeats` after `warmup` untimed steps, its tokens/s, and the MFU against
    this machine's measured GEMM peak in `precision` (CPU, fp32 or bf16 autocast; what
    `normlab plan --time` prints)."""
    from normlab.nn import build_model
    from normlab.train.precision import precision_context

    seq_len = seq_len or min(128, cfg.max_seq_len)
    with torch.random.fork_rng(devices=[]):  # build_model seeds the global generator
        model = build_model(cfg, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=gen)
    targets = (idx if cfg.kind == "decoder"
               else torch.randint(0, cfg.n_classes, (batch,), generator=gen))

    def step() -> None:
        with precision_context(precision, torch.device("cpu")):
            loss = model(idx, targets).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    seconds = steady_step_seconds(step, warmup=warmup, repeats=repeats)
    tokens_per_s = batch * seq_len / seconds
    peak = gemm_peak_tflops(torch.bfloat16 if precision == "bf16" else torch.float32)
    mfu = tokens_per_s * train_flops_per_token(cfg, seq_len) / (peak * 1e12)
    return (f"steady forward+backward{' in bf16' if precision == 'bf16' else ''}, batch {batch} "
            f"x {seq_len} tokens: {seconds * 1e3:.1f} ms (median of {repeats} after {warmup} "
            f"warm-up steps), {tokens_per_s:,.0f} tokens/s, MFU {mfu:.1%} of the measured "
            f"{precision} GEMM peak ({peak * 1e3:,.0f} GFLOP/s)")
