"""The verdict table: one row per prediction (claim, subject, measured value with its 95%
interval, expected, the prediction's own verdict, the claim's calibration status), grouped by
claim. The terminal summary, the HTML report and the markdown that the README's tables are
pasted from (`normlab report DIR --markdown`) all read these rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
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
    role: str             # "claim" | "premise" | "diagnostic" | ""
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
                str(p.get("verdict", "")), str(p.get("role", "claim")), cal, i == 0,
                len(preds), stalled))
    return rows


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(claims: Iterable[Mapping[str, Any]]) -> str:
    """The verdict table as GitHub markdown: the claim's id, title and verdict on its first
    row; a premise's and a diagnostic's verdict marked as such."""
    lines = ["| claim | verdict | prediction | measured [95% interval] | expected | its verdict "
             "| calibration |", "|---|---|---|---|---|---|---|"]
    for r in verdict_rows(claims):
        stalled = f" (stalled: {', '.join(r.stalled)})" if r.stalled else ""
        head = (f"**{r.claim}** {_md(r.title)}", f"**{r.claim_verdict}**{stalled}") \
            if r.first else ("", "")
        own = r.verdict + (f" ({r.role})" if r.role in ("premise", "diagnostic") else "")
        lines.append(f"| {head[0]} | {head[1]} | {_md(r.subject)} | {r.measured} | "
                     f"{_md(r.expected)} | {own} | {_md(r.calibration) if r.first else ''} |")
    return "\n".join(lines) + "\n"


def _value(effect: Mapping[str, Any] | None) -> str:
    if not effect:
        return "no value"
    est = _num(effect.get("estimate"))
    if not math.isfinite(est):
        return "no value"
    lo, hi = _num(effect.get("ci_low")), _num(effect.get("ci_high"))
    return f"{est:+.3g} [{lo:+.3g}, {hi:+.3g}]"


def _pred_words(p: Mapping[str, Any]) -> str:
    eff = p.get("effect") if isinstance(p.get("effect"), Mapping) else None
    expected = (eff or {}).get("expected", "")
    if p.get("kind") == "setting":  # a fact, checked exactly: its values, no interval
        shown = ", ".join(f"{v:.3g}" for v in p.get("values") or []) or "no value"
        return f"{p.get('subject', '')} {shown} (expected {expected})"
    return f"{p.get('subject', '')} {_value(eff)} (expected {expected})"


# how a ladder claim's derivation says a prediction was computed from the rung's own measured
# quantities (the source's mechanism, not its numbers: normlab.study.claims.c04_*, c08_*)
_OWN = ("own measured", "rung's own", "this rung's")


def _own_quantities(deciding: Sequence[Mapping[str, Any]]) -> str:
    """What a finding adds where a deciding prediction is the source's mechanism evaluated
    with the measured block's own quantities: on normlab's block it holds as the mechanism
    predicts, which may be far from the source's law (C4's 1/sqrt(L) is absent where the
    block's stream does not grow)."""
    own = [p for p in deciding if any(k in str(p.get("derivation") or "") for k in _OWN)]
    if not own:
        return ""
    return ("; off the source's setting these are the source's mechanism with each rung's own "
            "quantities, not its law: " + "; ".join(f"{p.get('subject', '')} "
                                                   f"({p.get('derivation')})" for p in own))


def finding(claim: Mapping[str, Any]) -> str:
    """One plain line for a claim, from its study.json entry only: "holds", "does not hold",
    "departs at rung X", "not tested here: needs ...", "undecided" or "not run", with the
    numbers it rests on."""
    verdict = claim.get("verdict", "")
    preds = [p for p in claim.get("predictions") or [] if isinstance(p, Mapping)]
    deciding = [p for p in preds if p.get("role", "claim") in ("claim", "test")]
    if verdict == "supported":
        head = "holds: " + "; ".join(_pred_words(p) for p in deciding)
    elif verdict == "not supported":
        failed = [p for p in deciding if p.get("verdict") == "not supported"]
        head = "does not hold: " + "; ".join(_pred_words(p) for p in failed)
    elif verdict == "not tested at this scale":
        short = [p for p in preds if p.get("role") == "premise"
                 and p.get("verdict") == "not supported"]
        head = ("not tested here: " + "; ".join(_pred_words(p) for p in short)
                + (f"; needs {claim['needs']}" if claim.get("needs") else ""))
    elif verdict == "calibration failed":
        head = "calibration failed in the source's own setting: no verdict on normlab's block"
    elif verdict == "not run":
        head = "not run: " + (claim.get("note") or "")
    else:
        open_ = [p for p in preds if p.get("role") != "diagnostic"
                 and p.get("verdict") != "supported"]
        head = "undecided: " + ("; ".join(_pred_words(p) for p in open_) if open_
                                else (claim.get("note") or "no prediction measured"))
    if verdict in ("supported", "not supported"):
        head += _own_quantities(deciding)
    if claim.get("departure") and " departs when " in claim["departure"] and verdict in (
            "supported", "not supported", "inconclusive"):
        head += f"; along the ladder: {claim['departure']}"
    return f"**{claim.get('id')}** {claim.get('title', '')}: {_md(head)}"


def findings(claims: Iterable[Mapping[str, Any]]) -> str:
    """One line per claim (`finding`), as a markdown list."""
    return "".join(f"- {finding(c)}\n" for c in claims)


def study_header(study: Mapping[str, Any]) -> str:
    """What a recorded study was, from its study.json: profile, when, how long (each part of a
    resumed study and the total), at which commit, on which machine."""
    parts = [p for p in study.get("parts") or [] if isinstance(p, Mapping)]
    if not parts:
        parts = [{"started": study.get("created"), "git_commit": study.get("git_commit"),
                  "elapsed_s": study.get("elapsed_s") or 0.0}]
    total = sum(float(p.get("elapsed_s") or 0.0) for p in parts)

    def one(p: Mapping[str, Any]) -> str:
        return (f"{float(p.get('elapsed_s') or 0.0) / 60:.1f} min from {p.get('started')} at "
                f"commit `{str(p.get('git_commit') or '?')[:7]}`")

    when = (one(parts[0]) if len(parts) == 1 else
            f"{total / 60:.1f} min in {len(parts)} parts (" + "; ".join(map(one, parts)) + ")")
    s = study.get("profile_settings") or {}
    shape = (f"width {s.get('train_width')}, {s.get('train_blocks')} blocks, {s.get('steps')} "
             f"steps, {s.get('seeds')} paired seeds" if s else "")
    return (f"Profile `{study.get('profile')}`: {when}; {shape}; {study.get('machine', '')}, "
            f"torch {study.get('torch', '')}.")
