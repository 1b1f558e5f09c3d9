"""Mutation test of the report's stylesheet and templates: each rule that keeps a table readable
is broken in turn (on a copy of the templates), the report pages are rendered with it and measured
in headless Chromium by the browser test's layout check (tests/report/test_report.py:
LAYOUT_CHECK, at every width of WIDTHS), and the mutant must be seen. Prints mutant ->
killed/survived; exits 1 if any survives, 2 if a mutation no longer applies (the rule it breaks
has changed).

    python scripts/mutate_report_css.py              # `make mutate-report`
    python scripts/mutate_report_css.py STUDY_DIR    # a study already run, instead of a new one

Inputs: a real tiny study (about a minute), a folder of tiny runs that differ in many settings,
built once, and the recorded standard study's study.json (docs/results). Needs Chromium
(scripts/install_chromium.sh).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "report")]

import jinja2  # noqa: E402
import test_report as checks  # noqa: E402
import yaml  # noqa: E402

import normlab.report.html as report_html  # noqa: E402
from normlab.config import load_run_config  # noqa: E402
from normlab.report import render  # noqa: E402
from normlab.study.runner import run_study  # noqa: E402
from normlab.train import train_run  # noqa: E402

TEMPLATES = ROOT / "normlab" / "report" / "templates"

# name -> (file, text to find, its replacement). Each breaks one rule that keeps tables readable.
MUTANTS = {
    "numbers may wrap": ("report.css", "td.num { white-space: nowrap; }", "td.num { }"),
    "proportional digits": ("report.css", "font-variant-numeric: tabular-nums;", ""),
    "words break anywhere": ("report.css", "word-break: keep-all;", "word-break: break-all;"),
    "overflow-wrap anywhere": ("report.css", "overflow-wrap: normal; word-break: keep-all;",
                               "overflow-wrap: anywhere;"),
    "no scroll box": ("report.css", ".scroll { overflow-x: auto;", ".scroll {"),
    "first column not sticky": ("report.css", "position: sticky; left: 0;", ""),
    "sticky column transparent": ("report.css", "hyphens: manual; background: #fff;",
                                  "hyphens: manual;"),
    "signed numbers may break": ("report.css", ".nb { white-space: nowrap; }", ""),
    "headers squeezed": ("report.css", "thead th { background: #e8ecf1; }",
                         "thead th { background: #e8ecf1; width: 1px; word-break: break-all; }"),
    "tables without their box": ("macros.html",
                                 '<div class="scroll">\n<table class="{{ t.kind }}">',
                                 '<div>\n<table class="{{ t.kind }}">'),
    "runs table without its box": ("macros.html",
                                   '<div class="scroll">\n<table class="runs cards">',
                                   '<div>\n<table class="runs cards">'),
    "outcome after the settings": (
        "macros.html",
        '<th>run, outcome</th>{% for col in view.config_columns %}<th{% if col.numeric %}'
        ' class="num"{% endif %}>{{ col.title }}</th>{% endfor %}{% for col in view.result_columns'
        ' %}<th class="num">{{ col.title }}</th>{% endfor %}',
        '<th>run</th>{% for col in view.config_columns %}<th{% if col.numeric %} class="num"'
        '{% endif %}>{{ col.title }}</th>{% endfor %}{% for col in view.result_columns %}'
        '<th class="num">{{ col.title }}</th>{% endfor %}<th>outcome</th>'),
    "no cards on a narrow page": ("report.css",
                                  "table.cards > tbody > tr > td {\n    display: block; }",
                                  "table.cards > tbody > tr > td {\n    }"),
    "cards without their column names": ("report.css", "content: attr(data-label);", ""),
    "list values may break": ("macros.html", '<span class="nb">{{ v }}</span>', "{{ v }}"),
}


def build_inputs(work: Path, given: Path | None) -> list[Path]:
    """A tiny study (or a copy of `given`), and four tiny runs rewritten to differ in many
    settings."""
    study = work / "study"
    if given is not None:
        shutil.copytree(given, study)
    else:
        run_study(study, "tiny", log=lambda m: None)
    runs = work / "runs"
    for i, (placement, seed) in enumerate((("pre", 0), ("pre", 1), ("post", 0), ("post", 1))):
        cfg = load_run_config(None, [*checks.TINY, f"model.placement={placement}",
                                     f"train.seed={seed}"])
        train_run(cfg, runs, progress=False)
        path = runs / cfg.run_id() / "config.yaml"
        raw = yaml.safe_load(path.read_text())
        raw["train"].update(lr=0.001 * 2 ** i, warmup=i, weight_decay=0.1 * i,
                            grad_clip=1.0 + i, beta2=0.95 + 0.01 * i, min_lr_ratio=0.1 * i)
        raw["model"].update(dropout=0.05 * i, init_std=0.02 * (i + 1))
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
    # the recorded standard study: its numbers hold lists of run ids (pre-L6-d64-...)
    recorded = work / "standard"
    recorded.mkdir()
    shutil.copy(ROOT / "docs" / "results" / "study_standard" / "study.json", recorded)
    return [study, runs, recorded]


def use_templates(folder: Path) -> None:
    """Render from `folder` instead of the package's templates (same settings as html.py)."""
    env = report_html.environment()
    copy = jinja2.Environment(loader=jinja2.FileSystemLoader(folder), autoescape=env.autoescape,
                              undefined=env.undefined, trim_blocks=True, lstrip_blocks=True)
    copy.filters.update(env.filters)
    report_html.environment = lambda: copy


def problems(browser: checks.Browser, pages: list[Path]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for page in pages:
        url = render(page).resolve().as_uri()
        for width in checks.WIDTHS:
            browser.resize(width, 2000)
            for key, items in checks.layout_problems(browser.load(url)).items():
                found.setdefault(key, []).extend(items)
    return found


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="normlab-mutate-report-"))
    browser = None
    try:
        print("building a tiny study and a runs folder...", flush=True)
        pages = build_inputs(work, Path(sys.argv[1]) if len(sys.argv) > 1 else None)
        browser = checks.Browser(checks.CHROMIUM, work / "profile", work / "chromium.log")
        browser.open_page(1200, 2000)
        original = report_html.environment
        base = problems(browser, pages)
        if base:
            print(f"the unmutated report already fails the check: {json.dumps(base)[:2000]}")
            return 1
        results, stale = [], []
        for name, (file, find, replace) in MUTANTS.items():
            copy = work / "templates"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(TEMPLATES, copy)
            text = (copy / file).read_text()
            if find not in text:
                stale.append(name)
                continue
            (copy / file).write_text(text.replace(find, replace))
            use_templates(copy)
            try:
                seen = problems(browser, pages)
            finally:
                report_html.environment = original
            results.append((name, sorted(seen)))
        width = max(len(n) for n in MUTANTS)
        print(f"{'mutant':<{width}}  result    seen by")
        for name, seen in results:
            print(f"{name:<{width}}  {'killed' if seen else 'SURVIVED':<8}  {', '.join(seen)}")
        for name in stale:
            print(f"{name:<{width}}  STALE     the text it mutates is no longer in the template")
        survived = [n for n, seen in results if not seen]
        print(f"{len(results) - len(survived)} of {len(results)} mutants killed")
        return 2 if stale else 1 if survived else 0
    finally:
        if browser is not None:
            browser.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
