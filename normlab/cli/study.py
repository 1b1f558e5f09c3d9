"""`normlab study`: every claim as an experiment with a verdict, then the HTML report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from normlab.cli.app import app, output_folder
from normlab.cli.console import console, fail
from normlab.cli.names import did_you_mean


@app.command()
def study(
    profile: Annotated[str, typer.Option(
        help="tiny | quick | standard | long | gpu | full (gpu and full: sized for a GPU); "
             "measured wall times: docs/study.md")] = "quick",
    claims: Annotated[str | None, typer.Option(
        help="comma separated, e.g. C1,C4 (default all; C6 means C6a and C6b)")] = None,
    part: Annotated[str | None, typer.Option(
        help="run one part of the study (its claims, into --out: parts run into one folder "
             "accumulate) and export it to OUT/parts/NAME; --list-parts names them")] = None,
    list_parts: Annotated[bool, typer.Option(
        "--list-parts", help="print the parts of the study and their claims, and exit")] = False,
    merge: Annotated[list[Path] | None, typer.Option(
        metavar="PART_DIR",
        help="merge parts' exports (OUT/parts/NAME, or a study folder for all of its parts; "
             "repeat the option for each) into --out and write its report; nothing is "
             "trained")] = None,
    out: Annotated[Path, typer.Option(
        callback=output_folder,
        help="study folder (runs, cache, figures, study.json, report.html)")] = Path("study"),
    report: Annotated[bool, typer.Option(help="write report.html at the end")] = True,
    executor: Annotated[str, typer.Option(
        help="where the training runs go: local (processes on this machine) or ray")
    ] = "local",
    address: Annotated[str | None, typer.Option(
        help="Ray cluster address with --executor ray (e.g. auto, HOST:PORT or "
             "ray://host:10001); none: a local Ray instance")] = None,
    device: Annotated[str, typer.Option(
        help="where every run trains: auto (a CUDA GPU where there is one, else the CPU), cpu "
             "or cuda")] = "auto",
    time_limit: Annotated[float | None, typer.Option(
        "--time-limit", metavar="MINUTES",
        help="stop before starting work that would end after MINUTES (work in progress at the "
             "limit is interrupted as by Ctrl-C), keep what finished and exit with status 75; "
             "the same command again continues")] = None,
) -> None:
    """Put the Pre-Norm vs Post-Norm claims to the test. A re-run reuses finished work."""
    from rich.text import Text

    from normlab.config import ConfigError
    from normlab.data import DataError
    from normlab.study.context import EX_TEMPFAIL, TimeLimit
    from normlab.study.runner import run_study

    if list_parts:
        console.print(parts_table())
        return
    if merge:
        others = [o for o, given in (("--part", part), ("--claims", claims),
                                     ("--time-limit", time_limit)) if given is not None]
        if others:
            fail(f"--merge with {', '.join(others)}: a merge trains nothing; give --merge and "
                 "--out only")
        _merge(merge, out, report)
        return
    t0 = time.perf_counter()

    def log(message: str) -> None:
        console.print(Text.assemble((f"{time.perf_counter() - t0:6.0f}s", "dim"), " ", message),
                      highlight=False)

    from normlab.sweep.executors import ExecutorError

    if time_limit is not None and not time_limit > 0:
        fail(f"--time-limit {time_limit:g}: give the minutes the study may take, more than 0")
    limit = TimeLimit(time_limit * 60) if time_limit is not None else None
    try:
        result = run_study(out, profile, claims.split(",") if claims else None, log=log,
                           executor=executor, address=address, device=device,
                           time_limit=limit, part=part)
    except KeyboardInterrupt:
        options = [f"--profile {profile}", f"--claims {claims}" if claims else "",
                   f"--part {part}" if part else "",
                   f"--out {out}", f"--device {device}" if device != "auto" else "",
                   f"--executor {executor}" if executor != "local" else "",
                   f"--address {address}" if address else "",
                   f"--time-limit {time_limit:g}" if time_limit is not None else "",
                   "" if report else "--no-report"]
        again = " ".join(["normlab study", *filter(None, options)])
        kept = (f"what finished is kept in {out} (study.json holds every claim decided so far, "
                "runs/ every finished run)")
        if limit is not None and limit.reached:
            console.print(f"time limit of {time_limit:g} min reached ({limit.reached}): {kept}; "
                          f"continue with the same command: {again}", highlight=False)
            raise typer.Exit(EX_TEMPFAIL) from None
        console.print(f"interrupted: {kept}; resume with: {again}", highlight=False)
        raise typer.Exit(130) from None
    except (ConfigError, DataError, ExecutorError) as e:
        from normlab.study.runner import PROFILES

        hint = did_you_mean(profile, list(PROFILES)) if str(e).startswith("--profile:") else ""
        fail(f"{e}{hint}")
    console.print(summary_table(result, f"normlab study, profile {profile} "
                                        f"({time.perf_counter() - t0:.0f} s)"))
    console.print(f"every number: {out / 'study.json'}", highlight=False)
    if report:
        from normlab.report.html import render

        path = render(out)
        console.print(f"report: {path}", highlight=False)


def parts_table():
    """The parts of the study (`normlab.study.parts`): name, claims, what each measures."""
    from rich.table import Table

    from normlab.study.parts import STUDY_PARTS

    table = Table(title="the parts of the study (normlab study --part NAME)")
    for col in ("part", "claims", "what it measures"):
        table.add_column(col, overflow="fold")
    for p in STUDY_PARTS:
        table.add_row(p.name, ", ".join(p.claims), p.description)
    return table


def _merge(sources: list[Path], out: Path, report: bool) -> None:
    """`normlab study --merge`: the parts' exports into the study folder `out`, its report."""
    from normlab.study.parts import MergeError, merge_parts

    try:
        result = merge_parts(out, sources, log=lambda m: console.print(m, highlight=False))
    except MergeError as e:
        fail(str(e))
    missing = result["parts_not_merged"]
    console.print(summary_table(result, f"normlab study, profile {result.get('profile')}, "
                                        f"merged from {len(result['merged_from'])} part(s)"))
    if missing:
        console.print(f"not merged, so their claims are not run: {', '.join(missing)}",
                      highlight=False)
    console.print(f"every number: {out / 'study.json'}", highlight=False)
    if report:
        from normlab.report.html import render

        console.print(f"report: {render(out)}", highlight=False)


VERDICT_STYLE = {"supported": "green", "not supported": "red", "inconclusive": "yellow",
                 "not tested at this scale": "cyan", "calibration failed": "magenta",
                 "not run": "dim"}


def summary_table(result: dict, title: str):
    """The verdict table (`normlab.study.table`) for the terminal: every prediction on its own
    row, grouped by claim; long cells wrap, never cut."""
    from rich.table import Table
    from rich.text import Text

    from normlab.study.table import verdict_rows

    table = Table(title=title, show_lines=False)
    for col, ratio in (("claim", 2), ("verdict", 2), ("prediction", 4),
                       ("measured [95% interval]", 4), ("expected", 1), ("its verdict", 2),
                       ("calibration", 2)):
        table.add_column(col, overflow="fold", ratio=ratio)
    rows = verdict_rows(result["claims"])
    for i, r in enumerate(rows):
        own = r.verdict + (f" ({r.role})" if r.role in ("premise", "diagnostic") else "")
        table.add_row(f"{r.claim} {r.title}" if r.first else "",
                      Text(r.claim_verdict, style=VERDICT_STYLE.get(r.claim_verdict, ""))
                      if r.first else "", r.subject, r.measured, r.expected,
                      Text(own, style=VERDICT_STYLE.get(r.verdict, "")),
                      r.calibration if r.first else "",
                      end_section=i + 1 == len(rows) or rows[i + 1].first)
    return table
