"""Which pending runs of a sweep train together as one stacked model (`normlab.train.group`).

Runs are grouped by their stack key (same model, data, batch size, device, precision, compile;
see `normlab.train.group.stack_key`), in plan order, at most `group_limit` to a group. A key's
runs are split into near-equal groups, enough of them to keep every worker busy (8 runs on 2
workers: two groups of 4). A group of one is a separate run.

The limit depends on where the runs train:
- CPU (and MPS): `MAX_GROUP` runs.
- CUDA (`train.device=cuda`, or `auto` on a machine with CUDA): as many runs as the GPU's free
  memory allows, by the memory estimate of a stacked group (`normlab.train.memory.runs_that_fit`:
  `GPU_GROUP_MARGIN`, 80%, of the free memory of the first GPU when the plan is made). A GPU step of
  a small model is bound by kernel launches, so added members cost little step time; one group
  per worker, and one worker per GPU (`normlab.sweep.executors.default_workers`), puts a whole
  lr x seed grid of one shape in one group.

Engines:
- `separate`: every run on its own (`train_run`), as before stacking existed.
- `stacked`: every group of two or more stackable runs is stacked; runs that cannot be stacked
  (dropout, batchnorm, encoders, gradient accumulation, activation checkpointing, or any
  setting the stacked engine does not list as honoured: `normlab.train.group`) run separately,
  and the reason, naming the setting, is reported.
- `auto` (the default): `stacked` where it pays, otherwise `separate`. On a GPU stacking always
  pays (one kernel per op for all members instead of one per member). On a CPU the gain is the
  per-op overhead a small run pays; a run whose step is larger keeps the cores busy by itself, and
  a stacked group of such runs is no faster, or slower (its activations are M times larger and
  fall out of cache). Measured with `benchmarks/bench_batched.py`, auto stacks CPU runs only when
  `d_model * batch_size * seq_len <= AUTO_CPU_WORK_PER_THREAD * threads` (16,384 a thread: where
  stacking was >= 1.2x; with more threads a run computes its step sooner, so overhead is a larger
  share of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from normlab.config import RunConfig
from normlab.sweep.spec import PlannedRun
from normlab.train.machine import cpu_stacking_note, cpu_stacking_pays

MAX_GROUP = 8  # runs in a CPU group (a GPU group: `group_limit`)
# The CPU rule (`AUTO_CPU_WORK_PER_THREAD`, the largest CPU run that auto stacks per thread a run
# gets) is `normlab.train.machine`'s, where fine-tuning's plan reads it too


@dataclass(frozen=True)
class RunTask:
    """One run, trained on its own."""

    run_id: str
    config: dict  # RunConfig.to_dict(): plain data, cheap to send to a worker

    @property
    def run_ids(self) -> tuple[str, ...]:
        return (self.run_id,)


@dataclass(frozen=True)
class GroupTask:
    """Runs trained as one stacked model by one worker."""

    members: tuple[RunTask, ...]

    @property
    def run_ids(self) -> tuple[str, ...]:
        return tuple(m.run_id for m in self.members)


def cpu_work(cfg: RunConfig) -> int:
    """d_model x batch_size x seq_len: how much a step of the run computes, for the auto rule."""
    return cfg.model.d_model * cfg.train.batch_size * cfg.data.seq_len


def on_cuda(cfg: RunConfig, cuda_available: bool) -> bool:
    """Whether the run trains on a CUDA GPU (`train.device` cuda, or auto where CUDA is)."""
    return cfg.train.device == "cuda" or (cfg.train.device == "auto" and cuda_available)


def stacking_pays(cfg: RunConfig, cuda_available: bool, threads: int = 1) -> bool:
    """The `auto` rule for one run trained with `threads` CPU threads (see the module
    docstring)."""
    if on_cuda(cfg, cuda_available):
        return True
    if cfg.train.device == "mps":
        return False  # not measured
    return cpu_stacking_pays(cpu_work(cfg), threads)


def group_limit(cfg: RunConfig, cuda_available: bool) -> int:
    """The most runs of `cfg` one stacked group holds (see the module docstring)."""
    if not on_cuda(cfg, cuda_available):
        return MAX_GROUP
    from normlab.train.memory import available_bytes, runs_that_fit

    free, _ = available_bytes("cuda")
    return MAX_GROUP if free is None else runs_that_fit(cfg, free)


def _split(runs: list[PlannedRun], workers: int, limit: int) -> list[list[PlannedRun]]:
    from normlab.train.group import split_evenly  # (the rule fine-tuning's groups follow too)

    return split_evenly(runs, workers, limit)


def plan_tasks(runs: Sequence[PlannedRun], engine: str, workers: int, threads: int = 1,
               cuda_available: bool = False) -> tuple[list[RunTask | GroupTask], list[str]]:
    """The tasks that train `runs` under `engine` on `workers` workers of `threads` CPU threads
    each, in plan order, and notes on the choices made (for the progress display).
    `cuda_available`: whether this machine has CUDA (`torch.cuda.is_available()`), which decides
    where `train.device=auto` runs train and so the `auto` rule and the size of their groups."""
    from normlab.train.group import run_unstackable_reason, stack_key

    def single(run: PlannedRun) -> RunTask:
        return RunTask(run.run_id, run.config.to_dict())

    if engine == "separate":
        return [single(r) for r in runs], []
    by_key: dict[str, list[PlannedRun]] = {}
    tasks: list[tuple[int, RunTask | GroupTask]] = []
    notes: dict[str, int] = {}
    for run in runs:
        reason = run_unstackable_reason(run.config)
        if reason is None and engine == "auto" and not stacking_pays(run.config, cuda_available,
                                                                     threads):
            reason = cpu_stacking_note("d_model*batch_size*seq_len", cpu_work(run.config),
                                       threads)
        if reason is not None:
            notes[reason] = notes.get(reason, 0) + 1
            tasks.append((run.index, single(run)))
        else:
            by_key.setdefault(stack_key(run.config), []).append(run)
    for members in by_key.values():
        for group in _split(members, workers, group_limit(members[0].config, cuda_available)):
            if len(group) == 1:
                tasks.append((group[0].index, single(group[0])))
            else:
                tasks.append((group[0].index, GroupTask(tuple(single(r) for r in group))))
    tasks.sort(key=lambda t: t[0])
    groups = [t for _, t in tasks if isinstance(t, GroupTask)]
    lines = []
    if groups:
        sizes = "+".join(str(len(g.members)) for g in groups)
        lines.append(f"engine {engine}: {sum(len(g.members) for g in groups)} runs in "
                     f"{len(groups)} stacked group(s) ({sizes}), "
                     f"{len(tasks) - len(groups)} separate")
    lines += [f"{n} run(s) separate: {reason}" for reason, n in notes.items()]
    return [t for _, t in tasks], lines
