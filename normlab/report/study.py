"""A study folder as the report reads it: `study.json` (see `normlab.study.schema`), checked field
by field so that a damaged file is a clear `ReportError` naming the claim and the field.

Fields of a claim that this normlab's `ClaimResult` does not know (a newer study: a per-placement
`predictions` table, the `paper`'s number, the `power` of the test...) are kept in
`ClaimView.extra` and shown as tables, so a report never drops what a study measured.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.report.numbers import is_number, nonfinite_text
from normlab.study.schema import VERDICTS, ClaimResult, Effect

STUDY_FILE = "study.json"


class ReportError(ValueError):
    """Nothing sensible can be reported from this input; the message says why and where."""


@dataclass
class ClaimView:
    claim: ClaimResult
    anchor: str                                           # the id of its section on the page
    extra: dict[str, Any] = field(default_factory=dict)   # fields ClaimResult does not know


@dataclass
class Study:
    folder: Path
    header: dict[str, Any]
    claims: list[ClaimView]


_CLAIM_TEXT = ("statement", "source", "method", "rule", "caveat", "note")
# The fields `_claim_from` checks and puts into a ClaimResult; every other one goes to `extra`.
_PARSED = {"id", "title", "verdict", "effect", "numbers", "figures", "elapsed_s", *_CLAIM_TEXT}


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
        if v is None or nonfinite_text(v):  # JSON has no NaN: written as a string
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
    anchors = _anchors(results)
    views = [ClaimView(c, a, {k: v for k, v in raw.items() if k not in _PARSED})
             for c, a, raw in zip(results, anchors, claims, strict=True)]
    header = {k: v for k, v in data.items() if k != "claims"}
    return Study(folder=folder, header=header, claims=views)


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
