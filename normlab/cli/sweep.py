"""`normlab sweep ...`: plan, run, summarize and map a sweep. Bad input exits 2 with one message.

Registered on `normlab.cli.app.app` as the `sweep` group; also runnable alone as
`python -m normlab.cli.sweep`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from normlab.cli.app import app, check_output_folder, command_group, output_file
from normlab.cli.console import console, fail
from normlab.cli.names import did_you_mean
from normlab.config import ConfigError

sweep_app = command_group("Many runs from one spec, resumable. Tables and stability maps of "
                          "their outcomes.")
app.add_typer(sweep_app, name="sweep")

SpecArg = Annotated[Path, typer.Argument(metavar="SPEC", help="sweep spec (YAML: base + axes)")]
RootOpt = Annotated[Path | None, typer.Option(
    help="folder of the sweep's run folders and sweep.json [default: runs/sweeps/<name>]")]
DirArg = Annotated[Path, typer.Argument(metavar="DIR",
                                        help="sweep folder (the --root of `sweep run`)")]


def _plan(spec: Path):
    """The expanded spec; its largest run is checked against the memory it would need."""
    from normlab.sweep.spec import plan_sweep
    from normlab.train.memory import check_run_fits, run_estimate

    try:
        plan = plan_sweep(spec)
        if plan.runs:
            largest = max(plan.runs, key=lambda run: run_estimate(run.config).total_bytes)
            check_run_fits(largest.config, what=f"sweep run {largest.index} ({largest.run_id})")
    except ConfigError as e:
        fail(str(e))
    return plan


def _default_workers(plan, executor: str) -> int:
    """`--workers` when not given: for the local executor `default_workers` (one per GPU where
    every run trains on CUDA), for ray 2."""
    from normlab.sweep.executors import CPU_WORKERS, default_workers

    if executor != "local":
        return CPU_WORKERS
    import torch

    return default_workers([run.config for run in plan.runs], torch.cuda.is_available())


@sweep_app.command("plan")
def sweep_plan(
    spec: SpecArg,
    root: RootOpt = None,
    workers: Annotated[int | None, typer.Option(
        min=1, help="local workers the grouping is planned for [default: one per GPU where "
                    "every run trains on CUDA, else 2]")] = None,
    threads: Annotated[int | None, typer.Option(
        min=1, help="CPU threads per run [default: CPUs / workers]")] = None,
    engine: Annotated[str | None, typer.Option(
        help="auto | stacked | separate [default: the spec's engine, else auto]")] = None,
) -> None:
    """Print the runs of a spec; nothing runs. Their count and state under ROOT, and how
    `sweep run` with the local executor would group the pending ones into stacked models."""
    import torch

    from normlab.sweep.grouping import plan_tasks
    from normlab.sweep.runner import default_root
    from normlab.sweep.spec import check_engine, format_value
    from normlab.sweep.state import is_finished, run_state
    from normlab.train.machine import default_threads

    plan = _plan(spec)
    try:
        engine = plan.engine if engine is None else check_engine(engine, "engine")
    except ConfigError as e:
        fail(str(e))
    root = root if root is not None else default_root(plan)
    table = Table(title=f"sweep {plan.name}: {len(plan.runs)} runs under {root}")
    for col in ("#", "run", *(a.split(".")[-1] for a in plan.axis_paths), "state"):
        table.add_column(col)
    counts: dict[str, int] = {}
    for run in plan.runs:
        state = run_state(root / run.run_id)[0]
        counts[state] = counts.get(state, 0) + 1
        table.add_row(str(run.index), run.run_id,
                      *(format_value(run.point[a]) if a in run.point else "-"
                        for a in plan.axis_paths), state)
    console.print(table)
    for axis in plan.axes:
        when = (" when " + ", ".join(f"{k} in {list(v)}" for k, v in axis.when.items())
                if axis.when else "")
        console.print(f"  {axis.path}: {', '.join(format_value(v) for v in axis.values)}{when}",
                      highlight=False)
    state = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    console.print(f"{len(plan.runs)} runs ({state})", highlight=False)
    pending = [run for run in plan.runs if not is_finished(root / run.run_id)]
    cuda = torch.cuda.is_available()
    workers = workers if workers is not None else _default_workers(plan, "local")
    _, notes = plan_tasks(pending, engine, workers,
                          threads if threads is not None else default_threads(workers), cuda)
    for note in notes or [f"engine {engine}: every pending run separate"]:
        console.print(f"  {note}", highlight=False)


@sweep_app.command("run")
def sweep_run(
    spec: SpecArg,
    root: RootOpt = None,
    workers: Annotated[int | None, typer.Option(
        min=0,
        help="runs in parallel (ray with --address: 0 = as many as the cluster's CPUs allow) "
             "[default: local, one per GPU where every run trains on CUDA, else 2; ray, 2]")
    ] = None,
    executor: Annotated[str, typer.Option(help="local (processes on this machine) or ray")
                        ] = "local",
    address: Annotated[str | None, typer.Option(
        help="Ray cluster address (e.g. auto or ray://host:10001); none: a local Ray instance")
    ] = None,
    threads: Annotated[int | None, typer.Option(
        min=1, help="CPU threads per run [default: CPUs / workers; 1 on a Ray cluster]")] = None,
    engine: Annotated[str | None, typer.Option(
        help="auto | stacked | separate: train runs of one model shape as one stacked model "
             "[default: the spec's engine, else auto]")] = None,
    quiet: Annotated[bool, typer.Option(help="no progress output")] = False,
) -> None:
    """Run every run of SPEC. Finished runs are skipped, interrupted ones resumed. Exit status:
    0 when every run finished (completed or diverged), 1 when some failed, 130 when
    interrupted."""
    from normlab.sweep.executors import ExecutorError
    from normlab.sweep.runner import default_root, run_sweep

    plan = _plan(spec)
    check_output_folder(root if root is not None else default_root(plan), "--root")
    workers = workers if workers is not None else _default_workers(plan, executor)
    try:
        result = run_sweep(plan, root, workers=workers, executor=executor, address=address,
                           threads=threads, progress=not quiet, engine=engine)
    except (ConfigError, ExecutorError) as e:
        fail(str(e))
    c = result.counts
    console.print(f"sweep {plan.name}: {len(plan.runs)} runs in {result.root}: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(c.items())), highlight=False)
    console.print(f"table: normlab sweep summarize {result.root}\n"
                  f"map:   normlab sweep map {result.root}", highlight=False)
    if result.interrupted:
        raise typer.Exit(130)
    if not result.ok:  # failed runs (or runs left unfinished)
        raise typer.Exit(1)


@sweep_app.command("summarize")
def sweep_summarize(
    dir: DirArg,
    format: Annotated[str, typer.Option(
        help="table (terminal), json (a list of row objects), csv (a header row, then a row per "
             "run) or parquet")] = "table",
    out: Annotated[Path | None, typer.Option(
        callback=output_file,
        help="output file for json/csv/parquet [default: DIR/summary.json|csv|parquet]; - for "
             "stdout (json, csv)")] = None,
) -> None:
    """One table of every run of a sweep. Axes, outcome, divergence step and reason, losses,
    tokens/s."""
    from normlab.sweep.summarize import (
        SummaryError,
        collect,
        fit_rich,
        summarize,
        to_csv,
        to_json,
        to_rich,
    )

    try:
        if format in ("csv", "json") and str(out) == "-":
            sys.stdout.write((to_csv if format == "csv" else to_json)(collect(dir)))
            return
        table, path = summarize(dir, format, out)
    except SummaryError as e:
        fail(str(e))
    if path is None and console.is_terminal:  # fitted to the terminal, nothing cut
        fitted, note = fit_rich(table, console.width)
        console.print(fitted)
        if note:
            console.print(note, style="dim", highlight=False)
    elif path is None:  # a file or a pipe: as wide as the table needs
        width, console.width = console.width, 10_000
        try:
            console.print(to_rich(table), crop=False)
        finally:
            console.width = width
    else:
        console.print(f"{len(table.rows)} runs -> {path}", highlight=False)


@sweep_app.command("map")
def sweep_map(
    dir: DirArg,
    x: Annotated[str | None, typer.Option(
        help="config path on the x axis [default: the sweep's axes: warmup if swept, else the "
             "first swept axis]")] = None,
    y: Annotated[str | None, typer.Option(
        help="config path on the y axis [default: lr if swept, else the next swept axis]")
                 ] = None,
    panel: Annotated[str | None, typer.Option(
        help="one panel per value of this path; none: one panel [default: model.placement]")
                     ] = None,
    metric: Annotated[str, typer.Option(help="val_loss, best_val_loss or train_loss")
                      ] = "val_loss",
    out: Annotated[Path | None, typer.Option(
        callback=output_file, help="PNG to write [default: DIR/map.png]")] = None,
    curves: Annotated[bool, typer.Option(
        help="also draw the loss curves of every cell (<out>_curves.png)")] = False,
) -> None:
    """Draw the stability map of a sweep. Cells coloured by outcome, annotated with the final
    loss over seeds."""
    from normlab.sweep.maps import MapError, curves_path, loss_curves, map_axes, stability_map
    from normlab.sweep.state import read_sweep_file
    from normlab.sweep.summarize import SummaryError, collect

    if metric not in ("val_loss", "best_val_loss", "train_loss"):
        metrics = ["val_loss", "best_val_loss", "train_loss"]
        fail(f"metric: {metric!r} is not one of {', '.join(metrics)}"
             f"{did_you_mean(metric, metrics)}")
    out = out or dir / "map.png"
    try:
        table = collect(dir)
        auto_x, auto_y, auto_panel = map_axes(read_sweep_file(dir), table.configs)
        x, y = x or auto_x, y or auto_y
        panel_path = auto_panel if panel is None else (
            None if panel.lower() in ("none", "") else panel)
        info = stability_map(table, out, x=x, y=y, panel=panel_path, metric=metric)
        console.print(f"map: {info.path} ({len(info.panels)} panel(s), {len(info.y_values)} x "
                      f"{len(info.x_values)} cells, {len(table.rows)} runs)", highlight=False)
        if curves:
            c = loss_curves(table, curves_path(out), x=x, y=y, panel=panel_path)
            console.print(f"curves: {c.path}", highlight=False)
    except (SummaryError, MapError) as e:
        fail(str(e))


if __name__ == "__main__":
    sweep_app()
