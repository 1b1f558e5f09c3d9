"""The verdict table: one row per prediction (claim, subject, measured value with its 95%
interval, expected, the prediction's own verdict, the claim's calibration status), grouped by
claim. The terminal summary, the HTML report and the markdown that the README's tables are
pasted from (`normlab report DIR --markdown`) all read these rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

NONE = "—"


@dataclass
class VerdictRow:
    claim: str            # "C6a"
    title: str
    claim_verdict: str
    subject: str          # "post, lr 0.003 (post's tuned)"; "" for a claim without predictions
    measured: str         # "+0.59 [+0.31, +0.87], n=5"
    expected: str         # "> 0"
    verdict: str          # the prediction's own verdict
    role: str             # "test" | "premise" | ""
    calibration: str      # the claim's calibration status, NONE when it has none
    first: bool           # the first row of its claim (the claim's cells go here)
    rows_in_claim: int
    stalled: tuple[str, ...] = ()  # the claim's sides that never trained: not compared


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) else math.nan


def measured_text(effect: Mapping[str, Any] | None) -> str:
    if not effect:
        return NONE
    est, lo, hi = (_num(effect.get(k)) for k in ("estimate", "ci_low", "ci_high"))
    if not math.isfinite(est):
        return f"no value, n={effect.get('n', 0)}"

    def f(v: float) -> str:
        return f"{v:+.3g}" if math.isfinite(v) else "n/a"

    return f"{f(est)} [{f(lo)}, {f(hi)}], n={effect.get('n', 0)}"


def verdict_rows(claims: Iterable[Mapping[str, Any]]) -> list[VerdictRow]:
    rows: list[VerdictRow] = []
    for c in claims:
        cal = c.get("calibration") or NONE
        stalled = tuple(str(x) for x in c.get("stalled") or [])
        preds = [p for p in c.get("predictions") or [] if isinstance(p, Mapping)]
        if not preds:  # a claim decided by its own rule (C12), or not run
            eff = c.get("effect")
            rows.append(VerdictRow(
                c["id"], c["title"], c["verdict"], "" if eff else (c.get("note") or ""),
                measured_text(eff), (eff or {}).get("expected", NONE) if eff else NONE,
                c["verdict"], "", cal, True, 1, stalled))
            continue
        for i, p in enumerate(preds):
            eff = p.get("effect") if isinstance(p.get("effect"), Mapping) else None
            rows.append(VerdictRow(
                c["id"], c["title"], c["verdict"], str(p.get("subject", "")),
                measured_text(eff), str((eff or {}).get("expected", NONE)),
                str(p.get("verdict", "")), str(p.get("role", "test")), cal, i == 0,
                len(preds), stalled))
    return rows


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(claims: Iterable[Mapping[str, Any]]) -> str:
    """The verdict table as GitHub markdown: the claim's id, title and verdict on its first
    row; a premise's verdict marked as such."""
    lines = ["| claim | verdict | prediction | measured [95% interval] | expected | its verdict "
             "| calibration |", "|---|---|---|---|---|---|---|"]
    for r in verdict_rows(claims):
        stalled = f" (stalled: {', '.join(r.stalled)})" if r.stalled else ""
        head = (f"**{r.claim}** {_md(r.title)}", f"**{r.claim_verdict}**{stalled}") \
            if r.first else ("", "")
        own = r.verdict + (" (premise)" if r.role == "premise" else "")
        lines.append(f"| {head[0]} | {head[1]} | {_md(r.subject)} | {r.measured} | "
                     f"{_md(r.expected)} | {own} | {_md(r.calibration) if r.first else ''} |")
    return "\n".join(lines) + "\n"
