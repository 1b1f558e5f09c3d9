"""The decisions of C10 (fine-tuning transfer) and C12 (removable deep layers) on synthetic
measurements, the pairing at matched loss, and the drop-cost statistic.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from normlab.study.claims.common import matched_pairs
from normlab.study.schema import Pretrained

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


# -- the rule's edges ---------------------------------------------------------------------------

def test_an_interval_touching_zero_is_above_or_below_only_when_the_edge_counts():
    from normlab.study.claims.common import _above, _below, _detectable

    touch_low = {"ci95": [0.0, 1.0], "n": 3}
    touch_high = {"ci95": [-1.0, 0.0], "n": 3}
    assert not _above(touch_low) and _above(touch_low, strict=False)
    assert not _below(touch_high) and _below(touch_high, strict=False)
    assert _above({"ci95": [0.5, 1.0], "n": 2}, threshold=0.4)
    assert not _above({"ci95": [0.5, 1.0], "n": 2}, threshold=0.5)
    assert _below({"ci95": [-1.0, 0.3], "n": 2}, threshold=0.4)
    assert not _below({"ci95": [-1.0, 0.4], "n": 2}, threshold=0.4)
    one_seed = {"n": 1}
    assert not _above({**one_seed, "ci95": [0.5, 1.0]}, strict=False)
    assert not _below({**one_seed, "ci95": [-1.0, -0.5]}, strict=False)
    undefined = {"ci95": [math.nan, math.nan], "n": 3}
    assert not _above(undefined, strict=False) and not _below(undefined, strict=False)
    assert _detectable({"ci95": [-0.5, 1.5], "n": 2}) == pytest.approx(1.0)
    assert _detectable({"ci95": [1.0, 1.0], "n": 1}) is None
    assert _detectable({"ci95": [math.nan, math.nan], "n": 3}) is None
    assert _detectable({"ci95": [-1e308, 1e308], "n": 4}) is None  # its width overflows


def test_pairs_refuse_a_placement_c10_and_c12_do_not_compare():
    with pytest.raises(ValueError, match=r"one of \('pre', 'post'\), got 'sandwich' \(x\)"):
        matched_pairs([Pretrained("sandwich", 0, Path("x"), 2.0)], 0.05)


def test_predictions_refuse_lists_that_are_not_paired_by_seed():
    """C10's and C12's per-seed differences pair lists by seed: a list one seed short is an
    error, never a difference over the seeds both happen to have."""
    from normlab.study.claims.c10_transfer import c10_predictions
    from normlab.study.claims.c12_removable_layers import c12_predictions

    with pytest.raises(ValueError, match="shorter|longer"):
        c12_predictions({"pre": [0.0, 0.001, 0.002], "post": [0.15, 0.16]})
    with pytest.raises(ValueError, match="shorter|longer"):  # the costs at init as well
        c12_predictions({"pre": [0.0, 0.001], "post": [0.15, 0.16]},
                        {"pre": [0.03, 0.03], "post": [0.03]})
    paired = {"pretrained": {"pre": [0.6, 0.62, 0.61], "post": [0.7, 0.71, 0.69]},
              "scratch": {"pre": [0.5, 0.52, 0.51], "post": [0.5, 0.51, 0.52]}}
    assert len(c10_predictions(paired, 0.4)) == 5
    for arm, p in [("pretrained", "pre"), ("scratch", "pre"), ("pretrained", "post"),
                   ("scratch", "post")]:
        short = {a: dict(v) for a, v in paired.items()}
        short[arm][p] = short[arm][p][:2]
        with pytest.raises(ValueError, match="shorter|longer"):
            c10_predictions(short, 0.4)
    # each arm paired within its placement, but pre one seed short of post
    short = {a: {"pre": v["pre"][:2], "post": v["post"]} for a, v in paired.items()}
    with pytest.raises(ValueError, match="shorter|longer"):
        c10_predictions(short, 0.4)


def test_pairs_go_on_past_a_left_out_seed_and_name_both_untrained_sides():
    ok = [Pretrained(pl, 1, Path(f"{pl}-1"), 2.0) for pl in ("pre", "post")]
    pairs, left_out = matched_pairs([Pretrained("pre", 0, Path("pre-0"), 2.0), *ok], 0.05)
    assert sorted(pairs) == [1] and left_out == ["seed 0: no post checkpoint"]
    both = [Pretrained("pre", 2, Path("pre-2"), 2.0, outcome="stalled"),
            Pretrained("post", 2, Path("post-2"), 2.0, outcome="diverged")]
    assert matched_pairs(both, 0.05)[1] == ["seed 2: pre stalled, post diverged"]
    # a gap of exactly the tolerance is within it (0.25 and the losses are exact in binary)
    edge = [Pretrained("pre", 3, Path("pre-3"), 2.0), Pretrained("post", 3, Path("post-3"), 2.25)]
    assert sorted(matched_pairs(edge, 0.25)[0]) == [3]
