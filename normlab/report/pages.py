"""What each page shows, as plain data for its template (`templates/study.html`,
`templates/runs.html`): no markup is written here, except the inline SVG of figures (sanitized in
`normlab.report.embed`) and the prose filter that turns `backticks` into <code>."""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from normlab.report.embed import Figure, figure_from_bytes, load_figure
from normlab.report.figures import loss_curves_svg, sweep_map_svgs
from normlab.report.numbers import (
    Block,
    Cell,
    Interval,
    as_interval,
    blocks,
    cell,
    fmt,
    fmt_seconds,
    heading,
    is_number,
    label,
    numbers_blocks,
    table_of,
)
from normlab.report.runs import RunsView, find_folders, href, read_runs, runs_view
from normlab.report.study import ClaimView, Study
from normlab.report.study_map import study_map_svg, tuned_grids
from normlab.study.schema import VERDICTS, Effect
from normlab.study.table import verdict_rows

# Extra claim fields with a place of their own on the page (see ClaimView.extra).
PAPER_FIELDS = ("paper", "predictions", "power", "diagnosis", "stalled", "calibration",
                "ladder", "departure", "needs")


@dataclass
class LadderCell:
    subject: str
    measured: Interval | None
    verdict: str


@dataclass
class LadderRow:
    """One rung of a theory claim's ladder: the setting, the one change from the previous rung,
    and each prediction's measured value and verdict there (`cells`, one per subject of the
    ladder, empty where the rung has no such prediction; `present`, those it has)."""
    rung: str
    change: str
    calibration: bool
    verdict: str
    cells: list[LadderCell]

    @property
    def present(self) -> list[LadderCell]:
        """The predictions this rung made, in the ladder's order; one empty cell if none: the
        rows of the rung in the page's ladder table (one row per prediction, so that the table
        is as wide however many predictions a ladder has)."""
        return [c for c in self.cells if c.verdict or c.measured] or [LadderCell("", None, "")]


@dataclass
class Ladder:
    subjects: list[str]
    rows: list[LadderRow]
    calibration: str   # passed / passed (<readings>) / failed / inconclusive
    departure: str


def ladder_of(extra: dict[str, Any]) -> Ladder | None:
    """The ladder a theory claim wrote (`normlab.study.claims.ladder.ladder_row`); None without
    one."""
    rows = extra.get("ladder")
    if not (isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows)):
        return None
    subjects: list[str] = []
    for r in rows:
        for p in r.get("predictions") or []:
            if isinstance(p, dict) and str(p.get("subject")) not in subjects:
                subjects.append(str(p.get("subject")))
    out = []
    for r in rows:
        by_subject = {str(p.get("subject")): p for p in r.get("predictions") or []
                      if isinstance(p, dict)}
        cells = [LadderCell(s, as_interval(by_subject[s].get("effect")),
                            str(by_subject[s].get("verdict", ""))) if s in by_subject
                 else LadderCell(s, None, "") for s in subjects]
        out.append(LadderRow(str(r.get("rung", "")), str(r.get("change", "")),
                             bool(r.get("calibration")), str(r.get("verdict", "")), cells))
    return Ladder(subjects, out, str(extra.get("calibration") or ""),
                  str(extra.get("departure") or ""))


@dataclass
class PredictionRow:
    """One prediction of a claim (`normlab.study.verdict.Prediction` as written to study.json):
    what the paper predicts for a placement or a comparison, what we measured, its verdict."""
    subject: str
    quantity: str
    paper: str
    measured: Interval | None
    expected: str
    verdict: str
    power: str        # the smallest effect this test could detect vs the one the claim means
    rule: str
    diagnosis: str
    threshold_source: str = ""  # where the expected value's threshold comes from
    role: str = "claim"  # "claim" | "premise" | "diagnostic" (a third-edition "test" is a claim)
    derivation: str = ""  # how the prediction was derived on this rung


@dataclass
class ClaimPage:
    id: str
    title: str
    verdict: str
    anchor: str
    rule: str
    elapsed: str
    texts: list[tuple[str, str]]
    figures: list[tuple[Figure, str]]
    numbers: list[Block]
    effect: Interval | None
    effect_name: str
    expected: str
    caveat: str
    note: str
    paper: Cell | None = None
    needs: str = ""  # "not tested at this scale": the smallest setting that could test it
    prediction_rows: list[PredictionRow] | None = None
    predictions: list[Block] = field(default_factory=list)  # in a shape not known here
    power: Cell | None = None
    diagnosis: str = ""                  # why an inconclusive verdict is inconclusive
    stalled: list[str] = field(default_factory=list)  # sides that did not train: not compared
    extra: list[Block] = field(default_factory=list)
    ladder: Ladder | None = None         # theory claims: source setting -> normlab's block


def effect_interval(e: Effect | None) -> Interval | None:
    if e is None:
        return None
    return Interval(fmt(e.estimate), fmt(e.ci_low), fmt(e.ci_high), str(e.n))


def figure_number(claim_id: str, i: int, n: int) -> str:
    """A claim's figures are numbered by its id: 'C9' for its only one, 'C3.1', 'C3.2' for
    several; so a figure's number says whose it is, whatever claims come before it."""
    return claim_id if n == 1 else f"{claim_id}.{i + 1}"


def _figures(study: Study, view: ClaimView) -> list[tuple[Figure, str]]:
    c = view.claim
    out = []
    for i, rel in enumerate(c.figures):
        stand_in = f"{c.id}: {c.title} (figure {i + 1} of {len(c.figures)})"
        fig = load_figure(study.folder, rel, f"{view.anchor}-f{i + 1}-", alt=stand_in,
                          caption=stand_in)
        out.append((fig, figure_number(c.id, i, len(c.figures))))
    return out


def prediction_rows(v: Any) -> list[PredictionRow] | None:
    """The rows of a list of predictions; None if `v` is not one (it is then shown as a generic
    table)."""
    if not (isinstance(v, list) and v and all(isinstance(p, dict) and "subject" in p
                                              for p in v)):
        return None
    rows = []
    for p in v:
        effect = p.get("effect") if isinstance(p.get("effect"), dict) else {}
        mde, meaningful = p.get("mde"), p.get("meaningful")
        power = ""
        if mde is not None:
            power = f"detects {fmt(mde)}"
            if meaningful:
                power += f"; the claim means {fmt(meaningful)}"
        rows.append(PredictionRow(
            subject=str(p.get("subject", "")), quantity=str(p.get("quantity", "")),
            paper=str(p.get("paper", "")), measured=as_interval(effect),
            expected=str(effect.get("expected", "")), verdict=str(p.get("verdict", "")),
            power=power, rule=str(p.get("rule", "")), diagnosis=str(p.get("diagnosis", "")),
            threshold_source=str(p.get("threshold_source") or ""),
            role=str(p.get("role") or "claim"), derivation=str(p.get("derivation") or "")))
    return rows


def _predictions(v: Any) -> list[Block]:
    """Predictions in a shape `prediction_rows` does not know, as tables."""
    if not v or prediction_rows(v) is not None:
        return []
    out = blocks("", v)
    for b in out:
        if b.table is not None and b.table.has_row_heads and not b.table.corner:
            b.table.corner = "placement"  # a dict keyed by placement
    return out


def claim_page(study: Study, view: ClaimView) -> ClaimPage:
    c = view.claim
    texts = [(name, getattr(c, key)) for key, name in (
        ("statement", "Claim"), ("source", "Source"), ("method", "Method"),
        ("rule", "Decision rule")) if getattr(c, key)]
    extra = view.extra
    return ClaimPage(
        id=c.id, title=c.title, verdict=c.verdict, anchor=view.anchor, rule=c.rule,
        elapsed=fmt_seconds(c.elapsed_s) if c.elapsed_s else "", texts=texts,
        figures=_figures(study, view), numbers=numbers_blocks(c.numbers),
        effect=effect_interval(c.effect), effect_name=c.effect.name if c.effect else "",
        expected=c.effect.expected if c.effect else "", caveat=c.caveat, note=c.note,
        paper=cell(extra["paper"], "paper") if extra.get("paper") else None,
        prediction_rows=prediction_rows(extra.get("predictions")),
        predictions=_predictions(extra.get("predictions")),
        power=cell(extra["power"], "power") if extra.get("power") is not None else None,
        diagnosis=str(extra.get("diagnosis") or ""), needs=str(extra.get("needs") or ""),
        stalled=[str(x) for x in extra.get("stalled") or []]
        if isinstance(extra.get("stalled"), list) else [],
        extra=[b for k, v in extra.items() if k not in PAPER_FIELDS
               for b in blocks(heading(k), v, k)],
        ladder=ladder_of(extra))


_HEADER = (("profile", "profile"), ("created", "date"), ("elapsed_s", "elapsed"),
           ("normlab", "normlab"), ("git_commit", "git commit"), ("torch", "torch"),
           ("machine", "machine"))


def _parts(h: dict[str, Any]) -> list[dict[str, Any]]:
    parts = h.get("parts")
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def elapsed_text(h: dict[str, Any]) -> str:
    """The whole study's time: `elapsed_total_s` (every part the study was run in, each
    re-run of its claims in the same folder included), not the last part's `elapsed_s`."""
    parts = _parts(h)
    total = h.get("elapsed_total_s")
    if not is_number(total):  # a study from before parts were recorded
        total = sum(p["elapsed_s"] for p in parts if is_number(p.get("elapsed_s"))) \
            if parts else h.get("elapsed_s")
    text = fmt_seconds(total)
    return text + f" in {len(parts)} parts" if len(parts) > 1 else text


def parts_text(h: dict[str, Any]) -> str:
    """Each part of a study run in several: when it started, at which commit, how long."""
    out = []
    for p in _parts(h):
        commit = str(p.get("git_commit") or "")[:7]
        claims = p.get("claims") if isinstance(p.get("claims"), list) else []
        out.append(f"{p.get('started') or '?'}" + (f" at {commit}" if commit else "")
                   + (f" on {p['device']}" if p.get("device") else "")
                   + f": {fmt_seconds(p.get('elapsed_s'))}"
                   + (f" ({len(claims)} claims)" if claims else ""))
    return "; ".join(out)


def stability_map(study: Study) -> tuple[Figure | None, list[str]]:
    """The study's stability map (`normlab.report.study_map`) and the notes on what it left
    out; no figure when the study tuned nothing."""
    grids = tuned_grids([(v.claim.id, v.claim.numbers) for v in study.claims])
    settings = study.header.get("profile_settings")
    warmup = settings.get("warmup") if isinstance(settings, dict) else None
    try:
        svg = study_map_svg(grids, warmup)
    except Exception as e:  # a map is a bonus: its failure must not cost the whole report
        return None, [*grids.notes, f"stability map unavailable: {type(e).__name__}: {e}"]
    return (figure_from_bytes(svg, "map-") if svg else None), grids.notes


def study_context(study: Study, page_dir: Path) -> dict[str, Any]:
    h = study.header
    header = []
    parts = _parts(h)
    for key, name in _HEADER:
        v = h.get(key)
        if key == "elapsed_s":
            header.append((name, elapsed_text(h)))
            if len(parts) > 1:
                header.append(("parts", parts_text(h)))
        elif key == "created" and len(parts) > 1 and parts[0].get("started"):
            header.append((name, f"{parts[0]['started']} (first part), {fmt(v)} (last)"))
        elif key == "git_commit":
            header.append((name, v or "not recorded"))
        else:
            header.append((name, fmt(v)))
    known = {k for k, _ in _HEADER} | {"profile_settings", "elapsed_total_s", "parts"}
    header += [(label(k), fmt(v)) for k, v in h.items()
               if k not in known and (v is None or isinstance(v, str | int | float | bool))]
    # the numerics flags the study ran under, and how many of its runs trained on each device
    header += [(label(k), ", ".join(f"{a} {b}" for a, b in h[k].items()))
               for k in ("numerics", "runs_by_device") if isinstance(h.get(k), dict)]
    settings = h.get("profile_settings")
    settings_table = table_of({k: v for k, v in settings.items() if k != "name"}) \
        if isinstance(settings, dict) and settings else None
    runs_dir = study.folder / "runs"
    runs = None
    if runs_dir.is_dir():
        folders, _ = find_folders(runs_dir)
        runs = runs_view(read_runs(runs_dir, folders), page_dir) if folders else None
    counts = [(v, sum(c.claim.verdict == v for c in study.claims)) for v in VERDICTS]
    anchors = {v.claim.id: v.anchor for v in study.claims}
    rows = verdict_rows([{**v.claim.to_dict(), **v.extra} for v in study.claims])
    map_figure, map_notes = stability_map(study)
    return {
        "verdict_rows": [(r, anchors.get(r.claim, "")) for r in rows],
        "title": f"normlab study ({h['profile']})" if h.get("profile") else "normlab study",
        "header": header, "counts": [(v, n) for v, n in counts if n],
        "settings": settings_table,
        "stability_map": map_figure, "stability_notes": map_notes,
        "claims": [claim_page(study, v) for v in study.claims],
        "runs": runs, "runs_href": href(runs_dir, page_dir),
        "commit": h.get("git_commit") or ""}


@dataclass
class SweepPage:
    name: str
    figures: list[tuple[Figure, str]]
    note: str | None


def runs_context(root: Path, run_folders: list[Path], sweeps: list[Path], page_dir: Path
                 ) -> dict[str, Any]:
    rows = read_runs(root, run_folders)
    view: RunsView | None = runs_view(rows, page_dir) if rows else None
    counts = view.counts if view else {}
    svg = loss_curves_svg([r.curve for r in rows if r.curve is not None]) if rows else None
    curves = figure_from_bytes(svg, "loss-") if svg else None
    number = 2 if curves else 1
    sweep_pages = []
    for i, s in enumerate(sweeps):
        images, note = sweep_map_svgs(s)
        figs = []
        for j, data in enumerate(images):
            figs.append((figure_from_bytes(data, f"sweep{i + 1}-{j + 1}-"), str(number)))
            number += 1
        sweep_pages.append(SweepPage(str(s.relative_to(root)) if s != root else s.name, figs,
                                     note))
    from normlab.train.machine import git_commit

    header = [("folder", _folder_text(root, page_dir)),
              ("runs", f"{len(rows)}" + (" (" + ", ".join(
                  f"{k} {v}" for k, v in sorted(counts.items())) + ")" if counts else "")),
              ("sweeps", str(len(sweeps))),
              ("rendered on", f"{platform.node()} ({platform.machine()}, {platform.system()})")]
    return {"title": f"normlab runs: {root.name}", "header": header, "runs": view,
            "curves": curves, "sweeps": sweep_pages, "commit": git_commit() or ""}


def _folder_text(root: Path, page_dir: Path) -> str:
    """The folder of runs, as the page names it: relative to the page when below it (so that
    the page names no folder of the machine that wrote it), else as given."""
    rel = href(root, page_dir)
    return unquote(rel).rstrip("/") or "." if rel else str(root)


_CODE = re.compile(r"`([^`\n]+)`")
# A number with a minus sign in it ("-0.35", "2.046e-06"): browsers may break a line after the
# hyphen-minus, so it is kept whole. Not inside an escaped entity ("&#34;").
_SIGNED_NUMBER = re.compile(r"(?<![&#\w.])-?\d+(?:\.\d+)?(?:e[-+]\d+)?(?![\w.])")
# A name ending in a hyphen and a number ("GPT-2", "Peri-LN" is a word pair and may break).
_NAME_NUMBER = re.compile(r"(?<![&#\w-])[A-Za-z][A-Za-z0-9]*-\d[\w.]*")
# A number or a range, a hyphen and a word ("30-layer", "12-block", "12-24-block"): one word,
# kept whole.
_NUMBER_WORD = re.compile(r"(?<![&#\w.-])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)*-[A-Za-z]\w*")
# A run's folder name ("pre-L12-d64-1582d6aa6c4e"): one name, kept whole.
_RUN_ID = re.compile(r"(?<![&#\w-])[a-z][a-z0-9_]*-L\d+-d\d+-[0-9a-f]{6,}(?![\w-])")


def prose(value: str):
    """Escaped text in which `backticks` become <code> and no number can break across lines
    (a Jinja filter)."""
    from markupsafe import Markup, escape

    def whole(m: re.Match) -> str:
        return f'<span class="nb">{m.group(0)}</span>' if "-" in m.group(0) else m.group(0)

    text = _RUN_ID.sub(lambda m: f'<span class="nb">{m.group(0)}</span>', str(escape(value)))
    text = _SIGNED_NUMBER.sub(whole, text)
    text = _NAME_NUMBER.sub(lambda m: f'<span class="nb">{m.group(0)}</span>', text)
    text = _NUMBER_WORD.sub(lambda m: f'<span class="nb">{m.group(0)}</span>', text)
    return Markup(_CODE.sub(r"<code>\1</code>", text))


def slug(value: str) -> str:
    """A CSS class suffix: 'not supported' -> 'not-supported'."""
    return re.sub(r"[^a-z]+", "-", str(value).lower()).strip("-") or "x"
