"""Learning-rate schedules, every step of short runs against the formulas written out here."""

from __future__ import annotations

import math

import pytest

from normlab.config import TrainConfig
from normlab.train.schedules import lr_at


def reference(step: int, schedule: str, lr: float, steps: int, warmup: int,
              min_lr_ratio: float) -> float:
    """Step `step` (0-based) takes the `step + 1`-th warmup increment; after warmup the decay
    runs over `steps - warmup` steps to `min_lr_ratio * lr` at the last step (step steps - 1)."""
    k = step + 1
    if warmup and k <= warmup:
        return lr * k / warmup
    if schedule == "constant":
        return lr
    if schedule == "inv_sqrt":  # Vaswani et al. 2017, eq. 3, scaled to peak lr at warmup
        return lr * (warmup / k) ** 0.5
    done = min(k - warmup, max(steps - warmup, 1)) / max(steps - warmup, 1)
    low = min_lr_ratio * lr
    if schedule == "cosine":
        return low + (lr - low) * (1 + math.cos(math.pi * done)) / 2
    return lr - (lr - low) * done


CASES = [(schedule, steps, warmup, ratio)
         for schedule in ("constant", "cosine", "linear", "inv_sqrt")
         for steps, warmup, ratio in ((12, 4, 0.1), (10, 0, 0.25), (6, 5, 0.0), (5, 5, 0.5),
                                      (9, 1, 1.0))
         if not (schedule == "inv_sqrt" and warmup == 0)]  # the config rejects that one


@pytest.mark.parametrize("schedule, steps, warmup, ratio", CASES)
def test_every_step_matches_the_formula(schedule, steps, warmup, ratio):
    cfg = TrainConfig(lr=3.0, steps=steps, warmup=warmup, schedule=schedule,
                      min_lr_ratio=ratio)
    got = [lr_at(i, cfg) for i in range(steps + 3)]  # and past the end: the floor holds
    want = [reference(i, schedule, 3.0, steps, warmup, ratio) for i in range(steps + 3)]
    assert got == pytest.approx(want, rel=1e-13, abs=0)


def test_landmarks():
    cos = TrainConfig(lr=2.0, steps=11, warmup=1, schedule="cosine", min_lr_ratio=0.1)
    assert lr_at(0, cos) == 2.0  # the one warmup step reaches the peak
    assert lr_at(5, cos) == pytest.approx(0.2 + 1.8 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(10, cos) == pytest.approx(0.2)  # the last step: the floor
    assert lr_at(50, cos) == pytest.approx(0.2)
    lin = TrainConfig(lr=1.0, steps=4, warmup=0, schedule="linear", min_lr_ratio=0.0)
    assert [lr_at(i, lin) for i in range(4)] == pytest.approx([0.75, 0.5, 0.25, 0.0])
    warm = TrainConfig(lr=1.0, steps=100, warmup=10, schedule="linear", min_lr_ratio=0.0)
    assert [lr_at(i, warm) for i in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    inv = TrainConfig(lr=1.0, steps=100, warmup=4, schedule="inv_sqrt")
    assert lr_at(3, inv) == 1.0 and lr_at(15, inv) == pytest.approx(0.5)
    # warmup as long as the run: the decay span is one step, never zero
    whole = TrainConfig(lr=1.0, steps=3, warmup=3, schedule="cosine", min_lr_ratio=0.5)
    assert [lr_at(i, whole) for i in range(5)] == pytest.approx([1 / 3, 2 / 3, 1.0, 0.5, 0.5])
