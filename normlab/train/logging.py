"""Run records: metrics.jsonl (appended and flushed), TensorBoard events (scalars, the run's
config as text and as hparams), atomic JSON writes, and the progress display (a bar on a terminal,
plain lines otherwise) with a smoothed throughput."""

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


# What the HParams tab shows next to a run's config (keys of the run's summary.json).
FINAL_METRICS = ("train_loss", "val_loss", "best_val_loss", "step", "tokens_per_s")


class MetricsLog:
    """One JSON object per logged step; on resume, lines past the checkpoint step are dropped so
    the file continues exactly as an uninterrupted run's would. A disabled log (a rank other than
    0 of a multi-process run) writes nothing.

    Records reach the disk at least every `FLUSH_EVERY_S` seconds (a reader following the file
    sees them that late at most), and always before a checkpoint (`flush`, called by the loop):
    a crash loses at most records past the last checkpoint, which a resume drops and writes
    again. Flushing each record cost a group of 64 runs logging every step about a fifth of
    its step on a CPU (benchmarks/README.md)."""

    FLUSH_EVERY_S = 1.0

    def __init__(self, path: Path, tb_dir: Path | None = None, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled
        self._file = None
        self._flushed = 0.0
        self._tb = None
        self._tb_dir = tb_dir

    def truncate_after(self, step: int) -> tuple[list[dict[str, Any]], str | None]:
        """Keep the intact records up to `step`; returns them and what damaged lines were
        skipped (see `normlab.train.rundir.cut_metrics_after`)."""
        if not self.enabled:
            return [], None
        return cut_metrics_after(self.path, step)

    def _writer(self):
        """The TensorBoard writer, opened on first use; None when there is no TensorBoard log."""
        if not self.enabled or self._tb_dir is None:
            return None
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self._tb_dir))
        return self._tb

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._file is None:
            self._file = self.path.open("a")
        self._file.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        if time.monotonic() - self._flushed >= self.FLUSH_EVERY_S:
            self.flush()
        tb = self._writer()
        if tb is not None:  # the record's scalars as one event (one `add_scalar` each costs 5)
            from tensorboard.compat.proto.summary_pb2 import Summary

            values = [Summary.Value(tag=key.replace(".", "/"), simple_value=float(value))
                      for key, value in record.items()
                      if key != "step" and isinstance(value, (int, float))
                      and math.isfinite(value)]
            if values:
                tb.file_writer.add_summary(Summary(value=values), record["step"])

    def flush(self) -> None:
        """Put every record written so far on the disk (metrics.jsonl; TensorBoard's events
        keep their own writer's pace)."""
        if self._file is not None:
            self._file.flush()
            self._flushed = time.monotonic()

    def write_config(self, config_yaml: str, step: int) -> None:
        """The run's resolved config as a TensorBoard text entry (tab TEXT, tag `config`)."""
        tb = self._writer()
        if tb is not None:
            # indented four spaces: TensorBoard renders text as Markdown, this keeps it verbatim
            tb.add_text("config", "".join("    " + line + "\n"
                                          for line in config_yaml.splitlines()), step)

    def write_hparams(self, config: dict[str, Any], summary: dict[str, Any]) -> None:
        """The run's config as hyperparameters with its final metrics, for TensorBoard's HParams
        tab (one row per run, comparable across runs): nested config keys flattened to
        `train.lr`; `FINAL_METRICS` from the run's summary as scalars under `final/`, at the
        summary's step; the outcome as an hparam and as the session's status."""
        tb = self._writer()
        if tb is None:
            return
        from torch.utils.tensorboard.summary import hparams

        metrics = {f"final/{k}": float(v) for k in FINAL_METRICS
                   if isinstance(v := summary.get(k), (int, float)) and math.isfinite(v)}
        outcome, step = summary["outcome"], summary["step"]
        exp, ssi, _ = hparams(flat_hparams(config) | {"outcome": outcome}, metrics)
        tb.file_writer.add_summary(exp, step)
        tb.file_writer.add_summary(ssi, step)
        tb.file_writer.add_summary(_session_end(outcome), step)
        for key, value in metrics.items():
            tb.add_scalar(key, value, step)
        tb.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def flat_hparams(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as TensorBoard hyperparameters: dotted keys, values that are numbers,
    strings or booleans (None and lists become their text)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_hparams(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = json.dumps(value)
    return out


def _session_end(outcome: str):
    """The HParams session-end summary with the run's outcome as its status (torch's `hparams`
    always writes success)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams.api_pb2 import Status
    from tensorboard.plugins.hparams.metadata import (
        PLUGIN_DATA_VERSION,
        PLUGIN_NAME,
        SESSION_END_INFO_TAG,
    )
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionEndInfo

    status = {"completed": "STATUS_SUCCESS", "stalled": "STATUS_FAILURE",
              "diverged": "STATUS_FAILURE", "failed": "STATUS_FAILURE"}.get(outcome,
                                                                          "STATUS_UNKNOWN")
    content = HParamsPluginData(session_end_info=SessionEndInfo(status=Status.Value(status)),
                                version=PLUGIN_DATA_VERSION)
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name=PLUGIN_NAME, content=content.SerializeToString()))
    return Summary(value=[Summary.Value(tag=SESSION_END_INFO_TAG, metadata=meta)])


class Throughput:
    """Step time and tokens/s smoothed as nanoGPT smooths its MFU: an exponential moving average
    (weight `1 - decay` on the newest step) that starts after the first `skip` steps of a
    (re)start, whose time goes to allocation, lazy compilation and cold caches. Single steps on a
    shared CPU vary by more than 10x; the average is what a reader can extrapolate from.

    MFU is the share of `peak_tflops` (a measured GEMM peak, see `normlab.train.perf`) that the
    model's own matrix work (`flops_per_token` per trained token) takes at the smoothed rate; a
    share above 1 means the short peak measurement read this machine low (another process held the
    cores), so no MFU is shown rather than an impossible one. It is shown with two significant
    digits (`0.021%`, not a rounded-away `0.0%`), and on a GPU a share under `LAUNCH_BOUND_MFU`
    says why: a model this small spends its step launching kernels, not multiplying."""

    def __init__(self, tokens_per_step: int, *, flops_per_token: float | None = None,
                 peak_tflops: float | None = None, skip: int = 3, decay: float = 0.9,
                 device_type: str = "cpu") -> None:
        self.device_type = device_type
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.peak_tflops = peak_tflops
        self.skip, self.decay = skip, decay
        self.steps = 0
        self.step_s: float | None = None

    def update(self, seconds: float) -> None:
        self.steps += 1
        if self.steps <= self.skip:
            return
        self.step_s = seconds if self.step_s is None else (
            self.decay * self.step_s + (1 - self.decay) * seconds)

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.step_s is None else self.tokens_per_step / self.step_s

    @property
    def mfu(self) -> float | None:
        if self.step_s is None or not self.flops_per_token or not self.peak_tflops:
            return None
        share = self.tokens_per_s * self.flops_per_token / (self.peak_tflops * 1e12)
        return share if share <= 1.0 else None

    def describe(self) -> str:
        """`182 ms, 45.1k tok/s, mfu 12.3%`, or `warm-up` before the average starts."""
        if self.step_s is None:
            return "warm-up"
        out = f"{self.step_s * 1e3:,.0f} ms, {_si(self.tokens_per_s)} tok/s"
        mfu = self.mfu
        if mfu is None:
            return out
        out += f", mfu {percent(mfu)}"
        if self.device_type == "cuda" and mfu < LAUNCH_BOUND_MFU:
            out += " (launch-bound: too small for this GPU; stacked runs fill it)"
        return out


# Under this share of the GEMM peak a GPU step is bound by kernel launches (a 6-block, width-64
# step launches about 700 kernels and takes 13-15 ms on an H200 whatever the width up to 256).
LAUNCH_BOUND_MFU = 0.01


def percent(share: float, digits: int = 2) -> str:
    """`share` as a percentage with `digits` significant digits: `3.0%`, `12%`, `0.021%`."""
    pct = share * 100
    if pct <= 0 or not math.isfinite(pct):
        return f"{pct:.0f}%"
    decimals = max(0, digits - 1 - math.floor(math.log10(pct)))
    return f"{pct:.{decimals}f}%"


def _si(x: float) -> str:
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def progress_info(train_loss: float, lr: float, grad_norm: float, val_loss: float | None,
                  speed: Throughput, accuracy: dict[str, float] | None = None, *,
                  val_step: int | None = None, step: int | None = None,
                  bpb: float | None = None) -> str:
    """The progress line after a step, as nanoGPT prints it: `loss 2.431, val 2.502, lr 1.00e-03,
    grad norm 0.84, 182 ms, 45.1k tok/s, mfu 12.3%` (val: the latest evaluation, if any; one
    computed at an earlier step than `step` says so, `val 2.502 (step 250)`, so that a value
    repeated between evaluations does not read as a stalled validation loss). Text runs give the
    same loss in bits per byte of the held-out text after it: `val 2.502, val bpb 1.210`. A
    synthetic task's accuracies of that evaluation follow val: `acc 0.71 (k=1 0.98, k=2 0.66)`
    (`val_acc`, then each `val_acc_hop{k}`)."""
    val = f", val {val_loss:.4f}" if val_loss is not None else ""
    if val and bpb is not None:
        val += f", val bpb {bpb:.4f}"
    if val and step is not None and val_step != step:
        val += f" (step {val_step})" if val_step is not None else " (before this start)"
    if accuracy and "val_acc" in accuracy:
        hops = [f"k={key[len('val_acc_hop'):]} {value:.2f}" for key, value in accuracy.items()
                if key.startswith("val_acc_hop")]
        val += f", acc {accuracy['val_acc']:.2f}" + (f" ({', '.join(hops)})" if hops else "")
    return (f"loss {train_loss:.4f}{val}, lr {lr:.2e}, grad norm {grad_norm:.3g}, "
            f"{speed.describe()}")


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
