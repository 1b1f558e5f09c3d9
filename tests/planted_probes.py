"""The planted studies of the probed claims (C2, C13) that their tests and
tests/study/test_study_claims.py share.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from fake_study import FakeStudy

from normlab.study.claims import measures
from normlab.study.context import MatchedPair, ProbedPair

# the empirical claims (the theory claims: test_study_theory)
CLAIMS = {cid: f for cid, f in measures().items()
          if cid in ("C2", "C3", "C6a", "C6b", "C9", "C11", "C13")}


# C2 reads the deeper half of a trained model: "large t" needs 12 blocks or more (its premise)
DEEP = {"train_blocks": 12}


def _study(cid: str, tmp: Path, noise: float, **world: float) -> FakeStudy:
    """The planted study for a claim, trained at a depth where its premises hold."""
    return FakeStudy(tmp, noise, "quick", settings=DEEP if cid == "C2" else None, **world)


def _fill(params: dict[str, float]) -> dict[str, float]:
    """Defaults for the numbers a claim reads but the world does not plant."""
    base = {"ang_slope_pre": 0.0, "ang_slope_post": 0.0, "merge_pre": 0.0, "merge_post": 0.0,
            "lens_gap_pre": 0.0, "lens_gap_post": 0.0}
    return {**base, **params}


class _Unmatched(FakeStudy):
    def __init__(self, tmp: Path, pair: dict[str, Any], drop: bool,
                 settings: dict[str, Any] | None = None,
                 world: dict[str, float] | None = None) -> None:
        super().__init__(tmp, 0.01, "quick", settings=settings, **(world or _fill({})))
        self.pair, self.drop = MatchedPair.from_json(pair), drop

    def trained_probes(self) -> ProbedPair:
        out = super().trained_probes()
        return ProbedPair(self.pair) if self.drop else replace(out, pair=self.pair)
