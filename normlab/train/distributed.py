"""Data-parallel training of one run across processes (DistributedDataParallel).

A run's results do not depend on the number of processes N: `train.batch_size` is the global
batch, every rank draws the same global batch from the step-indexed `BatchSampler` and trains on
its own contiguous shard of `batch_size / N` rows. DDP averages the gradients (so clipping and the
gradient norm are the same on every rank), the logged losses are all-reduced means, and the stop
decision (signal, divergence) is made from identical or all-reduced values, so all ranks stop at
the same step. Rank 0 alone writes the run folder.

Processes come from `torchrun --nproc-per-node N -m normlab train ...` or from
`normlab train --nproc N ...`, which starts N local ranks itself (`launch`). Backend: gloo on
CPU, nccl on CUDA with one GPU per rank (`LOCAL_RANK`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as tdist
from torch import nn

from normlab.config import ConfigError

TIMEOUT_ENV = "NORMLAB_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0


def timeout_s() -> float:
    """Seconds a rank waits for the others in one collective before it fails (a crashed or
    stuck rank must not hang the rest forever); `NORMLAB_DIST_TIMEOUT_S` overrides the default."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"{TIMEOUT_ENV}={raw!r}: need a positive number of seconds")
    return value


@dataclass(frozen=True)
class Dist:
    """This process's place in the process group; `Dist()` is a single process, where every
    collective is the identity."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")  # where collectives run (cuda for nccl)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes the run folder and prints."""
        return self.rank == 0

    def train_device(self, device: torch.device) -> torch.device:
        """The device this rank trains on: its own GPU (`LOCAL_RANK`) when the run is on CUDA."""
        if self.enabled and device.type == "cuda":
            return torch.device("cuda", self.local_rank)
        return device

    def shard(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's contiguous rows of a global batch (`check_divisible` ran before)."""
        if not self.enabled:
            return x, y
        rows = x.shape[0] // self.world_size
        part = slice(self.rank * rows, (self.rank + 1) * rows)
        return x[part], y[part]

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of `value` over ranks (every rank gets it); `value` itself in one process.
        With equal shards, the mean of per-shard means is the mean over the global batch."""
        if not self.enabled:
            return value
        t = value.detach().to(self.device, copy=True)
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
        return (t / self.world_size).to(value.device)

    def max(self, value: int) -> int:
        """The largest `value` over ranks (e.g. a stop code: any rank's signal stops all)."""
        if not self.enabled:
            return value
        t = torch.tensor(value, dtype=torch.int64, device=self.device)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        return int(t.item())

    def barrier(self) -> None:
        if self.enabled:
            tdist.barrier()

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module to train: DDP around `model` in a process group, `model` itself alone."""
        if not self.enabled:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def sync_context(self, net: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
        """Around a micro-batch's forward and backward: DDP's `no_sync` unless `sync` (the last
        micro-batch of a step), so gradients are all-reduced once per optimizer step."""
        if sync or not self.enabled:
            return contextlib.nullcontext()
        return net.no_sync()


SINGLE = Dist()
"""One process, no process group."""


def current() -> Dist:
    """The `Dist` of the initialized process group, or a single process when there is none."""
    if not (tdist.is_available() and tdist.is_initialized()):
        return SINGLE
    rank, world = tdist.get_rank(), tdist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = (torch.device("cuda", local) if tdist.get_backend() == "nccl"
              else torch.device("cpu"))
    return Dist(rank, world, local, device)


def env_world_size() -> int:
    """N when this process was started as one rank of N (torchrun or `--nproc`), else 1."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_divisible(batch_size: int, world_size: int) -> int:
    """Rows per rank; a clear error when the global batch does not split evenly."""
    if batch_size % world_size:
        raise ConfigError(
            f"train.batch_size={batch_size} is the global batch and must be divisible by the "
            f"number of processes ({world_size}); set train.batch_size to a multiple of "
            f"{world_size} or use a process count that divides {batch_size}")
    return batch_size // world_size


def _ways_out(processes: int) -> str:
    return (f"train on one GPU with --nproc 1, or on {processes} CPU processes with --set "
            "train.device=cpu")


def check_gpus(device: torch.device, processes: int) -> None:
    """`ConfigError` (before any process starts) when a CUDA run on `processes` local processes,
    one GPU each, would find fewer GPUs than that: a rank would start on a device that does not
    exist ("invalid device ordinal") and rank 0 wait for it until the collective timeout."""
    if device.type != "cuda" or processes <= 1:
        return
    visible = torch.cuda.device_count()
    if visible < processes:
        raise ConfigError(f"--nproc {processes}: a CUDA run takes one GPU a process, and "
                          f"{visible} {'is' if visible == 1 else 'are'} visible; "
                          + _ways_out(processes))


def check_local_rank(device: torch.device) -> None:
    """`ConfigError` when this rank (started by torchrun) would train on a GPU that is not
    there: its `LOCAL_RANK` is at least the number of visible GPUs."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    visible = torch.cuda.device_count()
    if device.type == "cuda" and local >= visible:
        raise ConfigError(f"LOCAL_RANK={local}: a CUDA run takes one GPU a process, and {visible} "
                          f"{'is' if visible == 1 else 'are'} visible; start at most {visible} "
                          f"process(es) a node (torchrun --nproc-per-node {visible}), or "
                          + _ways_out(env_world_size()))


@contextlib.contextmanager
def process_group(device: torch.device) -> Iterator[Dist]:
    """Join the process group described by the environment (`RANK`, `WORLD_SIZE`,
    `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`, as torchrun sets them) for the duration; a
    single process (no `WORLD_SIZE` > 1) yields `Dist()` and joins nothing. A group the caller
    initialised already is used as it is, unless it is a gloo group and the run is on CUDA
    (DDP's gradients would go through the CPU): that is a `ConfigError`."""
    if tdist.is_available() and tdist.is_initialized():
        if device.type == "cuda" and tdist.get_backend() != "nccl":
            raise ConfigError(f"a CUDA run in a {tdist.get_backend()} process group: initialise "
                              "it with the nccl backend, or train on the CPU (--set "
                              "train.device=cpu)")
        yield current()
        return
    if env_world_size() <= 1:
        yield current()
        return
    wait = timedelta(seconds=timeout_s())
    if device.type == "cuda":
        check_local_rank(device)
        local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(local)
        # device_id binds the group to this rank's GPU at once (no guess at the first collective)
        tdist.init_process_group("nccl", timeout=wait, device_id=local)
    else:
        tdist.init_process_group("gloo", timeout=wait)
    try:
        yield current()
    except BaseException:
        tdist.destroy_process_group()  # another rank may be gone: no barrier that could hang
        raise
    _leave_together(device, min(wait, timedelta(seconds=TEARDOWN_WAIT_S)))
    tdist.destroy_process_group()


# How long a rank that finished waits for the others before it tears the group down anyway.
TEARDOWN_WAIT_S = 60


def _leave_together(device: torch.device, wait: timedelta) -> None:
    """Wait (at most `wait`) until every rank has finished before the group is destroyed: a
    rank that tears gloo down while another still talks to it can abort the process
    ("terminate called without an active exception") after its results are written."""
    try:
        if device.type == "cuda":
            tdist.barrier()
        else:
            tdist.monitored_barrier(timeout=wait)
    except RuntimeError:
        pass  # a rank that did not arrive in time: tear down anyway, as before


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: list[str], nproc: int) -> int:
    """Run `python -m normlab <args>` as ranks 0..nproc-1 of one local process group and wait.

    SIGINT/SIGTERM are passed on to every rank (which checkpoint and stop together); a second
    one kills them. Once a rank has exited with an error, the others get the collective timeout
    plus a grace period before they are killed. Returns rank 0's exit code when it is not 0,
    else the first non-zero one, else 0.
    """
    env = os.environ | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                        "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc)}
    procs = [subprocess.Popen([sys.executable, "-m", "normlab", *args],
                              env=env | {"RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(nproc)]
    signals: list[int] = []

    def forward(signum, _frame) -> None:
        signals.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL if len(signals) > 1 else signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    deadline = None
    try:
        while any(p.poll() is None for p in procs):
            if deadline is None and any(p.poll() not in (None, 0) for p in procs):
                deadline = time.monotonic() + timeout_s() + 30
            if deadline is not None and time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.1)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    codes = [p.wait() for p in procs]
    return codes[0] or next((c for c in codes if c), 0)
