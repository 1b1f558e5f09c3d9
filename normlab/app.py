"""The `normlab` command-line app object, below every command.

Each command module registers itself on :data:`app` when imported (`@app.command()`, or
`app.add_typer(...)` for a group); :mod:`normlab.cli`, the top layer, imports them all and runs
it. Nothing here imports a command module, and no command module imports :mod:`normlab.cli`, so
the commands form no import cycle. Console output and `fail` live in :mod:`normlab.console`.
"""

from __future__ import annotations

from typing import Annotated

import typer


def command_group(help: str) -> typer.Typer:
    """A Typer app with normlab's settings: `--help` when called bare, no shell-completion
    options, no pretty tracebacks (bad input is reported by `fail`, never as a traceback), and
    click's plain help. Typer's Rich help keeps the line breaks of a docstring in the command
    list, labels flags `<bool>` and cuts long option names to fit 80 columns; the plain one
    rewraps paragraphs to the terminal and puts a long option name on its own line."""
    return typer.Typer(add_completion=False, no_args_is_help=True,
                       pretty_exceptions_enable=False, rich_markup_mode=None, help=help)


app = command_group("normlab: where the normalization goes in a Transformer.")

# Options shared by several commands.
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", metavar="FIELD=VALUE",
    help="override a model field, e.g. --set d_model=128 (repeatable)")]
