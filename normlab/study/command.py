"""`normlab study`: every claim as an experiment with a verdict, then the HTML report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from normlab.app import app, output_folder
from normlab.console import console, fail


@app.command()
def study(
    profile: Annotated[str, typer.Option(help="tiny | quick | standard | full (GPU); "
                                              "measured wall times: docs/study.md")] = "quick",
    claims: Annotated[str | None, typer.Option(help="comma separated, e.g. C1,C4 (default all)")
                      ] = None,
    out: Annotated[Path, typer.Option(
        callback=output_folder,
        help="study folder (runs, cache, figures, study.json, report.html)")] = Path("study"),
    report: Annotated[bool, typer.Option(help="write report.html at the end")] = True,
) -> None:
    """Put the Pre-Norm vs Post-Norm claims to the test. A re-run reuses finished work."""
    from rich.table import Table
    from rich.text import Text

    from normlab.config import ConfigError
    from normlab.data import DataError
    from normlab.study.runner import run_study

    t0 = time.perf_counter()

    def log(message: str) -> None:
        console.print(Text.assemble((f"{time.perf_counter() - t0:6.0f}s", "dim"), " ", message),
                      highlight=False)

    try:
        result = run_study(out, profile, claims.split(",") if claims else None, log=log)
    except (ConfigError, DataError) as e:
        fail(str(e))
    colours = {"supported": "green", "not supported": "red", "inconclusive": "yellow",
               "calibration failed": "magenta", "not run": "dim"}
    table = Table(title=f"normlab study, profile {profile} ({time.perf_counter() - t0:.0f} s)")
    for col in ("claim", "title", "verdict", "effect [95% interval], n"):
        table.add_column(col)
    for c in result["claims"]:
        e = c.get("effect")
        eff = (f"{e['estimate']:+.3g} [{e['ci_low']:+.3g}, {e['ci_high']:+.3g}], n={e['n']}"
               if e else c.get("note", "")[:60])
        v = c["verdict"]
        table.add_row(c["id"], c["title"], Text(v, style=colours[v]), eff)
    console.print(table)
    console.print(f"every number: {out / 'study.json'}", highlight=False)
    if report:
        from normlab.report.html import render

        path = render(out)
        console.print(f"report: {path}", highlight=False)
