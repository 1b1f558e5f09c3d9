"""What a sweep folder holds and how the state of each run is read from it.

    <root>/sweep.json          the spec, the axes and every run (id, axis values, full config)
    <root>/<run_id>/           one run folder per run, written by `train_run` only
    <root>/<run_id>/.lock      the run's lock (`normlab.train.rundir`), held by the worker training
                               the run as by any other trainer; the kernel releases it when that
                               process ends, however it ends

A run's summary says `running` from the moment a worker starts it until it ends. After a crash or
a SIGKILL the word stays; the lock tells a live run from a dead one: `running` with a free lock is
`interrupted` (resumable from its last checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import normlab
from normlab.sweep.spec import SweepPlan
from normlab.train.logging import read_json, write_json_atomic
from normlab.train.rundir import FINISHED, hold_run, is_live, read_summary

SWEEP_FILE = "sweep.json"


def write_sweep_file(root: Path, plan: SweepPlan) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    data = {
        "name": plan.name,
        "normlab": normlab.__version__,
        "axes": plan.axis_paths,
        "spec": plan.spec,
        "runs": [{"run_id": r.run_id, "point": {k: _jsonable(v) for k, v in r.point.items()},
                  "config": r.config.to_dict()} for r in plan.runs],
    }
    path = root / SWEEP_FILE
    write_json_atomic(path, data)
    return path


def read_sweep_file(root: Path) -> dict[str, Any] | None:
    """sweep.json, or None when there is none or it is not a JSON object."""
    data = read_json(Path(root) / SWEEP_FILE)
    return data if isinstance(data, dict) else None


def _jsonable(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def run_lock(run_dir: Path):
    """Hold the run's lock while training it; waits while another process holds it (an earlier
    sweep's worker finishing its last step after its parent was killed, or a `normlab train`)."""
    return hold_run(run_dir, wait=True)


def run_state(run_dir: Path) -> tuple[str, dict[str, Any]]:
    """(outcome, summary) of a run folder, with `running` resolved against the lock."""
    summary = read_summary(run_dir) if run_dir.exists() else None
    if summary is None:
        return "pending", {}
    outcome = str(summary.get("outcome", "pending"))
    if outcome == "running" and is_live(run_dir) is False:
        outcome = "interrupted"
    return outcome, summary


def is_finished(run_dir: Path) -> bool:
    return run_state(run_dir)[0] in FINISHED
