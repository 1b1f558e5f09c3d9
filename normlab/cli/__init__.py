"""The command line, the top layer of normlab: every command, the `normlab` root group that
finds them, and `main`, the entry point (`normlab`, `python -m normlab`).

Each command group is a module of this package that registers itself on `normlab.cli.app.app`
when imported: `plan`, `train`, `runs`, `sample`, `advise`, `probe`, `interop` (probe-hf),
`study`, `report`, `finetune`, `sweep` and `data` (prepare). A module is imported only when its
command runs or its help is asked for, so `normlab --help` pays for Typer and Rich alone. Only
this package imports Typer: the libraries below raise their own errors (`ConfigError`,
`DataError`, ...), which a command turns into `fail` (one message, exit status 2).
"""

from __future__ import annotations

import difflib
import importlib
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from normlab import __version__
from normlab.cli.app import app
from normlab.cli.console import console, show_warnings

# Every command's module, imported when the command runs (or its help is asked for), so that
# `normlab --help` does not pay for torch. The command list of `normlab --help` shows each one's
# first sentence from here (tests/cli/test_cli_start.py checks that it is the command's own), in
# this order.
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("normlab.cli.plan", "Print the resolved per-block plan."),
    "train": ("normlab.cli.train", "Train one run."),
    "runs": ("normlab.cli.runs", "List the runs under ROOT."),
    "sample": ("normlab.cli.sample", "Generate text from a trained run."),
    "advise": ("normlab.cli.advise", "Placement guidance for your shape."),
    "probe": ("normlab.cli.probe", "Probe stability and effective depth of a model."),
    "probe-hf": ("normlab.cli.interop", "Probe real checkpoints (Hugging Face, GGUF) offline."),
    "study": ("normlab.cli.study", "Put the Pre-Norm vs Post-Norm claims to the test."),
    "report": ("normlab.cli.report", "Write one self-contained HTML report."),
    "finetune": ("normlab.cli.finetune", "Fine-tune a trained run on a Shakespeare task."),
    "sweep": ("normlab.cli.sweep", "Many runs from one spec, resumable."),
    "prepare": ("normlab.cli.data", "Tokenize a corpus into token files."),
}


class LazyCommands(TyperGroup):
    """The root command group: the commands are named in `LAZY_COMMANDS` and imported on first
    use."""

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
    show_warnings()
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)

