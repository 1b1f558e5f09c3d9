"""What a study writes: `study.json` holds every number behind the report.

    {
      "normlab": "0.1.0", "torch": "2.13.0", "created": "2026-11-29 10:00",
      "profile": "quick", "elapsed_s": 412.0, "machine": "...",
      "claims": [ClaimResult, ...]
    }

Each claim is one experiment with a verdict decided by a rule written in code (see
`normlab.study.verdict`). Figures are files relative to the study folder. Each claim lists
its per-placement predictions (`normlab.study.verdict.Prediction`) next to the paper's numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Verdict = Literal["supported", "not supported", "inconclusive", "not tested at this scale",
                  "calibration failed", "not run"]
# "calibration failed": a theory claim whose prediction does not hold in its source's own setting
# (our reading or the instrument is wrong there), so no verdict is given on normlab's block.
# "not tested at this scale": a premise about scale fails (depth below the source's, runs not
# trained to the regime the source means); the claim names the smallest setting that could test it.
VERDICTS: tuple[str, ...] = ("supported", "not supported", "inconclusive",
                             "not tested at this scale", "calibration failed", "not run")


@dataclass
class Effect:
    """The number a verdict rests on: an estimate with its interval over n seeds/batches."""

    name: str  # e.g. "slope(pre) - slope(post) of the last-layer gradient vs depth"
    estimate: float
    ci_low: float
    ci_high: float
    n: int
    expected: str  # e.g. "< 0", "> 0"


@dataclass
class ClaimResult:
    id: str  # "C1" ... "C13"
    title: str
    statement: str
    source: str
    method: str
    verdict: Verdict
    rule: str  # the decision rule, in words, with its thresholds
    effect: Effect | None = None
    numbers: dict[str, Any] = field(default_factory=dict)  # every number behind the verdict
    figures: list[str] = field(default_factory=list)  # SVG files relative to the study folder
    caveat: str = ""  # e.g. scale: a small CPU model may not show an effect seen at scale
    # per placement (or comparison): the paper's prediction, our measurement, its own verdict
    predictions: list[dict[str, Any]] = field(default_factory=list)
    paper: str = ""  # what the literature reports, with its numbers
    diagnosis: str = ""  # why a verdict is inconclusive: absent effect or too small a test
    stalled: list[str] = field(default_factory=list)  # sides whose runs stalled (not compared)
    note: str = ""  # e.g. why not run, with the install command
    # theory claims: "passed", "passed (<reading>)" or "failed" in the source's own setting
    calibration: str | None = None
    # theory claims: one row per rung from the source's setting to normlab's block (see
    # normlab.study.claims.ladder.ladder_row) and where the claim stops holding along it
    ladder: list[dict[str, Any]] = field(default_factory=list)
    departure: str = ""
    needs: str = ""  # "not tested at this scale": the smallest setting that could test the claim
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The two placements the study trains and pairs by seed (its runs, C10's and C12's checkpoints);
# not the placement registry, `normlab.config.PLACEMENTS`.
PRE_POST: tuple[str, str] = ("pre", "post")


@dataclass(frozen=True)
class Pretrained:
    """One pretrained checkpoint handed to C10 or C12 by the study."""

    placement: str  # one of PRE_POST
    seed: int  # pairs are formed by seed (the same data order)
    run_dir: Path  # an ordinary run folder with a checkpoint
    val_loss: float  # validation loss of that checkpoint
    outcome: str = "completed"  # "stalled" / "diverged" runs are reported, never compared
    step: int | None = None  # a checkpoint kept along the run (None: its last)
