"""`normlab train`: one run, on one process or with `--nproc N` on N (DistributedDataParallel;
each rank runs `python -m normlab train` with the same arguments but `--nproc`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from normlab.cli.app import app, check_output_folder
from normlab.cli.console import console, err_console, fail
from normlab.config import ConfigError


@app.command()
def train(
    config: Annotated[Path | None, typer.Argument(
        metavar="CONFIG", help="YAML run config (model/data/train)")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="PATH=VALUE",
        help="dotted override, e.g. --set model.placement=post --set train.lr=1e-3")
    ] = None,
    root: Annotated[Path, typer.Option(help="folder that holds the run folders")] = Path("runs"),
    resume: Annotated[Path | None, typer.Option(
        help="continue the run in this folder; with --set train.steps=N, extend the finished "
             "run to N steps (a new run folder beside it)")] = None,
    quiet: Annotated[bool, typer.Option(help="no progress output")] = False,
    nproc: Annotated[int, typer.Option(
        min=1, help="train on N local processes with DistributedDataParallel; "
                    "train.batch_size is the global batch and must be divisible by N")] = 1,
    threads: Annotated[int | None, typer.Option(
        min=1, help="torch CPU threads per process [default: CPUs / processes when N > 1]")
    ] = None,
) -> None:
    """Train one run. Its folder under ROOT is named by a hash of the resolved config. Under
    torchrun (or with --nproc) the processes train the one run together. `--resume RUN --set
    train.steps=N` extends a finished run to N steps: a new run that starts from its final
    checkpoint (docs/reliability.md)."""
    import torch

    from normlab.data import DataError
    from normlab.train import (
        CheckpointError,
        RunFolderError,
        distributed,
        read_run_config,
        train_run,
    )
    from normlab.train.machine import default_threads
    from normlab.train.memory import check_run_fits
    from normlab.train.trainer import extended_config, finished_run_damage, resolve_device

    world = distributed.env_world_size()
    try:
        if resume is not None:
            if config is not None:
                fail("--resume takes the run's own config.yaml; drop CONFIG")
            try:
                cfg = read_run_config(resume)
            except RunFolderError as e:
                if not (resume / "config.yaml").is_file():
                    raise
                fail(f"{e}; --resume reads the run's settings from it, so the run cannot be "
                     "continued: restore the file (the folder's name is the hash of those "
                     "settings), or train the run again from its config")
            root = resume.parent
            if cfg.run_id() != resume.name:
                fail(f"{resume}: folder name does not match its config (run id {cfg.run_id()})")
            check_output_folder(resume, "--resume")
            if set_:
                cfg = extended_config(resume, _extension_steps(set_, resume))
        else:
            from normlab.config import load_run_config

            if config is not None and config.is_dir() and (config / "config.yaml").is_file():
                fail(f"{config}: is a run folder, not a config file; to continue that run use "
                     f"`normlab train --resume {config}`, or to train with its settings give "
                     f"its config.yaml ({config / 'config.yaml'})")
            cfg = load_run_config(config, set_)
            check_output_folder(root, "--root")
        damage = finished_run_damage(Path(root) / cfg.run_id())
        if damage:
            fail(damage)
        check_run_fits(cfg, processes=max(nproc, world))
        if nproc > 1:
            if world > 1:
                fail("--nproc starts its own processes; under torchrun leave it out")
            distributed.check_divisible(cfg.train.batch_size, nproc)
            distributed.check_gpus(resolve_device(cfg.train.device), nproc)
            raise typer.Exit(distributed.launch(_rank_args(
                config, set_, root, resume, quiet, threads), nproc))
        # an extension is a new run: its folder need not exist yet
        extending = resume is not None and bool(set_)
        if threads is not None or world > 1:
            torch.set_num_threads(threads or default_threads(world))
        with distributed.process_group(resolve_device(cfg.train.device)) as dist:
            # an explicit --threads that differs from a resumed run's own count is refused
            # (exit 2, with the count to use); otherwise a resume runs on the recorded count
            summary = train_run(cfg, root,
                                resume="require" if resume and not extending else "auto",
                                progress=not quiet,
                                threads="refuse" if threads is not None else "match")
    except (ConfigError, DataError, RunFolderError, CheckpointError) as e:
        fail(str(e))
    if not dist.main:  # rank 0 reports; the others only say why they failed
        if summary["outcome"] == "failed":
            err_console.print(f"rank {dist.rank}: {summary.get('message', '')}",
                              highlight=False)
        raise typer.Exit(_train_exit_code(summary["outcome"]))
    outcome = summary["outcome"]
    named = f" ({cfg.train.name})" if cfg.train.name else ""
    line = f"{summary['run_id']}{named}: {outcome} at step {summary['step']}"
    if summary.get("reason"):
        line += f" ({summary['reason']})"
    for key in ("train_loss", "val_loss", "val_bpb", "val_acc"):
        if summary.get(key) is not None:
            line += f", {key} {summary[key]:.4f}"
    console.print(line, highlight=False)
    console.print(f"run folder: {Path(root) / summary['run_id']}", highlight=False)
    if outcome == "failed":
        err_console.print(summary.get("message", ""), highlight=False)
    if outcome == "interrupted":
        err_console.print(f"to continue: normlab train --resume {Path(root) / summary['run_id']} "
                          "(or the same command again)", highlight=False)
    raise typer.Exit(_train_exit_code(outcome))


def _extension_steps(sets: list[str], run_dir: Path) -> int:
    """The N of `--resume RUN --set train.steps=N`: the one setting an extension changes
    (`fail` for any other, which would make another run, not a continuation of this one)."""
    from normlab.config import parse_overrides

    steps = None
    for item in sets:
        key = item.partition("=")[0].strip()
        if key != "train.steps":
            fail(f"--set {key}: --resume continues {run_dir} with its own settings; only "
                 "train.steps may be given, to extend the finished run to more steps. To change "
                 f"{key}, train a new run: `normlab train {run_dir / 'config.yaml'} --set "
                 f"{key}=...`")
        steps = parse_overrides([item])["train"]["steps"]
        if isinstance(steps, bool) or not isinstance(steps, int):
            fail(f"--set {item}: give train.steps as a whole number of steps")
    assert isinstance(steps, int)
    return steps


def _train_exit_code(outcome: str) -> int:
    return {"failed": 1, "interrupted": 130}.get(outcome, 0)


def _rank_args(config: Path | None, sets: list[str] | None, root: Path, resume: Path | None,
               quiet: bool, threads: int | None) -> list[str]:
    """The `normlab train` arguments each rank started by --nproc runs with (all but --nproc)."""
    args = ["train", *([str(config)] if config is not None else []),
            *(f"--set={s}" for s in sets or []), f"--root={root}"]
    if resume is not None:
        args.append(f"--resume={resume}")
    if quiet:
        args.append("--quiet")
    if threads is not None:
        args.append(f"--threads={threads}")
    return args
