"""How far a run got when it stopped without writing its own summary.

A run that stops on a signal checkpoints and writes `interrupted` with its step and losses itself.
One whose worker was killed (a Ray task cancelled with force, SIGKILL, power loss) leaves the
`running` summary it wrote when it started, with the step it started from. What it did get to is
still on disk: the checkpoint's step (where a resume continues) and the losses metrics.jsonl
logged up to that step. `last_progress` reads them; `record_interrupted` writes them into the
run's summary.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from normlab.sweep.state import is_live
from normlab.train.logging import read_json, read_metrics, write_json_atomic
from normlab.train.trainer import read_summary


def last_progress(run_dir: Path) -> dict[str, Any]:
    """`step`: the checkpoint's (0 without one), where a resume continues; `best_val_loss`: the
    checkpoint's; `train_loss` and `val_loss`: the last ones logged up to that step. Lines past
    the checkpoint are left out: a resume drops them and trains those steps again."""
    state = read_json(run_dir / "checkpoint" / "trainer_state.json") or {}
    step = int(state.get("step", 0))
    out: dict[str, Any] = {"step": step}
    best = state.get("best_val_loss")
    if isinstance(best, int | float) and math.isfinite(best):
        out["best_val_loss"] = best
    for record in read_metrics(run_dir / "metrics.jsonl"):
        if record.get("step", step + 1) > step:
            continue
        for key in ("train_loss", "val_loss"):
            if key in record:
                out[key] = record[key]
    return out


def record_interrupted(run_dir: Path, run_id: str, reason: str, wait_s: float = 10.0
                       ) -> dict[str, Any]:
    """Once no process holds the run (waits up to `wait_s` for a killed worker to be gone), write
    `interrupted` with `last_progress` into a summary that still says `running`; a summary the
    run wrote itself when it stopped is kept, and a run that never started stays pending.
    Returns the run's summary."""
    deadline = time.monotonic() + wait_s
    while is_live(run_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    old = read_summary(run_dir)
    if old is None:  # never started
        return {"run_id": run_id, "outcome": "pending"}
    if old.get("outcome") != "running":
        return old
    summary = {**old, "run_id": run_id, "outcome": "interrupted", "reason": reason,
               **last_progress(run_dir)}
    write_json_atomic(run_dir / "summary.json", summary)
    return summary
