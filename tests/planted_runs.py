"""The planted worlds and checks that the tests of the trained claims share
(tests/study/claims/test_c03.py, test_c06.py, ..., tests/study/test_study_empirical.py).
"""

from __future__ import annotations

import random
from pathlib import Path

from fake_study import SEEDS, FakeStudy

from normlab.study.claims import measures

CLAIMS = measures()


def verdicts(result) -> list[str]:
    return [p["verdict"] for p in result.predictions]


def roles(result) -> list[str]:
    return [p["role"] for p in result.predictions]


def check_each_prediction(cid: str, good: dict[str, float], breaks: list[dict[str, float]],
                          tmp: Path, profile: str = "standard",
                          diagnostics: list[dict[str, float]] = (), noise: float = 0.01) -> None:
    """`good` supports every prediction; `breaks[k]` (merged into it) breaks only the k-th
    claim prediction, leaving every other claim prediction and premise supported, and the claim
    not supported (a diagnostic may follow the claim prediction it restates: it is reported
    only); `diagnostics[k]` breaks only the k-th diagnostic, every other prediction still
    supported, and leaves the claim supported: a diagnostic never decides."""
    result = CLAIMS[cid](FakeStudy(tmp, noise, profile, **good))
    assert verdicts(result) == ["supported"] * len(result.predictions), result.predictions
    assert result.verdict == "supported"
    role = roles(result)
    tests = [i for i, r in enumerate(role) if r == "claim"]
    diags = [i for i, r in enumerate(role) if r == "diagnostic"]
    assert len(tests) == len(breaks) and len(diags) == len(diagnostics), role
    for k, change in enumerate(breaks):
        result = CLAIMS[cid](FakeStudy(tmp, noise, profile, **(good | change)))
        assert roles(result) == role
        got = [v for v, r in zip(verdicts(result), role, strict=True) if r != "diagnostic"]
        expected = ["not supported" if i == tests[k] else "supported"
                    for i, r in enumerate(role) if r != "diagnostic"]
        assert got == expected, (k, change, [
            (p["subject"], p["effect"]["estimate"]) for p in result.predictions])
        assert result.verdict == "not supported"
    for k, change in enumerate(diagnostics):
        result = CLAIMS[cid](FakeStudy(tmp, noise, profile, **(good | change)))
        expected = ["not supported" if i == diags[k] else "supported" for i in range(len(role))]
        assert verdicts(result) == expected, (k, change, [
            (p["subject"], p["effect"]["estimate"]) for p in result.predictions])
        assert result.verdict == "supported", k


# -- C6a: both placements at a common peak lr ------------------------------------------------

C6_GOOD = {"val_post": 2.2, "val_post_nowarmup": 3.0, "val_pre": 2.2, "val_pre_nowarmup": 2.1}


# -- C6b: each placement's best over its own grid --------------------------------------------

# post without warmup diverges in every seed at every lr (scored ln 256)
C6B_GOOD = C6_GOOD | {"fails_post_nowarmup": 5}


# -- C9: the placements under one init, each family tuned ------------------------------------

# C9's families train under wsd (docs/study.md, C9)
C9_GOOD = {"val_pre_xavier_wsd": 2.3, "val_post_wsd": 2.2, "val_pre_wsd": 2.3,
           "val_post_gpt2_wsd": 2.2}


# -- C3: the merge cost in units of the block's own drop cost --------------------------------

# C3 reads the deeper half of a trained model: "large t" needs 12 blocks or more (its premise)
DEEP = {"train_blocks": 12}


# -- C10: transfer against the same architecture from init -----------------------------------

MAJORITY = 0.4


def _acc(rng: random.Random, **v: float) -> dict[str, dict[str, list[float]]]:
    return {arm: {p: [v[f"{arm}_{p}"] + 0.005 * rng.gauss(0, 1) for _ in range(SEEDS)]
                  for p in ("pre", "post")} for arm in ("pretrained", "scratch")}


C10_GOOD = {"scratch_pre": 0.5, "scratch_post": 0.5, "pretrained_pre": 0.6,
            "pretrained_post": 0.7}


# -- C11: the cost of dropping the final norm at two depths ----------------------------------

C11_GOOD = {"val_pre": 2.2, "val_pre_nofinal": 2.5, "fn6": 0.5, "fn12": 1.0,
            "rms6": 4.0, "rms12": 6.0, "rms6_init": 1.2, "rms12_init": 1.6}
