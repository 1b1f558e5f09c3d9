"""The command line's output: one console for results, one for errors, and `fail`, which every
command uses to reject bad input (one message, exit code 2). Free of torch, so commands that
need no model start fast.

Rich markup is off on both consoles: what they print is full of user text (paths, config
values, error messages that quote them), and a file named `[red]x.yaml` or a value `[0.001]`
must print as it is, not be read as a style tag. Styles are given as `style=` or `Text`.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.text import Text

# Rich wraps at 80 columns when output is not a terminal; logs and CI read better wider.
console = Console(width=None if sys.stdout.isatty() else 160, markup=False)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160, markup=False)


def fail(message: str, code: int = 2) -> None:
    err_console.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False)
    raise typer.Exit(code)
