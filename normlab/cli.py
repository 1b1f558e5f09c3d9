"""The command line, its top layer: the core commands (plan, train, runs, advise, sample) and
the lazy import of every other command module, each of which registers itself on
`normlab.app.app` when imported. Nothing imports this module but the entry points. Bad input
exits with status 2 and one message.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from typer.core import TyperGroup

from normlab import __version__
from normlab.app import SetOpt, app, check_output_folder, finite
from normlab.config import (
    MAX_BLOCKS,
    PLACEMENTS,
    ConfigError,
    ModelConfig,
    load_model_config,
    parse_config,
)
from normlab.console import console, err_console, fail


def output_format(value: str) -> str:
    """Option callback for `--format`: one of `FORMATS`, named in the error otherwise."""
    from normlab.train.rows import FORMATS  # not at import: normlab.train loads torch

    if value not in FORMATS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(FORMATS)}")
    return value


@app.command()
def plan(
    placement: Annotated[str | None, typer.Option(help=f"one of {', '.join(PLACEMENTS)}")] = None,
    blocks: Annotated[int | None, typer.Option(min=1, max=MAX_BLOCKS, help="number of blocks L")
                      ] = None,
    norm: Annotated[str | None, typer.Option(help="layernorm|rmsnorm|dyt|identity|batchnorm")
                    ] = None,
    kind: Annotated[str | None, typer.Option(help="decoder|encoder")] = None,
    config: Annotated[Path | None, typer.Option(help="YAML file with model fields")] = None,
    set_: SetOpt = None,
    time_step: Annotated[bool, typer.Option(
        "--time", help="also time a steady forward+backward of this model (after warm-up "
        "steps), in the precision of the config's train.precision (or --set train.precision=)")
    ] = False,
) -> None:
    """Print the resolved per-block plan. Each sublayer's formula, with its norms and
    constants."""
    from normlab.nn.plan import build_plan

    try:
        if time_step:  # timed in the run config's train.precision (or --set train.precision=)
            from normlab.train.precision import asked_precision

            asked, set_ = asked_precision(config, set_)
        cfg = load_model_config(config, set_, {
            "placement": placement, "n_blocks": blocks, "norm": norm, "kind": kind})
    except ConfigError as e:
        fail(str(e))
    console.print(build_plan(cfg).describe(), markup=False, highlight=False, soft_wrap=True)
    if time_step:
        from normlab.perf import steady_step_report
        from normlab.train.precision import timing_precision

        precision, notes = timing_precision(asked, cfg)  # said before the timing starts
        for note in notes:
            console.print(note, markup=False, highlight=False, soft_wrap=True)
        console.print(steady_step_report(cfg, precision=precision), markup=False,
                      highlight=False, soft_wrap=True)


@app.command()
def train(
    config: Annotated[Path | None, typer.Argument(
        metavar="CONFIG", help="YAML run config (model/data/train)")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="PATH=VALUE",
        help="dotted override, e.g. --set model.placement=post --set train.lr=1e-3")
    ] = None,
    root: Annotated[Path, typer.Option(help="folder that holds the run folders")] = Path("runs"),
    resume: Annotated[Path | None, typer.Option(help="continue the run in this folder")] = None,
    quiet: Annotated[bool, typer.Option(help="no progress output")] = False,
    nproc: Annotated[int, typer.Option(
        min=1, help="train on N local processes with DistributedDataParallel; "
                    "train.batch_size is the global batch and must be divisible by N")] = 1,
    threads: Annotated[int | None, typer.Option(
        min=1, help="torch CPU threads per process [default: CPUs / processes when N > 1]")
    ] = None,
) -> None:
    """Train one run. Its folder under ROOT is named by a hash of the resolved config. Under
    torchrun (or with --nproc) the processes train the one run together."""
    import torch

    from normlab.data import DataError
    from normlab.memory import check_run_fits
    from normlab.sweep.executors import default_threads
    from normlab.train import (
        CheckpointError,
        RunFolderError,
        distributed,
        read_run_config,
        train_run,
    )
    from normlab.train.trainer import resolve_device

    world = distributed.env_world_size()
    try:
        if resume is not None:
            if config is not None or set_:
                fail("--resume takes the run's own config.yaml; drop CONFIG and --set")
            cfg = read_run_config(resume)
            root = resume.parent
            if cfg.run_id() != resume.name:
                fail(f"{resume}: folder name does not match its config (run id {cfg.run_id()})")
            check_output_folder(resume, "--resume")
        else:
            from normlab.config import load_run_config

            cfg = load_run_config(config, set_)
            check_output_folder(root, "--root")
        check_run_fits(cfg, processes=max(nproc, world))
        if nproc > 1:
            if world > 1:
                fail("--nproc starts its own processes; under torchrun leave it out")
            distributed.check_divisible(cfg.train.batch_size, nproc)
            raise typer.Exit(distributed.launch(_rank_args(
                config, set_, root, resume, quiet, threads), nproc))
        if threads is not None or world > 1:
            torch.set_num_threads(threads or default_threads(world))
        with distributed.process_group(resolve_device(cfg.train.device)) as dist:
            # an explicit --threads that differs from a resumed run's own count is refused
            # (exit 2, with the count to use); otherwise a resume runs on the recorded count
            summary = train_run(cfg, root, resume="require" if resume else "auto",
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


@app.command()
def runs(root: Annotated[Path, typer.Argument(
        metavar="ROOT", help="folder of run folders")] = Path("runs"),
         wide: Annotated[bool, typer.Option(
             help="a column per setting, however wide the terminal")] = False,
         format: Annotated[str, typer.Option(
             "--format", callback=output_format,
             help="table, json (a list of row objects) or csv (a header row, then a row per run)")
         ] = "table",
         ) -> None:
    """List the runs under ROOT.

    Shows the settings in which they differ, the outcome and the final losses; a damaged folder
    is listed as damaged, with why. In a terminal narrower than the table the settings fold into
    one column (--wide: a column each). --format json or csv prints the same rows as data, keyed
    by config path (model.placement) and result (val_loss), numbers unformatted."""
    from normlab.train.listing import list_runs, runs_table

    if not root.is_dir():
        fail(f"{root}: no such folder of runs")
    listing = list_runs(root)
    if format != "table":
        from normlab.train.rows import render

        sys.stdout.write(render(listing.records(), listing.record_keys, format))
        return
    table = runs_table(root, listing=listing)
    if console.is_terminal:
        if not wide and _natural_width(table) > console.width:
            table = runs_table(root, compact=True, listing=listing)
        console.print(table)
        return
    width = console.width  # in a file or a pipe no cell is folded: as wide as the table needs
    console.width = max(width, _natural_width(table))
    try:
        console.print(table)
    finally:
        console.width = width


@app.command()
def sample(
    run_dir: Annotated[Path, typer.Argument(
        metavar="RUN_DIR", help="a finished run folder (runs/<run_id>), or under ./runs its "
                                "id, a unique prefix of it or its train.name")],
    prompt: Annotated[str, typer.Option(help="text the model continues",
                                        show_default="a newline")] = "\n",
    tokens: Annotated[int, typer.Option(min=1, help="tokens to generate (bytes for a "
                                                    "byte-level run)")] = 200,
    temperature: Annotated[float, typer.Option(
        min=0, callback=finite, help="softmax temperature; 0: the most likely token each time")
    ] = 0.8,
    top_k: Annotated[int | None, typer.Option(
        min=1, help="draw from the K most likely tokens only [default: all]")] = None,
    seed: Annotated[int, typer.Option(min=0, help="seed of the draws")] = 0,
) -> None:
    """Generate text from a trained run. The run's model continues the prompt (as nanoGPT's
    sample.py), through the run's own tokenizer; the prompt and its continuation are
    printed."""
    from normlab.sample import SampleError, sample_run

    try:
        text = sample_run(run_dir, prompt, tokens=tokens, temperature=temperature, top_k=top_k,
                          seed=seed)
    except SampleError as e:
        fail(str(e))
    sys.stdout.write(prompt + text + ("" if text.endswith("\n") else "\n"))


def _natural_width(table: Table) -> int:
    """The width at which `table` needs no folding."""
    return console.measure(table, options=console.options.update_width(10_000)).maximum


@app.command()
def advise(
    blocks: Annotated[int, typer.Option(help="intended number of blocks", min=1,
                                        max=MAX_BLOCKS)],
    width: Annotated[int, typer.Option(help="intended d_model", min=8)],
    heads: Annotated[int | None, typer.Option(min=1, help="attention heads (default width/64)")
                     ] = None,
    finetune: Annotated[bool, typer.Option(help="you will fine-tune a Post-Norm checkpoint")
                        ] = False,
    warmup_budget: Annotated[int | None, typer.Option(min=0, help="warmup steps you can afford")
                             ] = None,
    intermediate_heads: Annotated[bool, typer.Option(help="heads read intermediate blocks")
                                  ] = False,
    check_steps: Annotated[int, typer.Option(min=1, help="steps of each stability-check run")
                           ] = 60,
    measure: Annotated[bool, typer.Option(
        help="measure at this shape (a few minutes); --no-measure: say what the recorded studies "
             "(docs/results) found at this shape instead, or that they measured nothing here")
                       ] = True,
) -> None:
    """Placement guidance for your shape. Each rule is shown with what normlab measures
    there, or without measuring with what its recorded studies found there."""
    from normlab.advise import advise as run_advise
    from normlab.memory import check_fits, estimate

    if heads is not None and width % heads:
        fail(f"--heads {heads} does not divide --width {width}")
    try:
        if measure:  # the init measurement builds the model at the full shape
            shape = parse_config(ModelConfig, {"n_blocks": blocks, "d_model": width,
                                               "n_heads": heads or max(1, width // 64)})
            check_fits(estimate(shape, 4, 64, training=False), "cpu", "advise",
                       "lower --width or --blocks, or use --no-measure")
        advice = run_advise(blocks, width, heads, finetune=finetune, warmup_budget=warmup_budget,
                            intermediate_heads=intermediate_heads, check_steps=check_steps,
                            measure=measure, progress=lambda msg: err_console.print(
                                f"measuring: {msg} ...", highlight=False))
    except ConfigError as e:
        fail(str(e))
    table = Table(title=f"rules of thumb for {blocks} blocks, width {width} (the literature's "
                        "guidance)")
    table.add_column("rule")
    table.add_column("applies")
    for r in advice.rules:
        table.add_row(r["rule"], "yes" if r["applies"] else "no")
    console.print(table)
    if advice.measured.get("stability"):
        st = Table(title="short stability check (reduced width, your depth)")
        for col in ("placement", "lr", "warmup", "outcome", "val loss"):
            st.add_column(col)
        for r in advice.measured["stability"]:
            st.add_row(r["placement"], f"{r['lr']:g}", str(r["warmup"]),
                       r["outcome"] + (f" ({r['reason']} @ {r['step']})" if r["reason"] else ""),
                       f"{r['val_loss']:.3f}" if r["val_loss"] is not None else "-")
        console.print(st)
    if advice.recorded is not None and advice.recorded.rows:
        rt = Table(title=f"recorded studies at {blocks} blocks, width {width} (docs/results)")
        for col in ("claim", "study", "verdict", "measured: estimate [95% interval], n"):
            rt.add_column(col)
        for r in advice.recorded.rows:
            needs = [f"needs: {r['needs']}"] if r["needs"] else []
            rt.add_row(f"{r['claim']} {r['title']}", r["study"], r["verdict"],
                       "\n".join([*r["numbers"], *needs]))
        console.print(rt)
    console.print(f"recommendation: {advice.recommendation}", style="bold", highlight=False)
    for reason in advice.reasons:
        console.print(f"  - {reason}", highlight=False)


# The commands kept with their libraries register themselves on `app` when their module is
# imported; a module is imported only when its command runs (or its help is asked for), so that
# `normlab --help` and the core commands above do not pay for torch. The command list of
# `normlab --help` shows each one's first sentence from here (tests/test_cli_start.py checks that
# it is the command's own), in this order, after the core commands.
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "probe": ("normlab.probe.command", "Probe stability and effective depth of a model."),
    "probe-hf": ("normlab.interop.command", "Probe real checkpoints (Hugging Face, GGUF) offline."),
    "study": ("normlab.study.command", "Put the Pre-Norm vs Post-Norm claims to the test."),
    "report": ("normlab.report.command", "Write one self-contained HTML report."),
    "finetune": ("normlab.finetune_command", "Fine-tune a trained run on a Shakespeare task."),
    "sweep": ("normlab.sweep.command", "Many runs from one spec, resumable."),
    "prepare": ("normlab.data.command", "Tokenize a corpus into token files."),
}


class LazyCommands(TyperGroup):
    """The root command group: the core commands are defined, the others are named in
    `LAZY_COMMANDS` and imported on first use."""

    def list_commands(self, ctx: typer.Context | None) -> list[str]:
        return [*(n for n in self.commands if n not in LAZY_COMMANDS), *LAZY_COMMANDS]

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in LAZY_COMMANDS:
            importlib.import_module(LAZY_COMMANDS[cmd_name][0])
            self.commands.update(
                (name, cmd) for name, cmd in typer.main.get_group(app).commands.items()
                if name not in self.commands)
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> Any:
        """An unknown command gets a "did you mean" among all commands, loaded or not."""
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in self.list_commands(ctx):
            near = difflib.get_close_matches(name, self.list_commands(ctx))
            hint = f" Did you mean {', '.join(repr(n) for n in near)}?" if near else ""
            ctx.fail(f"No such command {name!r}.{hint}")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: typer.Context, formatter: Any) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, self.commands[n].get_short_help_str(limit) if n in self.commands
                 else LAZY_COMMANDS[n][1]) for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


app.info.cls = LazyCommands


def load_commands() -> LazyCommands:
    """Every command imported: the whole command tree, as `normlab --help` names it."""
    for module, _ in LAZY_COMMANDS.values():
        importlib.import_module(module)
    group = typer.main.get_command(app)
    assert isinstance(group, LazyCommands)
    group.commands = {name: group.commands[name] for name in group.list_commands(None)}
    return group


def _version(value: bool) -> None:
    if value:
        console.print(f"normlab {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_version, help="print the version and exit")
          ] = False) -> None:
    """normlab: where the normalization goes in a Transformer."""


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
