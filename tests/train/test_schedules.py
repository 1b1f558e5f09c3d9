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


# -- wsd: warmup, stable at the peak, a linear decay to 0 over the last decay_frac -----------

def wsd_reference(step: int, lr: float, steps: int, warmup: int, frac: float) -> float:
    """Written out: 1-based step k warms up over `warmup` steps, holds `lr`, and over the last
    D = max(1, round(frac * steps)) steps falls linearly to 0 at step `steps`; the smaller of
    warmup and decay where they overlap, 0 past the end."""
    k = step + 1
    d = max(1, round(frac * steps))
    ramp = k / warmup if warmup and k <= warmup else 1.0
    tail = (steps - k) / d if k > steps - d else 1.0
    return lr * max(0.0, min(ramp, tail))


WSD_CASES = [(20, 4, 0.2), (10, 0, 0.2), (12, 3, 0.25), (9, 2, 0.1), (6, 5, 0.5), (5, 0, 1.0),
             (400, 100, 0.2)]


@pytest.mark.parametrize("steps, warmup, frac", WSD_CASES)
def test_wsd_every_step_matches_the_formula(steps, warmup, frac):
    cfg = TrainConfig(lr=3.0, steps=steps, warmup=warmup, schedule="wsd", decay_frac=frac)
    got = [lr_at(i, cfg) for i in range(steps + 3)]
    want = [wsd_reference(i, 3.0, steps, warmup, frac) for i in range(steps + 3)]
    assert got == pytest.approx(want, rel=1e-13, abs=0)


def test_wsd_landmarks_and_the_end_of_its_stable_phase():
    from normlab.train.schedules import decay_steps, stable_end

    cfg = TrainConfig(lr=1.0, steps=20, warmup=4, schedule="wsd", decay_frac=0.2)
    assert decay_steps(cfg) == 4 and stable_end(cfg) == 16
    lrs = [lr_at(i, cfg) for i in range(20)]
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[3:16] == [1.0] * 13  # steps 4..16 (1-based) at the peak: the stable phase
    assert lrs[16:] == pytest.approx([0.75, 0.5, 0.25, 0.0])  # the decay, 0 at the last step
    assert TrainConfig().decay_frac == 0.2  # the literature's 10-20%, at its long end
    with pytest.raises(ValueError, match="no stable phase"):
        stable_end(TrainConfig(schedule="cosine"))


def test_decay_frac_leaves_every_earlier_run_id_alone():
    """A field added after run ids were issued is hashed only away from its default."""
    from normlab.config import HASHED_WHEN_SET, load_run_config

    assert "decay_frac" in HASHED_WHEN_SET
    base = load_run_config(None, [])
    assert load_run_config(None, ["train.decay_frac=0.2"]).run_id() == base.run_id()
    assert load_run_config(None, ["train.decay_frac=0.1"]).run_id() != base.run_id()
    assert load_run_config(None, ["train.schedule=wsd"]).run_id() != base.run_id()


# -- wsd in training: a resume continues bit for bit; a stacked member trains as alone -------

WSD_TINY = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
            "data.seq_len=32", "train.batch_size=8", "train.eval_batches=2", "train.log_every=1",
            "train.device=cpu", "train.schedule=wsd", "train.steps=20", "train.warmup=4",
            "train.eval_every=4"]


def _rows(run_dir):
    from normlab.train.logging import read_metrics

    return [{k: v for k, v in r.items() if k not in ("time_s", "tokens_per_s")}
            for r in read_metrics(run_dir / "metrics.jsonl")]


def test_a_wsd_run_resumes_bit_for_bit_and_logs_its_schedule(tmp_path):
    from normlab.config import load_run_config
    from normlab.train import train_run

    cfg = load_run_config(None, WSD_TINY)
    full = train_run(cfg, tmp_path / "a", progress=False)
    part = train_run(cfg, tmp_path / "b", progress=False, interrupt_at=17)  # inside the decay
    assert part["outcome"] == "interrupted" and part["step"] == 17
    resumed = train_run(cfg, tmp_path / "b", progress=False)
    a, b = _rows(tmp_path / "a" / cfg.run_id()), _rows(tmp_path / "b" / cfg.run_id())
    assert len(a) == len(b) == 20 and a == b  # every loss, lr and val loss identical
    assert full["val_loss"] == resumed["val_loss"]
    assert [r["lr"] for r in a] == pytest.approx([lr_at(i, cfg.train) for i in range(20)])


def test_wsd_members_of_a_stacked_group_train_as_they_do_alone(tmp_path):
    from normlab.config import load_run_config
    from normlab.train import train_run
    from normlab.train.group import run_unstackable_reason, train_group

    cfgs = [load_run_config(None, WSD_TINY + m) for m in (
        ["train.lr=3e-3"], ["train.lr=1e-3", "train.seed=1", "train.decay_frac=0.5"],
        ["train.lr=2e-3", "train.seed=2", "train.schedule=cosine"])]
    assert all(run_unstackable_reason(c) is None for c in cfgs)
    group = train_group(cfgs, tmp_path / "group")
    for cfg in cfgs:
        alone = train_run(cfg, tmp_path / "alone", progress=False)
        assert group[cfg.run_id()]["engine"] == "stacked"
        a = _rows(tmp_path / "alone" / cfg.run_id())
        g = _rows(tmp_path / "group" / cfg.run_id())
        assert [r["lr"] for r in g] == [r["lr"] for r in a] == pytest.approx(
            [lr_at(i, cfg.train) for i in range(20)])
        for ra, rg in zip(a, g, strict=True):
            assert rg["train_loss"] == pytest.approx(ra["train_loss"], rel=1e-4)
        assert group[cfg.run_id()]["val_loss"] == pytest.approx(alone["val_loss"], rel=1e-5)
