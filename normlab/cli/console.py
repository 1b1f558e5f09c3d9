"""The command line's output: one console for results, one for errors, and `fail`, which every
command uses to reject bad input (one message, exit code 2). Free of torch, so commands that
need no model start fast.

Rich markup is off on both consoles: what they print is full of user text (paths, config
values, error messages that quote them), and a file named `[red]x.yaml` or a value `[0.001]`
must print as it is, not be read as a style tag. Styles are given as `style=` or `Text`.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

import normlab
from normlab.warnings import NormlabNote, NormlabWarning

# Rich wraps at 80 columns when output is not a terminal; logs and CI read better wider.
console = Console(width=None if sys.stdout.isatty() else 160, markup=False)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160, markup=False)


def fail(message: str, code: int = 2) -> None:
    err_console.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False)
    raise typer.Exit(code)


_NORMLAB = Path(normlab.__file__).resolve().parent
_python_show = warnings.showwarning


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
    """`warnings.showwarning` for the command line: a `NormlabWarning`, or any warning raised
    from normlab's own code (a data module's, which sits below the `NormlabWarning` layer),
    prints as one line on stderr, `warning: ...` (`note: ...` for a `NormlabNote`), without the
    file, line and source Python's display adds; other libraries' warnings print as Python
    prints them."""
    ours = issubclass(category, NormlabWarning)
    if not ours:
        try:
            ours = Path(filename).resolve().is_relative_to(_NORMLAB)
        except (OSError, ValueError):
            ours = False
    if not ours or file not in (None, sys.stderr):
        _python_show(message, category, filename, lineno, file, line)
        return
    label = ("note:", "bold cyan") if issubclass(category, NormlabNote) else (
        "warning:", "bold yellow")
    err_console.print(Text.assemble(label, " ", str(message)), highlight=False)


def show_warnings() -> None:
    """Print warnings as `show_warning` does, from now on (the entry point calls this)."""
    warnings.showwarning = show_warning
