"""The decisions of C10 (fine-tuning transfer) and C12 (removable deep layers) on synthetic
measurements, the pairing at matched loss, and the drop-cost statistic."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from normlab.study.external import (
    Pretrained,
    decide_c10,
    decide_c12,
    drop_cost_profile,
    matched_pairs,
)

SEEDS = 5


def _noise(scale: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, scale, SEEDS)


# -- C12 -------------------------------------------------------------------------------------------

def _curve(L: int, slope: float, first: float = 3.0, last: float = 2.0) -> list[float]:
    """A drop-cost curve with a linear interior trend (in units of its median) and heavy ends."""
    depth = (np.arange(L) + 0.5) / L
    interior = 0.2 * (1 + slope * (depth - 0.5))
    return [first, *interior[1:-1].tolist(), last]


def test_drop_cost_profile_reads_the_interior_trend_and_keeps_the_ends_apart():
    falling = drop_cost_profile(_curve(12, -1.2))
    assert falling["depth_slope"] == pytest.approx(-1.2, rel=0.05)
    assert (falling["first"], falling["last"]) == (3.0, 2.0)
    assert len(falling["interior"]) == 10
    flat = drop_cost_profile(_curve(12, 0.0, first=9.0, last=9.0))
    assert flat["depth_slope"] == pytest.approx(0.0, abs=1e-9)  # heavy ends do not count
    assert flat["removable_share"] == 0.0
    # a model's scale does not matter: the curve is divided by its own median
    scaled = drop_cost_profile([10 * c for c in _curve(12, -1.2)])
    assert scaled["depth_slope"] == pytest.approx(falling["depth_slope"])


def test_drop_cost_profile_is_undefined_when_the_typical_block_costs_nothing():
    res = drop_cost_profile([1.0, 0.0, -0.01, 0.0, 0.0, 1.0])
    assert res["depth_slope"] is None and "median" in res["why_undefined"]
    assert drop_cost_profile([1.0, 0.5, 1.0])["depth_slope"] is None  # too few interior blocks


def _slopes(pre: float, post: float, noise: float, seed: int = 0) -> dict[str, list[float]]:
    return {"pre": (pre + _noise(noise, seed)).tolist(),
            "post": (post + _noise(noise, seed + 1)).tolist()}


def test_c12_planted_effect_is_supported():
    res = decide_c12(_slopes(pre=-1.0, post=0.1, noise=0.1))
    assert res["verdict"] == "supported", res["reason"]
    assert res["effect"].estimate > 0 and res["effect"].n == SEEDS


def test_c12_planted_opposite_is_not_supported():
    res = decide_c12(_slopes(pre=0.5, post=-0.5, noise=0.1))
    assert res["verdict"] == "not supported"
    # pre flat, post flat: pre's deep blocks are not cheaper
    flat = decide_c12(_slopes(pre=0.4, post=0.6, noise=0.05))
    assert flat["verdict"] == "not supported" and "pre's deep blocks" in flat["reason"]


def test_c12_noise_is_inconclusive_and_says_what_it_could_detect():
    res = decide_c12(_slopes(pre=0.0, post=0.0, noise=1.0, seed=3))
    assert res["verdict"] == "inconclusive"
    assert res["smallest_detectable"] > 0.5


def test_c12_both_declining_is_not_called_supported():
    res = decide_c12(_slopes(pre=-2.0, post=-1.0, noise=0.05))
    assert res["verdict"] == "inconclusive" and "both" in res["reason"]


def test_c12_one_pair_is_inconclusive():
    assert decide_c12({"pre": [-1.0], "post": [1.0]})["verdict"] == "inconclusive"


# -- pairing at matched loss ----------------------------------------------------------------

def test_pairs_are_formed_by_seed_at_matched_loss_and_stalled_sides_are_reported():
    cps = [Pretrained("pre", 0, Path("a"), 2.20), Pretrained("post", 0, Path("b"), 2.23),
           Pretrained("pre", 1, Path("c"), 2.20), Pretrained("post", 1, Path("d"), 2.40),
           Pretrained("pre", 2, Path("e"), 2.20),
           Pretrained("post", 2, Path("f"), 3.30, outcome="stalled"),
           Pretrained("pre", 3, Path("g"), 2.20)]
    pairs, left_out = matched_pairs(cps, tolerance=0.05)
    assert list(pairs) == [0]
    assert pairs[0]["post"].run_dir == Path("b")
    text = " | ".join(left_out)
    assert "seed 1" in text and "not within 0.05" in text
    assert "seed 2: post stalled" in text
    assert "seed 3: no post" in text


# -- C10 -------------------------------------------------------------------------------------------

BASELINE = 0.56


def _acc(pre: float, post: float, noise: float, seed: int = 0) -> dict[str, list[float]]:
    return {"pre": (pre + _noise(noise, seed)).tolist(),
            "post": (post + _noise(noise, seed + 1)).tolist()}


def test_c10_planted_effect_is_supported():
    res = decide_c10(_acc(pre=0.62, post=0.70, noise=0.005), BASELINE)
    assert res["verdict"] == "supported" and res["transfers"] == {"pre": True, "post": True}


def test_c10_planted_opposite_is_not_supported():
    res = decide_c10(_acc(pre=0.70, post=0.62, noise=0.005), BASELINE)
    assert res["verdict"] == "not supported"


def test_c10_noise_is_inconclusive():
    res = decide_c10(_acc(pre=0.66, post=0.66, noise=0.03, seed=4), BASELINE)
    assert res["verdict"] == "inconclusive" and "includes 0" in res["reason"]
    assert res["smallest_detectable"] > 0


@pytest.mark.parametrize("side", ["pre", "post"])
def test_c10_a_side_at_or_below_the_baseline_means_no_transfer_was_measured(side):
    """Even a large, clean difference is not a transfer result when one side does not beat the
    trigram baseline (here: one side sits exactly at it, the other far above)."""
    spread = [-0.004, -0.002, 0.0, 0.002, 0.004]
    acc = {p: [0.75 + s for s in spread] for p in ("pre", "post")}
    acc[side] = [BASELINE + s for s in spread[::-1]]  # mean exactly at the baseline
    res = decide_c10(acc, BASELINE)
    assert res["verdict"] == "inconclusive"
    assert res["reason"].startswith("no transfer was measured") and side in res["reason"]
    assert res["transfers"][side] is False
    # both at majority level (what the quick study measured before): no transfer either
    both = decide_c10({"pre": [0.355, 0.347, 0.350], "post": [0.347, 0.352, 0.349]}, 0.557)
    assert both["verdict"] == "inconclusive" and both["transfers"] == {"pre": False,
                                                                      "post": False}
    assert math.isfinite(both["effect"].estimate)
