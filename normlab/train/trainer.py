"""Training a run: a run is a pure function of its `RunConfig`, recorded in its own folder.

    runs/<run_id>/config.yaml      resolved config plus versions, device, precision
    runs/<run_id>/metrics.jsonl    one JSON object per logged step
    runs/<run_id>/summary.json     outcome: completed | stalled | diverged | failed | interrupted
    runs/<run_id>/checkpoint/      safetensors + JSON (see `normlab.train.checkpoint`)
    runs/<run_id>/tb/              TensorBoard events

Before every optimizer step the loss and gradient norm must be finite and the loss must not be in
a sustained spike; otherwise the run ends `diverged` with the step and the reason. A resumed run
reproduces the uninterrupted run's metrics bit for bit on CPU when it runs with the same number of
CPU threads (recorded in the checkpoint; a resume uses it, see `restore_checkpoint`), the same
torch and the same machine: batches are a function of the step, and the checkpoint holds the RNG,
optimizer and detector states. The process training a run holds its folder's lock
(`normlab.train.rundir`); the conditions are listed in docs/reliability.md.
Each evaluation also records the token-varying share of the final stream and, for text, the loss
as bits per byte of the held-out text (`val_bpb`, comparable across tokenizers); a run that ends
no better than the unigram entropy of its training tokens is `stalled` (see
`normlab.train.diagnostics`).

The steps, the cadences and the stops are the shared loop's (`normlab.train.loop.TrainLoop`);
`RunLoop` adds what every run with a folder records (metrics.jsonl, checkpoint, summary.json,
progress), for one run here (`train_run`) and for a stacked group (`normlab.train.group`).
"""

from __future__ import annotations

import contextlib
import json
import sys
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import torch

import normlab
from normlab.config import ConfigError, RunConfig, TrainConfig, parse_config
from normlab.data import load_run_data
from normlab.data.batches import BatchSampler
from normlab.data.fingerprint import changes as data_changes
from normlab.data.khop import IGNORE
from normlab.nn import build_model, capture
from normlab.nn.block import prores_ramps, set_branch_ramps
from normlab.nn.model import NormTransformer
from normlab.nn.plan import resolved_run_fields, resolved_settings
from normlab.train import distributed
from normlab.train.checkpoint import (
    CheckpointError,
    copy_checkpoint,
    keep_weights,
    load_checkpoint,
    recover_checkpoint,
    save_checkpoint,
    usable_checkpoint,
)
from normlab.train.diagnostics import FINAL_STREAM, TokenShare, end_of_run
from normlab.train.divergence import SpikeDetector
from normlab.train.listing import with_resolved_precision
from normlab.train.logging import (
    MetricsLog,
    Progress,
    Throughput,
    progress_info,
    write_json_atomic,
)
from normlab.train.loop import BLOCK_STATS_MIN_EVERY as BLOCK_STATS_MIN_EVERY
from normlab.train.loop import Member, TrainLoop, tokens_per_s
from normlab.train.loop import block_stats_due as block_stats_due
from normlab.train.loop import block_stats_every as block_stats_every
from normlab.train.loop import eval_due as eval_due
from normlab.train.machine import tune_cpu_allocator
from normlab.train.numerics import (
    deterministic_algorithms,
    kept_numerics,
    match_numerics,
    numerics_in_force,
)
from normlab.train.optim import build_optimizer, fused_available
from normlab.train.perf import quick_peak_tflops, train_flops_per_token
from normlab.train.precision import (
    Precision,
    precision_context,
    run_precision,
    warn_slow_bf16,
)
from normlab.train.rundir import (
    FINISHED,
    RunFolderError,
    RunLockedError,
    hold_run,
    lock_holder,
    read_config_data,
    read_run_config,
    read_summary,
    safetensors_problem,
    seed_metrics,
    summary_problem,
)
from normlab.train.schedules import extension_lr
from normlab.train.step import accumulate_gradients, clip_and_step, gradient_norm, set_lr
from normlab.userinput import write_yaml
from normlab.warnings import NormlabWarning

ThreadPolicy = Literal["match", "refuse"]


class ThreadCountError(RunFolderError):
    """A resume that would run with another CPU thread count than the run's checkpoint."""


class RunRefusedError(RunFolderError):
    """A run that is not trained because its folder holds something a training must not touch:
    said to the caller, never recorded in the folder (`record_failure`), which stays as it is."""


class DataChangedError(RunRefusedError):
    """A run folder whose recorded data fingerprint differs from the data now (see
    `check_data_unchanged`)."""


class DamagedRunError(RunRefusedError):
    """A finished run whose folder does not hold its result (see `finished_run_damage`)."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: cuda requested but no CUDA device is available; use auto")
    return torch.device(name)


def check_run_folder(cfg: RunConfig, run_dir: Path, resume: str,
                     fingerprint: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """What `run_dir` allows before anything is written: the summary of a finished run (nothing
    to train), None to train or resume; `RunFolderError` when it holds another run, exists with
    `resume="never"`, or has no checkpoint with `resume="require"`, `DataChangedError` when
    the data's `fingerprint` (the files the run reads now, `normlab.data.fingerprint`) differs
    from the one its config.yaml recorded (a folder recorded without one is not checked), and
    `DamagedRunError` when it says it finished but does not hold the result
    (`finished_run_damage`): a train, a sweep or the study would otherwise skip it as done."""
    if (run_dir / "config.yaml").exists():
        try:
            on_disk = read_run_config(run_dir)
        except (RunFolderError, ConfigError) as e:
            detail = str(e).replace("\n", " ")
            raise RunFolderError(f"{run_dir}: damaged, cannot be resumed: {detail}. Move the "
                                 "folder away (or delete it) to train the run again") from None
        if on_disk.run_id() != cfg.run_id():
            raise RunFolderError(f"{run_dir}: holds run {on_disk.run_id()}, not {cfg.run_id()}")
        summary = read_summary(run_dir)
        finished = bool(summary and summary.get("outcome") in FINISHED)
        if fingerprint is not None:
            check_data_unchanged(run_dir, fingerprint, finished)
        if finished:
            damage = finished_run_damage(run_dir)
            if damage:
                raise DamagedRunError(damage)
            return summary
        if resume == "never":
            raise RunFolderError(f"{run_dir}: exists; resume it with `normlab train --resume "
                                 f"{run_dir}` or delete it")
    if resume == "require" and not (run_dir / "checkpoint" / "trainer_state.json").exists():
        raise RunFolderError(f"{run_dir}: no checkpoint to resume from")
    return None


def finished_run_damage(run_dir: Path) -> str | None:
    """Why a run folder whose summary.json says it finished (so a train or a resume would skip
    it as done) does not hold that result: its checkpoint's weights are missing or not whole,
    or its checkpoint is of another step than the summary's. None when it is whole, or not
    finished (a run that diverged before its first checkpoint has none, and needs none)."""
    summary = read_summary(run_dir)
    if not summary or summary.get("outcome") not in FINISHED:
        return None
    outcome, step = summary["outcome"], summary.get("step")
    folder = usable_checkpoint(run_dir / "checkpoint")
    if folder is None and outcome == "diverged":
        return None
    weights = (folder or run_dir / "checkpoint") / "model.safetensors"
    state_file = weights.parent / "trainer_state.json"
    if not weights.is_file():
        problem = f"{weights} is missing"
    else:
        problem = safetensors_problem(weights)
        problem = f"{weights} is {problem}" if problem else None
    if problem is None and outcome != "diverged":
        try:
            state = json.loads(state_file.read_text(encoding="utf-8"))
            saved = state.get("step") if isinstance(state, dict) else None
        except (OSError, ValueError):
            saved = None
            problem = f"{state_file} is missing or not valid JSON"
        if problem is None and saved != step:
            problem = f"its checkpoint ({state_file}) is of step {saved}, not {step}"
    if problem is None:
        return None
    moved = run_dir.with_name(run_dir.name + ".damaged")
    return (f"{run_dir}: damaged: its summary.json says {outcome} at step {step}, but {problem}, "
            "so the run's result cannot be used (sample, probe and finetune read its weights). "
            f"Restore the file, or train the run again: move the folder away (`mv {run_dir} "
            f"{moved}`) and run `normlab train {moved / 'config.yaml'} --root {run_dir.parent}`")


EXTENDABLE = ("completed", "stalled")  # trained all their steps: an extension continues them


def extendable_summary(run_dir: Path) -> dict[str, Any]:
    """The summary of the run in `run_dir` when it can be extended (`EXTENDABLE`, its result
    whole); otherwise `RunFolderError` saying why and what to do (`DamagedRunError` for a
    damaged result)."""
    if not (run_dir / "config.yaml").is_file():
        raise RunFolderError(f"{run_dir}: no such run folder (no config.yaml); an extension "
                             "continues a finished run in the same root")
    summary = read_summary(run_dir) or {}
    outcome, step = summary.get("outcome"), summary.get("step")
    if outcome == "diverged":
        raise RunFolderError(
            f"{run_dir}: diverged at step {step} ({summary.get('reason')}), so it cannot be "
            "extended: its weights are not a trained model to continue; train a new run "
            "(e.g. with a lower train.lr)")
    if outcome not in EXTENDABLE:
        where = f" at step {step} of {summary.get('steps_planned', '?')}" if step else ""
        raise RunFolderError(
            f"{run_dir}: the run is {outcome or 'not started'}{where}, not finished, so it "
            f"cannot be extended yet; resume it first (`normlab train --resume {run_dir}`), then "
            "extend it with --set train.steps=N")
    damage = finished_run_damage(run_dir)
    if damage:
        raise DamagedRunError(damage)
    return summary


def extended_config(run_dir: Path, steps: int) -> RunConfig:
    """The config of the run that continues the finished run in `run_dir` to `steps` steps:
    its own config with `train.steps` and `train.extends` (that run's id and last step), so
    the extension is a new run folder beside it, whose id differs from it and from a run of
    `steps` steps from scratch. `RunFolderError` when the run cannot be extended
    (`extendable_summary`), `ConfigError` when `steps` does not exceed its last step."""
    cfg = read_run_config(run_dir)
    summary = extendable_summary(run_dir)
    last = summary["step"]
    if steps <= last:
        raise ConfigError(f"--set train.steps={steps}: {run_dir} finished at step {last}; an "
                          f"extension trains on from there, so give train.steps > {last}")
    data = cfg.to_dict()
    data["train"] |= {"steps": steps, "extends": {"run": run_dir.name, "step": last}}
    return parse_config(RunConfig, data)


def check_extension(cfg: RunConfig, run_dir: Path,
                    fingerprint: dict[str, Any] | None = None) -> Path:
    """The folder of the run that `cfg` extends (`train.extends`, beside `run_dir`), checked:
    it finished at the recorded step with its result whole (`extendable_summary`), its config
    differs from `cfg` in `train.steps` alone (and the labels and execution options, which
    change nothing computed), and its data are what they were (`check_data_unchanged`).
    `RunFolderError` otherwise."""
    ext = cfg.train.extends
    assert ext is not None
    source = run_dir.parent / ext.run
    summary = extendable_summary(source)
    if summary.get("step") != ext.step:
        raise RunFolderError(f"{run_dir}: extends {source} from step {ext.step}, but that run "
                             f"ended at step {summary.get('step')}; extend it again with "
                             f"`normlab train --resume {source} --set train.steps=N`")
    try:
        base = extended_config(source, cfg.train.steps)
    except ConfigError as e:
        raise RunFolderError(str(e)) from None
    if base.run_id() != cfg.run_id():
        raise RunFolderError(f"{run_dir}: its config differs from that of {source}, which it "
                             "extends, in more than train.steps; an extension changes only the "
                             "step count (`normlab train --resume RUN --set train.steps=N`)")
    if fingerprint is not None:
        check_data_unchanged(source, fingerprint, finished=True)
    return source


def check_data_unchanged(run_dir: Path, fingerprint: dict[str, Any], finished: bool) -> None:
    """`DataChangedError`, naming the files, when the data the run reads now is not what its
    config.yaml's `meta.data_fingerprint` recorded: the run id hashes the config (the paths), not
    the files' content, so the folder's result or checkpoint is of other data."""
    meta = read_config_data(run_dir).get("meta")
    found = data_changes(meta.get("data_fingerprint") if isinstance(meta, dict) else None,
                         fingerprint)
    if not found:
        return
    more = f"; and {len(found) - 5} more" if len(found) > 5 else ""
    what = ("holds a result trained on other data" if finished else
            "holds a run started on other data, which a resume would continue on this data")
    raise DataChangedError(
        f"{run_dir}: {what}: {'; '.join(found[:5])}{more}. The run id covers the config, not "
        "the data, so the folder is left as it is. To train on the data as it is now, move the "
        "folder away (or delete it), or train under another --root; to use the folder, put the "
        "data back as it was")


def start_extension(source: Path, run_dir: Path, run_id: str, step: int) -> None:
    """Seed the folder of an extension with the final checkpoint of the run it extends (the
    trainer state marked as this run's, so that its resume path restores it) and that run's
    metrics.jsonl records, so that its records tell the whole trajectory. TensorBoard events
    and kept weights stay in the source's folder."""
    seed_metrics(source / "metrics.jsonl", run_dir / "metrics.jsonl", step)
    copy_checkpoint(usable_checkpoint(source / "checkpoint") or source / "checkpoint",
                    run_dir / "checkpoint", {"config_hash": run_id, "extends": source.name})


def run_meta(cfg: RunConfig, model: NormTransformer, data: Any, device: torch.device,
             precision: Precision) -> dict[str, Any]:
    """The `meta` section of a run's config.yaml: versions, device, dtype, the precision it
    trains in and why (`train.precision=auto` resolved; a resume reads it back), CPU threads,
    resolved plan."""
    return {"run_id": cfg.run_id(), "normlab": normlab.__version__,
            "torch": str(torch.__version__), "device": str(device),
            "dtype": "bfloat16-autocast" if precision.precision == "bf16" else "float32",
            "precision": precision.precision, "precision_reason": precision.reason,
            "threads": torch.get_num_threads(), "numerics": numerics_in_force(),
            "init": model.plan.init, "final_norm": model.plan.final_norm,
            "constants": model.plan.constants, "params": model.num_params(), **data.meta()}


def write_run_config(run_dir: Path, cfg: RunConfig, meta: dict[str, Any]) -> None:
    """config.yaml (the resolved config plus `meta`), written once, atomically."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / "config.yaml").exists():
        return
    tmp = run_dir / "config.yaml.tmp"
    tmp.write_text(cfg.to_yaml() + write_yaml({"meta": meta}))
    tmp.replace(run_dir / "config.yaml")


def checkpoint_state(step: int, best_val: float, spike: SpikeDetector, run_id: str
                     ) -> dict[str, Any]:
    """trainer_state.json: what a resume needs besides tensors, and the CPU thread count and
    float32 matmul flags the numbers were computed with (results depend on them; see
    `restore_checkpoint`)."""
    return {"step": step, "best_val_loss": best_val, "spike": spike.state_dict(),
            "config_hash": run_id, "threads": torch.get_num_threads(),
            "numerics": numerics_in_force()}


@dataclass
class Restored:
    """Where a run continues: its step and best val loss, the final losses its records hold
    (so a summary rebuilt at the last step keeps them), the repairs made on the way (warned and
    recorded in summary.json) and the thread count its checkpoint recorded."""

    step: int = 0
    best_val: float = float("inf")
    final: dict[str, Any] = field(default_factory=dict)
    repairs: list[str] = field(default_factory=list)
    threads: int | None = None  # the count recorded in the checkpoint
    val_step: int | None = None  # the step of the last evaluation its records hold


def match_threads(recorded: int | None, device: torch.device, policy: ThreadPolicy,
                  where: Path) -> None:
    """Make a resumed CPU run use the thread count its checkpoint recorded: `match` sets it
    (`train_run` puts this process's count back when the run ends), `refuse` raises
    `ThreadCountError` saying how to resume. CPU matrix products split their sums by thread, so
    another count changes the last bits of every step, and a resume would match neither the old
    nor a new run."""
    current = torch.get_num_threads()
    if recorded is None or device.type != "cpu" or recorded == current:
        return
    if policy == "refuse":
        raise ThreadCountError(
            f"{where}: trained with {recorded} CPU thread(s), this process has {current}; "
            f"resuming would change the run's numbers. Resume with --threads {recorded} (from "
            f"Python: torch.set_num_threads({recorded})), or delete the folder to restart")
    torch.set_num_threads(recorded)
    warnings.warn(f"{where}: resuming with the {recorded} CPU thread(s) it was trained with, "
                  f"not {current}, so that its numbers continue exactly", NormlabWarning,
                  stacklevel=3)


def restore_checkpoint(run_dir: Path, cfg: RunConfig, model: torch.nn.Module,
                       optimizer: torch.optim.Optimizer, spike: SpikeDetector,
                       metrics: MetricsLog, resume: str = "auto",
                       threads: ThreadPolicy | None = None,
                       device: torch.device | None = None) -> Restored:
    """Continue from the run's checkpoint when there is one (and `resume` is not "never"):
    restores model, optimizer and spike detector in place, applies `threads` (see
    `match_threads`; None: leave the thread count alone) and cuts metrics.jsonl back to the
    checkpoint's step, keeping every intact record (damaged lines are skipped, said and kept
    aside). A fresh start (no checkpoint) returns `Restored()`."""
    ckpt_dir = run_dir / "checkpoint"
    restored = Restored()
    if resume != "never" and (ckpt_dir / "trainer_state.json").exists():
        state = load_checkpoint(ckpt_dir, model, optimizer, expected_config_hash=cfg.run_id())
        try:
            spike.load_state_dict(state["spike"])
        except ValueError as e:
            raise CheckpointError(f"{ckpt_dir / 'trainer_state.json'}: malformed checkpoint "
                                  f"state (spike: {e}); delete the checkpoint folder to restart "
                                  "the run from step 0") from None
        restored.step, restored.best_val = state["step"], float(state["best_val_loss"])
        restored.threads = state.get("threads")
        if threads is not None:
            match_threads(restored.threads, device or torch.device("cpu"), threads, run_dir)
        match_numerics(state.get("numerics"), run_dir)
    records, note = metrics.truncate_after(restored.step)  # 0: died before its first checkpoint
    if note:
        restored.repairs.append(note)
        warnings.warn(note, NormlabWarning, stacklevel=2)
    for record in records:
        for key in ("train_loss", "val_loss", "token_share"):
            if key in record:
                restored.final[key] = record[key]
        if "val_loss" in record:
            restored.final.update(accuracy_of(record) | bits_of(record))
            restored.val_step = record.get("step")
    return restored


def run_summary(cfg: RunConfig, precision: Precision, outcome: str, step: int,
                best_val: float, final: dict[str, Any], reason: str | None = None, **extra: Any
                ) -> dict[str, Any]:
    """The content of summary.json when a run stops (see the module docstring); `precision` is
    the one it trained in."""
    return {"run_id": cfg.run_id(), "name": cfg.train.name, "tags": list(cfg.train.tags),
            "outcome": outcome, "step": step, "reason": reason,
            "steps_planned": cfg.train.steps,
            # the settings the placement decided (init, final norm, constants), not null/auto
            "resolved": {k: v for k, v in resolved_settings(cfg.model).items() if v is not None},
            # the precision it trained in (`train.precision=auto` resolved), and why
            "precision": precision.precision, "precision_reason": precision.reason,
            "best_val_loss": best_val if best_val < float("inf") else None, **final,
            "threads": torch.get_num_threads(), **extra}


def record_failure(run_dir: Path, run_id: str, reason: str | BaseException,
                   message: str | None = None, tb: str | None = None) -> dict[str, Any]:
    """Write `failed` into the run's summary (keeping its step); the run stays resumable.
    `reason` is a word (`worker_died`) with its `message`, or the exception that stopped the
    run (its type's name and its text). A refusal (`RunRefusedError`: the data changed, a
    damaged result) is returned, without the folder's numbers, and not written: the folder
    keeps what it holds."""
    error = reason if isinstance(reason, BaseException) else None
    if error is not None:
        reason, message = type(error).__name__, str(error) if message is None else message
    old = read_summary(run_dir) or {}
    if isinstance(error, RunRefusedError):
        return {"run_id": run_id, "outcome": "failed", "step": old.get("step", 0),
                "reason": reason, "message": message}
    summary = {**{k: v for k, v in old.items() if k not in ("outcome", "reason", "message")},
               "run_id": run_id, "outcome": "failed", "step": old.get("step", 0),
               "reason": reason, "message": message}
    if tb:
        summary["traceback"] = tb
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "summary.json", summary)
    return summary


def throughput(cfg: RunConfig, precision: str, tokens_per_step: int, device: torch.device,
               measure_peak: bool, devices: int = 1) -> Throughput:
    """The smoothed throughput of the progress line; with `measure_peak`, also MFU against the
    GEMM peak of `devices` devices in the run's `precision` (measured once per machine, about
    0.2 s)."""
    peak = None
    if measure_peak:
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        peak = quick_peak_tflops(dtype, device.type) * devices
    return Throughput(tokens_per_step, peak_tflops=peak,
                      flops_per_token=train_flops_per_token(cfg.model, cfg.data.seq_len),
                      device_type=device.type)


def train_run(
    cfg: RunConfig,
    root: Path | str = "runs",
    *,
    resume: Literal["auto", "require", "never"] = "auto",
    progress: bool = True,
    interrupt_at: int | None = None,
    threads: ThreadPolicy = "match",
) -> dict[str, Any]:
    """Train (or resume, or just report) the run of `cfg` under `root`; returns its summary.

    A finished run (completed or diverged) is not trained again. `resume="auto"` continues from a
    checkpoint when one exists; `"require"` insists on one; `"never"` refuses an existing folder.
    A resumed CPU run uses the thread count its checkpoint recorded (`threads="match"`, restored
    afterwards) or refuses another one (`"refuse"`). `interrupt_at` stops after that many steps
    as a signal would (for tests and demos). The run's folder is locked while this trains it: a
    second process asking for the same run gets `RunLockedError`.
    Inside a process group, every rank calls this and trains its shard of each batch (see
    `normlab.train.distributed`); rank 0 alone writes the run folder and holds its lock.
    """
    tc = cfg.train
    # Everything that can be rejected is checked before anything is written.
    data = load_run_data(cfg.data, cfg.model)
    dist = distributed.current()
    device = dist.train_device(resolve_device(tc.device))
    if device.type == "cpu":
        tune_cpu_allocator()
    distributed.check_divisible(tc.batch_size, dist.world_size)
    run_dir = Path(root) / cfg.run_id()
    if run_dir.exists() and not run_dir.is_dir():
        raise RunFolderError(f"{run_dir}: is a file, where this run's folder goes; move it away "
                             "or train under another --root")
    if resume == "require" and not run_dir.exists():
        raise RunFolderError(f"{run_dir}: no checkpoint to resume from")
    with contextlib.ExitStack() as held:
        refused, repairs = None, []
        if dist.main:
            try:
                stale = held.enter_context(hold_run(run_dir))
            except RunLockedError as e:
                refused = e
            else:  # a stale lock cleared (warned as it was) is kept with the repairs
                repairs = [*([stale] if stale else []), *recover_run_folder(run_dir)]
        if dist.max(int(refused is not None)):  # (a collective: the others wait for rank 0)
            raise refused or RunLockedError(
                f"{run_dir}: in use by process {lock_holder(run_dir)}, which is training this "
                "run; wait for it to finish or stop it, then run again")
        before = torch.get_num_threads()
        try:
            with kept_numerics():  # a resume may match the recorded flags; deterministic mode
                return _train_held(cfg, run_dir, data, dist, device, resume, progress,
                                   interrupt_at, threads, repairs)
        finally:
            torch.set_num_threads(before)  # a resume may have matched the recorded count


def recover_run_folder(run_dir: Path) -> list[str]:
    """Repairs of a run folder before it is read (the caller holds its lock): a checkpoint left
    between the two renames of `save_checkpoint` is put back; a damaged summary.json is noted
    (the run writes a new one, from its records and checkpoint). Returns what was done."""
    notes = []
    note = recover_checkpoint(run_dir / "checkpoint")
    if note is not None:
        notes.append(note)
    problem = summary_problem(run_dir)
    if problem is not None:
        notes.append(f"{run_dir / 'summary.json'}: was damaged ({problem}); rebuilt from "
                     "metrics.jsonl and the checkpoint")
    for note in notes:
        warnings.warn(note, NormlabWarning, stacklevel=3)
    return notes


def agreed_precision(cfg: RunConfig, run_dir: Path, device: torch.device,
                     dist: distributed.Dist) -> Precision:
    """The precision the run trains in (`normlab.train.precision.run_precision`: for `auto` the
    one its folder recorded, else decided now). In a process group rank 0 reads or measures and
    every rank trains in its choice (the reason is rank 0's, which alone writes it)."""
    if cfg.train.precision != "auto":
        return run_precision(cfg, run_dir, device)  # the same on every rank, nothing measured
    mine = run_precision(cfg, run_dir, device) if dist.main else None
    bf16 = dist.max(int(mine is not None and mine.precision == "bf16"))  # (a collective)
    return mine or Precision("bf16" if bf16 else "fp32", "rank 0's choice")


def _train_held(cfg: RunConfig, run_dir: Path, data: Any, dist: distributed.Dist,
                device: torch.device, resume: str, progress: bool, interrupt_at: int | None,
                threads: ThreadPolicy, repairs: list[str]) -> dict[str, Any]:
    """`train_run` once the run's lock is held."""
    tc = cfg.train
    run_id = cfg.run_id()
    finished = check_run_folder(cfg, run_dir, resume, data.fingerprint)
    if finished is not None:
        if progress and dist.main:
            print(f"[{run_id}] already {finished['outcome']} at step {finished.get('step')}, "
                  f"skipped (its folder {run_dir} holds the result; delete it to train again)",
                  file=sys.stderr, flush=True)
        return finished
    # an extension without a checkpoint of its own starts from the final one of the run it
    # extends (the same on every rank: the folder was read before anyone writes to it)
    source = None
    if tc.extends is not None and not (run_dir / "checkpoint" / "trainer_state.json").exists():
        source = check_extension(cfg, run_dir, data.fingerprint)

    # decided before anything is built, and said (a bf16 run on a CPU that emulates it warns);
    # an extension trains in the precision the run it continues recorded
    precision = agreed_precision(cfg, source or run_dir, device, dist)
    if dist.main:
        if progress and tc.precision == "auto":
            print(f"{run_id}: trains in {precision.precision} ({precision.reason})",
                  file=sys.stderr, flush=True)
        warn_slow_bf16(cfg, precision.precision, device)

    if tc.deterministic:  # before the model reaches the device: cuBLAS reads it at its start
        deterministic_algorithms()
    sampler = data.sampler(tc.batch_size, cfg.data.seq_len, seed=tc.seed)
    val = data.val_batches(tc.batch_size, cfg.data.seq_len, tc.eval_batches, seed=tc.seed)
    model = build_model(cfg.model, seed=tc.seed, profile_batch=sampler.batch(0)[0]).to(device)
    if device.type != "cpu" and isinstance(sampler, BatchSampler):  # batches gathered there
        sampler = sampler.to(device)
    optimizer = build_optimizer(model, tc, fused=fused_available(device))
    spike = SpikeDetector(factor=tc.spike_factor, patience=tc.spike_patience)
    model.activation_checkpointing = tc.activation_checkpointing
    net = dist.wrap(model)
    if tc.compile:  # compiled lazily: the first step pays (its time_s in metrics.jsonl)
        net = torch.compile(net)

    lr_rule = extension_lr(tc) if tc.extends is not None else None  # recorded in its meta
    dist.barrier()  # every rank has read the folder's state before rank 0 writes to it
    if dist.main:
        meta = run_meta(cfg, model, data, device, precision) | {"world_size": dist.world_size}
        write_run_config(run_dir, cfg, meta | ({"extends": lr_rule} if lr_rule else {}))
        data.save_tokenizer(run_dir)
        if source is not None:
            start_extension(source, run_dir, run_id, tc.extends.step)
    if source is not None:
        dist.barrier()  # the seeded checkpoint is there before any rank reads it

    metrics = MetricsLog(run_dir / "metrics.jsonl", tb_dir=run_dir / "tb", enabled=dist.main)
    restored = restore_checkpoint(run_dir, cfg, model, optimizer, spike, metrics, resume,
                                  threads=threads, device=device)
    if source is not None and lr_rule is not None and progress and dist.main:
        print(f"{run_id}: extends {source} from step {restored.step} to {tc.steps}; lr "
              f"{lr_rule['rule']}: {lr_rule['lr_before']:.3g} at its last step, "
              f"{lr_rule['lr_after']:.3g} now", file=sys.stderr, flush=True)
    elif restored.step and progress and dist.main:  # a re-run continues where it left off
        print(f"{run_id}: resuming from step {restored.step} of {tc.steps} (its checkpoint)",
              file=sys.stderr, flush=True)
    metrics.write_config(cfg.to_yaml(), restored.step)
    member = RunMember.restored(cfg, run_dir, restored, spike, metrics, precision, data,
                                repairs)
    loop = _SingleLoop(member, model, net, optimizer, sampler, val, data, dist, device,
                       progress)
    loop.run(interrupt_at)
    return loop.summaries[run_id]


@dataclass(kw_only=True)
class RunMember(Member):
    """A member of a run-folder loop (`RunLoop`): a run with its folder, records and the
    precision it trains in."""

    cfg: RunConfig
    run_dir: Path
    metrics: MetricsLog
    precision: Precision
    data: Any  # the run's data (its unigram entropy, bits per byte, a task's accuracy)
    repairs: list[str] = field(default_factory=list)  # said in its summary (see train_run)
    threads: int | None = None  # the CPU thread count its checkpoint recorded

    @cached_property
    def run_id(self) -> str:  # (a hash of the frozen config: once, not at every record)
        return self.cfg.run_id()

    @classmethod
    def restored(cls, cfg: RunConfig, run_dir: Path, restored: Restored, spike: SpikeDetector,
                 metrics: MetricsLog, precision: Precision, data: Any, repairs: list[str],
                 **more: Any) -> RunMember:
        """The member of a run continued from `restored` (see `restore_checkpoint`)."""
        return cls(tc=cfg.train, cfg=cfg, run_dir=run_dir, step=restored.step,
                   start=restored.step, spike=spike, best_val=restored.best_val,
                   final=dict(restored.final), val_step=restored.val_step, metrics=metrics,
                   precision=precision, data=data, repairs=repairs + restored.repairs,
                   threads=restored.threads if restored.step else None, **more)


class RunLoop(TrainLoop):
    """The `TrainLoop` of runs with folders (a single run, a stacked group): each member's
    metrics.jsonl, checkpoint, summary.json (`running` while it trains; its outcome at its end,
    `stalled` or `completed` as `end_of_run` decides) and progress. In a process group
    (`dist`) rank 0 alone writes them, and the ranks leave together."""

    def __init__(self, members: list[RunMember], device: torch.device,
                 dist: distributed.Dist = distributed.SINGLE) -> None:
        super().__init__(members)
        self.device = device
        self.dist = dist
        self.summaries: dict[str, dict[str, Any]] = {}
        self.bar: Progress | None = None

    def summary_fields(self) -> dict[str, Any]:
        """What every summary of this loop says besides the run's own fields."""
        return {}

    def begin(self) -> None:
        if self.dist.main:
            for m in self.active:
                write_json_atomic(m.run_dir / "summary.json", {
                    "run_id": m.run_id, "outcome": "running", "step": m.step,
                    "steps_planned": m.tc.steps, **self.summary_fields()})

    def write(self, m: RunMember, record: dict[str, Any]) -> None:
        m.metrics.write(record)

    def sync_records(self, row: int) -> None:
        self.active[row].metrics.flush()

    def keep_weights(self, row: int) -> None:
        if self.dist.main:
            m = self.active[row]
            keep_weights(m.run_dir / "checkpoint", m.step)

    def finish(self, m: RunMember, outcome: str, reason: str | None = None,
               **extra: Any) -> None:
        if m.repairs:
            extra["repairs"] = m.repairs
        summary = run_summary(m.cfg, m.precision, outcome, m.step, m.best_val, m.final, reason,
                              **self.summary_fields(), **extra)
        if self.dist.main:
            write_json_atomic(m.run_dir / "summary.json", summary)
            m.metrics.write_hparams(with_resolved_precision(resolved_run_fields(m.cfg),
                                                            m.precision.precision), summary)
        m.metrics.close()
        self.summaries[m.run_id] = summary
        if outcome != "failed":  # ranks in step: none returns before the folder is complete
            self.dist.barrier()  # (after a failure the others may be inside another collective)

    def end_trained(self, m: RunMember) -> None:
        """`completed`, or `stalled` as `end_of_run` decides it (from metrics.jsonl too)."""
        m.metrics.flush()
        outcome, diagnosis = end_of_run(m.final, m.run_dir, m.data.unigram_entropy,
                                        m.tc.stall_margin)
        self.end(m, outcome, **diagnosis, tokens_per_s=tokens_per_s(self, m))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        for m in self.members:
            m.metrics.close()


class _SingleLoop(RunLoop):
    """The loop of one run (`train_run`): its model, possibly wrapped for DDP (`net`) or
    compiled, steps by `accumulate_gradients` over `grad_accum` micro-batches."""

    def __init__(self, member: RunMember, model: NormTransformer, net: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, sampler: Any, val: list, data: Any,
                 dist: distributed.Dist, device: torch.device, progress: bool) -> None:
        super().__init__([member], device, dist)
        self.model, self.net, self.optimizer = model, net, optimizer
        self.all_params = list(model.parameters())
        self.sampler, self.val, self.data = sampler, val, data
        tc, cfg = member.tc, member.cfg
        self.bar = Progress(tc.steps, member.step, member.run_id, every=tc.log_every,
                            enabled=progress and dist.main)
        self.tokens_per_step = tc.batch_size * tc.grad_accum * cfg.data.seq_len
        self.speed = throughput(cfg, member.precision.precision, self.tokens_per_step, device,
                                progress and dist.main, dist.world_size)
        self.autocast = precision_context(member.precision.precision, device)

    def summary_fields(self) -> dict[str, Any]:
        return {"world_size": self.dist.world_size}

    def stop_reasons(self, signalled: bool, interrupt_at: int | None) -> list[str | None]:
        # 2: a signal on some rank, 1: interrupt_at; the max over ranks stops all alike
        m = self.active[0]
        code = self.dist.max(2 if signalled else int(interrupt_at is not None
                                                     and m.step >= interrupt_at))
        return [{0: None, 1: "requested", 2: "signal"}[code]]

    def gradients(self, lrs: list[float], stats_due: list[bool]
                  ) -> tuple[list[float], list[float]]:
        m = self.active[0]
        ramp_branches(self.model, m.tc, m.step)
        self.acc = accumulate_gradients(
            self.net, self.sampler, m.step, m.tc.grad_accum, self.dist, self.device,
            self.autocast,
            capture(self.model, "blocks.*.mlp.stream_out") if stats_due[0] else None,
            token_weighted=self.data.masked_targets)
        self.params, self.total_norm = gradient_norm(self.all_params)
        return [self.acc.train_loss], [self.total_norm.item()]

    def block_stats(self, row: int) -> dict[str, float]:
        return block_stats(self.model, self.acc.captured, self.dist)

    def update(self, rows: list[int], lrs: list[float]) -> None:
        set_lr(self.optimizer, lrs[0])
        clip_and_step(self.optimizer, self.params, self.total_norm, self.active[0].tc.grad_clip)

    def evaluate(self, due: list[bool]) -> list[dict[str, Any] | None]:
        ramp_branches(self.model, self.active[0].tc, self.active[0].step)
        values = evaluate(self.model, self.val, self.autocast, self.dist, self.data.accuracy(),
                          token_weighted=self.data.masked_targets)
        return [values | bits_per_byte(self.data, values["val_loss"])]

    def checkpoint(self, row: int) -> None:
        if self.dist.main:
            m = self.active[row]
            save_checkpoint(m.run_dir / "checkpoint", self.model, self.optimizer,
                            checkpoint_state(m.step, m.best_val, m.spike, m.run_id))

    def show(self, records: list[dict[str, Any]], dt: float) -> None:
        (m,), (record,) = self.active, records
        self.speed.update(dt)
        self.bar.update(m.step, progress_info(
            record["train_loss"], record["lr"], record["grad_norm"], m.final.get("val_loss"),
            self.speed, accuracy_of(m.final), val_step=m.val_step, step=m.step,
            bpb=m.final.get("val_bpb")))


def ramp_branches(model: NormTransformer, tc: TrainConfig, step: int) -> None:
    """ProRes (`train.prores_steps`, Chen et al. 2026, arXiv 2603.05369): set each block's
    branch factor for `step`, the optimizer steps done (`normlab.nn.block.prores_ramps`). A
    function of the step counter alone, so a resumed run continues with the factors it would
    have had; nothing when ProRes is off."""
    if tc.prores_steps:
        set_branch_ramps(model, prores_ramps(tc.prores_steps, len(model.blocks), step))


def bits_per_byte(data: Any, val_loss: float) -> dict[str, float]:
    """`val_bpb`, the validation loss as bits per byte of the held-out text (see
    `normlab.data.TextData.bits_per_byte`), when the data knows its bytes; else nothing."""
    bpb = data.bits_per_byte(val_loss)
    return {} if bpb is None else {"val_bpb": bpb}


def bits_of(record: dict[str, Any]) -> dict[str, float]:
    """The bits per byte of an evaluation record, if it has them."""
    return {"val_bpb": record["val_bpb"]} if "val_bpb" in record else {}


def accuracy_of(record: dict[str, Any]) -> dict[str, float]:
    """The accuracies of an evaluation record (`val_acc`, `val_acc_hop{k}`: a synthetic task's
    metric, see `normlab.data.khop`); empty for text."""
    return {k: v for k, v in record.items() if k.startswith("val_acc")}


@torch.no_grad()
def evaluate(model: NormTransformer, batches, autocast,
             dist: distributed.Dist = distributed.SINGLE, accuracy: Any = None,
             token_weighted: bool = False) -> dict[str, float]:
    """`val_loss`, the mean validation loss, and `token_share`, the token-varying share of the
    stream the head reads (`normlab.train.diagnostics`), from the same forward passes; with an
    `accuracy` accumulator (a synthetic task's, `normlab.data.khop.HopAccuracy`), its values from
    the same logits. In a process group each rank evaluates its shard of every batch and all are
    over all ranks, the same numbers on all of them. `val_loss` is the mean of the batches'
    losses, or with `token_weighted` (targets with ignored positions, a synthetic task's) the
    mean over all counted targets, which a process group's shards give alike."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, counted = 0.0, 0
    share = TokenShare()
    with capture(model, FINAL_STREAM) as cap:
        for batch in batches:
            x, y = dist.shard(*batch)
            x, y = x.to(device), y.to(device)
            with autocast:
                out = model(x, y)
            if token_weighted:
                n = int((y != IGNORE).sum())
                total, counted = total + out.loss.item() * n, counted + n
            else:
                total += out.loss.item()
            if accuracy is not None:
                accuracy.add(x, y, out.logits)
            share.add(cap[FINAL_STREAM].unsqueeze(0))
    model.train(was_training)
    if token_weighted:
        sums = dist.mean(torch.tensor([total, counted], dtype=torch.float64)).tolist()
        loss = sums[0] / sums[1]
    else:
        loss = dist.mean(torch.tensor(total, dtype=torch.float64)).item() / len(batches)
    result = {"val_loss": loss, "token_share": share.values(dist)[0]}
    if accuracy is not None:
        result.update(accuracy.values(dist)[0])
    return result


def block_stats(model: NormTransformer, cap,
                dist: distributed.Dist = distributed.SINGLE) -> dict[str, float]:
    """Per block: gradient norm of the attention and MLP parameters, stream norm after the block
    (mean over tokens of the per-token L2 norm; over all ranks' tokens in a process group)."""
    names, grads, streams = block_stat_tensors(model, cap, members=False)
    values = torch.cat([grads, dist.mean(streams)]).squeeze(1).tolist()  # one host sync
    return dict(zip(names, values, strict=True))


def block_stat_tensors(model: NormTransformer, cap, *, members: bool
                       ) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """The per-block statistics of `block_stats` as tensors still on the device, without a
    host sync: their names (gradient norms first), gradient norms [G, M] and stream norms [S, M],
    M the members of a stacked model (`members=True`: weights and stream carry a leading member
    dimension) or 1. Computed from the gradients and the captured `blocks.*.mlp.stream_out`
    the step already has; nothing runs the model again."""
    grad_names, grads, stream_names, streams = [], [], [], []
    for i, block in enumerate(model.blocks):
        for part in ("attn", "mlp"):
            per_param = [torch.linalg.vector_norm((g if members else g[None]).flatten(1), dim=1)
                         for p in getattr(block, part).parameters()
                         if (g := p.grad) is not None]
            if per_param:
                grad_names.append(f"blocks.{i}.{part}.grad_norm")
                grads.append(torch.linalg.vector_norm(torch.stack(per_param), dim=0))
        act = cap.activations.get(f"blocks.{i}.mlp.stream_out") if cap is not None else None
        if act is not None:
            stream_names.append(f"blocks.{i}.stream_norm")
            norms = act.float().norm(dim=-1)
            streams.append(norms.flatten(1).mean(1) if members else norms.mean()[None])
    empty = torch.zeros(0, model.members if members else 1,
                        device=next(model.parameters()).device)
    return (grad_names + stream_names, torch.stack(grads) if grads else empty,
            torch.stack(streams) if streams else empty)


def train_run_raising_interrupt(cfg: RunConfig, root: Path | str,
                                **kwargs: Any) -> dict[str, Any]:
    """`train_run` for a caller that trains several runs in a row: a signal that interrupted this
    run (after its checkpoint) also stops the caller, by raising KeyboardInterrupt."""
    summary = train_run(cfg, root, **kwargs)
    if summary["outcome"] == "interrupted" and summary.get("reason") == "signal":
        raise KeyboardInterrupt(f"run {summary['run_id']} interrupted at step {summary['step']}")
    return summary
