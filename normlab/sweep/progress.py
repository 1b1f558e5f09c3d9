"""One sweep-level progress display: runs done / running / diverged / failed and an ETA.

On a terminal a rich bar with the counts; otherwise one plain line per finished run (logs, CI).
Workers print nothing; the sweep process calls `start` / `finish` as runs begin and end.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any, TextIO

from normlab.train.trainer import FINISHED


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class SweepProgress:
    """Counts of a sweep; `already` are runs found finished on disk (skipped)."""

    def __init__(self, total: int, already: Counter | None = None, *, workers: int = 1,
                 enabled: bool = True, stream: TextIO | None = None,
                 labels: dict[str, str] | None = None) -> None:
        self.total, self.workers = total, max(1, workers)
        self.counts: Counter = Counter(already or {})
        self.skipped = sum(self.counts.values())
        self.running: set[str] = set()
        self.labels = labels or {}
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self._walls: list[float] = []
        self._t0 = time.perf_counter()
        self._bar = None
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"),
                                 console=Console(file=self.stream), transient=False)
            self._task = self._bar.add_task("sweep", total=total, completed=self.done,
                                            info=self.info())
            self._bar.start()
        elif enabled and self.skipped:
            self._line(f"{self.skipped} of {total} runs already finished "
                       f"({self._counts_text()}); skipped")

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    def eta_s(self) -> float | None:
        """Mean wall time of the runs trained in this session, times the runs left, over the
        workers; unknown until one run has finished."""
        if not self._walls:
            return None
        left = self.total - self.done
        return sum(self._walls) / len(self._walls) * left / self.workers

    def _counts_text(self) -> str:
        c = self.counts
        return (f"completed {c['completed']}, diverged {c['diverged']}, failed {c['failed']}"
                + (f", stalled {c['stalled']}" if c["stalled"] else "")
                + (f", interrupted {c['interrupted']}" if c["interrupted"] else ""))

    def info(self) -> str:
        return (f"running {len(self.running)} · {self._counts_text()} · "
                f"ETA {_duration(self.eta_s())}")

    def start(self, run_id: str) -> None:
        self.running.add(run_id)
        self._refresh()

    def finish(self, run_id: str, summary: dict[str, Any], wall_s: float) -> None:
        self.running.discard(run_id)
        outcome = str(summary.get("outcome", "failed"))
        self.counts[outcome] += 1
        if wall_s > 0 and outcome in FINISHED:
            self._walls.append(wall_s)
        if self._bar is not None:
            self._refresh()
        elif self.enabled:
            what = outcome
            if outcome in ("diverged", "failed", "interrupted"):
                what += f" at step {summary.get('step', '?')}"
                if summary.get("reason"):
                    what += f" ({summary['reason']})"
            elif isinstance(summary.get("val_loss"), float):
                what += f", val loss {summary['val_loss']:.4f}"
            label = self.labels.get(run_id, "")
            self._line(f"{self.done}/{self.total} {run_id} {label}: {what} · {self.info()}")

    def _refresh(self) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, info=self.info())

    def _line(self, text: str) -> None:
        print(f"[sweep] {text}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elif self.enabled:
            elapsed = time.perf_counter() - self._t0
            self._line(f"{self.done}/{self.total} runs finished in {_duration(elapsed)} "
                       f"({self._counts_text()})")
