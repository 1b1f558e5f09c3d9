"""`keep_local_workers`: inside it, `run_local` calls share one pool of worker processes (the
study's many small calls start their workers once); outside it, each call has its own."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import normlab.sweep.executors as executors
from normlab.config import load_run_config
from normlab.sweep.executors import keep_local_workers, run_local
from normlab.sweep.grouping import RunTask

TINY = ["model.n_blocks=1", "model.d_model=16", "model.n_heads=2", "model.max_seq_len=16",
        "data.seq_len=16", "train.steps=2", "train.batch_size=4", "train.eval_batches=1",
        "train.eval_every=2", "train.checkpoint_every=2"]
# (train.device left at auto: on a GPU machine the workers hold a GPU each, and their pool is
# kept as a CPU machine's is; nothing here depends on where the runs train)


def task(lr: float) -> RunTask:
    cfg = load_run_config(None, [*TINY, f"train.lr={lr}"])
    return RunTask(cfg.run_id(), cfg.to_dict())


@pytest.fixture
def pools(monkeypatch):
    """Every pool `run_local` starts, in order."""
    made: list[executors._Pool] = []
    real = executors._Pool

    def counting(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(executors, "_Pool", counting)
    return made


def run(tasks: list[RunTask], root, threads: int = 1) -> dict[str, str]:
    outcomes: dict[str, str] = {}
    run_local(tasks, root, workers=1, threads=threads, on_start=lambda _r: None,
              on_finish=lambda r, s, _w: outcomes.__setitem__(r, s["outcome"]))
    return outcomes


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def workers_of(pool: executors._Pool) -> set[int]:
    return set(pool.executor._processes or {})


def test_calls_inside_share_one_pool_until_it_cannot_serve_and_it_ends_with_the_block(
        pools, tmp_path):
    with keep_local_workers():
        first = run([task(1e-3)], tmp_path)
        (pool,) = pools
        started = workers_of(pool)
        second = run([task(2e-3)], tmp_path)
        assert len(pools) == 1 and workers_of(pool) == started  # the same worker trained both
        with keep_local_workers():  # nested: still the outer block's pool
            run([task(3e-3)], tmp_path)
        assert len(pools) == 1
        run([task(4e-3)], tmp_path, threads=2)  # workers started with another thread count
        assert len(pools) == 2 and executors._KEPT["pool"] is pools[1]
        assert not any(alive(pid) for pid in started)  # the first pool was shut down
        pools[1].stop.set()  # as after Ctrl-C: its workers refuse new runs
        run([task(5e-3)], tmp_path, threads=2)
        assert len(pools) == 3 and executors._KEPT["pool"] is pools[2]
        last = workers_of(pools[2])
    assert set(first.values()) | set(second.values()) <= {"completed", "stalled"}
    assert len(first) == len(second) == 1
    assert not any(alive(pid) for pid in last)  # shut down when the block ended
    assert executors._KEPT is None


def test_a_pool_whose_workers_hold_gpus_is_kept_too(pools, tmp_path, monkeypatch):
    """On a machine with a GPU (here one, as `_gpu_count` says) each worker is given one when it
    starts and keeps it: the calls of a study share the pool as on a CPU, and a call that asks
    for another number of GPUs gets a pool of its own."""
    monkeypatch.setattr(executors, "_gpu_count", lambda tasks: 1)
    with keep_local_workers():
        first = run([task(1e-3)], tmp_path)
        (pool,) = pools
        started = workers_of(pool)
        second = run([task(2e-3)], tmp_path)
        assert len(pools) == 1 and workers_of(pool) == started and pool.key == (1, 1, 1)
        # work on the CPU alone (a study's measurements at init) takes it as it is
        squares = executors.map_local(_pid_and_square, [2, 3], workers=1, threads=1)
        assert [v for _p, v in squares] == [4, 9] and {p for p, _v in squares} <= started
        assert len(pools) == 1
        monkeypatch.setattr(executors, "_gpu_count", lambda tasks: 0)
        run([task(3e-3)], tmp_path)
        assert len(pools) == 2 and executors._KEPT["pool"].key == (1, 1, 0)
        assert not any(alive(pid) for pid in started)
    assert {*first.values(), *second.values()} <= {"completed", "stalled"}


def test_outside_the_block_each_call_has_its_own_pool(pools, tmp_path):
    run([task(1e-3)], tmp_path)
    run([task(2e-3)], tmp_path)
    assert len(pools) == 2 and executors._KEPT is None
    assert all(not workers_of(p) for p in pools)  # each shut down after its call


def test_a_worker_that_dies_while_idle_in_a_kept_pool_is_replaced(pools, tmp_path):
    """Killed between two calls: the next call starts a new pool, whether the pool already
    knew its worker was gone (first) or finds out when the call's run comes back broken
    (second: the kill and the call race, and either order must work)."""
    with keep_local_workers():
        run([task(1e-3)], tmp_path)
        for noticed, lr in ((True, 2e-3), (False, 3e-3)):
            pool = pools[-1]
            for pid in workers_of(pool):
                os.kill(pid, 9)
            deadline = time.monotonic() + 10
            while noticed and not pool.executor._broken and time.monotonic() < deadline:
                time.sleep(0.05)
            outcomes = run([task(lr)], tmp_path)
            assert pools[-1] is not pool and executors._KEPT["pool"] is pools[-1]
            assert list(outcomes.values())[0] in ("completed", "stalled")


# -- map_local: a study's measurements at init on the kept workers ---------------------------

def _pid_and_square(x: int) -> tuple[int, int]:
    return os.getpid(), x * x


def _square_or_raise(x: int) -> int:
    if x == 3:
        raise ValueError("three")
    return x * x


def _die_at(x: tuple[int, int]) -> int:
    value, parent = x
    if value == 2 and os.getpid() != parent:  # dies on a worker, computes here
        os._exit(1)
    return value * value


def test_map_local_computes_on_the_kept_workers_in_order_and_here_outside(pools):
    items = list(range(7))
    outside = executors.map_local(_pid_and_square, items, workers=2, threads=1)
    assert [v for _p, v in outside] == [x * x for x in items]
    assert {p for p, _v in outside} == {os.getpid()} and pools == []
    with keep_local_workers():
        inside = executors.map_local(_pid_and_square, items, workers=2, threads=1)
        assert [v for _p, v in inside] == [x * x for x in items]
        assert os.getpid() not in {p for p, _v in inside}
        assert {p for p, _v in inside} <= workers_of(pools[0]) and len(pools) == 1
        with pytest.raises(ValueError, match="three"):  # fn's own error reaches the caller
            executors.map_local(_square_or_raise, items, workers=2, threads=1)
        # a worker that dies: what was not done is computed here, in order
        assert executors.map_local(_die_at, [(x, os.getpid()) for x in items], workers=2,
                                   threads=1) == [x * x for x in items]
        # the broken pool was dropped: the next call starts a new one
        assert executors.map_local(_square_or_raise, [0, 1], workers=2, threads=1) == [0, 1]
        assert len(pools) == 2
