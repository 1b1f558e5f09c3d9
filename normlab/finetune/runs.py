"""Fine-tuning a run folder (`finetune`, `finetune_lrs`): its trained model (or, `from_init`, its
architecture at init) through the loop of :mod:`normlab.finetune.loop`, with the result stored in
``run_dir/finetune/<task>-<hash>.json`` (``<task>-init-<hash>`` from init), the hash
(`FinetuneConfig.cache_hash`) covering every setting and the weights' run and step; an existing
file is returned as it is (with ``cached: True``), so a study that is re-run does no finished work
again. `finetune_many` runs many, of many run folders: those that can stack as stacked groups
(`plan_finetunes`), on worker processes.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from normlab.finetune.config import FinetuneConfig, FinetuneError, finetune_config
from normlab.finetune.loop import finetune_models
from normlab.train.checkpoint import CheckpointError
from normlab.train.group import finetune_stack_key, finetune_unstackable_reason, split_evenly
from normlab.train.logging import read_json, write_json_atomic
from normlab.train.machine import cpu_stacking_note, cpu_stacking_pays, default_threads
from normlab.warnings import NormlabWarning


def _checkpoint_step(run_dir: Path) -> int | None:
    path = run_dir / "checkpoint" / "trainer_state.json"
    try:
        return int(json.loads(path.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _source_step(run_dir: Path, from_init: bool, step: int | None) -> int | None:
    """The training step of the weights fine-tuned: None from init, ``step`` for weights kept
    along the run, else the last checkpoint's."""
    if from_init:
        return None
    return step if step is not None else _checkpoint_step(run_dir)


def finetune_path(run_dir: Path | str, config: FinetuneConfig, from_init: bool = False,
                  step: int | None = None) -> Path:
    """Where the result of fine-tuning ``run_dir`` (its weights kept at ``step``, or its last
    checkpoint) with ``config`` is (or will be) stored: named by `FinetuneConfig.cache_hash`."""
    run_dir = Path(run_dir)
    digest = config.cache_hash(run_dir.name, from_init, _source_step(run_dir, from_init, step))
    return run_dir / "finetune" / f"{config.task}-{'init-' if from_init else ''}{digest}.json"


def _load_run_model(run_dir: Path, from_init: bool, step: int | None = None):
    from normlab.nn import build_model
    from normlab.train import RunFolderError, load_trained_model, read_run_config

    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: no such run folder")
    try:
        if from_init:
            cfg = read_run_config(run_dir)
            return cfg, build_model(cfg.model, seed=cfg.train.seed)
        return load_trained_model(run_dir, step=step)
    except RunFolderError as e:
        raise CheckpointError(str(e)) from None


# Fine-tunings in one stacked group of `finetune_many`, as a sweep's groups on a CPU
# (`normlab.sweep.grouping.MAX_GROUP`).
MAX_GROUP = 8


@dataclass(frozen=True)
class Wanted:
    """One fine-tuning of a run folder: its settings (``window`` resolved from the run), where
    its weights come from (``from_init``, ``step``), where it runs and its result file."""

    run_dir: Path
    config: FinetuneConfig
    from_init: bool
    step: int | None
    device: str
    path: Path


def _wanted(run_dir: Path | str, cfg: FinetuneConfig, lrs: Sequence[float], from_init: bool,
            step: int | None, device: str) -> list[Wanted]:
    """The fine-tunings of ``run_dir`` with ``cfg`` at each of ``lrs``. A config without
    ``window`` reads a passage longer than the run's pretraining context (``data.seq_len``,
    learned positions) in windows of that context when it divides ``passage_bytes``."""
    from normlab.train import RunFolderError, read_run_config
    from normlab.train.rundir import find_run

    try:  # a run's id, a unique prefix of it, or its name, under ./runs
        run_dir = find_run(run_dir)
    except RunFolderError as e:
        raise CheckpointError(str(e)) from None
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: no such run folder")
    if cfg.window is None and not from_init:
        try:
            run_cfg = read_run_config(run_dir)
        except RunFolderError as e:
            raise CheckpointError(str(e)) from None
        context = run_cfg.data.seq_len
        if (run_cfg.model.positions == "learned" and cfg.passage_bytes > context
                and cfg.passage_bytes % context == 0):
            cfg = cfg.replace(window=context)
    out = []
    for lr in lrs:
        c = cfg.replace(lr=lr)
        out.append(Wanted(run_dir, c, from_init, step, device,
                          finetune_path(run_dir, c, from_init, step)))
    return out


def _request(run_dir: Path | str, config: FinetuneConfig | None = None, *,
             lrs: Sequence[float] | None = None, from_init: bool = False,
             step: int | None = None, device: str = "auto", force: bool = False,
             progress: Callable[[str], None] | None = None, **settings: Any
             ) -> tuple[list[Wanted], bool, Callable[[str], None] | None]:
    """The arguments of `finetune` or `finetune_lrs` as the fine-tunings they ask for."""
    cfg = finetune_config(config, **settings)
    lrs = [cfg.lr] if lrs is None else list(lrs)
    if not lrs:
        raise FinetuneError("lrs: at least one learning rate")
    return _wanted(run_dir, cfg, lrs, from_init, step, device), force, progress


def _stored(w: Wanted) -> dict[str, Any] | None:
    """The result file of ``w`` when it holds ``w``'s settings (a missing or damaged file, or
    other settings: None, recomputed)."""
    stored = read_json(w.path)
    if isinstance(stored, dict) and stored.get("settings") == w.config.record():
        return stored | {"cached": True}
    return None


def finetune(run_dir: Path | str, config: FinetuneConfig | None = None, *,
             from_init: bool = False, step: int | None = None, device: str = "auto",
             force: bool = False, progress: Callable[[str], None] | None = None,
             **settings: Any) -> dict[str, Any]:
    """Fine-tune the trained model of ``run_dir`` (or, ``from_init``, its architecture at init
    with the run's seed) with ``config`` (or the `FinetuneConfig` of ``settings``) and store the
    result in ``run_dir/finetune/<task>-<hash>.json``.

    A config without ``window`` reads a passage longer than the run's pretraining context
    (``data.seq_len``, learned positions) in windows of that context when it divides
    ``passage_bytes``. ``step`` fine-tunes the weights the run kept at that step
    (``train.keep_checkpoints``) instead of its last checkpoint.
    If that file exists (same settings, same checkpoint step), it is returned without training,
    with ``cached: True`` (``force=True`` recomputes). See :func:`finetune_model` for the keys;
    added here: ``run_dir``, ``run_id``, ``from_init``, ``checkpoint_step``, ``pretrain`` (the
    run's outcome and losses), ``path``.

    Raises:
        CheckpointError: not a run folder, or no checkpoint (unless ``from_init``).
        FinetuneError: bad settings, or ``passage_bytes`` above the model's ``max_seq_len``.
    """
    wanted, force, progress = _request(run_dir, config, from_init=from_init, step=step,
                                       device=device, force=force, progress=progress,
                                       **settings)
    return _finetune_wanted(wanted, force, progress)[0]


def finetune_lrs(run_dir: Path | str, config: FinetuneConfig | None = None, *,
                 lrs: Sequence[float] | None = None, from_init: bool = False,
                 step: int | None = None, device: str = "auto", force: bool = False,
                 progress: Callable[[str], None] | None = None, **settings: Any
                 ) -> list[dict[str, Any]]:
    """:func:`finetune` at each of ``lrs`` (default: the config's lr), in order, each lr's
    result in its own file (the one :func:`finetune` at that lr reads and writes); the lrs not
    stored yet are trained together (:func:`normlab.finetune.finetune_models`: as one stacked
    group, or with ``freeze=True`` one pass of the body over the passages for all of them)."""
    wanted, force, progress = _request(run_dir, config, lrs=lrs, from_init=from_init,
                                       step=step, device=device, force=force,
                                       progress=progress, **settings)
    return _finetune_wanted(wanted, force, progress)


def _finetune_wanted(wanted: Sequence[Wanted], force: bool = False,
                     progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The result of each of ``wanted`` (one device), in order: read from its file, or (all
    with ``force``) trained together (:func:`normlab.finetune.finetune_models`) and stored."""
    from normlab.train import read_summary

    out: list[dict[str, Any] | None] = [None if force else _stored(w) for w in wanted]
    todo = [i for i, r in enumerate(out) if r is None]
    if not todo:
        return out  # type: ignore[return-value]
    models: dict[tuple[Path, bool, int | None], Any] = {}
    for i in todo:
        w = wanted[i]
        source = (w.run_dir, w.from_init, w.step)
        if source not in models:
            models[source] = _load_run_model(w.run_dir, w.from_init, w.step)
        _check_source(w, *models[source])
    results = finetune_models([(models[(w.run_dir, w.from_init, w.step)][1], w.config)
                               for w in (wanted[i] for i in todo)],
                              device=wanted[todo[0]].device, progress=progress)
    summaries: dict[Path, dict[str, Any]] = {}
    for i, result in zip(todo, results, strict=True):
        w = wanted[i]
        if w.run_dir not in summaries:
            summaries[w.run_dir] = read_summary(w.run_dir) or {}
        summary = summaries[w.run_dir]
        result |= {"run_dir": str(w.run_dir), "run_id": w.run_dir.name,
                   "from_init": w.from_init,
                   "checkpoint_step": _source_step(w.run_dir, w.from_init, w.step),
                   "pretrain": {k: summary.get(k) for k in ("outcome", "step", "train_loss",
                                                            "val_loss", "best_val_loss")},
                   "path": str(w.path)}
        w.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(w.path, result)
        out[i] = result | {"cached": False}
    return out  # type: ignore[return-value]


def _check_source(w: Wanted, run_cfg: Any, model: Any) -> None:
    """Refuse a run whose model cannot read ``w``'s passages; warn where it reads positions it
    never trained."""
    cfg, run_dir = w.config, w.run_dir
    task = cfg.task
    if run_cfg.data.task is not None:
        raise FinetuneError(f"{run_dir}: trained on data.task={run_cfg.data.task}; the "
                            f"{task} task reads text, which this model's tokens are not")
    if run_cfg.data.tokenizer != "byte" or (Path(run_dir) / "tokenizer.json").exists():
        raise FinetuneError(f"{run_dir}: trained on the tokens of a tokenizer "
                            f"({run_cfg.data.tokenizer}, or its folder's tokenizer.json); the "
                            f"{task} task reads passages as bytes, so fine-tune a byte-level run")
    hint = " or pretrain with a larger model.max_seq_len"
    read = cfg.window or cfg.passage_bytes
    if read > run_cfg.model.max_seq_len:
        raise FinetuneError(
            f"{'window' if cfg.window else 'passage_bytes'}={read} exceeds the run's "
            f"model.max_seq_len={run_cfg.model.max_seq_len}; lower it{hint}")
    if (not w.from_init and run_cfg.model.positions == "learned"
            and read > run_cfg.data.seq_len):
        warnings.warn(
            f"the model reads {read} bytes at once, more than the run's data.seq_len="
            f"{run_cfg.data.seq_len}: learned positions beyond it were never trained (set "
            f"window to a divisor of passage_bytes at most {run_cfg.data.seq_len})",
            NormlabWarning, stacklevel=4)


def stacking_pays_here(w: Wanted, model: Any, threads: int) -> str | None:
    """None where stacking ``w`` pays, else why not: the sweep's `auto` rule
    (`normlab.sweep.grouping.stacking_pays`) with a fine-tuning step's work, d_model x
    passages x bytes per passage; on a CUDA GPU stacking always pays."""
    work = model.d_model * w.config.batch_size * w.config.passage_bytes
    if w.device == "cuda" or cpu_stacking_pays(work, threads):
        return None
    return cpu_stacking_note("d_model*batch_size*passage_bytes", work, threads)


def plan_finetunes(wanted: Sequence[Wanted], workers: int = 1, threads: int | None = None
                   ) -> tuple[list[list[int]], list[str]]:
    """Which of ``wanted`` train together, as lists of their indices, in the order of their
    first, and notes on the choices (as a sweep's `normlab.sweep.grouping.plan_tasks`):
    fine-tunings with one stack key (`normlab.train.group.finetune_stack_key`) as stacked
    groups of at most `MAX_GROUP`, near-equal, enough to keep ``workers`` busy, where stacking
    pays (`stacking_pays_here`, with ``threads`` CPU threads a worker: by default each
    worker's share); a frozen body's lrs of one run's weights together (their features computed
    once); any other fine-tuning alone, with the reason (`finetune_unstackable_reason`)."""
    from normlab.train import read_run_config

    threads = default_threads(workers) if threads is None else threads

    models: dict[Path, Any] = {}
    keyed: dict[Any, list[int]] = {}
    notes: dict[str, int] = {}
    for i, w in enumerate(wanted):
        if w.run_dir not in models:
            models[w.run_dir] = read_run_config(w.run_dir).model
        reason = finetune_unstackable_reason(w.config, models[w.run_dir])
        if reason is None and not w.config.freeze:
            reason = stacking_pays_here(w, models[w.run_dir], threads)
        if reason is None:
            key: Any = ("stacked", finetune_stack_key(w.config, models[w.run_dir], w.device))
        elif w.config.freeze:
            key = ("frozen", w.run_dir, w.from_init, w.step, w.device,
                   w.config.replace(lr=FinetuneConfig().lr))
        else:
            key = ("alone", i)
        if reason is not None:
            notes[reason] = notes.get(reason, 0) + 1
        keyed.setdefault(key, []).append(i)
    tasks: list[list[int]] = []
    for key, rows in keyed.items():
        tasks += split_evenly(rows, workers, MAX_GROUP) if key[0] == "stacked" else [rows]
    tasks.sort(key=lambda t: t[0])
    groups = [t for t in tasks if len(t) > 1 and not wanted[t[0]].config.freeze]
    lines = []
    if groups:
        sizes = "+".join(str(len(g)) for g in groups)
        lines.append(f"{sum(len(g) for g in groups)} fine-tunings in {len(groups)} stacked "
                     f"group(s) ({sizes}), {len(tasks) - len(groups)} apart")
    lines += [f"{n} fine-tuning(s) alone: {reason}" for reason, n in notes.items()]
    return tasks, lines


def _finetune_task(task: tuple[list[Wanted], int]) -> list[dict[str, Any]]:
    wanted, threads = task
    torch.set_num_threads(threads)
    return _finetune_wanted(wanted, force=True)


def finetune_many(jobs: list[tuple[Path | str, dict[str, Any]]], workers: int = 1,
                  log: Callable[[str], None] | None = None) -> list[Any]:
    """``finetune(run_dir, **kwargs)`` for every job, in order (``finetune_lrs`` for a job whose
    kwargs give ``lrs``: its list of results). The results not stored yet train as
    `plan_finetunes` groups them (those that can stack, of every job, as stacked groups), with
    ``workers > 1`` on that many fresh (spawned) processes, each with its share of the CPU
    threads; ``log`` is told the plan. Results are cached in the run folders as usual, so a
    later ``finetune`` call with the same settings reads them."""
    requests = [(_request(run_dir, **kw), "lrs" in kw) for run_dir, kw in jobs]
    wanted: list[Wanted] = []
    where: list[list[int]] = []
    results: list[dict[str, Any] | None] = []
    progress = None
    for (ws, force, told), _ in requests:
        where.append(list(range(len(wanted), len(wanted) + len(ws))))
        wanted += ws
        results += [None if force else _stored(w) for w in ws]
        progress = progress or told
    todo = [i for i, r in enumerate(results) if r is None]
    tasks, notes = plan_finetunes([wanted[i] for i in todo], workers)
    tasks = [[todo[k] for k in t] for t in tasks]
    if log is not None:
        for line in notes:
            log(line)
    if workers <= 1 or len(tasks) < 2:
        done = [_finetune_wanted([wanted[i] for i in t], force=True, progress=progress)
                for t in tasks]
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        threads = default_threads(workers)
        with ProcessPoolExecutor(max_workers=min(workers, len(tasks)),
                                 mp_context=mp.get_context("spawn")) as pool:
            done = list(pool.map(_finetune_task,
                                 [([wanted[i] for i in t], threads) for t in tasks]))
    for t, got in zip(tasks, done, strict=True):
        for i, result in zip(t, got, strict=True):
            results[i] = result
    return [[results[i] for i in rows] if lrs else results[rows[0]]
            for rows, (_, lrs) in zip(where, requests, strict=True)]
