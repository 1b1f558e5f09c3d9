"""The divergence checks step by step: the spike detector's warm-up, its threshold (strictly
above factor x mean), its patience, the frozen mean, its state; the finite checks' order."""

from __future__ import annotations

import math

import pytest

from normlab.train.divergence import SpikeDetector, divergence_reason, nonfinite_reason


def test_defaults():
    d = SpikeDetector()
    assert (d.factor, d.patience, d.decay, d.warm_steps) == (1.5, 10, 0.9, 5)
    assert (d.mean, d.seen, d.above) == (None, 0, 0)


def test_running_mean_is_an_ema_started_at_the_first_loss():
    d = SpikeDetector(decay=0.5)
    d.update(4.0)
    assert d.mean == 4.0 and d.seen == 1
    d.update(2.0)
    assert d.mean == 3.0
    d.update(1.0)
    assert d.mean == 2.0 and d.seen == 3


def test_warm_up_losses_never_count_as_above():
    d = SpikeDetector(factor=1.5, patience=1, warm_steps=3)
    assert d.update(1.0) is False
    # steps 2 and 3 are still warm-up: far above 1.5 x mean, yet they move the mean instead
    assert d.update(100.0) is False and d.above == 0
    assert d.update(100.0) is False and d.above == 0
    mean = d.mean
    assert d.update(2 * mean) is True  # step 4: past warm-up, patience 1


def test_threshold_is_strictly_above_factor_times_mean():
    d = SpikeDetector(factor=2.0, patience=1, warm_steps=0, decay=0.5)
    d.update(1.0)
    assert d.update(2.0) is False  # exactly 2 x mean: not above, and it moves the mean
    assert d.mean == 1.5
    assert d.update(3.0000001) is True


def test_patience_and_frozen_mean():
    d = SpikeDetector(factor=1.5, patience=3, warm_steps=0)
    d.update(2.0)
    assert [d.update(10.0) for _ in range(3)] == [False, False, True]
    assert d.mean == 2.0 and d.above == 3  # the plateau did not raise its own baseline
    # a normal loss resets the count
    d2 = SpikeDetector(factor=1.5, patience=2, warm_steps=0)
    d2.update(2.0)
    assert d2.update(10.0) is False and d2.above == 1
    assert d2.update(2.0) is False and d2.above == 0
    assert d2.update(10.0) is False and d2.update(10.0) is True


def test_state_round_trip_and_bad_state():
    d = SpikeDetector(factor=1.7, patience=4)
    for loss in (3.0, 2.5, 2.4):
        d.update(loss)
    state = d.state_dict()
    assert state == {"factor": 1.7, "patience": 4, "decay": 0.9, "warm_steps": 5,
                     "mean": d.mean, "seen": 3, "above": 0}
    e = SpikeDetector()
    e.load_state_dict(state)
    assert e == d
    e.load_state_dict({"mean": None})  # mean alone may be null
    assert e.mean is None and e.seen == 3
    with pytest.raises(ValueError, match=r"^unknown field 'speed'$"):
        e.load_state_dict({"speed": 1})
    for key, value in (("seen", None), ("above", True), ("factor", "1.5"), ("mean", "x")):
        with pytest.raises(ValueError, match=rf"^{key} is {value!r}, not a number$"):
            SpikeDetector().load_state_dict({key: value})
    # a bad field leaves the detector untouched, even after good fields
    f = SpikeDetector()
    with pytest.raises(ValueError):
        f.load_state_dict({"seen": 7, "above": None})
    assert f.seen == 0


def test_nonfinite_reasons_in_order():
    assert nonfinite_reason(1.0, 1.0) is None
    assert nonfinite_reason(math.nan, 1.0) == "nonfinite_loss"
    assert nonfinite_reason(math.inf, math.nan) == "nonfinite_loss"  # the loss first
    assert nonfinite_reason(1.0, math.inf) == "nonfinite_grad"
    assert nonfinite_reason(1.0, -math.inf) == "nonfinite_grad"


def test_divergence_reason():
    d = SpikeDetector(factor=1.5, patience=1, warm_steps=0)
    assert divergence_reason(2.0, 1.0, d) is None
    assert divergence_reason(math.nan, 1.0, d) == "nonfinite_loss"
    assert d.seen == 1  # a non-finite loss never reaches the detector
    assert divergence_reason(2.0, math.inf, d) == "nonfinite_grad"
    assert divergence_reason(10.0, 1.0, d) == "loss_spike"
