"""Executors: run a list of training runs on local worker processes or on a Ray cluster.

Both call the same `run_one` for each run, which trains (or resumes, or just reports) the run in
its own folder under the sweep root, holding the run's lock (`normlab.train.rundir`, the lock
`normlab train` takes too: a worker waits while another process trains the run). A worker
never prints progress; the sweep process reports through the `on_start` / `on_finish` callbacks.
A stacked group (`GroupTask`, see `normlab.sweep.grouping`) is one task on one local worker:
`run_group` holds every member's lock and trains them as one model; the Ray executor trains a
group's runs separately.

Local: `concurrent.futures.ProcessPoolExecutor` with the spawn context, at most `workers` runs in
flight, each worker limited to `threads` CPU threads (`torch.set_num_threads`; a run resuming from
a checkpoint uses the count recorded there, so its numbers continue exactly) and, where there
are GPUs, given one of them (`CUDA_VISIBLE_DEVICES`, round robin; by default one worker per
GPU, `default_workers`). Workers ignore SIGINT while
idle; during a run, SIGINT/SIGTERM make `train_run` checkpoint and return `interrupted`. A worker
whose parent dies (even by SIGKILL) sends itself SIGTERM, so an orphan checkpoints and stops
instead of training on. A worker that dies (segfault, OOM kill) breaks the pool: the runs it may
have been running are retried one at a time, and the one that kills its worker alone is recorded
`failed` (reason `worker_died`); a stacked group that kills its worker alone is retried as
separate runs. A pool whose workers all die before they start (a script without an
`if __name__ == "__main__":` guard: spawn re-runs it in each worker) is an `ExecutorError` at once.

A caller that makes many `run_local` calls of a few runs each (a study) wraps them in
`keep_local_workers()`: the calls then share one pool, so each worker process starts and imports
torch once (see that function). That holds on a GPU machine too: a worker keeps the GPU it was
given for its life, and a pool is kept for calls with the same workers, threads and GPU count.

Ray: `normlab.sweep.ray_executor`, which calls the same `run_one`.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from normlab.config import RunConfig, parse_config
from normlab.sweep.grouping import GroupTask, RunTask
from normlab.sweep.state import run_lock, run_state
from normlab.train.trainer import record_failure

EXECUTORS = ("local", "ray")
OnStart = Callable[[str], None]
OnFinish = Callable[[str, dict[str, Any], float], None]


class ExecutorError(RuntimeError):
    """An executor that cannot start (Ray missing, cluster unreachable or refusing us, local
    workers that die while starting)."""


# -- one run (in a worker) -------------------------------------------------------------------

_STOP: Any = None  # a multiprocessing Event in local workers: set when the sweep is stopping
_BUSY = threading.Event()  # set while this process trains (run_one, run_group)


def run_one(config: dict[str, Any], root: str, threads: int | None = None,
            run_id: str | None = None) -> tuple[dict[str, Any], float]:
    """Train one run in its folder under `root`; returns (summary, wall seconds). Never raises
    for a run's own failure: that is recorded in the run's summary as `failed`. `run_id` is the
    id the sweep planned; a worker whose normlab resolves the config to another id (the code
    changed under a running sweep, or a cluster node runs another version) refuses the run."""
    def train(cfgs: list[RunConfig]) -> list[dict[str, Any]]:
        from normlab.train import train_run

        return [train_run(cfgs[0], root, resume="auto", progress=False)]

    summaries, wall = _train_locked([config], root, threads,
                                    None if run_id is None else [run_id], train)
    return summaries[0], wall


def run_group(configs: list[dict[str, Any]], root: str, threads: int | None = None,
              run_ids: list[str] | None = None) -> tuple[list[dict[str, Any]], float]:
    """Train runs as one stacked group in their folders under `root`, holding every member's lock;
    returns (each member's summary, wall seconds), as `run_one` does for one run."""
    def train(cfgs: list[RunConfig]) -> list[dict[str, Any]]:
        from normlab.train.group import train_group

        by_id = train_group(cfgs, root)
        return [by_id[c.run_id()] for c in cfgs]

    return _train_locked(configs, root, threads, run_ids, train)


def _train_locked(configs: list[dict[str, Any]], root: str, threads: int | None,
                  run_ids: list[str] | None,
                  train: Callable[[list[RunConfig]], list[dict[str, Any]]]
                  ) -> tuple[list[dict[str, Any]], float]:
    """What `run_one` and `run_group` share: thread count, the planned-id check, every run's
    lock, the stop check, and failures before the trainer's own guard recorded per run."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    cfgs = [parse_config(RunConfig, c) for c in configs]
    ids = [c.run_id() for c in cfgs]
    if run_ids is not None and ids != list(run_ids):
        return [record_failure(Path(root) / planned, planned, "ConfigMismatch", (
            f"this worker's normlab resolves the run's config to {got}, not {planned}: the config "
            "schema differs between the sweep process and the worker (another normlab "
            "version); nothing was trained"))
            for planned, got in zip(run_ids, ids, strict=True)], 0.0
    _BUSY.set()
    try:
        with contextlib.ExitStack() as locks:
            for run_id in sorted(ids):  # one order everywhere: no two groups wait on each other
                locks.enter_context(run_lock(Path(root) / run_id))
            if _STOP is not None and _STOP.is_set():
                states = [run_state(Path(root) / i) for i in ids]
                return [summary or {"run_id": i, "outcome": outcome}
                        for i, (outcome, summary) in zip(ids, states, strict=True)], 0.0
            try:
                summaries = train(cfgs)
            except Exception as e:  # raised before the trainer's guard (checkpoint, data, device)
                summaries = [record_failure(Path(root) / i, i, e, tb=traceback.format_exc())
                             for i in ids]
    finally:
        _BUSY.clear()
    return summaries, time.perf_counter() - t0


# -- local processes ---------------------------------------------------------------------------

def _init_worker(threads: int, gpu_ids: Any, stop: Any, started: Any) -> None:
    global _STOP
    _STOP = stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # idle workers ignore Ctrl-C; runs handle it
    if gpu_ids is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu_ids.get())
    import torch

    torch.set_num_threads(threads)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    with started.get_lock():
        started.value += 1


def spawn_failure_message() -> str:
    """Why every worker of a pool died before it could start, and what to do. Mostly: a script
    that starts the sweep at its top level, which each spawned worker runs again on import."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    where = f"the main module ({main})" if main else "the main module"
    return (
        "the local workers died while starting, before any run began. With the spawn start "
        f"method each worker first imports {where}; a script that starts the sweep at its top "
        "level starts it again in every worker, which cannot start processes while it is "
        "starting itself, and dies. Put the script's work under `if __name__ == \"__main__\":` "
        "(docs/sweeps.md, 'From Python'). If it has that guard, the workers' own error output "
        "above says why they died.")


def _watch_parent(parent_pid: int) -> None:
    """Orphaned (the sweep process died, even by SIGKILL): a running run checkpoints and stops
    (SIGTERM), then the worker exits; an idle worker just exits. Nobody is left training."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)
    while _BUSY.is_set():
        time.sleep(0.2)
    os._exit(0)


AnyTask = RunTask | GroupTask


def runs_of(task: AnyTask) -> tuple[RunTask, ...]:
    return task.members if isinstance(task, GroupTask) else (task,)


CPU_WORKERS = 2  # local workers by default where the runs train on the CPU


def default_workers(configs: Sequence[RunConfig], cuda_available: bool) -> int:
    """The local workers of a sweep that asks for none: one per GPU when every run trains on
    CUDA (two processes on one GPU time-slice it, each waiting on the other's kernels, and one
    stacked group already fills it: `normlab.sweep.grouping`), else `CPU_WORKERS`."""
    from normlab.sweep.grouping import on_cuda

    if configs and cuda_available and all(on_cuda(c, True) for c in configs):
        import torch

        return max(1, torch.cuda.device_count())
    return CPU_WORKERS


def _gpu_count(tasks: list[AnyTask]) -> int:
    wants_gpu = any(t.config["train"]["device"] in ("auto", "cuda")
                    for task in tasks for t in runs_of(task))
    if not wants_gpu:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _context() -> mp.context.BaseContext:
    """spawn: each worker is a fresh interpreter whose parent is the sweep process, so the
    watchdog sees the sweep die. (forkserver starts faster, but its server outlives a SIGKILLed
    sweep and keeps its workers, and their run locks, alive: measured, not used.)"""
    return mp.get_context("spawn")


def _report(task: AnyTask, result: tuple[Any, float], on_finish: OnFinish) -> None:
    """Pass a task's result to `on_finish`, run by run (a group's wall time shared among its
    runs)."""
    summaries, wall = result
    runs = runs_of(task)
    if isinstance(task, RunTask):
        summaries = [summaries]
    for run, summary in zip(runs, summaries, strict=True):
        on_finish(run.run_id, summary, wall / len(runs))


class _Pool:
    """A local pool of worker processes and what its workers were started with."""

    def __init__(self, workers: int, threads: int, n_gpu: int) -> None:
        self.ctx = _context()
        self.key = (workers, threads, n_gpu)  # what a later call must ask for to share it
        self.stop = self.ctx.Event()
        self.started = self.ctx.Value("i", 0)  # workers that got through _init_worker
        gpu_ids = None
        if n_gpu:
            gpu_ids = self.ctx.Queue()
            for i in range(workers):
                gpu_ids.put(i % n_gpu)
        self.executor = ProcessPoolExecutor(max_workers=workers, mp_context=self.ctx,
                                            initializer=_init_worker,
                                            initargs=(threads, gpu_ids, self.stop, self.started))


# The pool `keep_local_workers` keeps open between `run_local` calls ({} inside it, before the
# first call; None outside it).
_KEPT: dict[str, _Pool] | None = None


@contextlib.contextmanager
def keep_local_workers() -> Iterator[None]:
    """Inside it, `run_local` calls with the same workers, threads and GPU count share one pool of
    worker processes: each worker starts (a fresh interpreter that imports torch, and on a GPU
    machine initialises CUDA: a few seconds) once, not once per call. Each worker keeps the GPU
    it was given (`CUDA_VISIBLE_DEVICES`, set when it starts) for its life, which is why the GPU
    count is part of what must match (`map_local`'s work on the CPU takes the pool whatever GPUs
    its workers hold). A study makes many calls of a few runs each. The pool is replaced when a
    worker dies or a call asks for other workers, threads or GPUs, dropped after Ctrl-C, and shut
    down when the block ends. A run's numbers do not depend on the process that trains it (a run
    is a function of its config)."""
    global _KEPT
    if _KEPT is not None:  # nested: the outer block keeps the pool
        yield
        return
    _KEPT = {}
    try:
        yield
    finally:
        kept, _KEPT = _KEPT, None
        if kept:
            kept["pool"].executor.shutdown(wait=True, cancel_futures=True)


def _take_pool(workers: int, threads: int, n_gpu: int | None) -> tuple[_Pool, bool]:
    """A pool for one `run_local` or `map_local` call, and whether it is kept open after it:
    inside `keep_local_workers`, the kept pool when it was started with these workers, threads
    and GPU count (its workers' GPUs, assigned at their start, then fit the call; `n_gpu` None,
    for work on the CPU alone, takes it whatever GPUs they hold), else a new pool that replaces
    it; outside, a pool of the call's own."""
    if _KEPT is None:
        return _Pool(workers, threads, n_gpu or 0), False
    kept = _KEPT.get("pool")
    if kept is not None and kept.key[:2] == (workers, threads) \
            and n_gpu in (None, kept.key[2]) and not kept.stop.is_set() \
            and not getattr(kept.executor, "_broken", False):  # (a worker died while idle)
        return kept, True
    if kept is not None:
        kept.executor.shutdown(wait=True, cancel_futures=True)
    _KEPT["pool"] = _Pool(workers, threads, n_gpu or 0)
    return _KEPT["pool"], True


def _drop_kept(pool: _Pool) -> None:
    if _KEPT is not None and _KEPT.get("pool") is pool:
        del _KEPT["pool"]


def map_local(fn: Callable[[Any], Any], items: Sequence[Any], *, workers: int, threads: int
              ) -> list[Any]:
    """`[fn(item) for item in items]`, on the pool of worker processes that an enclosing
    `keep_local_workers` block keeps (started here if it has none yet), else in this process.
    A study's measurements at init are many small independent models: one thread each on every
    core does them faster than every thread on each in turn. `fn` and the items must pickle
    (`fn` a module-level function). The results come back in order; an exception of `fn`
    propagates. A worker that dies leaves its items, and every one not yet done, to this
    process; Ctrl-C cancels what has not started."""
    items = list(items)
    if _KEPT is None or len(items) < 2:
        return [fn(item) for item in items]
    pool, _kept = _take_pool(workers, threads, None)  # any GPUs its workers hold go unused
    futures = [pool.executor.submit(fn, item) for item in items]
    out: list[Any] = []
    try:
        for i, fut in enumerate(futures):
            try:
                out.append(fut.result())
            except BrokenProcessPool:
                _drop_kept(pool)
                pool.executor.shutdown(wait=True, cancel_futures=True)
                return out + [fn(item) for item in items[i:]]
    except KeyboardInterrupt:
        for fut in futures:
            fut.cancel()
        raise
    return out


def run_local(tasks: list[AnyTask], root: Path, *, workers: int, threads: int,
              on_start: OnStart, on_finish: OnFinish) -> None:
    """Run every task on `workers` local processes. Ctrl-C (KeyboardInterrupt) asks running runs
    to checkpoint, waits for them, reports them, and re-raises; a second Ctrl-C kills them."""
    n_gpu = _gpu_count(tasks)
    pending: deque[AnyTask] = deque(tasks)
    suspects: deque[AnyTask] = deque()   # in flight when a worker died: retried one at a time
    in_flight: dict[Future, AnyTask] = {}
    pool, kept = _take_pool(workers, threads, n_gpu)

    alone: AnyTask | None = None      # the suspect now running by itself, if any

    def submit(task: AnyTask) -> None:
        try:
            if isinstance(task, GroupTask):
                fut = pool.executor.submit(run_group, [t.config for t in task.members],
                                           str(root), threads, list(task.run_ids))
            else:
                fut = pool.executor.submit(run_one, task.config, str(root), threads,
                                           task.run_id)
        except BrokenProcessPool as e:  # a worker died before the task went out: as if after
            fut = Future()
            fut.set_exception(e)
        in_flight[fut] = task
        for run_id in task.run_ids:
            on_start(run_id)

    killed, done_cleanly = False, False
    try:
        while pending or suspects or in_flight:
            if suspects:
                if not in_flight:
                    task = suspects.popleft()
                    alone = task
                    submit(task)
            else:
                alone = None
                while pending and len(in_flight) < workers:
                    submit(pending.popleft())
            done, _ = wait(list(in_flight), timeout=1.0, return_when=FIRST_COMPLETED)
            broken: list[AnyTask] = []
            for fut in done:
                task = in_flight.pop(fut)
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    broken.append(task)
                    continue
                except Exception as e:  # e.g. a result that could not be sent back
                    for run in runs_of(task):
                        on_finish(run.run_id, record_failure(root / run.run_id, run.run_id,
                                                             e), 0.0)
                    continue
                _report(task, result, on_finish)
            if broken and pool.started.value == 0:  # no worker ever started: retrying cannot help
                raise ExecutorError(spawn_failure_message())
            if broken:  # a worker died; every run in flight is a suspect
                broken.extend(in_flight.values())
                in_flight.clear()
                pool.executor.shutdown(wait=True, cancel_futures=True)
                if len(broken) == 1 and isinstance(alone, GroupTask) and broken[0] is alone:
                    suspects.extend(alone.members)  # (out of memory?) its runs, one at a time
                elif len(broken) == 1 and broken[0] is alone:
                    task = broken[0]  # it killed its worker while running alone: the culprit
                    summary = record_failure(
                        root / task.run_id, task.run_id, "worker_died",
                        "the worker process running this run died (killed, out of memory, or "
                        "crashed); its last checkpoint is kept")
                    on_finish(task.run_id, summary, 0.0)
                else:
                    suspects.extendleft(reversed(broken))
                if kept:
                    _drop_kept(pool)
                pool, kept = _take_pool(workers, threads, n_gpu)
        done_cleanly = True
    except KeyboardInterrupt:
        killed = _stop_local(pool.executor, in_flight, pool.stop, root, on_finish)
        raise
    finally:
        if not (kept and done_cleanly):  # a kept pool stays open for the next call
            if kept:
                _drop_kept(pool)
            pool.executor.shutdown(wait=not killed, cancel_futures=True)


def _stop_local(pool: ProcessPoolExecutor, in_flight: dict[Future, AnyTask], stop: Any,
                root: Path, on_finish: OnFinish) -> bool:
    """Ask running runs to checkpoint (SIGINT) and report them; True if a second Ctrl-C made us
    kill the workers instead."""
    stop.set()
    pids = list(getattr(pool, "_processes", {}) or {})
    try:
        while in_flight:
            for pid in pids:  # repeated: a worker that was just starting a run gets it too
                with _suppress():
                    os.kill(pid, signal.SIGINT)
            done, _ = wait(list(in_flight), timeout=1.0, return_when=FIRST_COMPLETED)
            for fut in done:
                task = in_flight.pop(fut)
                try:
                    _report(task, fut.result(), on_finish)
                except Exception:
                    for run in runs_of(task):
                        on_finish(run.run_id, run_state(root / run.run_id)[1], 0.0)
    except KeyboardInterrupt:  # second Ctrl-C: no more waiting
        for pid in pids:
            with _suppress():
                os.kill(pid, signal.SIGKILL)
        return True
    return False


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return exc[0] is not None and issubclass(exc[0], ProcessLookupError | PermissionError)
