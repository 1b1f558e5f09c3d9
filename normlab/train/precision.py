"""The precision a run trains in: fp32, bf16 (autocast), or `auto`, which picks one of them.

`train.precision=bf16` runs the forward pass under bf16 autocast (`precision_context`). Whether
that pays depends on the hardware: on a CPU without native bf16 matrix instructions (neither
avx512_bf16 nor amx_bf16 among its flags, `normlab.train.machine.native_bf16`) PyTorch emulates bf16
matrix products, far slower than fp32. So a bf16 run on such a CPU warns before its first step,
with the measured ratio and how to train in fp32 (`warn_slow_bf16`).

`precision: auto` resolves once, when a run starts (`resolve_precision`): bf16 on a CUDA GPU that
supports it natively (compute capability 8.0 or later), fp32 on MPS, fp32 on a CPU without native
bf16, and on any other CPU the faster of the two by the measured ratio. The choice and why are
recorded in the run's config.yaml (`meta`) and summary; a resumed run keeps the recorded choice
(`run_precision`) and never measures again, so its numbers continue as they began.

The ratio (`bf16_ratio`) is of one matrix product at the model's MLP shape (tokens of a batch,
at most `PROBE_MAX_ROWS`, by d_model, times d_model by d_ff), bf16 against fp32, best of a few
repeats after a warm-up, kept once per machine and shape for 30 days (`RATIO_FILE` in normlab's
cache folder: delete it to measure again). It is not a full training step: on a CPU that
emulates bf16 one step of a width-256 model can take a minute, while this product takes a
fraction of a second there.
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import torch

from normlab.config import ModelConfig, RunConfig
from normlab.train.machine import cpu_model, kept_measurement, native_bf16
from normlab.warnings import NormlabWarning

PRECISIONS = ("fp32", "bf16")  # what a run trains in; `auto` resolves to one of them

# The product timed by `bf16_ratio`: the tokens of a batch, at most this many rows...
PROBE_MAX_ROWS = 512
# ...and fewer for a wide model, so that one product stays under this many multiply-adds (2^27:
# the width-256 default at 512 rows). An emulated bf16 product runs at about 1 GFLOP/s or less
# (a width-1024 product of 512 rows took 15 s on a CPU without native bf16 instructions).
PROBE_MAX_MACS = 2**27
PROBE_REPEATS = 5  # timed products per precision, the best of them counts...
PROBE_SECONDS = 1.0  # ...or as many as fit in this time, one at least
# `auto` picks bf16 on a CPU only when its product took at most this share of fp32's time: a
# smaller gain is within the measurement's noise and does not pay for bf16's rounding.
BF16_MAX_RATIO = 0.9


class Precision(NamedTuple):
    """The precision a run trains in (`fp32` or `bf16`), and why."""

    precision: str
    reason: str


def precision_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Around forward passes: bf16 autocast (matrix work in bfloat16, fp32 weights), or nothing."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# -- the measurement ------------------------------------------------------------------------------
def probe_shape(model: ModelConfig, tokens: int) -> tuple[int, int, int]:
    """(rows, d_model, d_ff) of the product `bf16_ratio` times for a model trained on batches of
    `tokens` tokens (see `PROBE_MAX_ROWS`, `PROBE_MAX_MACS`)."""
    d, f = model.d_model, model.ff_width
    rows = min(tokens, PROBE_MAX_ROWS, PROBE_MAX_MACS // (d * f))
    return max(1, rows), d, f


RATIO_FILE = "bf16_ratio.json"


def bf16_ratio(model: ModelConfig, tokens: int) -> float:
    """How many times as long a bf16 matrix product at the model's MLP shape takes as the same
    product in fp32 on this CPU, with the current thread count: measured once per machine and
    shape (in about a second at most) and kept with its date (`kept_measurement`, in
    `RATIO_FILE`). Measured in each process, the same shape on a shared CPU took 0.14x in one
    and 2.35x in the next, so two runs of one config trained in different precisions."""
    shape = probe_shape(model, tokens)
    threads = torch.get_num_threads()
    key = (f"{cpu_model()}, torch {torch.__version__}, {threads} threads, "
           f"{shape[0]}x{shape[1]} @ {shape[1]}x{shape[2]}")
    return kept_measurement(RATIO_FILE, key, "ratio", lambda: _measured_ratio(*shape, threads))


@functools.cache
def _measured_ratio(rows: int, d: int, f: int, threads: int) -> float:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(rows, d, generator=gen), torch.randn(d, f, generator=gen)
    operands = {"fp32": (a, b), "bf16": (a.bfloat16(), b.bfloat16())}
    for x, y in operands.values():  # warm-up: the first call picks and prepares its kernel
        torch.mm(x, y)
    best = dict.fromkeys(operands, float("inf"))
    deadline = time.perf_counter() + PROBE_SECONDS
    for _ in range(PROBE_REPEATS):  # alternating, so that a change of load hits both alike
        for name, (x, y) in operands.items():
            t0 = time.perf_counter()
            torch.mm(x, y)
            best[name] = min(best[name], time.perf_counter() - t0)
        if time.perf_counter() > deadline:
            break
    return best["bf16"] / max(best["fp32"], 1e-9)


def _measured(ratio: float) -> str:
    times = f"{ratio:.2f}" if ratio < 10 else f"{ratio:.0f}"
    return (f"a bf16 matrix product at this model's shape took {times}x the time of the fp32 one "
            "here")


def emulated_bf16(device: torch.device) -> bool:
    """Whether bf16 matrix products on `device` are emulated: a CPU whose flags show no native
    bf16 instructions (a CPU whose flags are unknown is not claimed to)."""
    return device.type == "cpu" and native_bf16() is False


_NO_NATIVE = "a CPU without native bf16 (neither avx512_bf16 nor amx_bf16 among its flags)"


# -- the choice -----------------------------------------------------------------------------------
def choose_precision(asked: str, device: torch.device, model: ModelConfig, tokens: int
                     ) -> Precision:
    """The precision of `asked` (`train.precision`) on `device`, for a model trained on batches
    of `tokens` tokens: fp32 and bf16 as they are; `auto` as the module docstring says."""
    if asked != "auto":
        return Precision(asked, f"train.precision={asked}")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return Precision("bf16", f"auto: {name} supports bf16 natively")
        return Precision("fp32", f"auto: {name} has no native bf16 (before compute capability "
                         "8.0, bf16 is emulated)")
    if device.type != "cpu":
        return Precision("fp32", f"auto: fp32 on {device.type} (bf16 is chosen on CUDA GPUs "
                         "that support it natively, and by measurement on a CPU)")
    native = native_bf16()
    ratio = bf16_ratio(model, tokens)
    if native is False:
        return Precision("fp32", f"auto: {cpu_model()} is {_NO_NATIVE}; {_measured(ratio)}")
    cpu = cpu_model() + (" (native bf16)" if native else " (its bf16 flags unknown)")
    if ratio <= BF16_MAX_RATIO:
        return Precision("bf16", f"auto: on {cpu}, {_measured(ratio)}")
    return Precision("fp32", f"auto: on {cpu}, {_measured(ratio)}; bf16 is chosen only at "
                     f"{BF16_MAX_RATIO}x or less")


def resolve_precision(cfg: RunConfig, device: torch.device) -> Precision:
    """The precision the run of `cfg` trains in on `device` when it starts (see
    `choose_precision`); `auto` measures (`bf16_ratio`) on a CPU."""
    return choose_precision(cfg.train.precision, device, cfg.model,
                            cfg.train.batch_size * cfg.data.seq_len)


def recorded_precision(run_dir: Path) -> Precision | None:
    """The precision the run folder's config.yaml records (`meta.precision`, with its
    `precision_reason`), or None: no folder, no such record (written before there was one), or a
    file that cannot be read."""
    from normlab.train.rundir import RunFolderError, read_config_data

    try:
        meta = read_config_data(run_dir).get("meta")
    except RunFolderError:
        return None
    if not isinstance(meta, dict) or meta.get("precision") not in PRECISIONS:
        return None
    return Precision(meta["precision"], str(meta.get("precision_reason") or ""))


def run_precision(cfg: RunConfig, run_dir: Path, device: torch.device) -> Precision:
    """The precision the run of `cfg` in `run_dir` trains in: for `auto`, the one its folder
    recorded when it began (a resume never decides again: its numbers continue as they began),
    else `resolve_precision`."""
    if cfg.train.precision == "auto":
        recorded = recorded_precision(run_dir)
        if recorded is not None:
            return recorded
    return resolve_precision(cfg, device)


# -- the warning ----------------------------------------------------------------------------------
ADVICE = ("Train in fp32 instead: --set train.precision=fp32, or `precision: fp32` under "
          "`train:` in the config (`precision: auto` picks the faster of the two)")


def slow_bf16_note(precision: str, device: torch.device, ratio: float) -> str | None:
    """Why a bf16 run on `device` will crawl, with the measured `ratio` (`bf16_ratio`), or None
    where bf16 is not emulated there (`emulated_bf16`)."""
    if precision != "bf16" or not emulated_bf16(device):
        return None
    return (f"train.precision=bf16 on {cpu_model()}, {_NO_NATIVE}: {_measured(ratio)}, so every "
            f"training step will be far slower than in fp32. {ADVICE}")


_slow_bf16_warned = False  # `warn_slow_bf16` says it once per process


def warn_slow_bf16(cfg: RunConfig, precision: str, device: torch.device) -> None:
    """Warn (once per process) when the run of `cfg` trains in bf16 on a CPU that emulates it,
    with the ratio measured at its shape; nothing is measured otherwise."""
    global _slow_bf16_warned
    if _slow_bf16_warned or precision != "bf16" or not emulated_bf16(device):
        return
    _slow_bf16_warned = True
    ratio = bf16_ratio(cfg.model, cfg.train.batch_size * cfg.data.seq_len)
    warnings.warn(slow_bf16_note(precision, device, ratio), NormlabWarning, stacklevel=3)


def timing_precision(asked: str, model: ModelConfig) -> tuple[str, list[str]]:
    """For `normlab plan --time`, which times a step of batch 8 x min(128, max_seq_len) tokens
    on the CPU (`normlab.train.perf.steady_step_report`): the precision to time it in, and what
    to say before timing when the config asks for bf16 or auto. A bf16 step where bf16 is
    emulated is not timed (it can take a minute): the step is timed in fp32, and the note gives
    the measured ratio and the advice."""
    if asked == "fp32":
        return "fp32", []
    cpu, tokens = torch.device("cpu"), 8 * min(128, model.max_seq_len)
    choice = choose_precision(asked, cpu, model, tokens)
    if choice.precision == "bf16" and emulated_bf16(cpu):
        note = slow_bf16_note("bf16", cpu, bf16_ratio(model, tokens))
        return "fp32", [f"{note}. Timed in fp32 here: a bf16 step would take far longer."]
    return choice.precision, [f"precision: {choice.precision} ({choice.reason})"]


def asked_precision(config: Path | None, sets: list[str] | None) -> tuple[str, list[str]]:
    """For `normlab plan --time`: the precision a run config asks for (the file's
    `train.precision`, then `--set train.precision=...`; fp32 when neither says), and the other
    `--set` items (the model's). `ConfigError` for a precision that is not one."""
    from normlab.config import TrainConfig, load_yaml, parse_config, parse_overrides

    train = load_yaml(Path(config)).get("train") if config is not None else None
    asked = train.get("precision", "fp32") if isinstance(train, dict) else "fp32"
    rest = []
    for item in sets or []:
        if item.partition("=")[0].strip() == "train.precision":
            asked = parse_overrides([item])["train"]["precision"]
        else:
            rest.append(item)
    return parse_config(TrainConfig, {"precision": asked}).precision, rest
