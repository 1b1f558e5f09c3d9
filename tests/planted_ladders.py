"""The planted study at init and the verdict readers that the tests of the claims at
initialization share (tests/study/claims/test_c01.py, ..., tests/study/test_study_theory.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fake_study import LADDER_SEEDS, FakeStudy, Planted

from normlab.study.verdict import base_subject

SEEDS = LADDER_SEEDS


def planted_study(tmp: Path, world: Planted, failing_lrs: tuple[float, ...] = ()) -> FakeStudy:
    """The fake study serving `world`'s ladders (and C6's post runs failing at `failing_lrs`)."""
    return FakeStudy(tmp, profile="quick", world=world, failing_lrs=failing_lrs)


# by the subject as the source rung names it: off the source rungs C1's "pre (mechanism)" is
# the same prediction as its source rung's "pre"
def _verdicts(result) -> dict[str, str]:
    return {base_subject(p["subject"]): p["verdict"] for p in result.predictions}


def _rung_verdicts(row: dict[str, Any]) -> dict[str, str]:
    return {base_subject(p["subject"]): p["verdict"] for p in row["predictions"]}
