"""`normlab report DIR`: write DIR/report.html (registered on `normlab.cli.app.app`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from normlab.cli.app import app, output_file
from normlab.cli.console import console, fail


@app.command()
def report(
    dir: Annotated[Path, typer.Argument(
        metavar="DIR", help="a study folder (with study.json) or any folder of runs and sweeps")],
    out: Annotated[Path | None, typer.Option(
        callback=output_file, help="HTML file to write (default: DIR/report.html)")] = None,
    markdown: Annotated[bool, typer.Option(
        "--markdown", help="print the study's verdict table as markdown (one row per "
        "prediction) instead of writing HTML")] = False,
) -> None:
    """Write one self-contained HTML report. Figures are inlined, with no network references:
    the verdicts of a study, or the runs, loss curves and stability maps of a folder of runs."""
    from normlab.report.html import ReportError, render

    if markdown:
        from normlab.report.study import STUDY_FILE, load_study
        from normlab.study.table import markdown_table

        folder = dir.parent if dir.is_file() else dir
        if not (folder / STUDY_FILE).exists():
            fail(f"--markdown: {folder} has no {STUDY_FILE}; give a study folder")
        try:
            study = load_study(folder)
        except ReportError as e:
            fail(str(e))
        claims = [{**v.claim.to_dict(), **v.extra} for v in study.claims]
        print(markdown_table(claims), end="")
        return
    if dir.exists() and not dir.is_dir():
        fail(f"DIR {dir}: is a file; give a folder: a study folder (with study.json) or a "
             "folder of runs and sweeps")
    try:
        path = render(dir, out)
    except ReportError as e:
        fail(str(e))
    console.print(f"report: {path}", highlight=False)
