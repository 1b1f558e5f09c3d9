"""The command line's output: one console for results, one for errors, and `fail`, which every
command uses to reject bad input (one message, exit code 2). Free of torch, so commands that
need no model start fast."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

# Rich wraps at 80 columns when output is not a terminal; logs and CI read better wider.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def fail(message: str, code: int = 2) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)
