"""What the recorded studies found at a shape: the study.json files under docs/results/study_*/
(each a `normlab study` run kept with the repository), read for `normlab advise --no-measure`.

A study trains pre and post at one shape, its profile's `train_blocks` x `train_width`: the
training claims (warmup C6a/C6b, the end loss C9, fine-tuning C10, the final norm C11, the
intermediate heads C13) are measured there, and a profile with `deep_blocks` also trains deeper
models at the same width (C11's deeper model, C12). Nothing else is trained, so of any other
shape the record says nothing.

docs/results is part of the repository, not of the installed package: the studies are found
when normlab runs from its repository (a checkout, or an editable install of one); an installed
copy has none, and says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# the claims a study measures by training at its shape, and those it measures on its deeper models
TRAINED_CLAIMS = ("C6a", "C6b", "C9", "C10", "C11", "C13")
DEEP_CLAIMS = ("C11", "C12")


def results_dir(repo: Path | None = None) -> Path | None:
    """docs/results of the repository normlab runs from (`repo`, default `REPO`), or None (an
    installed copy, which has no docs/)."""
    repo = REPO if repo is None else repo
    path = repo / "docs" / "results"
    return path if (repo / "pyproject.toml").is_file() and path.is_dir() else None


@dataclass
class Study:
    name: str                     # the profile (quick, standard, ...)
    path: Path
    settings: dict[str, Any]      # its profile_settings
    claims: dict[str, dict[str, Any]]

    def shapes(self) -> list[tuple[int, int, tuple[str, ...]]]:
        """(blocks, width, claims) of each shape this study trained."""
        s = self.settings
        width = s.get("train_width")
        out = [(s.get("train_blocks"), width, TRAINED_CLAIMS)]
        if s.get("deep_blocks"):
            out.append((s["deep_blocks"], width, DEEP_CLAIMS))
        return [(b, w, c) for b, w, c in out if isinstance(b, int) and isinstance(w, int)]

    def budget(self) -> str:
        s = self.settings
        parts = [f"{s['steps']} steps" if s.get("steps") else "",
                 f"{s['seeds']} seeds" if s.get("seeds") else "",
                 f"{s['train_heads']} heads" if s.get("train_heads") else ""]
        return ", ".join(p for p in parts if p)


@dataclass
class Recorded:
    """The recorded studies' findings at one shape (`recorded_at`)."""

    blocks: int
    width: int
    where: Path | None                    # the folder read; None: not available here
    studies: list[Study] = field(default_factory=list)   # every study read
    problems: list[str] = field(default_factory=list)    # study.json files that did not read
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per (study, claim) here

    @property
    def available(self) -> bool:
        return self.where is not None and bool(self.studies)

    @property
    def measured_here(self) -> bool:
        return bool(self.rows)

    def verdicts(self, claim: str) -> list[str]:
        return [r["verdict"] for r in self.rows if r["claim"] == claim]

    def shapes_text(self) -> str:
        """The shapes the studies trained, e.g. `6 blocks, width 64 (quick: 240 steps, 3 seeds;
        standard: 400 steps, 4 seeds); 12 blocks, width 64 (standard: C11, C12)`."""
        shapes: dict[tuple[int, int], list[str]] = {}
        for st in self.studies:
            for b, w, claims in st.shapes():
                what = st.budget() if claims == TRAINED_CLAIMS else ", ".join(claims)
                shapes.setdefault((b, w), []).append(f"{st.name}: {what}" if what else st.name)
        return "; ".join(f"{b} blocks, width {w} ({'; '.join(v)})"
                         for (b, w), v in sorted(shapes.items()))


def read_studies(where: Path) -> tuple[list[Study], list[str]]:
    """The studies under `where` (study_*/study.json, by name), and the files that did not
    read (a study being written, a damaged file), each with why."""
    studies, problems = [], []
    for path in sorted(where.glob("study_*/study.json")):
        try:
            data = json.loads(path.read_text())
            settings = data["profile_settings"]
            claims = {c["id"]: c for c in data["claims"]}
            if not isinstance(settings, dict):
                raise TypeError("profile_settings is not a mapping")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            problems.append(f"{path}: cannot be read ({type(e).__name__}: {e})")
            continue
        name = str(data.get("profile") or settings.get("name") or path.parent.name)
        studies.append(Study(name, path, settings, claims))
    return studies, problems


def recorded_at(blocks: int, width: int, where: Path | None = None,
                claims: tuple[str, ...] | None = None) -> Recorded:
    """What the recorded studies found at `blocks` x `width` (`where`: the results folder;
    default the repository's, when there is one), for the claims named in `claims` (default:
    every claim measured at the shape), in each study's order."""
    where = where if where is not None else results_dir()
    rec = Recorded(blocks, width, where)
    if where is None or not where.is_dir():
        rec.where = None
        return rec
    rec.studies, rec.problems = read_studies(where)
    for st in rec.studies:
        here = [c for b, w, cs in st.shapes() if (b, w) == (blocks, width) for c in cs]
        for cid in dict.fromkeys(c for c in here if claims is None or c in claims):
            claim = st.claims.get(cid)
            if claim is not None:
                rec.rows.append(claim_row(st, claim))
    return rec


def claim_row(study: Study, claim: dict[str, Any]) -> dict[str, Any]:
    """One claim of one study: its verdict, its claim and diagnostic predictions with their
    numbers (estimate, 95% interval, n), and what it needs when it was not tested."""
    numbers = []
    for p in claim.get("predictions") or []:
        if p.get("role") not in ("claim", "diagnostic"):
            continue
        numbers.append(f"{p.get('subject', '?')}: {p.get('quantity', '')} "
                       f"{effect_text(p.get('effect') or {})} ({p.get('verdict', '?')})")
    return {"study": study.name, "claim": claim.get("id", "?"), "title": claim.get("title", ""),
            "verdict": claim.get("verdict", "?"), "numbers": numbers,
            "needs": claim.get("needs") or ""}


def _num(v: Any) -> str:
    return f"{v:+.3g}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def effect_text(effect: dict[str, Any]) -> str:
    """`+0.663 [+0.462, +0.863], n=4`, or `not measured` when there is no finite estimate."""
    est = effect.get("estimate")
    if not isinstance(est, (int, float)) or not math.isfinite(est):
        return "not measured"
    return (f"{_num(est)} [{_num(effect.get('ci_low'))}, {_num(effect.get('ci_high'))}], "
            f"n={effect.get('n', '?')}")
