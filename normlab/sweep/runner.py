"""Run a planned sweep: check it, record it, skip what is finished, execute the rest.

Re-running the same sweep on the same root skips completed and diverged runs, resumes interrupted
ones from their checkpoints, and retries failed ones. Pending runs that share a model shape may
train as stacked groups (the sweep's `engine`, see `normlab.sweep.grouping`). The sweep's own
state is `sweep.json` (the spec and the run ids); everything else is in the run folders.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.config import ConfigError
from normlab.sweep.executors import EXECUTORS, run_local
from normlab.sweep.grouping import RunTask, plan_tasks
from normlab.sweep.progress import SweepProgress
from normlab.sweep.ray_executor import run_ray
from normlab.sweep.spec import SpecError, SweepPlan, check_engine
from normlab.sweep.state import read_sweep_file, run_state, write_sweep_file
from normlab.train.machine import default_threads
from normlab.train.trainer import FINISHED


@dataclass
class SweepResult:
    root: Path
    summaries: dict[str, dict[str, Any]]       # run id -> summary (empty dict: never started)
    outcomes: dict[str, str]                   # run id -> outcome as on disk after the sweep
    skipped: int = 0                           # found finished before this invocation
    interrupted: bool = False
    counts: Counter = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        """Every run finished (completed or diverged: both are results)."""
        return all(o in FINISHED for o in self.outcomes.values())


def default_root(plan: SweepPlan) -> Path:
    return Path("runs") / "sweeps" / plan.name


def preflight(plan: SweepPlan, check_device: bool = True) -> None:
    """What would make every run fail is checked once, before anything runs."""
    from normlab.data import DataError, load_run_data
    from normlab.train.trainer import resolve_device

    axes = set(plan.axis_paths)
    seen: set[tuple] = set()
    for run in plan.runs:
        d = run.config.data
        key = (d.source, d.val_fraction, d.split_seed, d.task, d.tokenizer, d.text_field,
               run.config.model.vocab_size)
        if key not in seen:
            seen.add(key)
            try:
                load_run_data(d, run.config.model)
            except DataError as e:
                where = "axis data.source" if "data.source" in axes else "base data.source"
                raise SpecError(f"{where} = {d.source!r}: {e}") from None
        if check_device and (run.config.train.device,) not in seen:
            seen.add((run.config.train.device,))
            try:
                resolve_device(run.config.train.device)
            except ConfigError as e:
                raise SpecError(str(e)) from None


def _sigterm_as_interrupt() -> Any:
    """SIGTERM stops the sweep like Ctrl-C: running runs checkpoint, the sweep reports them.
    (A sweep started in the background of a script ignores SIGINT; SIGTERM still works.)"""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)


def run_sweep(plan: SweepPlan, root: Path | str | None = None, *, workers: int = 2,
              executor: str = "local", address: str | None = None, threads: int | None = None,
              progress: bool = True, engine: str | None = None) -> SweepResult:
    """Run every run of `plan` under `root` (default `runs/sweeps/<name>`); returns the outcome of
    each. Ctrl-C stops the sweep after running runs checkpoint (`interrupted=True`). `engine`
    (auto | stacked | separate) overrides the spec's."""
    engine = plan.engine if engine is None else check_engine(engine, "engine")
    if executor not in EXECUTORS:
        raise ConfigError(f"executor: {executor!r} is not one of {', '.join(EXECUTORS)}")
    if executor == "local" and address:
        raise ConfigError("address: only used with --executor ray")
    if workers < (0 if executor == "ray" else 1):
        raise ConfigError(f"workers: {workers}; need at least 1 (0 with ray: as many as the "
                          "cluster's CPUs allow)")
    root = Path(root if root is not None else default_root(plan)).resolve()
    preflight(plan, check_device=not (executor == "ray" and address))
    if threads is None:
        threads = 1 if (executor == "ray" and address) else default_threads(workers)

    old = read_sweep_file(root)
    old_ids = {r["run_id"] for r in (old or {}).get("runs", [])}
    if old is not None and old_ids != set(plan.run_ids):
        kept = len(set(plan.run_ids) & old_ids)
        print(f"[sweep] {root}/sweep.json described another sweep ({len(old_ids)} runs, {kept} "
              "shared with this one); replaced. Run folders are never removed.", file=sys.stderr)
    write_sweep_file(root, plan)

    pending = []
    already: Counter = Counter()
    for run in plan.runs:
        outcome, _ = run_state(root / run.run_id)
        if outcome in FINISHED:
            already[outcome] += 1
        else:  # pending, interrupted, failed; or running in another live process: the worker
            pending.append(run)  # waits for its lock
    if executor == "local":
        import torch

        todo, notes = plan_tasks(pending, engine, workers, threads, torch.cuda.is_available())
    else:
        todo = [RunTask(r.run_id, r.config.to_dict()) for r in pending]
        notes = ["the ray executor trains every run separately"] if engine == "stacked" else []
    if progress:
        for line in notes:
            print(f"[sweep] {line}", file=sys.stderr, flush=True)
    labels = {r.run_id: r.label() for r in plan.runs}
    bar = SweepProgress(len(plan.runs), already, workers=workers, enabled=progress,
                        labels=labels)
    interrupted = False
    previous = _sigterm_as_interrupt()
    try:
        if todo and executor == "local":
            run_local(todo, root, workers=workers, threads=threads, on_start=bar.start,
                      on_finish=bar.finish)
        elif todo:
            run_ray(todo, root, workers=workers or None,
                    threads=threads, address=address, on_start=bar.start, on_finish=bar.finish)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        bar.close()

    summaries, outcomes = {}, {}
    for run in plan.runs:
        outcome, summary = run_state(root / run.run_id)
        summaries[run.run_id], outcomes[run.run_id] = summary, outcome
    return SweepResult(root=root, summaries=summaries, outcomes=outcomes,
                       skipped=sum(already.values()), interrupted=interrupted,
                       counts=Counter(outcomes.values()))
