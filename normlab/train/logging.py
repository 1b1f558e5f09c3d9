"""Run records: metrics.jsonl (appended and flushed), TensorBoard events, atomic JSON writes,
and the progress display (a bar on a terminal, plain lines otherwise)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

# metrics.jsonl is read by the run-folder reader (damaged lines skipped); re-exported here
from normlab.train.rundir import cut_metrics_after, read_metrics  # noqa: F401


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=_jsonable))
    os.replace(tmp, path)


def read_json(path: Path) -> Any | None:
    """A JSON file's content, or None when it is missing or cut short (e.g. by a crash)."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def _clean(value: Any) -> Any:
    # JSON has no NaN/inf: a diverged loss is recorded as a string so the file stays valid JSON.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsLog:
    """One JSON object per logged step; on resume, lines past the checkpoint step are dropped so
    the file continues exactly as an uninterrupted run's would. A disabled log (a rank other than
    0 of a multi-process run) writes nothing."""

    def __init__(self, path: Path, tb_dir: Path | None = None, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled
        self._file = None
        self._tb = None
        self._tb_dir = tb_dir

    def truncate_after(self, step: int) -> tuple[list[dict[str, Any]], str | None]:
        """Keep the intact records up to `step`; returns them and what damaged lines were
        skipped (see `normlab.train.rundir.cut_metrics_after`)."""
        if not self.enabled:
            return [], None
        return cut_metrics_after(self.path, step)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._file is None:
            self._file = self.path.open("a")
        self._file.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._file.flush()
        if self._tb_dir is not None:
            if self._tb is None:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self._tb_dir))
            step = record["step"]
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(key.replace(".", "/"), value, step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


class Progress:
    """A rich progress bar on a terminal; plain log lines every `every` steps otherwise."""

    def __init__(self, total: int, start: int, label: str, every: int, enabled: bool = True):
        self.total, self.every, self.label = total, every, label
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self._bar = None
        self._t0 = time.perf_counter()
        if self.tty:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False)
            self._task = self._bar.add_task(label, total=total, completed=start, info="")
            self._bar.start()

    def update(self, step: int, info: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
        elif self.enabled and (step % self.every == 0 or step == self.total):
            print(f"[{self.label}] step {step}/{self.total} {info}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
