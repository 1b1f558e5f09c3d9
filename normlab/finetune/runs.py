"""Fine-tuning a run folder (`finetune`, `finetune_lrs`): its trained model (or, `from_init`, its
architecture at init) through the loop of :mod:`normlab.finetune.loop`, with the result stored in
``run_dir/finetune/<task>-<hash>.json`` (``<task>-init-<hash>`` from init), the hash
(`FinetuneConfig.cache_hash`) covering every setting and the weights' run and step; an existing
file is returned as it is (with ``cached: True``), so a study that is re-run does no finished work
again. `finetune_many` runs several on worker processes.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from normlab.finetune.config import FinetuneConfig, FinetuneError, finetune_config
from normlab.finetune.loop import finetune_model_lrs
from normlab.train.checkpoint import CheckpointError
from normlab.train.logging import read_json, write_json_atomic
from normlab.train.machine import default_threads
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
    cfg = finetune_config(config, **settings)
    return finetune_lrs(run_dir, cfg, lrs=[cfg.lr], from_init=from_init, step=step, device=device,
                        force=force, progress=progress)[0]


def finetune_lrs(run_dir: Path | str, config: FinetuneConfig | None = None, *,
                 lrs: Sequence[float] | None = None, from_init: bool = False,
                 step: int | None = None, device: str = "auto", force: bool = False,
                 progress: Callable[[str], None] | None = None, **settings: Any
                 ) -> list[dict[str, Any]]:
    """:func:`finetune` at each of ``lrs`` (default: the config's lr), in order, each lr's
    result in its own file (the one :func:`finetune` at that lr reads and writes); the lrs not
    stored yet are trained together (:func:`finetune_model_lrs`: with ``freeze=True``, one pass
    of the body over the passages for all of them)."""
    from normlab.train import RunFolderError, read_run_config, read_summary
    from normlab.train.rundir import find_run

    cfg = finetune_config(config, **settings)
    lrs = [cfg.lr] if lrs is None else list(lrs)
    if not lrs:
        raise FinetuneError("lrs: at least one learning rate")
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
    configs = [cfg.replace(lr=lr) for lr in lrs]
    paths = [finetune_path(run_dir, c, from_init, step) for c in configs]
    out: list[dict[str, Any] | None] = [None] * len(lrs)
    if not force:
        for i, (path, c) in enumerate(zip(paths, configs, strict=True)):
            stored = read_json(path)  # None when missing or damaged: recomputed
            if isinstance(stored, dict) and stored.get("settings") == c.record():
                out[i] = stored | {"cached": True}
    todo = [i for i, r in enumerate(out) if r is None]
    if not todo:
        return out  # type: ignore[return-value]
    run_cfg, model = _load_run_model(run_dir, from_init, step)
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
    if (not from_init and run_cfg.model.positions == "learned"
            and read > run_cfg.data.seq_len):
        warnings.warn(
            f"the model reads {read} bytes at once, more than the run's data.seq_len="
            f"{run_cfg.data.seq_len}: learned positions beyond it were never trained (set "
            f"window to a divisor of passage_bytes at most {run_cfg.data.seq_len})",
            NormlabWarning, stacklevel=3)
    results = finetune_model_lrs(model, cfg, lrs=[lrs[i] for i in todo], device=device,
                                 progress=progress)
    summary = read_summary(run_dir) or {}
    for i, result in zip(todo, results, strict=True):
        result |= {"run_dir": str(run_dir), "run_id": run_dir.name, "from_init": from_init,
                   "checkpoint_step": _source_step(run_dir, from_init, step),
                   "pretrain": {k: summary.get(k) for k in ("outcome", "step", "train_loss",
                                                            "val_loss", "best_val_loss")},
                   "path": str(paths[i])}
        paths[i].parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(paths[i], result)
        out[i] = result | {"cached": False}
    return out  # type: ignore[return-value]


def _finetune_job(job: tuple[str, dict[str, Any], int]) -> Any:
    run_dir, kwargs, threads = job
    torch.set_num_threads(threads)
    return finetune_lrs(run_dir, **kwargs) if "lrs" in kwargs else finetune(run_dir, **kwargs)


def finetune_many(jobs: list[tuple[Path | str, dict[str, Any]]], workers: int = 1
                  ) -> list[Any]:
    """``finetune(run_dir, **kwargs)`` for every job, in order (``finetune_lrs`` for a job whose
    kwargs give ``lrs``: its list of results); with ``workers > 1`` on that many fresh (spawned)
    processes, each with its share of the CPU threads. Results are cached in the run folders as
    usual, so a later ``finetune`` call with the same settings reads them."""
    if workers <= 1 or len(jobs) < 2:
        return [finetune_lrs(run_dir, **kw) if "lrs" in kw else finetune(run_dir, **kw)
                for run_dir, kw in jobs]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    threads = default_threads(workers)
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)),
                             mp_context=mp.get_context("spawn")) as pool:
        return list(pool.map(_finetune_job, [(str(rd), kw, threads) for rd, kw in jobs]))

