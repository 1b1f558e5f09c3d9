"""Contexts and pretrained checkpoints that C10's and C12's tests share
(tests/study/claims/test_c10.py, test_c12.py).
"""

from __future__ import annotations

from pathlib import Path

from fake_study import FakeStudy

from normlab.study.claims import with_settings
from normlab.study.schema import Pretrained


def _ctx(tmp_path, **extra):
    from normlab.study.experiments import StudyFolder
    from normlab.study.profiles import PROFILES

    return StudyFolder(tmp_path, with_settings(PROFILES["tiny"], **extra), log=lambda _: None)


# -- the words C10 and C12 show, on planted measurements -----------------------------------------

def _planted_ctx(tmp_path, **profile):
    return FakeStudy(tmp_path, settings=profile)


def _pretrained(outcome_post: str = "completed", seeds: int = 4) -> list[Pretrained]:
    return [Pretrained(pl, s, Path(f"/runs/{pl}-{s}"), 2.2,
                       outcome=outcome_post if pl == "post" else "completed")
            for pl in ("pre", "post") for s in range(seeds)]
