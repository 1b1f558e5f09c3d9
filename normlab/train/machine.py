"""The machine: what a measurement ran on (for benchmark and study records), the CPU threads a
process gets when several train at once, process-wide settings that make training on it faster,
and the measurements of it that are kept once per machine (`kept_measurement`)."""

from __future__ import annotations

import ctypes
import functools
import json
import math
import os
import platform
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

# d_model * batch_size * seq_len (a fine-tuning's: passages * bytes) of the largest CPU run that
# the sweep's `auto` rule stacks, per thread a run gets (`normlab.sweep.grouping.stacking_pays`,
# `normlab.finetune.runs.stacking_pays_here`). Measured with benchmarks/bench_batched.py (8 runs
# stacked vs one after another; results/bench_batched*.md). 2 threads: 1.86x at 32*8*32 and
# 1.65x at 64*8*32 (2 blocks); 1.20x at 32*16*64, 1.08x at 64*16*64, 1.01x at 128*16*64, 0.99x
# at 64*16*128 (6 blocks). 1 thread: 1.46x at 32*8*32, 1.24x at 64*8*32 (2 blocks); 0.95x at
# 32*16*64, 0.88x at 64*16*128.
AUTO_CPU_WORK_PER_THREAD = 64 * 8 * 32


# A measurement kept for a machine is taken again after this many days (a new driver, BIOS or
# load).
KEPT_MAX_AGE_DAYS = 30


def kept_measurement(file: str, key: str, field: str, measure: Callable[[], float]) -> float:
    """A number about this machine measured once, not once per process: kept with its date under
    `field` of entry `key` in `file` of normlab's cache folder (`normlab.data.corpus.cache_root`)
    and measured again (`measure()`) when the entry is missing, damaged, not a positive finite
    number or older than `KEPT_MAX_AGE_DAYS`. On a shared machine a quick timing swings by 3x
    and more from one process to the next; what is derived from it (an MFU, a precision chosen
    by speed) must not swing with it. The key names what the number belongs to (the device,
    torch, the threads, a shape)."""
    entry = _kept(file).get(key)
    if isinstance(entry, dict) and _fresh(entry, field):
        return float(entry[field])
    value = measure()
    _keep(file, key, {field: value, "measured": datetime.now(timezone.utc).isoformat(
        timespec="seconds")})
    return value


def _kept_file(file: str) -> Path:
    from normlab.data.corpus import cache_root

    return cache_root() / file


def _kept(file: str) -> dict[str, Any]:
    try:
        entries = json.loads(_kept_file(file).read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _fresh(entry: dict[str, Any], field: str) -> bool:
    try:
        measured = datetime.fromisoformat(entry["measured"])
        value = float(entry[field])
    except (KeyError, TypeError, ValueError):
        return False
    age = datetime.now(timezone.utc) - measured
    return value > 0 and math.isfinite(value) and timedelta(0) <= age < timedelta(
        days=KEPT_MAX_AGE_DAYS)


def _keep(file: str, key: str, entry: dict[str, Any]) -> None:
    """Add one entry to the file (written whole and renamed: a reader never sees half of it); a
    folder that cannot be written only costs the next process a measurement."""
    path = _kept_file(file)
    entries = _kept(file)
    entries[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass


def cpu_stacking_pays(work: int, threads: int) -> bool:
    """Whether stacking runs whose step computes `work` (`AUTO_CPU_WORK_PER_THREAD`'s product)
    pays on `threads` CPU threads a run."""
    return work <= AUTO_CPU_WORK_PER_THREAD * threads


def cpu_stacking_note(what: str, work: int, threads: int) -> str:
    """Why runs whose step computes `work` (`what`: the product's factors, in words) train alone
    on `threads` CPU threads: the note a plan shows."""
    return (f"auto: {what} = {work:,} above {AUTO_CPU_WORK_PER_THREAD * threads:,} "
            f"({AUTO_CPU_WORK_PER_THREAD:,} per CPU thread), where stacking does not pay on CPU")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as `lscpu` lists them (the `flags` line of /proc/cpuinfo, on ARM
    its `Features`); empty where the system does not say (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


# Flags of the instructions that multiply bf16 matrices in hardware: AVX512-BF16 and AMX on x86
# (oneDNN's bf16 GEMMs use them), BF16 on ARMv8.6. Without one of them PyTorch's CPU bf16 matrix
# products convert and multiply element by element, far slower than fp32.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def native_bf16() -> bool | None:
    """Whether this CPU has native bf16 matrix instructions (one of `NATIVE_BF16_FLAGS` among its
    flags); None where its flags are unknown."""
    flags = cpu_flags()
    if not flags:
        return None
    return any(f in flags for f in NATIVE_BF16_FLAGS)


def default_threads(workers: int) -> int:
    """The torch CPU threads of each of `workers` processes that share this process's CPUs."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        cpus = os.cpu_count() or 1
    return max(1, cpus // max(1, workers))


def git_commit() -> str | None:
    """The git commit of the normlab source that runs (with "+dirty" when tracked files differ
    from it), or None when normlab is not run from a git checkout or git is not available."""
    import subprocess

    src = Path(__file__).resolve().parents[1]  # the normlab package
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", *args], cwd=src, capture_output=True, text=True,
                                  timeout=5, check=True).stdout.strip()

        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "") if commit else None


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)
_allocator_tuned: bool | None = None


def tune_cpu_allocator() -> bool:
    """Keep freed memory in the process instead of handing it back to the kernel (glibc only).

    A training step frees and reallocates the same large activation buffers every step. By
    default glibc serves big blocks with fresh `mmap`s and trims the heap after frees, so every
    step page-faults its activations back in: measured here, ~100k faults and 13% of a bf16 step
    at width 512 (`benchmarks/bench_throughput.py`). With mmap off and trimming above 2 GiB the
    blocks are reused, as a caching allocator would. The process keeps its peak footprint, which
    a training process reaches anyway. Set NORMLAB_MALLOC_TUNING=0 to leave malloc alone.
    Returns whether the tuning is in effect.
    """
    global _allocator_tuned
    if _allocator_tuned is None:
        _allocator_tuned = False
        if os.environ.get("NORMLAB_MALLOC_TUNING", "1") != "0" and sys.platform == "linux":
            try:
                libc = ctypes.CDLL("libc.so.6")
                libc.gnu_get_libc_version  # noqa: B018 - glibc, not musl
                _allocator_tuned = bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(
                    libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
            except (OSError, AttributeError):
                pass
    return _allocator_tuned
