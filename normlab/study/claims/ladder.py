"""What the theory claims (C1, C4, C5, C7, C8) share: each is first calibrated in its source's
own setting, then traced rung by rung to normlab's block (`normlab.study.ladders`).
docs/study.md quotes each source, states its setting and derives each prediction at the depths
measured.

How a prediction is derived from its source (fixed before any run):
- a **bound** is a band whose edges are the bounds (Lemma 2: `0.5d <= increment <= 1.5d`);
- an **equality** the source derives (Post-LN's `E||x||^2 = 3d/2`; the FFN-only block's exact
  `d/2` per block) is a band of +- half the smallest difference the source itself separates;
- an **order of growth** becomes the log-log slope it takes over the measured range; laws are
  told apart by the nearest one (the band of each law reaches halfway to its neighbours);
- an **upper bound** is tested through the quantity its mechanism predicts (Theorem 1's final-norm
  Jacobian, `sqrt(d)/||x_L||`);
- a **direction** the source states without a size is decided at 0 and its size reported; where
  the claim means a factor, at that factor.

A claim whose calibration fails is "calibration failed", with its numbers, and gets no verdict on
normlab's block: our reading of the source or our instrument is wrong there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from normlab.probe.fits import loglog_fit
from normlab.study.claims.common import SCALE, _rel, make_claim
from normlab.study.context import StudyContext, WorkPlan
from normlab.study.figures import plot_ladder
from normlab.study.ladders import Rung, xiong_ladder
from normlab.study.schema import ClaimResult
from normlab.study.verdict import Prediction, base_subject, combine

# Xiong et al.'s Fig. 3 is a 6-layer model.
FIG3_DEPTH = 6
# v4: init_stats records each sublayer's branch and input energies
CACHE_VERSION = "v4"
# A ladder at init's cost for the time estimate, in training steps of the profile's 6-block
# shape per unit of its size, from the recorded quick study (docs/results/study_quick/log.txt:
# Xiong's ladder 12 s at 0.033 s a step). A ladder at init grows with its seeds x the sum of its
# depths x probe batches (`at_init_units`; quick: 3 x 45 x 2 = 270); the standard profile's
# recorded ladders lie within a fifth of what these give.
XIONG_STEPS = 360 / 270

Rows = list[dict[str, Any]]


# -- orders of growth in depth -------------------------------------------------------------------
# A claim that states an order of growth (O(1), O(log n), O(n)) is read with one rule wherever
# it is made (C7's DeepNorm, C8's Admin): a log-log slope over the depths measured lies in the
# band of the law it is nearer to than to a neighbour's.
def log_law_slope(ns: Sequence[float]) -> float:
    """The log-log slope that `y = ln n` takes over `ns` (an O(log n) law at zero offset)."""
    return loglog_fit([(n, math.log(n), 0) for n in ns], n_boot=0)["slope"]


def nearest_law_bands(s_log: float) -> dict[str, tuple[float, float]]:
    """Slope bands of O(1), O(log n), O(n) over a range where ln n has log-log slope `s_log`:
    each law's band holds the slopes nearer to its own (0, s_log, 1) than to a neighbour's."""
    lo, hi = s_log / 2, (1 + s_log) / 2
    return {"O(1)": (-lo, lo), "O(log n)": (lo, hi), "O(n)": (hi, 2 - hi)}


# -- per-seed quantities ---------------------------------------------------------------------------

def _by_seed(rows: Rows) -> dict[int, Rows]:
    out: dict[int, Rows] = {}
    for r in rows:
        out.setdefault(r["seed"], []).append(r)
    return dict(sorted(out.items()))


def _at_depth(rows: Rows, depth: int | None = None) -> list[dict[str, Any]]:
    """Per seed, the stats of the model at `depth` (the deepest when None)."""
    out = []
    for mine in _by_seed(rows).values():
        L = max(r["n_blocks"] for r in mine) if depth is None else depth
        out.append(next(r for r in mine if r["n_blocks"] == L))
    return out


def _slopes(rows: Rows, value: Callable[[dict[str, Any]], float], x: Callable[[int], float]
            = float) -> list[float]:
    """Per seed, the log-log slope of `value(row)` against `x(n_blocks)` over the depths."""
    out = []
    for seed, mine in _by_seed(rows).items():
        pts = [(x(r["n_blocks"]), value(r), seed) for r in mine]
        out.append(loglog_fit(pts, n_boot=0)["slope"])
    return out


# -- the ladder table ----------------------------------------------------------------------------

def ladder_row(rung: Rung, preds: Sequence[Prediction]) -> dict[str, Any]:
    return {"rung": rung.label, "key": rung.key, "change": rung.change,
            "calibration": rung.calibration, "verdict": combine(preds),
            "predictions": [p.to_dict() for p in preds]}


def calibration_status(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The calibration rungs' verdicts in one word: `passed` (every source rung supported),
    `passed (<rungs>)` (some supported: the readings that hold), `failed` (none supported and one
    contradicted: our reading or the instrument is wrong), `inconclusive` (none decided)."""
    cal = [r for r in rows if r["calibration"]]
    held = [r["rung"] for r in cal if r["verdict"] == "supported"]
    contradicted = [r["rung"] for r in cal if r["verdict"] == "not supported"]
    if held and len(held) == len(cal):
        status = "passed"
    elif held:
        status = "passed (" + "; ".join(held) + ")"
    elif contradicted:
        status = "failed"
    else:
        status = "inconclusive"
    return {"status": status, "held": held, "contradicted": contradicted,
            "rungs": [r["rung"] for r in cal]}


def departure(rows: Sequence[dict[str, Any]]) -> str:
    """Where each prediction first stops holding along the ladder (its first "not supported"
    rung after a source rung that holds), in words, and the later rungs where one that is
    contradicted nowhere was left undecided; "" when no source rung holds."""
    start = next((i for i, r in enumerate(rows) if r["calibration"]
                  and r["verdict"] == "supported"), None)
    if start is None:
        return ""
    parts, holds, undecided = [], [], []
    subjects = [p["subject"] for p in rows[start]["predictions"]]
    for subject in subjects:
        mine = [(r, p) for r in rows[start + 1:] for p in r["predictions"]
                if base_subject(p["subject"]) == subject]
        at = next((r for r, p in mine if p["verdict"] == "not supported"), None)
        if at is None:
            holds.append(subject)
            undecided += [f"{subject} at {r['rung']}" for r, p in mine
                          if p["verdict"] == "inconclusive"]
        else:
            parts.append(f"{subject} departs when {at['change']} ({at['rung']})")
    if holds:
        parts.append(f"{', '.join(holds)}: contradicted on no rung" + (
            f" (undecided: {', '.join(undecided)})" if undecided else ""))
    return "; ".join(parts)


def ladder_claim(ctx: StudyContext, claim: Any, method: str, rungs: Sequence[Rung],
                 predict: Callable[[Rung], list[Prediction]], numbers: dict[str, Any],
                 figures: list[str], quantities: dict[str, str], caveat: str = SCALE,
                 verdict_rung: int = -1) -> ClaimResult:
    """The claim's result: calibration, the ladder, and the verdict on normlab's block (the rung
    `verdict_rung`, the last unless the claim's source covers fewer depths: then later rungs
    are reported only) only when the calibration passed."""
    per_rung = [predict(rung) for rung in rungs]
    rows = [ladder_row(rung, preds) for rung, preds in zip(rungs, per_rung, strict=True)]
    cal = calibration_status(rows)
    cid = claim.id
    result = make_claim(cid, claim.title, claim.statement, claim.source, method,
                        per_rung[verdict_rung], claim.paper, numbers, figures, caveat=caveat)
    result.ladder = rows
    where = departure(rows)
    source_verdicts = "; ".join(f"{r['rung']}: {r['verdict']}" for r in rows if r["calibration"])
    if cal["status"] == "failed":
        result.verdict = "calibration failed"
        result.note = (f"Calibration failed: in the source's own setting ({source_verdicts}) "
                       "the prediction does not hold, so either our reading of the source or "
                       "the instrument is wrong there, and no verdict is given on normlab's "
                       "block.")
    elif cal["status"] == "inconclusive":
        result.verdict = "inconclusive"
        result.note = (f"Calibration inconclusive: in the source's own setting "
                       f"({source_verdicts}) the prediction could not be confirmed at this "
                       "size (see each rung's power), so normlab's block is not judged.")
    else:
        result.note = (f"Calibration {cal['status']}: the prediction holds in the source's "
                       f"setting; {where}.")
    result.calibration, result.departure = cal["status"], where
    fig = plot_ladder(rows, ctx.fig_dir / f"{cid.lower()}_ladder.svg", quantities,
                      title=f"{cid}: source setting to normlab's block")
    result.figures = _rel(ctx, fig) + list(figures)
    return result


def xiong_sweep(ctx: StudyContext) -> tuple[list[Rung], dict[str, Any]]:
    p = ctx.profile
    rungs = xiong_ladder(p.width, p.heads)
    depths = sorted(set(p.init_depths) | {FIG3_DEPTH})
    data = ctx.init_ladder(f"ladder_xiong_{CACHE_VERSION}", rungs, ["pre", "post"], depths)
    return rungs, data


def at_init_units(profile: Any) -> int:
    """A ladder at init's size: seeds x the sum of its depths x probe batches."""
    return profile.init_seeds * sum(profile.init_depths) * profile.probe_batches


def xiong_work(plan: WorkPlan) -> None:
    """Xiong's ladder, which C1, C4 and C5 share, for the time estimate."""
    plan.ladder(f"ladder_xiong_{CACHE_VERSION}", XIONG_STEPS * at_init_units(plan.profile))
