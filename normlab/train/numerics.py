"""The numerics a run computes with besides its config: float32 matrix precision (TF32) and
deterministic algorithms, recorded and kept across a resume.

On an Ampere or later GPU, `torch.set_float32_matmul_precision("high")` (or the older
`torch.backends.cuda.matmul.allow_tf32 = True`) makes every fp32 matrix product round its inputs
to TF32's 10 mantissa bits, and `torch.backends.cudnn.allow_tf32` does the same for cuDNN: a line
in a user's script changes every number of a run. So the flags in force (`numerics_in_force`) are
recorded in each run's `meta` (config.yaml) and in its checkpoint, and a resume under other flags
trains under the recorded ones, with a warning, as it takes the recorded CPU thread count
(`match_numerics`); `kept_numerics` puts the caller's flags back when the run ends.

`train.deterministic` (`deterministic_algorithms`): `torch.use_deterministic_algorithms(True)`
for the run (an operation without a deterministic implementation raises at the first step that
uses it, naming it, rather than leaving the run quietly non-deterministic); cuBLAS's fixed
workspace (`CUBLAS_WORKSPACE_CONFIG=:4096:8`), which cuBLAS reads when it creates its handle, so
it is set before the run's first CUDA call; and attention through the math kernel of
`scaled_dot_product_attention`, since the fused GPU kernels' backward passes add partial sums
with atomics and torch only warns about them. GPU kernels that split a sum by atomics otherwise
make two runs of one config differ in the last bits.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from normlab.warnings import NormlabWarning

CUBLAS_WORKSPACE = "CUBLAS_WORKSPACE_CONFIG"
DETERMINISTIC_WORKSPACE = ":4096:8"  # cuBLAS's documented setting for reproducible results
MATMUL_PRECISIONS = ("highest", "high", "medium")
# the fused kernels of scaled_dot_product_attention (the math kernel stays on): switches, states
_SDP = torch.backends.cuda
FUSED_ATTENTION = {"flash": _SDP.enable_flash_sdp, "mem_efficient": _SDP.enable_mem_efficient_sdp,
                   "cudnn": _SDP.enable_cudnn_sdp}
FUSED_ATTENTION_ENABLED = {"flash": _SDP.flash_sdp_enabled,
                           "mem_efficient": _SDP.mem_efficient_sdp_enabled,
                           "cudnn": _SDP.cudnn_sdp_enabled}
# the recorded flags: name -> type (what a checkpoint's `numerics` must hold)
FLAGS = {"float32_matmul_precision": str, "cuda_matmul_allow_tf32": bool,
         "cudnn_allow_tf32": bool, "deterministic": bool}


def numerics_in_force() -> dict[str, Any]:
    """The process's flags that change a run's numbers: the float32 matmul precision (`highest`:
    full fp32; `high`: TF32 on CUDA matmuls), cuDNN's TF32, and deterministic algorithms."""
    return {"float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "deterministic": torch.are_deterministic_algorithms_enabled()}


def numerics_problem(recorded: Any) -> str | None:
    """What is wrong with a recorded `numerics` entry (None: usable)."""
    if not isinstance(recorded, dict):
        return f"numerics is {recorded!r}, not an object"
    for name, kind in FLAGS.items():
        if not isinstance(recorded.get(name), kind):
            return f"numerics.{name} is {recorded.get(name)!r}, not a {kind.__name__}"
    if recorded["float32_matmul_precision"] not in MATMUL_PRECISIONS:
        return (f"numerics.float32_matmul_precision is {recorded['float32_matmul_precision']!r},"
                f" not one of {', '.join(MATMUL_PRECISIONS)}")
    return None


def _set_tf32(recorded: dict[str, Any]) -> None:
    # the precision first: it sets allow_tf32 too, which the next line then pins as recorded
    torch.set_float32_matmul_precision(recorded["float32_matmul_precision"])
    torch.backends.cuda.matmul.allow_tf32 = recorded["cuda_matmul_allow_tf32"]
    torch.backends.cudnn.allow_tf32 = recorded["cudnn_allow_tf32"]


def match_numerics(recorded: dict[str, Any] | None, where: Path) -> None:
    """Make a resumed run compute with the TF32 flags its checkpoint recorded, warning when they
    differ from this process's (a checkpoint without them, from an earlier version, changes
    nothing). Deterministic algorithms follow the run's config (`train.deterministic`)."""
    if recorded is None:
        return
    now = numerics_in_force()
    differ = [k for k in FLAGS if k != "deterministic" and recorded[k] != now[k]]
    if not differ:
        return
    _set_tf32(recorded)
    said = ", ".join(f"{k}={recorded[k]} (not {now[k]})" for k in differ)
    warnings.warn(f"{where}: resuming with the float32 matmul flags it was trained with, {said}, "
                  "so that its numbers continue exactly", NormlabWarning, stacklevel=3)


def deterministic_algorithms() -> None:
    """Deterministic algorithms from here on (see the module docstring); a process whose CUDA
    already ran without cuBLAS's fixed workspace is warned that it may come too late."""
    if os.environ.get(CUBLAS_WORKSPACE) is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            warnings.warn(f"train.deterministic: CUDA was initialised before {CUBLAS_WORKSPACE} "
                          f"was set; start the process with {CUBLAS_WORKSPACE}="
                          f"{DETERMINISTIC_WORKSPACE} for deterministic cuBLAS products",
                          NormlabWarning, stacklevel=2)
        os.environ[CUBLAS_WORKSPACE] = DETERMINISTIC_WORKSPACE
    torch.use_deterministic_algorithms(True)
    for enable in FUSED_ATTENTION.values():
        enable(False)


@contextlib.contextmanager
def kept_numerics() -> Iterator[None]:
    """Around a run: whatever it sets (a resume's recorded flags, deterministic algorithms), the
    caller's flags are back when it ends."""
    before = numerics_in_force()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    attention = {name: enabled() for name, enabled in FUSED_ATTENTION_ENABLED.items()}
    try:
        yield
    finally:
        _set_tf32(before)
        torch.use_deterministic_algorithms(before["deterministic"], warn_only=warn_only)
        for name, enabled in attention.items():
            FUSED_ATTENTION[name](enabled)
