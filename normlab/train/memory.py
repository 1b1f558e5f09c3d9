"""Memory a model and its training need, estimated from the config before anything is allocated,
so a size that cannot fit (`model.d_model=1e9`, `train.batch_size=1e8`) is refused with the
estimate and the memory available instead of ending in an allocator traceback.

The estimate is a lower bound, so a run that fits is never refused: the weights, and for
training their gradients and the two AdamW moments (fp32, 16 bytes a parameter); the
activations a backward pass keeps, counted as 6 d + 2 f values per token and block (two norm
outputs, Q, K, V and the attention output; f the MLP width, in and out of its activation)
without the T x T attention scores or the transient tensors of the backward pass, plus the
logits and their gradient. With activation checkpointing, one block's activations and every
block's input. (Checked against the tensors autograd saves, tests/cli/test_cli_errors.py.)

A stacked group (`normlab.train.group`) of M runs needs M times a member's estimate
(`group_estimate`); on a GPU the sweep sizes its groups to fill `GPU_GROUP_MARGIN` of the free
memory (`runs_that_fit`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from normlab.config import ConfigError, ModelConfig, RunConfig

GIB = 2**30
# The share of a GPU's free memory a stacked group is sized to fill. The estimate is a lower
# bound (no attention scores, no transient tensors of the backward pass, no allocator
# fragmentation, no token data on the device), so a fifth of the free memory is left for them.
GPU_GROUP_MARGIN = 0.8


@dataclass(frozen=True)
class MemoryEstimate:
    params: int
    weight_bytes: int  # weights, and for training their gradients and AdamW moments
    activation_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.activation_bytes

    def describe(self) -> str:
        return (f"at least {_size(self.total_bytes)} ({self.params:,} parameters: "
                f"{_size(self.weight_bytes)}; activations {_size(self.activation_bytes)})")


def param_count(cfg: ModelConfig) -> int:
    """Parameters of the model of `cfg` (norm gains and biases aside)."""
    from normlab.train.perf import matmul_params

    d = cfg.d_model
    embeddings = cfg.vocab_size * d + (cfg.max_seq_len * d if cfg.positions == "learned" else 0)
    tied_head = cfg.vocab_size * d if cfg.kind == "decoder" and cfg.tie_embeddings else 0
    return matmul_params(cfg) - tied_head + embeddings


def estimate(cfg: ModelConfig, batch_size: int, seq_len: int, *, training: bool = True,
             activation_checkpointing: bool = False, bytes_per_activation: int = 4,
             processes: int = 1) -> MemoryEstimate:
    """Lower bound of the memory of a forward and backward pass over `batch_size` sequences of
    `seq_len` tokens (with `training`, also the optimizer state), on `processes` processes
    that each hold the model and share the batch."""
    n = param_count(cfg)
    weight_bytes = processes * n * (16 if training else 8)
    tokens = batch_size * seq_len
    per_block = (6 * cfg.d_model + 2 * cfg.ff_width) * tokens
    if activation_checkpointing:
        stored = cfg.n_blocks * cfg.d_model * tokens + per_block
    else:
        stored = cfg.n_blocks * per_block
    outputs = cfg.vocab_size if cfg.kind == "decoder" else cfg.n_classes
    logits = 2 * tokens * outputs if cfg.kind == "decoder" else 2 * batch_size * outputs
    return MemoryEstimate(n, weight_bytes, (stored + logits) * bytes_per_activation)


def available_bytes(device: str = "cpu") -> tuple[int | None, str]:
    """Free memory of `device` ("cpu", "cuda", "mps" or "auto") and what it is, e.g.
    `(17_000_000_000, "RAM available")`; None when it cannot be read."""
    if device in ("auto", "cuda"):
        import torch

        if torch.cuda.is_available():
            free, _ = torch.cuda.mem_get_info()
            return free, f"free on {torch.cuda.get_device_name()}"
    return _ram_available(), "RAM available"


def check_fits(est: MemoryEstimate, device: str, what: str, fix: str) -> None:
    """`ConfigError` naming `what` when `est` exceeds the free memory of `device`."""
    available, where = available_bytes(device)
    if available is not None and est.total_bytes > available:
        raise ConfigError(f"{what}: needs {est.describe()}, but {_size(available)} is {where}; "
                          f"{fix}")


def activation_bytes(precision: str, device: str) -> int:
    """Bytes of one stored activation of a run in `precision` (`train.precision`) on `device`
    (`train.device`): bf16's 2, and `auto`'s on a GPU, where it picks bf16, counted as 2 too,
    so the estimate stays a lower bound; else fp32's 4."""
    if precision == "bf16":
        return 2
    if precision == "auto" and device in ("auto", "cuda"):
        import torch

        return 2 if torch.cuda.is_available() else 4
    return 4


def run_estimate(cfg: RunConfig, processes: int = 1) -> MemoryEstimate:
    """The memory estimate of training `cfg` on `processes` processes."""
    t = cfg.train
    return estimate(cfg.model, t.batch_size, cfg.data.seq_len,  # batch_size: one micro-batch
                    activation_checkpointing=t.activation_checkpointing,
                    bytes_per_activation=activation_bytes(t.precision, t.device),
                    processes=processes)


def group_estimate(cfg: RunConfig, members: int) -> MemoryEstimate:
    """The memory estimate of training `members` runs of `cfg` as one stacked group: each
    member's weights, gradients and AdamW moments, the [M, P] copy of the gradients the stacked
    optimizer clips (4 bytes a parameter), and its activations (the stack's are [M, B, T, ...])."""
    one = run_estimate(cfg)
    return MemoryEstimate(members * one.params, members * (one.weight_bytes + 4 * one.params),
                          members * one.activation_bytes)


def runs_that_fit(cfg: RunConfig, free_bytes: int, margin: float = GPU_GROUP_MARGIN) -> int:
    """How many runs of `cfg` one stacked group may hold so that its `group_estimate` stays
    within `margin` of `free_bytes`; at least 1 (a run that does not fit alone is refused by
    `check_run_fits`, not here)."""
    return max(1, int(free_bytes * margin) // group_estimate(cfg, 1).total_bytes)


def check_run_fits(cfg: RunConfig, processes: int = 1, what: str | None = None) -> None:
    """Refuse a training run whose memory estimate exceeds what its device has free."""
    check_fits(run_estimate(cfg, processes), cfg.train.device, what or f"run {cfg.run_id()}",
               "lower model.d_model, model.n_blocks, train.batch_size or data.seq_len "
               "(train.grad_accum keeps the tokens per step with a smaller batch)")


def _ram_available() -> int | None:
    """MemAvailable of /proc/meminfo, capped by a cgroup memory limit; else physical RAM."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            free = int(limit) - used
            available = free if available is None else min(available, free)
    except (OSError, ValueError):
        pass
    if available is None:
        try:
            available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    return available


def _size(n: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", GIB), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 1024:,.1f} KiB"
