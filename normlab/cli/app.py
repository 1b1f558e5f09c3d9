"""The `normlab` command-line app object and the options several commands share, below every
command.

Each command module of :mod:`normlab.cli` registers itself on :data:`app` when imported
(`@app.command()`, or `app.add_typer(...)` for a group); the package's `__init__` names them,
imports each when its command runs, and runs the app. Nothing here imports a command module, so
the commands form no import cycle. Console output and `fail` live in :mod:`normlab.cli.console`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated

import typer

from normlab.cli.console import fail


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
    help="override a model field, e.g. --set d_model=128 or --set model.d_model=128 "
         "(repeatable)")]


def finite(value: float | None) -> float | None:
    """Option callback for floats: click's ranges let nan and inf through (nan compares false
    with any bound), so `--update-lr nan` would reach the library; reject them by the option's
    name (click's usage error, exit status 2)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def positive(value: float | None) -> float | None:
    """Option callback for floats that must be finite and above 0."""
    if finite(value) is not None and value <= 0:
        raise typer.BadParameter(f"{value} is not above 0")
    return value


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def folder_problem(path: Path) -> str | None:
    """Why `path` cannot be used as an output folder (created if missing), or None."""
    if path.exists() and not path.is_dir():
        return f"{path} is a file, not a folder"
    base = _nearest_existing(path)
    then = "" if base == path else f", so {path} cannot be created"
    if not base.is_dir():
        return f"{base} is a file, not a folder{then}"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"{base} is not writable (read-only or permission denied){then}"
    return None


def file_problem(path: Path) -> str | None:
    """Why `path` cannot be written as an output file, or None."""
    if path.is_dir():
        return f"{path} is a folder; give a file name"
    if path.exists() and not os.access(path, os.W_OK):
        return f"{path} is not writable (read-only or permission denied)"
    problem = folder_problem(path.parent)
    return f"{problem}, so {path} cannot be written" if problem else None


def check_output_folder(path: Path, option: str) -> None:
    """`fail` naming `option` when `path` cannot be used as an output folder (for options whose
    default is decided in the command, where a callback cannot see it)."""
    problem = folder_problem(path)
    if problem:
        fail(f"{option} {path}: {problem}")


def output_folder(value: Path | None) -> Path | None:
    """Option callback: an output folder that exists as a folder or can be created and written,
    checked before any work starts."""
    problem = folder_problem(value) if value is not None else None
    if problem:
        raise typer.BadParameter(problem)
    return value


def output_file(value: Path | None) -> Path | None:
    """Option callback: an output file whose folder exists (or can be created) and is
    writable, checked before any work starts."""
    problem = file_problem(value) if value is not None and str(value) != "-" else None
    if problem:
        raise typer.BadParameter(problem)
    return value
